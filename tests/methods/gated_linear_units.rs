//! The gated_linear_units plugin on the host's GPT-2.
//!
//! - In-process: the real `libgated_linear_units.so` replaces every `gpt2_mlp` of the host
//!   GPT-2 at `init`, reading the attributes and shapes the host's contract gives
//!   (`n_embd`, `n_inner`, `resid_pdrop`, `c_fc.weight`); the new modules carry Composer's
//!   tensor names and shapes with PyTorch's `Linear` initialisation, and the changed model
//!   computes what the plain GPT-2 computes with each MLP swapped for the crate's functional
//!   `gpt2_glu_mlp` on the same weights (which `plugins/gated_linear_units/tests/golden.rs`
//!   checks against Composer's `BERTGatedFFOutput`).
//! - Through the binary: the replaced count is logged, training changes, bad settings are
//!   refused naming them, a killed run resumes bit for bit, and the export keeps
//!   `glu_gpt2_mlp` and loads strictly into the PyTorch twins with the same logits.
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).
//! Its export (the file's modules, the PyTorch twins) is the row `gated_linear_units_export`
//! of the export table, with this file's `exported` as the method's own assertions.

use std::collections::BTreeMap;

use serde_json::Value;
use tessera::config;
use tessera::model::{Attr, Layer, Model, Role};
use tessera::trainer::Trainer;
use tessera_plugin_api::tch::{self, Device, Kind, TchError, Tensor};
use tessera_tests::*;

use gated_linear_units::{gpt2_glu_mlp, Activation, GluWeights, GLU_MLP, METRIC_REPLACED};

use crate::lm_export;
use lm_export::Export;

const N_EMBD: i64 = 32;
const N_INNER: i64 = 4 * N_EMBD;

fn glu(run: &str, settings: &str) -> TrainerToml {
    let mut toml = TrainerToml::tiny_gpt(run).algorithm("gated_linear_units", settings);
    toml.max_duration = "6ba".to_owned();
    toml
}

fn with_dropout(mut toml: TrainerToml) -> TrainerToml {
    toml.model.push_str("\ndropout = 0.1");
    toml
}

/// The gated MLP as a host layer: the crate's functional form on fixed weights.
#[derive(Debug)]
struct FunctionalGlu {
    weights: GluWeights,
    act: Activation,
    resid_pdrop: f64,
}

impl Layer for FunctionalGlu {
    fn kind(&self) -> &str {
        "functional_glu_mlp"
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        gpt2_glu_mlp(xs, &self.weights, self.act, self.resid_pdrop, train)
            .map_err(|e| TchError::Torch(e.message().to_owned()))
    }
}

fn trainer(dir: &TempDir, settings: &str) -> (config::Config, Trainer) {
    let toml = with_dropout(glu("glu-model", settings)).render();
    let cfg = config::from_str(&toml, dir.path(), "trainer.toml").expect("the test's config");
    let trainer = Trainer::new(cfg.clone(), Vec::new()).expect("the trainer with the plugin");
    (cfg, trainer)
}

fn attrs_of(model: &Model, path: &str) -> (String, BTreeMap<String, Attr>) {
    let info = model
        .root
        .walk()
        .into_iter()
        .find(|m| m.path == path)
        .unwrap_or_else(|| panic!("no module at `{path}`"));
    (info.kind, info.attrs)
}

fn number(attrs: &BTreeMap<String, Attr>, key: &str) -> f64 {
    match attrs.get(key) {
        Some(Attr::Int(v)) => *v as f64,
        Some(Attr::Float(v)) => *v,
        Some(Attr::Bool(b)) => f64::from(u8::from(*b)),
        other => panic!("`{key}` is {other:?}"),
    }
}

