//! The gyro_dropout plugin through the real binary: the mlp with `dropout = 0.5` on
//! Fashion-MNIST, its two dropouts replaced; the logged schedule; training differs from plain
//! dropout; too short a run for `sigma` is an error naming it; a killed and resumed run (mid
//! selection period) equals the straight run bit for bit.
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use gyro_dropout::{METRIC_ITER_NUM, METRIC_NUM_LAYERS};
use serde_json::Value;
use tessera_tests::*;

fn mlp(label: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"mlp\"\nhidden = [64, 32]\ndropout = 0.5".to_owned();
    toml
}

/// The run's output, and its metrics when it succeeded.
fn run(label: &str, settings: Option<&str>) -> (Vec<Value>, Output) {
    let dir = TempDir::new(label);
    let mut toml = mlp(label);
    if let Some(s) = settings {
        toml = toml.algorithm("gyro_dropout", s);
    }
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    let lines = if out.status.success() {
        read_jsonl(&run_dir(&dir, label).join("metrics.jsonl"))
    } else {
        Vec::new()
    };
    (lines, out)
}

#[test]
fn the_dropouts_are_replaced_and_training_changes() {
    let (plain, out) = run("gyro-plain", None);
    out.assert_success();
    // 3 batches, sigma 2, tau 2: new masks every int(3 / 2) * 2 = 2 forwards.
    let (gyro, out) = run("gyro-run", Some("sigma = 2\ntau = 2"));
    out.assert_success();
    assert_eq!(method_metric(&gyro, METRIC_NUM_LAYERS), [(0, 2.0)]);
    assert_eq!(method_metric(&gyro, METRIC_ITER_NUM), [(0, 2.0)]);
    let (p, g) = (train_losses(&plain), train_losses(&gyro));
    assert_eq!(g.len(), 3);
    assert!(g.iter().all(|v| v.is_finite()), "{g:?}");
    assert_ne!(p, g);
}

#[test]
fn a_run_shorter_than_sigma_is_refused_naming_it() {
    // Composer's defaults (sigma 256) need at least 256 training batches.
    let (_, out) = run("gyro-short", Some(""));
    out.assert_failure(&["gyro_dropout", "3 training batches", "`sigma` = 256"]);
}

#[test]
fn a_model_without_dropout_is_left_alone_with_a_warning() {
    let dir = TempDir::new("gyro-none");
    let toml = TrainerToml::new("gyro-none").algorithm("gyro_dropout", "");
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("the model has no dropout layers"),
        "{}",
        out.dump()
    );
    let lines = read_jsonl(&run_dir(&dir, "gyro-none").join("metrics.jsonl"));
    assert_eq!(method_metric(&lines, METRIC_NUM_LAYERS), [(0, 0.0)]);
}
