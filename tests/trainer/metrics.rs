//! Losses and evaluation metrics (`train.loss`, `train.ignore_index`, `train.metrics`):
//! binary cross-entropy, top-k accuracy and macro-F1 against PyTorch references computed by
//! the test, and through the real binary on synthetic data: top-5 on by default for 100
//! classes, `f1` and `top3` when asked, in the log line, metrics.jsonl and run.json; a target on
//! top-k; the explorer ranking by F1; binary cross-entropy training with label smoothing, MixUp
//! and CutMix; config errors naming the key and line.
//!
//! The PyTorch comparisons need `import torch` (see tests/models/export.rs); run by hand without it
//! they are skipped with a notice, and fail under `TESSERA_REQUIRE_PYTORCH=1` (CI).

use serde_json::Value;
use tessera::model::{Loss, LossKind};
use tessera::trainer::metrics::{class_counts, macro_f1, top_k_correct};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_tests::*;

/// Synthetic 1×8×8 images of `classes` classes: 320 training samples in batches of 32, 200
/// evaluation samples in one batch.
fn synthetic_data(classes: u32) -> String {
    format!(
        r#"dataset = "synthetic"
batch_size = 32
eval_batch_size = 200
workers = 0

[data.synthetic]
samples = 320
eval_samples = 200
channels = 1
height = 8
width = 8
classes = {classes}"#
    )
}

/// A small MLP on [`synthetic_data`] for `batches` batches, `train_lines` added to `[train]`.
fn config(run: &str, classes: u32, batches: u32, train_lines: &str) -> String {
    let toml = TrainerToml {
        model: "name = \"mlp\"\nhidden = [32]".to_owned(),
        optimizer: "name = \"sgd\"\nlr = 0.05\nmomentum = 0.9".to_owned(),
        max_duration: format!("{batches}ba"),
        device: Some("cpu".to_owned()),
        data: synthetic_data(classes),
        ..TrainerToml::new(run)
    };
    with_train_lines(&toml, train_lines)
}

/// `toml` rendered with `lines` at the end of its `[train]` table.
fn with_train_lines(toml: &TrainerToml, lines: &str) -> String {
    let text = toml.render();
    let at = "progress = false\n";
    assert!(text.contains(at), "TrainerToml renders `{at}`");
    text.replacen(at, &format!("{at}{lines}\n"), 1)
}

/// A finished run: its metrics lines, run.json and stderr.
struct Run {
    lines: Vec<Value>,
    record: Value,
    stderr: String,
}

fn run(label: &str, text: &str) -> Run {
    run_in(&TempDir::new(label), label, text)
}

/// [`run`] with the trainer.toml in `dir`.
fn run_in(dir: &TempDir, label: &str, text: &str) -> Run {
    dir.write("trainer.toml", text);
    let out = train(dir, &[], &[]);
    out.assert_success();
    let path = run_dir(dir, label);
    Run {
        lines: read_jsonl(&path.join("metrics.jsonl")),
        record: read_json(&path.join("run.json")),
        stderr: out.stderr.clone(),
    }
}

fn number(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number `{key}` in {v}"))
}

#[test]
fn top5_is_on_by_default_for_a_hundred_classes_and_reaches_every_record() {
    let r = run("top5-default", &config("top5-default", 100, 4, ""));
    let evals = r.record["evals"].as_array().expect("run.json evals");
    assert!(!evals.is_empty());
    let eval_lines = lines_of_kind(&r.lines, "eval");
    assert_eq!(eval_lines.len(), evals.len());
    for (line, eval) in eval_lines.iter().zip(evals) {
        // The same record in metrics.jsonl and run.json, top5 among its fields, no f1.
        assert_eq!(&line["data"], eval);
        let (top1, top5) = (number(eval, "accuracy"), number(eval, "top5"));
        assert!((0.0..=1.0).contains(&top5), "{eval}");
        // Every target in the top 1 is in the top 5; 200 samples give multiples of 1/200.
        assert!(top5 >= top1, "{eval}");
        assert!(
            ((top5 * 200.0) - (top5 * 200.0).round()).abs() < 1e-9,
            "{eval}"
        );
        assert!(eval.get("f1").is_none(), "{eval}");
    }
    assert!(
        r.stderr.contains(", top5 "),
        "the evaluation log line shows top5:\n{}",
        r.stderr
    );
    // 10 classes: no top-5 unless asked.
    let r = run("top5-ten", &config("top5-ten", 10, 2, ""));
    let last = r.record["evals"].as_array().and_then(|e| e.last()).cloned();
    assert!(
        last.as_ref().is_some_and(|e| e.get("top5").is_none()),
        "{last:?}"
    );
}