/// The plugin's tree and weights on the host GPT-2, and its forward against the functional
/// reference on the same weights.
fn check_surgery(settings: &str, act: Activation, gated_bias: bool, non_gated_bias: bool) {
    let dir = TempDir::new("glu-model");
    let (cfg, trainer) = trainer(&dir, settings);
    let model = trainer.model();
    let plain = Model::build(&cfg.model, cfg.data.input_shape(), 64, Device::Cpu)
        .expect("the plain gpt2 builds");
    let tensor = |name: &str| model.params.get(name).map(|e| e.tensor.shallow_clone());

    let mut reference = plain;
    let mut gated = Vec::new();
    for i in 0..2 {
        let path = format!("transformer.h.{i}.mlp");
        let (kind, attrs) = attrs_of(model, &path);
        assert_eq!(kind, GLU_MLP, "{path}");
        assert_eq!(number(&attrs, "n_embd"), N_EMBD as f64);
        assert_eq!(number(&attrs, "n_inner"), N_INNER as f64);
        assert_eq!(number(&attrs, "act_fn"), act.code() as f64);
        assert_eq!(number(&attrs, "resid_pdrop"), 0.1);
        assert_eq!(
            number(&attrs, "gated_layer_bias"),
            f64::from(u8::from(gated_bias))
        );
        assert_eq!(
            number(&attrs, "non_gated_layer_bias"),
            f64::from(u8::from(non_gated_bias))
        );
        // GPT-2's Conv1D tensors are gone; Composer's Linear ones, (out, in), are trainable.
        for old in ["c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"] {
            assert!(tensor(&format!("{path}.{old}")).is_none(), "{path}.{old}");
        }
        let mut shapes = vec![
            ("gated_layer.weight", vec![N_INNER, N_EMBD]),
            ("non_gated_layer.weight", vec![N_INNER, N_EMBD]),
            ("wo.weight", vec![N_EMBD, N_INNER]),
            ("wo.bias", vec![N_EMBD]),
        ];
        if gated_bias {
            shapes.push(("gated_layer.bias", vec![N_INNER]));
        }
        if non_gated_bias {
            shapes.push(("non_gated_layer.bias", vec![N_INNER]));
        }
        for (leaf, shape) in &shapes {
            let name = format!("{path}.{leaf}");
            gated.push(name.clone());
            let e = model
                .params
                .get(&name)
                .unwrap_or_else(|| panic!("no `{name}`"));
            assert_eq!(&e.tensor.size(), shape, "{name}");
            assert_eq!(e.role, Role::Parameter, "{name}");
            // PyTorch's Linear default: U(±1/√fan_in), fan_in the layer's input width.
            let fan_in = if leaf.starts_with("wo") {
                N_INNER
            } else {
                N_EMBD
            };
            let bound = 1.0 / (fan_in as f64).sqrt();
            let max = e.tensor.abs().max().double_value(&[]);
            assert!(
                max <= bound && max > 0.9 * bound,
                "{name}: max |w| {max} vs bound {bound}"
            );
        }
        let get = |leaf: &str| tensor(&format!("{path}.{leaf}"));
        let weights = GluWeights {
            gated_weight: get("gated_layer.weight").unwrap(),
            gated_bias: get("gated_layer.bias"),
            non_gated_weight: get("non_gated_layer.weight").unwrap(),
            non_gated_bias: get("non_gated_layer.bias"),
            wo_weight: get("wo.weight").unwrap(),
            wo_bias: get("wo.bias").unwrap(),
        };
        reference
            .replace_module(
                &path,
                Box::new(FunctionalGlu {
                    weights,
                    act,
                    resid_pdrop: 0.1,
                }),
            )
            .expect("the mlp is replaceable");
    }
    // The rest of the model: the same tensors under the same names.
    let rest: Vec<(String, Tensor)> = reference
        .params
        .entries()
        .iter()
        .map(|e| {
            let t =
                tensor(&e.name).unwrap_or_else(|| panic!("the plugin's model lost `{}`", e.name));
            (e.name.clone(), t)
        })
        .collect();
    reference.params.restore(&rest).expect("same weights");
    // The plugin's model holds exactly those plus the gated tensors (which the reference's
    // functional layers hold outside its store).
    let mut names: Vec<String> = reference
        .params
        .entries()
        .iter()
        .map(|e| e.name.clone())
        .chain(gated.iter().cloned())
        .collect();
    names.sort();
    let mut ours: Vec<String> = model
        .params
        .entries()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    ours.sort();
    assert_eq!(ours, names);

    tch::manual_seed(4);
    let ids = Tensor::randint(64, [3, 20], (Kind::Int64, Device::Cpu));
    let got = tch::no_grad(|| model.forward(&ids, false)).expect("the plugin's model runs");
    let want = tch::no_grad(|| reference.forward(&ids, false)).expect("the reference runs");
    let diff = (&got - &want).abs().max().double_value(&[]);
    assert!(diff <= 1e-5, "max |plugin − functional| = {diff}");
    println!("{settings:?}: host gpt2 + libgated_linear_units.so vs functional: {diff:e}");
}

