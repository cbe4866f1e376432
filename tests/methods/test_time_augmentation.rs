//! The test_time_augmentation plugin: its averages against airbench's own Python on a small
//! fixed net (through the ABI on the test host), and through the real binary on 3 batches of
//! Fashion-MNIST: evaluation only changes (the trained weights are the same at every level),
//! deterministically; `tessera eval` and `tessera predict` apply it too; a text run is refused
//! before training; a run killed and resumed evaluates bit for bit as a straight one; 2 ranks
//! evaluate what one process does.
//!
//! Its kill -9 resume is a row of the method table (tests/methods/table.rs).

use serde_json::Value;
use tessera_plugin_api::tch::{kind::FLOAT_CPU, Kind, Tensor};
use tessera_plugin_api::testing::{settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, keys, Event};
use tessera_tests::dist::{assert_all_succeeded, max_difference, train_ranks};
use tessera_tests::*;
use test_time_augmentation::TestTimeAugmentation;

// ---- against the Python reference ----

struct Net {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
}

impl Net {
    fn forward(&self, x: &Tensor) -> Tensor {
        x.conv2d(&self.w1, Some(&self.b1), [1, 1], [1, 1], [1, 1], 1)
            .relu()
            .flatten(1, -1)
            .linear(&self.w2, None::<Tensor>)
    }
}

fn write_f32(dir: &TempDir, name: &str, t: &Tensor) {
    let t = t.to_kind(Kind::Float).contiguous().view(-1);
    let values: Vec<f32> = Vec::<f32>::try_from(&t).expect("f32 values");
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.join(name), bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
}

fn read_f32(dir: &TempDir, name: &str, shape: &[i64]) -> Tensor {
    let bytes = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Tensor::from_slice(&values).view(shape)
}

/// The plugin's output at `eval_after_forward` for `settings_json`, `forward_eval` running `net`.
fn plugin_output(net: &'static Net, x: &Tensor, settings_json: &str) -> Tensor {
    let mut host = TestHost::new(RandomSource::Seeded(0))
        .with(keys::INPUT, x)
        .with(keys::OUTPUT, &net.forward(x));
    host.eval_model = Some(Box::new(move |t: &Tensor| net.forward(t)));
    let mut m = boxed_method::<TestTimeAugmentation>(&settings(settings_json))
        .unwrap_or_else(|e| panic!("{}", e.message()));
    host.fire(&mut m, Event::EVAL_AFTER_FORWARD).unwrap();
    host.get(keys::OUTPUT).shallow_clone()
}