#[test]
fn asked_metrics_and_a_top_k_target_are_computed_and_recorded() {
    let text = config(
        "asked",
        10,
        4,
        "metrics = [\"top3\", \"f1\"]\ntarget = \"top2 >= 0.0\"\nstop_at_target = false",
    );
    let dir = TempDir::new("asked");
    let r = run_in(&dir, "asked", &text);
    let last = r.record["evals"]
        .as_array()
        .and_then(|e| e.last())
        .cloned()
        .expect("an evaluation");
    let (top1, top2, top3, f1) = (
        number(&last, "accuracy"),
        number(&last, "top2"),
        number(&last, "top3"),
        number(&last, "f1"),
    );
    assert!(top1 <= top2 && top2 <= top3 && top3 <= 1.0, "{last}");
    assert!((0.0..=1.0).contains(&f1), "{last}");
    assert!(last.get("top5").is_none(), "{last}");
    // The target's metric was computed (not listed in metrics) and met at the first evaluation.
    let reached = &r.record["target_reached"];
    assert_eq!(reached["metric"], "top2", "{reached}");
    let first = &r.record["evals"][0];
    assert_eq!(reached["reached_value"], first["top2"], "{reached}");
    // metrics.jsonl carries the same values.
    let eval_line = lines_of_kind(&r.lines, "eval");
    let data = &eval_line.last().expect("an eval line")["data"];
    assert_eq!(data["f1"], last["f1"]);
    // The explorer compares by a computed metric when asked, and skips runs without it.
    let explore = |metric: &str| {
        tessera(
            &["explore", "runs", "--metric", metric, "--usd-per-hour", "1"],
            dir.path(),
            &[],
        )
    };
    let out = explore("f1");
    out.assert_success();
    let header = out.stdout.lines().find(|l| l.starts_with("recipe"));
    assert!(header.is_some_and(|h| h.contains(" f1 ")), "{}", out.dump());
    assert!(out.stdout.contains(&format!("{f1:.4}")), "{}", out.dump());
    let out = explore("top5");
    out.assert_failure(&["none of the 1 run records found could be used"]);
    assert!(
        out.stderr
            .contains("run.json: its last evaluation has no finite top5"),
        "{}",
        out.dump()
    );
}

#[test]
fn methods_see_the_extra_metrics_in_the_evaluation_results() {
    // early_stopping watches f1 (higher is better by its name) with a patience it cannot run
    // out of: its best is the running maximum of the evaluations' f1.
    let toml = TrainerToml {
        model: "name = \"mlp\"\nhidden = [32]".to_owned(),
        max_duration: "30ba".to_owned(),
        device: Some("cpu".to_owned()),
        data: synthetic_data(10),
        ..TrainerToml::new("watch-f1")
    }
    .algorithm("early_stopping", "monitor = \"f1\"\npatience = 100");
    let r = run("watch-f1", &with_train_lines(&toml, "metrics = [\"f1\"]"));
    let f1: Vec<f64> = r.record["evals"]
        .as_array()
        .expect("evals")
        .iter()
        .map(|e| number(e, "f1"))
        .collect();
    assert_eq!(f1.len(), 3, "{f1:?}");
    let best: Vec<f64> = method_metric(&r.lines, "early_stopping/best")
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    let running_max: Vec<f64> = f1
        .iter()
        .scan(f64::NEG_INFINITY, |m, v| {
            *m = m.max(*v);
            Some(*m)
        })
        .collect();
    assert_eq!(best, running_max);
}

/// Mean of the first and of the last `n` values.
fn ends(values: &[f64], n: usize) -> (f64, f64) {
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    (mean(&values[..n]), mean(&values[values.len() - n..]))
}

