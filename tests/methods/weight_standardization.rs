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

use std::collections::HashMap;

use tessera::config;
use tessera::model::Model;
use tessera::trainer::Trainer;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::assert_close;
use tessera_tests::*;
use weight_standardization::{standardize_weight, CONV2D, METRIC_NUM_LAYERS, WS_CONV2D};

const IGNORE: usize = 1;

fn synthetic_toml(with_plugin: bool) -> String {
    let mut text = format!(
        r#"run_name = "ws-model"
seed = 5
output_dir = "runs"
[data]
dataset = "synthetic"
batch_size = 8
eval_batch_size = 8
workers = 0
[data.synthetic]
samples = 16
eval_samples = 8
channels = 3
height = 16
width = 16
classes = 10
[model]
name = "resnet20"
width = 8
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
[train]
max_duration = "2ba"
progress = false
[checkpoint]
interval = "2ba"
[plugins]
dirs = [{dirs}]
"#,
        dirs = toml_string(&target_dir().display().to_string()),
    );
    if with_plugin {
        text.push_str(&format!(
            "[[algorithms]]\nplugin = \"weight_standardization\"\nn_last_layers_ignore = {IGNORE}\n"
        ));
    }
    text
}

fn trainer(dir: &TempDir, with_plugin: bool) -> Trainer {
    let cfg = config::from_str(&synthetic_toml(with_plugin), dir.path(), "trainer.toml")
        .expect("the test's trainer.toml");
    Trainer::new(cfg, Vec::new()).expect("the trainer")
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

fn fashion(label: &str, settings: Option<&str>) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"resnet20\"\nwidth = 4".to_owned();
    toml.device = Some("cpu".to_owned());
    toml.max_duration = "8ba".to_owned();
    if let Some(settings) = settings {
        toml = toml.algorithm("weight_standardization", settings);
    }
    toml
}

/// A 3-batch run's training losses, its logged metric and its model's number of convs.
fn run_3_batches(label: &str, settings: Option<&str>) -> (Vec<f64>, Vec<(u64, f64)>, usize) {
    let dir = TempDir::new(label);
    let mut toml = fashion(label, settings);
    toml.max_duration = "3ba".to_owned();
    let path = toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let lines = read_jsonl(&run_dir(&dir, label).join("metrics.jsonl"));
    let cfg = config::from_str(&toml.render(), dir.path(), &path.display().to_string())
        .expect("the test's trainer.toml");
    let model = Model::build(
        &cfg.model,
        cfg.data.input_shape(),
        cfg.model.num_classes as i64,
        Device::Cpu,
    )
    .expect("the model");
    (
        train_losses(&lines),
        method_metric(&lines, METRIC_NUM_LAYERS),
        convs(&model).len(),
    )
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

