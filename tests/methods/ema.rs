//! Integration tests of the ema plugin through the real binary: 4 batches of Fashion-MNIST on
//! the CPU (deterministic), evaluated after batches 2 and 4.
//!
//! The plugin logs `ema/swapped_in` at `eval_start` (1 when the EMA weights went into the
//! model) and at `eval_end` (0 once the training weights are back), with `ema/updates` and
//! `ema/distance` (L2 distance between EMA and training weights) while swapped in. Each run is
//! compared with the same run without EMA: the training losses must be identical (the swaps
//! never disturb training) while the evaluations differ (they used the EMA weights).
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).

use serde_json::Value;
use tessera_tests::*;

/// A finished run: its run.json and metrics.jsonl lines.
struct Run {
    record: Value,
    lines: Vec<Value>,
}

impl Run {
    /// `(cross_entropy, accuracy)` of every evaluation.
    fn evals(&self) -> Vec<(u64, f64, f64)> {
        self.record["evals"]
            .as_array()
            .expect("evals")
            .iter()
            .map(|e| {
                (
                    e["batch"].as_u64().expect("batch"),
                    e["cross_entropy"].as_f64().expect("cross_entropy"),
                    e["accuracy"].as_f64().expect("accuracy"),
                )
            })
            .collect()
    }

    /// The training loss of every batch.
    fn train_losses(&self) -> Vec<f64> {
        train_losses(&self.lines)
    }

    /// `(batch, value)` of every logged method metric `name`, in order.
    fn metric(&self, name: &str) -> Vec<(u64, f64)> {
        method_metric(&self.lines, name)
    }
}

/// Trains 4 batches on the CPU, evaluating every 2 batches, with `ema_settings` for the ema
/// plugin (no plugin when `None`).
fn run(label: &str, ema_settings: Option<&str>) -> Run {
    let dir = TempDir::new(label);
    let mut toml = TrainerToml::new(label);
    toml.max_duration = "4ba".to_owned();
    toml.device = Some("cpu".to_owned());
    if let Some(settings) = ema_settings {
        toml = toml.algorithm("ema", settings);
    }
    toml.write_to(&dir);
    let out = train(&dir, &["train.eval_interval=2ba"], &[]);
    out.assert_success();
    if ema_settings.is_some() {
        assert!(out.stderr.contains("loaded plugin ema"), "{}", out.dump());
    }
    let run_path = run_dir(&dir, label);
    let record = read_json(&run_path.join("run.json"));
    assert_eq!(record["batches"], 4, "{record:#}");
    let lines = read_jsonl(&run_path.join("metrics.jsonl"));
    let run = Run { record, lines };
    let evals = run.evals();
    assert_eq!(
        evals.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![2, 4],
        "{:#}",
        run.record
    );
    for (_, ce, _) in &evals {
        assert!(ce.is_finite() && *ce > 0.0, "{evals:?}");
    }
    assert_eq!(run.train_losses().len(), 4, "{:?}", run.lines);
    run
}

#[test]
fn evaluation_uses_the_ema_weights_and_training_is_untouched() {
    let plain = run("plain", None);
    let ema = run("ema", Some("half_life = \"2ba\""));

    let p = &ema.record["plugins"][0];
    assert_eq!(p["name"], "ema", "{p:#}");
    assert_eq!(p["settings"]["half_life"], "2ba", "{p:#}");
    assert_eq!(p["sha256"], sha256_hex(&plugin_path("ema")), "{p:#}");

    // The swaps restore the training weights exactly: every training loss is identical.
    assert_eq!(
        ema.train_losses(),
        plain.train_losses(),
        "EMA changed the training itself"
    );
    // Each evaluation ran on the EMA weights: swapped in at eval_start, out at eval_end.
    assert_eq!(
        ema.metric("ema/swapped_in"),
        vec![(2, 1.0), (2, 0.0), (4, 1.0), (4, 0.0)],
        "{:?}",
        ema.lines
    );
    // One update per batch (update_interval defaults to 1ba), starting at the first batch.
    assert_eq!(ema.metric("ema/updates"), vec![(2, 2.0), (4, 4.0)]);
    let distances = ema.metric("ema/distance");
    assert_eq!(distances.len(), 2, "{distances:?}");
    for (_, d) in &distances {
        assert!(d.is_finite() && *d > 0.0, "{distances:?}");
    }
    // ... and so the evaluations differ from the run without EMA.
    for (e, p) in ema.evals().iter().zip(plain.evals()) {
        assert_ne!(
            e.1, p.1,
            "eval at batch {}: same cross-entropy as without EMA",
            e.0
        );
    }
    // The weights the EMA smooths away are the latest ones: with a 2-batch half-life the average
    // lags, so the distance to the training weights is a sizeable fraction of a step, not noise.
    assert!(distances.iter().all(|(_, d)| *d > 1e-4), "{distances:?}");
}

#[test]
fn before_ema_start_evaluation_uses_the_training_weights() {
    let plain = run("plain-late", None);
    // Averaging would start at batch 10; the run stops at 4, so nothing is ever swapped.
    let late = run(
        "ema-late",
        Some("half_life = \"2ba\"\nema_start = \"10ba\""),
    );
    assert_eq!(late.train_losses(), plain.train_losses());
    assert_eq!(
        late.evals(),
        plain.evals(),
        "evaluation changed before ema_start"
    );
    assert_eq!(
        late.metric("ema/swapped_in"),
        vec![(2, 0.0), (2, 0.0), (4, 0.0), (4, 0.0)]
    );
    assert!(late.metric("ema/updates").is_empty());
}

#[test]
fn evaluation_with_the_ema_weights_shows_learning() {
    // The final evaluation runs on the EMA weights (half-life 2 batches).
    let toml = TrainerToml::new("learns").algorithm("ema", "half_life = \"2ba\"");
    let record = train_batches("ema-learns", toml, 20);
    // Measured: 0.688 after 20 batches; 0.088 with a learning rate of 1e-9 (a step that does
    // nothing).
    assert_learned(&record, 0.45);
}