#[test]
fn binary_cross_entropy_trains_with_label_smoothing_mixup_and_cutmix() {
    let bce = "loss = \"binary_cross_entropy\"";
    for (label, plugin, settings) in [
        ("bce-smoothing", "label_smoothing", "smoothing = 0.1"),
        ("bce-mixup", "mixup", "alpha = 0.2"),
        ("bce-cutmix", "cutmix", "alpha = 1.0"),
    ] {
        let toml = TrainerToml {
            model: "name = \"mlp\"\nhidden = [32]".to_owned(),
            optimizer: "name = \"sgd\"\nlr = 0.05\nmomentum = 0.9".to_owned(),
            max_duration: "30ba".to_owned(),
            device: Some("cpu".to_owned()),
            data: synthetic_data(10),
            ..TrainerToml::new(label)
        }
        .algorithm(plugin, settings);
        let r = run(label, &with_train_lines(&toml, bce));
        assert!(
            r.stderr.contains(&format!("loaded plugin {plugin}")),
            "{}",
            r.stderr
        );
        assert_eq!(r.record["config"]["train"]["loss"], "binary_cross_entropy");
        let losses = train_losses(&r.lines);
        assert_eq!(losses.len(), 30, "{losses:?}");
        // Composer's BCE sums over the 10 classes: at the start, with logits near 0, about
        // 10·ln 2 per sample — far above the softmax cross-entropy's ln 10.
        assert!(
            losses[0] > 2.0 * 10f64.ln(),
            "{label}: first loss {}",
            losses[0]
        );
        let (first, last) = ends(&losses, 5);
        assert!(last < first, "{label}: the loss did not fall: {losses:?}");
    }
}

#[test]
fn bad_loss_and_metric_settings_name_the_key_and_line() {
    let dir = TempDir::new("metrics-errors");
    let gpt = TrainerToml::tiny_gpt("gpt");
    let cases = [
        (
            with_train_lines(&gpt, "loss = \"binary_cross_entropy\""),
            "loss = ",
            "train.loss: binary_cross_entropy is for image classifiers",
        ),
        (
            with_train_lines(&gpt, "metrics = [\"f1\"]"),
            "metrics = ",
            "train.metrics: f1 is for classification",
        ),
        (
            config("bad", 10, 2, "metrics = [\"top5\", \"recall\"]"),
            "metrics = ",
            "train.metrics: unknown metric \"recall\"",
        ),
        (
            config("bad", 10, 2, "target = \"precision >= 0.5\""),
            "target = ",
            "train.target: unknown metric \"precision\"",
        ),
        (
            config(
                "bad",
                10,
                2,
                "loss = \"binary_cross_entropy\"\nignore_index = 0",
            ),
            "ignore_index = ",
            "train.ignore_index: applies to loss = \"cross_entropy\" only",
        ),
    ];
    for (text, key_line, message) in cases {
        dir.write("trainer.toml", &text);
        let line = line_of(&text, key_line);
        let out = train(&dir, &[], &[]);
        out.assert_failure(&[&format!("trainer.toml:{line}:"), message]);
    }
    // A k above the class count is known once the model's outputs are: the first evaluation
    // stops the run, naming the key.
    dir.write("trainer.toml", &config("k", 10, 1, "metrics = [\"top20\"]"));
    let out = train(&dir, &[], &[]);
    out.assert_failure(&["train.metrics: top20 needs at least 20 classes, but the model has 10"]);
}

/// `values` as a Python list literal.
fn py_list(values: &[f64]) -> String {
    let items: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    format!("[{}]", items.join(", "))
}

fn floats(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).reshape([-1])).expect("floats")
}

/// Runs `script` (which prints one JSON value) with torch.
fn torch_json(script: &str) -> Value {
    let out = python(&["-c", script]).expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script prints JSON")
}

