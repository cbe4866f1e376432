//! Integration tests of the sam plugin through the real binary: 3 batches of Fashion-MNIST.
//!
//! SAM logs `sam/pass` (the pass index) at every `after_train_batch` and `sam/grad_norm` on the
//! first pass of each SAM step, so `metrics.jsonl` shows how often the train-batch events fired:
//! twice per SAM step, once per plain step.
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).

use std::collections::BTreeMap;

use serde_json::Value;
use tessera_tests::*;

/// Trains `toml` in a fresh folder; returns the lines of its metrics.jsonl.
fn run(label: &str, toml: TrainerToml) -> Vec<Value> {
    let dir = TempDir::new(label);
    let name = toml.run_name.clone();
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let run = run_dir(&dir, &name);
    let record = read_json(&run.join("run.json"));
    assert_eq!(record["batches"], 3, "{record:#}");
    assert!(record["final_accuracy"].is_f64(), "{record:#}");
    read_jsonl(&run.join("metrics.jsonl"))
}

#[test]
fn sam_steps_learn() {
    let toml = sam_toml("learns", "rho = 0.05\ninterval = 1");
    let record = train_batches("sam-learns", toml, 20);
    // Measured: 0.640 after 20 SAM steps; 0.080 with a learning rate of 1e-9 (a step that does
    // nothing).
    assert_learned(&record, 0.4);
}

/// The values of method metric `name`, grouped by the batch they were logged at.
fn by_batch(lines: &[Value], name: &str) -> BTreeMap<u64, Vec<f64>> {
    let mut out: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for l in lines_of_kind(lines, "method") {
        if l["name"] == name {
            let batch = l["batch"].as_u64().expect("batch");
            out.entry(batch)
                .or_default()
                .push(l["value"].as_f64().expect("value"));
        }
    }
    out
}

/// The reported training loss per batch.
fn checked_losses(lines: &[Value]) -> Vec<f64> {
    let losses = tessera_tests::train_losses(lines);
    assert_eq!(losses.len(), 3, "{lines:?}");
    for l in &losses {
        assert!(l.is_finite() && *l > 0.0, "{losses:?}");
    }
    losses
}

fn sam_toml(run_name: &str, settings: &str) -> TrainerToml {
    TrainerToml::new(run_name).algorithm("sam", settings)
}

fn assert_grad_norms(lines: &[Value], batches: &[u64]) {
    let norms = by_batch(lines, "sam/grad_norm");
    assert_eq!(
        norms.keys().copied().collect::<Vec<_>>(),
        batches,
        "{norms:?}"
    );
    for values in norms.values() {
        assert_eq!(values.len(), 1, "{norms:?}");
        assert!(values[0].is_finite() && values[0] > 0.0, "{norms:?}");
    }
}

#[test]
fn every_step_runs_two_passes_with_interval_one() {
    let lines = run(
        "sam_interval1",
        sam_toml("sam1", "rho = 0.05\ninterval = 1\nlog_grad_norm = true"),
    );
    checked_losses(&lines);
    let passes = by_batch(&lines, "sam/pass");
    let expected: BTreeMap<u64, Vec<f64>> = (0..3).map(|b| (b, vec![0.0, 1.0])).collect();
    assert_eq!(passes, expected);
    let count = lines_of_kind(&lines, "method")
        .iter()
        .filter(|l| l["name"] == "sam/pass")
        .count();
    assert_eq!(count, 6, "after_train_batch fires twice per step");
    assert_grad_norms(&lines, &[0, 1, 2]);
}

#[test]
fn only_every_second_step_runs_two_passes_with_interval_two() {
    let lines = run(
        "sam_interval2",
        sam_toml("sam2", "interval = 2\nlog_grad_norm = true"),
    );
    checked_losses(&lines);
    let passes = by_batch(&lines, "sam/pass");
    let expected = BTreeMap::from([(0, vec![0.0]), (1, vec![0.0, 1.0]), (2, vec![0.0])]);
    assert_eq!(passes, expected, "SAM on steps where (step + 1) % 2 == 0");
    assert_grad_norms(&lines, &[1]);
}

#[test]
fn sam_reports_the_first_pass_loss_and_changes_training() {
    let plain = checked_losses(&run("sam_plain", TrainerToml::new("plain")));
    let sam = checked_losses(&run("sam_rho", sam_toml("rho", "rho = 0.5")));
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs();
    // Batch 1's reported loss is the loss at w (the first pass), the same as without SAM.
    assert!(close(sam[0], plain[0]), "sam {sam:?} vs plain {plain:?}");
    // SAM stepped with the gradient at w + e(w): the weights, hence later losses, differ.
    assert!(
        !close(sam[1], plain[1]) || !close(sam[2], plain[2]),
        "sam {sam:?} vs plain {plain:?}"
    );
}

#[test]
fn rho_zero_trains_like_the_base_optimizer() {
    // e(w) = 0: both passes see the same weights, so the optimizer steps with the same gradient.
    let plain = checked_losses(&run("sam_plain0", TrainerToml::new("plain0")));
    let lines = run("sam_rho0", sam_toml("rho0", "rho = 0.0"));
    let sam = checked_losses(&lines);
    for (s, p) in sam.iter().zip(&plain) {
        assert!(
            (s - p).abs() <= 1e-4 * p.abs(),
            "sam {sam:?} vs plain {plain:?}"
        );
    }
    assert_eq!(by_batch(&lines, "sam/pass").len(), 3);
}