/// Levels 1 and 2 and the selective mode give airbench's `infer_mirror` and
/// `infer_mirror_translate` (`scripts/tta_reference.py`) on random images through a random
/// conv net: the flip's axis, the reflect padding, the two crops and the weights all match.
#[test]
fn the_averages_match_airbench_in_pytorch() {
    if !python_can_import("torch", "test-time augmentation") {
        return;
    }
    tessera_plugin_api::tch::manual_seed(21);
    let net: &'static Net = Box::leak(Box::new(Net {
        w1: Tensor::randn([2, 2, 3, 3], FLOAT_CPU),
        b1: Tensor::randn([2], FLOAT_CPU),
        w2: Tensor::randn([3, 60], FLOAT_CPU) * 0.3,
    }));
    let x = Tensor::randn([8, 2, 5, 6], FLOAT_CPU);
    let dir = TempDir::new("tta-reference");
    write_f32(&dir, "input.f32", &x);
    write_f32(&dir, "w1.f32", &net.w1);
    write_f32(&dir, "b1.f32", &net.b1);
    write_f32(&dir, "w2.f32", &net.w2);
    // A threshold between the 4th and 5th lowest top probability: half the batch is unsure.
    let top = net.forward(&x).softmax(1, Kind::Float).amax([1], false);
    let sorted = top.sort(0, false).0;
    let confidence = (sorted.double_value(&[3]) + sorted.double_value(&[4])) / 2.0;
    let out = python(&[
        "scripts/tta_reference.py",
        dir.path().to_str().expect("a UTF-8 temp path"),
        &confidence.to_string(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = net.forward(&x);
    for (json, file) in [
        (r#"{"level": 1}"#.to_owned(), "level1.f32"),
        (r#"{"level": 2}"#.to_owned(), "level2.f32"),
        (
            format!(r#"{{"confidence": {confidence}}}"#),
            "selective.f32",
        ),
    ] {
        let want = read_f32(&dir, file, &[8, 3]);
        let got = plugin_output(net, &x, &json);
        let diff = (&got - &want).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{json}: differs from PyTorch by {diff:e}");
        // Each mode changes the logits far beyond that tolerance.
        let moved = (&got - &plain).abs().max().double_value(&[]);
        assert!(moved > 1e-2, "{json}: moved the logits by only {moved:e}");
    }
}

// ---- through the binary ----

fn tta_run(run: &str, level: u64) -> TrainerToml {
    TrainerToml::new(run).algorithm("test_time_augmentation", &format!("level = {level}"))
}

fn last_eval(dir: &TempDir, run: &str) -> Value {
    read_json(&run_dir(dir, run).join("run.json"))["evals"]
        .as_array()
        .and_then(|e| e.last())
        .cloned()
        .unwrap_or_else(|| panic!("{run}: no evaluation in run.json"))
}

fn latest(dir: &TempDir, run: &str) -> std::path::PathBuf {
    run_dir(dir, run).join("checkpoints/latest.ckpt")
}

fn train_toml(dir: &TempDir, toml: &TrainerToml) {
    toml.write_to(dir);
    let out = train(dir, &[], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("loaded plugin test_time_augmentation"),
        "{}",
        out.dump()
    );
}

/// Levels 0, 1 and 2 train the same weights (evaluation only changes) and evaluate them
/// differently; a second level-2 run evaluates exactly as the first.
#[test]
fn levels_change_the_evaluation_only_and_deterministically() {
    let dir = TempDir::new("tta-levels");
    for (run, level) in [("l0", 0), ("l1", 1), ("l2", 2), ("l2-again", 2)] {
        train_toml(&dir, &tta_run(run, level));
    }
    for run in ["l1", "l2", "l2-again"] {
        let (diff, name) = max_difference(&latest(&dir, "l0"), &latest(&dir, run), &["model/"]);
        assert_eq!(
            diff, 0.0,
            "{run}: the trained `{name}` differs from level 0's"
        );
    }
    let (e0, e1, e2) = (
        last_eval(&dir, "l0"),
        last_eval(&dir, "l1"),
        last_eval(&dir, "l2"),
    );
    let ce = |e: &Value| e["cross_entropy"].as_f64().expect("cross_entropy");
    assert_eq!(e0["samples"], 500);
    assert_eq!(e1["samples"], 500);
    assert!(ce(&e0) != ce(&e1) && ce(&e1) != ce(&e2) && ce(&e0) != ce(&e2));
    assert_eq!(last_eval(&dir, "l2-again"), e2);
}

/// `tessera eval` of a level-2 run's checkpoint evaluates as the run did (the recorded config
/// loads the plugin), and `tessera predict`'s probabilities give the same accuracy on the 500
/// images the run record lists as evaluated: both apply the augmentation.
#[test]
fn eval_and_predict_apply_it() {
    let dir = TempDir::new("tta-standalone");
    train_toml(&dir, &tta_run("tta", 2));
    let last = last_eval(&dir, "tta");
    let ckpt = latest(&dir, "tta");
    let ckpt = ckpt.to_str().expect("a UTF-8 path");
    let out = tessera(&["eval", ckpt, "--json"], dir.path(), &[]);
    out.assert_success();
    let result: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{}", out.dump()));
    for key in ["accuracy", "cross_entropy", "samples"] {
        assert_eq!(result[key], last[key], "{key}: {result:#} vs {last:#}");
    }
    let predictions = dir.join("predictions.jsonl");
    let out = tessera(
        &["predict", ckpt, "--to", predictions.to_str().unwrap()],
        dir.path(),
        &[],
    );
    out.assert_success();
    let lines = read_jsonl(&predictions);
    // The run evaluated the fixed subset its record lists (`eval_subset_batches = 1` of 500).
    let record = read_json(&run_dir(&dir, "tta").join("run.json"));
    let subset = record["eval_subset"]["indices"]
        .as_array()
        .expect("the evaluated indices");
    assert_eq!(subset.len(), 500, "{record:#}");
    let hits = subset
        .iter()
        .map(|i| &lines[i.as_u64().expect("an index") as usize])
        .filter(|l| l["predicted"] == l["target"])
        .count();
    assert_eq!(Value::from(hits as f64 / 500.0), last["accuracy"]);
}

#[test]
fn a_language_model_run_is_refused_before_training() {
    let dir = TempDir::new("tta-text");
    TrainerToml::tiny_gpt("text")
        .algorithm("test_time_augmentation", "")
        .write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_failure(&["test_time_augmentation", "image batches", "[1, 32]"]);
    assert!(!out.stderr.contains("epoch 1"), "{}", out.dump());
}

/// 2 ranks of 64 evaluate half of the 10000 test images each, with the augmentation: the totals
/// are one process's (batch 128) up to the rounding that separates their trained weights, and
/// that is far below what the augmentation itself moves.
#[test]
fn two_ranks_evaluate_what_one_process_evaluates() {
    let dir = TempDir::new("tta-dp");
    // Synchronised batch norm: the ranks' running statistics are those of the whole batch.
    let toml = tta_run("unused", 2).render();
    dir.write(
        "trainer.toml",
        &format!("{toml}\n[distributed]\nsync_batchnorm = true\n"),
    );
    // The whole test set: each rank evaluates its own share of it.
    let (all, one_thread) = ("train.eval_subset_batches=0", "train.threads=1");
    let per = "data.batch_size=64";
    assert_all_succeeded(&train_ranks(
        &dir,
        2,
        &["run_name=ranks", per, one_thread, all],
    ));
    let double = "data.batch_size=128";
    train(&dir, &["run_name=one", double, one_thread, all], &[]).assert_success();
    let plain = [
        "run_name=plain",
        double,
        one_thread,
        all,
        "algorithms.0.level=0",
    ];
    train(&dir, &plain, &[]).assert_success();
    let ce = |run: &str| last_eval(&dir, run)["cross_entropy"].as_f64().unwrap();
    let (ranks, one, none) = (ce("ranks"), ce("one"), ce("plain"));
    assert_eq!(last_eval(&dir, "ranks")["samples"], 10000);
    assert_eq!(last_eval(&dir, "one")["samples"], 10000);
    let rounding = (ranks - one).abs();
    let effect = (one - none).abs();
    assert!(
        rounding < 1e-4 * one && effect > 100.0 * rounding,
        "ranks {ranks}, one process {one}, no augmentation {none}"
    );
}