#[test]
fn binary_cross_entropy_matches_torch_for_index_smoothed_and_mixed_targets() {
    if !python_can_import("torch", "binary cross-entropy") {
        return;
    }
    tch::manual_seed(11);
    let (n, c) = (6i64, 7i64);
    let logits = Tensor::randn([n, c], (Kind::Float, Device::Cpu)) * 3.0;
    let index = Tensor::randint(c, [n], (Kind::Int64, Device::Cpu));
    let one_hot = index.one_hot(c).to_kind(Kind::Float);
    // Label smoothing 0.1 (Composer's form) and a MixUp of the rows with a permutation.
    let smoothed = &one_hot * 0.9 + 0.1 / c as f64;
    let perm = Tensor::from_slice(&[3i64, 0, 5, 1, 2, 4]);
    let mixed = &one_hot * 0.7 + one_hot.index_select(0, &perm) * 0.3;
    let loss = Loss {
        kind: LossKind::BinaryCrossEntropy,
        ignore_index: -100,
    };
    let cases: [(&str, &Tensor, Tensor); 3] = [
        ("index", &index, one_hot.shallow_clone()),
        ("smoothed", &smoothed, smoothed.shallow_clone()),
        ("mixed", &mixed, mixed.shallow_clone()),
    ];
    for (name, target, dense) in cases {
        let ours = loss.compute(&logits, target, false).expect("the loss");
        let each = loss.compute(&logits, target, true).expect("per sample");
        // Composer: binary_cross_entropy_with_logits(reduction="sum") / batch size; per sample
        // the sum over classes.
        let script = format!(
            "import json, torch\n\
             import torch.nn.functional as F\n\
             x = torch.tensor({x}, dtype=torch.float64).view({n}, {c})\n\
             t = torch.tensor({t}, dtype=torch.float64).view({n}, {c})\n\
             e = F.binary_cross_entropy_with_logits(x, t, reduction='none')\n\
             print(json.dumps({{'mean': (e.sum() / {n}).item(), 'each': e.sum(1).tolist()}}))",
            x = py_list(&floats(&logits)),
            t = py_list(&floats(&dense)),
        );
        let reference = torch_json(&script);
        let want = reference["mean"].as_f64().expect("mean");
        let got = ours.double_value(&[]);
        assert!(
            (got - want).abs() <= 1e-5 * want.abs(),
            "{name}: {got} vs torch {want}"
        );
        let want_each: Vec<f64> = serde_json::from_value(reference["each"].clone()).expect("each");
        for (i, (g, w)) in floats(&each).iter().zip(&want_each).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs(),
                "{name} sample {i}: {g} vs torch {w}"
            );
        }
    }
}

#[test]
fn top_k_and_macro_f1_match_torch_references() {
    if !python_can_import("torch", "top-k accuracy and macro-F1") {
        return;
    }
    tch::manual_seed(23);
    let (n, c) = (64i64, 12i64);
    // Skewed predictions (a few classes predicted often, some never) and targets that miss
    // a class, so that the classes absent from both matter.
    let logits = Tensor::randn([n, c], (Kind::Float, Device::Cpu))
        + Tensor::linspace(0.0, 2.0, c, (Kind::Float, Device::Cpu));
    let target = Tensor::randint(c - 1, [n], (Kind::Int64, Device::Cpu));
    let valid = Tensor::ones([n], (Kind::Bool, Device::Cpu));
    let ks = [1u32, 2, 5, 12];
    let hits: Vec<i64> =
        Vec::try_from(top_k_correct(&logits, &target, &ks, &valid).expect("top-k")).expect("ints");
    let counts = class_counts(&logits, &target, c, &valid).expect("counts");
    let f1 = macro_f1(&floats(&counts));
    // torch.topk for the hits; macro-F1 from per-class precision and recall over the labels
    // present in targets or predictions (scikit-learn's definition, zero_division=0).
    let script = format!(
        "import json, torch\n\
         x = torch.tensor({x}).view({n}, {c})\n\
         y = torch.tensor({y}, dtype=torch.int64)\n\
         hits = [int((x.topk(k, 1).indices == y[:, None]).any(1).sum()) for k in {ks:?}]\n\
         p = x.argmax(1)\n\
         scores = []\n\
         for k in sorted(set(y.tolist()) | set(p.tolist())):\n\
         \x20   tp = int(((p == k) & (y == k)).sum())\n\
         \x20   npred, ntrue = int((p == k).sum()), int((y == k).sum())\n\
         \x20   prec = tp / npred if npred else 0.0\n\
         \x20   rec = tp / ntrue if ntrue else 0.0\n\
         \x20   scores.append(2 * prec * rec / (prec + rec) if prec + rec else 0.0)\n\
         print(json.dumps({{'hits': hits, 'f1': sum(scores) / len(scores)}}))",
        x = py_list(&floats(&logits)),
        y = py_list(&floats(&target)),
    );
    let reference = torch_json(&script);
    let want_hits: Vec<i64> = serde_json::from_value(reference["hits"].clone()).expect("hits");
    assert_eq!(hits, want_hits);
    assert_eq!(
        *hits.last().expect("k = C"),
        n,
        "every target is in the top C"
    );
    let want_f1 = reference["f1"].as_f64().expect("f1");
    assert!((f1 - want_f1).abs() < 1e-12, "{f1} vs {want_f1}");
}
