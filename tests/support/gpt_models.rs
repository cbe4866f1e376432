//! The GPT-2 architecture plugins (rotary, qk_norm, relu_squared, logit_softcap,
//! zero_init_projections) on the host's GPT-2, for their workspace tests (`#[path]` module):
//! an in-process trainer whose `init` ran the real plugins' surgery, its modules and weights,
//! and the float64 PyTorch reference of `tests/support/gpt_reference.py`.

#![allow(dead_code)]

use std::collections::BTreeMap;

use serde_json::Value;
use tessera::config;
use tessera::model::{Attr, Layer, Model, Role};
use tessera::trainer::Trainer;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_tests::*;

/// The tiny GPT of the binary tests (2 layers, 2 heads, width 32, context 64) with `plugins`
/// (each `(name, settings)`), 6 batches.
pub fn gpt(run: &str, plugins: &[(&str, &str)]) -> TrainerToml {
    let mut toml = TrainerToml::tiny_gpt(run);
    toml.max_duration = "6ba".to_owned();
    for (p, s) in plugins {
        toml = toml.algorithm(p, s);
    }
    toml
}

/// `toml` with `[model]` lines replaced by `model` (name gpt2 kept first).
pub fn with_model(mut toml: TrainerToml, model: &str) -> TrainerToml {
    toml.model = format!("name = \"gpt2\"\n{model}");
    toml
}

/// An in-process trainer for `toml` (`init` ran: the plugins' surgery is in its model).
pub fn trainer(dir: &TempDir, toml: &TrainerToml) -> Trainer {
    let cfg =
        config::from_str(&toml.render(), dir.path(), "trainer.toml").expect("the test's config");
    Trainer::new(cfg, Vec::new()).expect("the trainer with the plugins")
}

/// The layer at `path` below `root`.
pub fn layer<'a>(root: &'a dyn Layer, path: &str) -> &'a dyn Layer {
    let mut node = root;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        node = node
            .children()
            .into_iter()
            .find(|(name, _)| *name == part)
            .map(|(_, child)| child)
            .unwrap_or_else(|| panic!("no module at `{path}` (stopped at `{part}`)"));
    }
    node
}

/// `(kind, attributes as numbers)` of the module at `path`.
pub fn node(model: &Model, path: &str) -> (String, BTreeMap<String, f64>) {
    let info = model
        .root
        .walk()
        .into_iter()
        .find(|m| m.path == path)
        .unwrap_or_else(|| panic!("no module at `{path}`"));
    let attrs = info
        .attrs
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Attr::Int(i) => i as f64,
                Attr::Float(f) => f,
                Attr::Bool(b) => f64::from(u8::from(b)),
            };
            (k, v)
        })
        .collect();
    (info.kind, attrs)
}

/// The kinds of the model's modules, by path.
pub fn kinds(model: &Model) -> BTreeMap<String, String> {
    model
        .root
        .walk()
        .into_iter()
        .map(|m| (m.path, m.kind))
        .collect()
}

/// Overwrites every trainable parameter with normal(0, `std`) values from a stream seeded with
/// `seed` (layer-norm weights around 1), so that biases and every weight matter. The stream is
/// the test's own (`gpt_surgery::Normal`), not libtorch's global generator, which tests running
/// in parallel threads share.
pub fn randomize(model: &Model, std: f64, seed: u64) {
    let mut normal = gpt_surgery::Normal::new(seed);
    tch::no_grad(|| {
        for e in model.params.entries() {
            if e.role != Role::Parameter {
                continue;
            }
            let mut t = e.tensor.shallow_clone();
            let mut values = normal.tensor(&t.size(), std);
            if e.name.contains(".ln_") && e.name.ends_with(".weight") {
                values += 1.0;
            }
            t.copy_(&values);
        }
    });
}

/// Every tensor of the model (parameters and buffers) under its Hugging Face name.
pub fn state(model: &Model) -> Vec<(String, Tensor)> {
    model
        .params
        .entries()
        .iter()
        .map(|e| (e.name.clone(), e.tensor.detach().copy()))
        .collect()
}