#[test]
fn the_surgery_on_the_host_gpt2_equals_the_functional_form() {
    check_surgery("", Activation::GeluNew, false, false);
    check_surgery(
        "act_fn = \"relu\"\ngated_layer_bias = true\nnon_gated_layer_bias = true",
        Activation::Relu,
        true,
        true,
    );
}

/// Trains `toml` in a fresh folder; returns (run.json, metrics lines).
fn run(label: &str, toml: &TrainerToml) -> (Value, Vec<Value>) {
    let dir = TempDir::new(label);
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    let folder = run_dir(&dir, &toml.run_name);
    assert!(
        out.stderr
            .contains("gated_linear_units replaced 2 feed-forward blocks"),
        "{}",
        out.stderr
    );
    (
        read_json(&folder.join("run.json")),
        read_jsonl(&folder.join("metrics.jsonl")),
    )
}

#[test]
fn the_run_logs_the_replaced_mlps_and_trains() {
    let (record, lines) = run("glu-binary", &with_dropout(glu("glu", "")));
    assert_eq!(method_metric(&lines, METRIC_REPLACED), [(0, 2.0)]);
    assert_eq!(record["status"], "completed");
    let p = record["final_perplexity"].as_f64().expect("perplexity");
    assert!(p.is_finite() && p < 64.0, "perplexity {p}");
    let dir = TempDir::new("glu-plain");
    let mut plain = TrainerToml::tiny_gpt("plain");
    plain.model.push_str("\ndropout = 0.1");
    plain.max_duration = "6ba".to_owned();
    plain.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let plain_lines = read_jsonl(&run_dir(&dir, "plain").join("metrics.jsonl"));
    assert_ne!(train_losses(&plain_lines), train_losses(&lines));
}

/// The method's own part of its export check (`table::gated_linear_units_export`): the gated
/// MLPs keep their activation and biases, and their weights replace `c_fc`.
pub fn exported(export: &Export) {
    let Export { tensors, modules } = export;
    let attrs = &modules[1]["attrs"];
    assert_eq!(
        attrs["act_fn"].as_f64(),
        Some(Activation::Silu.code() as f64)
    );
    assert_eq!(attrs["non_gated_layer_bias"].as_f64(), Some(1.0));
    assert_eq!(attrs["gated_layer_bias"].as_f64(), Some(0.0));
    let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    for name in [
        "transformer.h.1.mlp.gated_layer.weight",
        "transformer.h.1.mlp.non_gated_layer.weight",
        "transformer.h.1.mlp.non_gated_layer.bias",
        "transformer.h.1.mlp.wo.weight",
        "transformer.h.1.mlp.wo.bias",
    ] {
        assert!(names.contains(&name), "no {name}: {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains(".mlp.c_fc.")), "{names:?}");
    assert!(!names.contains(&"transformer.h.0.mlp.gated_layer.bias"));
}
