//! The weight_standardization plugin on the host's real models.
//!
//! In-process (synthetic data, ResNet-20): the surgery replaces every conv but the last
//! `n_last_layers_ignore` (tree order, the execution order) and keeps the weights' names and
//! values; the model computes exactly what the plain model computes with those convs' weights
//! standardized (the fold a PyTorch user does after export); the optimizer trains the raw
//! weights; `tessera export` writes the raw weights.
//!
//! Through the binary (Fashion-MNIST, CPU): the method logs the standardized convs and changes
//! training, a bad setting is refused naming it, and a run killed and resumed equals the straight
//! run bit for bit (the surgery replayed at `init`).
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use std::collections::HashMap;

use tessera::model::Model;
use tessera::trainer::Trainer;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::assert_close;
use tessera_tests::*;
use weight_standardization::{standardize_weight, CONV2D, METRIC_NUM_LAYERS, WS_CONV2D};

use crate::host_model::{fashion, run_and_build, synthetic_toml};

const IGNORE: usize = 1;

/// An in-process trainer of [`synthetic_toml`], with the plugin (ignoring the last [`IGNORE`]
/// convs) or without.
fn trainer(dir: &TempDir, with_plugin: bool) -> Trainer {
    let plugin = format!(
        "[[algorithms]]\nplugin = \"weight_standardization\"\nn_last_layers_ignore = {IGNORE}\n"
    );
    crate::host_model::trainer(
        dir,
        &synthetic_toml("ws-model", if with_plugin { &plugin } else { "" }),
    )
}

/// A 3-batch run's training losses, its logged metric and its model's number of convs.
fn run_3_batches(label: &str, settings: Option<&str>) -> (Vec<f64>, Vec<(u64, f64)>, usize) {
    let plugin = settings.map(|s| ("weight_standardization", s));
    let (losses, metric, model) = run_and_build(&fashion(label, 3, plugin), METRIC_NUM_LAYERS);
    (losses, metric, convs(&model).len())
}

/// `(path, kind)` of every conv of `model`, plain or standardized, in tree order.
fn convs(model: &Model) -> Vec<(String, String)> {
    model
        .root
        .walk()
        .into_iter()
        .filter(|m| m.kind == CONV2D || m.kind == WS_CONV2D)
        .map(|m| (m.path, m.kind))
        .collect()
}

#[test]
fn the_surgery_keeps_the_weights_and_equals_the_folded_plain_model() {
    let dir = TempDir::new("ws-model");
    let plain = trainer(&dir, false);
    let mut ws = trainer(&dir, true);
    let before = convs(plain.model());
    let after = convs(ws.model());
    assert!(before.len() > IGNORE && before.iter().all(|(_, k)| k == CONV2D));
    let replaced: Vec<&String> = after
        .iter()
        .filter(|(_, k)| k == WS_CONV2D)
        .map(|(p, _)| p)
        .collect();
    let want: Vec<&String> = before[..before.len() - IGNORE]
        .iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(replaced, want, "every conv but the last {IGNORE}");
    assert_eq!(after.last(), before.last(), "the last conv is left alone");

    // Same tensors by name, with the same values and roles.
    let mut names: Vec<&str> = ws
        .model()
        .params
        .entries()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    let mut plain_names: Vec<&str> = plain
        .model()
        .params
        .entries()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    names.sort_unstable();
    plain_names.sort_unstable();
    assert_eq!(names, plain_names);
    for e in plain.model().params.entries() {
        let w = ws.model().params.get(&e.name).expect("kept");
        assert!(w.tensor.equal(&e.tensor), "{}", e.name);
        assert_eq!(w.role, e.role, "{}", e.name);
    }

    // The standardized model equals the plain one with those weights standardized (in
    // evaluation mode, so BatchNorm statistics stay put).
    tch::no_grad(|| {
        for path in &replaced {
            let w = plain
                .model()
                .params
                .get(&format!("{path}.weight"))
                .expect("weight");
            let folded = standardize_weight(&w.tensor).expect("standardize");
            w.tensor.shallow_clone().copy_(&folded);
        }
    });
    tch::manual_seed(3);
    let x = Tensor::randn([4, 3, 16, 16], (Kind::Float, Device::Cpu));
    let got = ws
        .model()
        .forward(&x, false)
        .expect("the standardized model runs");
    let want = plain
        .model()
        .forward(&x, false)
        .expect("the folded model runs");
    let scale = want.abs().max().double_value(&[]).max(1.0);
    assert_close("folded", &got, &want, 1e-5, 1e-5 * scale);

    // The optimizer trains the raw weights, checkpoints hold them, and the export holds them
    // standardized (the method folded into plain convs).
    let trained: Vec<&str> = ws.optimizer().param_names().collect();
    for path in &replaced {
        assert!(
            trained.contains(&format!("{path}.weight").as_str()),
            "{path}"
        );
    }
    let initial: HashMap<String, Tensor> = ws
        .model()
        .params
        .entries()
        .iter()
        .map(|e| (e.name.clone(), e.tensor.copy()))
        .collect();
    ws.fit().expect("training with weight standardization");
    let ckpt = ws.last_checkpoint().expect("a checkpoint").to_owned();
    let exported = dir.join("model.safetensors");
    tessera::trainer::export_checkpoint(&ckpt, &exported)
        .expect("the export of a standardized run");
    let exported: HashMap<String, Tensor> = Tensor::read_safetensors(&exported)
        .expect("the export reads back")
        .into_iter()
        .collect();
    for path in &replaced {
        let name = format!("{path}.weight");
        let w = &ws.model().params.get(&name).expect("weight").tensor;
        assert!(!w.equal(&initial[&name]), "{name} was not trained");
        let folded = tch::no_grad(|| standardize_weight(w)).expect("standardize");
        assert_close(&name, &exported[&name], &folded, 1e-6, 1e-6);
    }
}

#[test]
fn training_standardizes_the_convs_and_changes_the_run() {
    require_fashion_mnist();
    let (plain, _, _) = run_3_batches("ws-plain", None);
    let (all, all_metric, n) = run_3_batches("ws-all", Some(""));
    let (some, some_metric, _) = run_3_batches("ws-some", Some("n_last_layers_ignore = 3"));
    assert_eq!(all_metric, [(0, n as f64)]);
    assert_eq!(some_metric, [(0, (n - 3) as f64)]);
    assert_eq!(plain.len(), 3);
    assert!(all.iter().chain(&some).all(|l| l.is_finite()));
    assert_ne!(all, plain, "standardizing changed nothing");
    assert_ne!(some, all, "n_last_layers_ignore changed nothing");
}