/// The reference outputs of `tests/support/gpt_reference.py MODE SPEC` on `tensors`; `None`
/// (with a notice, or a failure under `TESSERA_REQUIRE_PYTORCH=1`) when torch does not import.
pub fn reference(
    mode: &str,
    spec: &Value,
    tensors: &[(String, Tensor)],
) -> Option<BTreeMap<String, Tensor>> {
    if !python_can_import("torch", "the GPT-2 architecture plugins' reference") {
        return None;
    }
    let dir = TempDir::new("gpt-reference");
    let case = dir.join("case.safetensors");
    let out = dir.join("out.safetensors");
    let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Tensor::write_safetensors(&named, &case).expect("write the case");
    let result = python(&[
        "tests/support/gpt_reference.py",
        mode,
        &spec.to_string(),
        case.to_str().expect("a UTF-8 temp path"),
        out.to_str().expect("a UTF-8 temp path"),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(result.status.success(), "gpt_reference.py {mode}:\n{text}");
    eprintln!("gpt_reference.py: {}", text.trim());
    Some(
        Tensor::read_safetensors(&out)
            .expect("the reference's output reads")
            .into_iter()
            .collect(),
    )
}

/// max |got − want| / max(1, max |want|), after checking the shapes; fails above `tol`.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) -> f64 {
    assert_eq!(got.size(), want.size(), "{what}: shape");
    let g = got.to_kind(Kind::Double);
    let w = want.to_kind(Kind::Double);
    let scale = w.abs().max().double_value(&[]).max(1.0);
    let diff = (&g - &w).abs().max().double_value(&[]) / scale;
    assert!(
        diff <= tol,
        "{what}: max |plugin − reference| = {diff:e} (relative to {scale}) > {tol:e}"
    );
    diff
}

/// Random inputs `(B, T, C)` for the given `(B, T)` shapes, named `x.0`, `x.1`, ...
pub fn inputs(shapes: &[(i64, i64)], c: i64, seed: i64) -> Vec<(String, Tensor)> {
    tch::manual_seed(seed);
    shapes
        .iter()
        .enumerate()
        .map(|(i, &(b, t))| {
            (
                format!("x.{i}"),
                Tensor::randn([b, t, c], (Kind::Float, Device::Cpu)),
            )
        })
        .collect()
}

/// The module at `path` run (evaluation mode) on each input, against the reference `mode`
/// with `spec` over the module's own tensors and `extra`; returns the worst relative
/// difference.
pub fn check_module(
    model: &Model,
    path: &str,
    mode: &str,
    spec: &Value,
    shapes: &[(i64, i64)],
    extra: Vec<(String, Tensor)>,
    tol: f64,
) -> Option<f64> {
    let c = match node(model, path).1.get("n_embd") {
        Some(&c) => c as i64,
        None => node(model, "").1["n_embd"] as i64,
    };
    let xs = inputs(shapes, c, 11);
    let prefix = format!("{path}.");
    let mut case: Vec<(String, Tensor)> = state(model)
        .into_iter()
        .filter_map(|(n, t)| n.strip_prefix(&prefix).map(|s| (s.to_owned(), t)))
        .collect();
    case.extend(xs.iter().map(|(n, t)| (n.clone(), t.shallow_clone())));
    case.extend(extra);
    let want = reference(mode, spec, &case)?;
    let module = layer(model.root.as_ref(), path);
    let mut worst = 0.0f64;
    for (name, x) in &xs {
        let got = tch::no_grad(|| module.forward(x, false)).expect("the module runs");
        let y = &want[&format!("y.{}", &name[2..])];
        let d = assert_close(&format!("{path} on {:?}", x.size()), &got, y, tol);
        worst = worst.max(d);
    }
    Some(worst)
}

/// The whole model's logits on random token ids `(b, t)` against the reference `model` mode
/// with `spec` (over all the model's tensors); returns the relative difference.
pub fn check_model(model: &Model, spec: &Value, b: i64, t: i64, tol: f64) -> Option<f64> {
    tch::manual_seed(5);
    let vocab = node(model, "").1["vocab_size"] as i64;
    let ids = Tensor::randint(vocab, [b, t], (Kind::Int64, Device::Cpu));
    let mut case = state(model);
    case.push(("ids".to_owned(), ids.shallow_clone()));
    let want = reference("model", spec, &case)?;
    let got = tch::no_grad(|| model.forward(&ids, false)).expect("the model runs");
    Some(assert_close(
        &format!("logits on {:?}", ids.size()),
        &got,
        &want["logits"],
        tol,
    ))
}

/// The training losses of a run's metrics.
pub fn losses(lines: &[Value]) -> Vec<f64> {
    train_losses(lines)
}

/// Trains `toml` in a fresh `dir`; returns (run.json, metrics lines, stderr).
pub fn run(dir: &TempDir, toml: &TrainerToml, overrides: &[&str]) -> (Value, Vec<Value>, String) {
    toml.write_to(dir);
    let out = train(dir, overrides, &[]);
    out.assert_success();
    let folder = run_dir(dir, &toml.run_name);
    (
        read_json(&folder.join("run.json")),
        read_jsonl(&folder.join("metrics.jsonl")),
        out.stderr,
    )
}

/// The run's last checkpoint rebuilt as `tessera eval` rebuilds it (plugins loaded, surgery
/// replayed, weights loaded): its model.
pub fn rebuilt(dir: &TempDir, run_name: &str) -> Trainer {
    let folder = run_dir(dir, run_name).join("checkpoints");
    let ckpt = tessera::checkpoint::list(&folder)
        .last()
        .cloned()
        .unwrap_or_else(|| panic!("no checkpoint in {}", folder.display()));
    let cfg = tessera::trainer::standalone_config(&ckpt, &[]).expect("the recorded config");
    Trainer::standalone(cfg, Vec::new()).expect("the run rebuilds from its checkpoint")
}

/// A trained run: it completed, every loss is finite, the last below the first, and its
/// perplexity is below a uniform guess over the 64 tokens.
pub fn assert_trains(record: &Value, lines: &[Value]) {
    assert_eq!(record["status"], "completed", "{record:#}");
    let l = losses(lines);
    assert!(!l.is_empty(), "no training losses");
    assert!(l.iter().all(|x| x.is_finite()), "{l:?}");
    assert!(l.last() < l.first(), "the loss did not decrease: {l:?}");
    let p = record["final_perplexity"].as_f64().expect("perplexity");
    assert!(p.is_finite() && p < 64.0, "perplexity {p}");
}
