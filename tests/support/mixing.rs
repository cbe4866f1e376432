//! Runs of a method that mixes samples (cutmix, mixup) on the small CNN on the CPU: the set-up
//! that tests/methods/cutmix.rs and tests/methods/mixup.rs share (`#[path]` module).

use serde_json::Value;
use tessera_tests::resume::{assert_continues, metrics, with_checkpoints};
use tessera_tests::*;

/// A finished run's metrics lines and run.json.
pub struct Run {
    pub lines: Vec<Value>,
    pub record: Value,
}

impl Run {
    /// The training loss of every batch.
    pub fn train_losses(&self) -> Vec<f64> {
        train_losses(&self.lines)
    }

    /// `(batch, value)` of every logged method metric `name`.
    pub fn metric(&self, name: &str) -> Vec<(u64, f64)> {
        method_metric(&self.lines, name)
    }
}

/// 3 batches of the small CNN on the CPU, with `plugin` and `settings` (none: no plugin).
pub fn config(plugin: &str, run: &str, settings: Option<&str>) -> TrainerToml {
    let mut toml = TrainerToml::new(run);
    toml.device = Some("cpu".to_owned());
    if let Some(s) = settings {
        toml = toml.algorithm(plugin, s);
    }
    toml
}

/// Trains [`config`] through the binary; checks that the plugin was loaded when given.
pub fn run(plugin: &str, label: &str, settings: Option<&str>) -> Run {
    let dir = TempDir::new(label);
    config(plugin, label, settings).write_to(&dir);
    crate::losses::train_checked(&dir, plugin, settings.is_some());
    let path = run_dir(&dir, label);
    Run {
        lines: read_jsonl(&path.join("metrics.jsonl")),
        record: read_json(&path.join("run.json")),
    }
}

/// A 6-batch run with `plugin` and `settings`, checkpointed every 2 batches, and the same run
/// stopped after 4 batches and resumed: the same metrics (draws, losses, evaluation), and the
/// same batch-6 checkpoint ([`assert_continues`]: weights and optimizer state bit for bit, the
/// same RNG state and clock).
pub fn assert_stopped_and_resumed_ends_as_the_straight_run(plugin: &str, settings: &str) {
    let dir = TempDir::new(&format!("{plugin}-resume"));
    let write = |run: &str| {
        let mut toml = config(plugin, run, Some(settings));
        toml.max_duration = "6ba".into();
        dir.write("trainer.toml", &with_checkpoints(&toml, ""));
    };
    write("straight");
    train(&dir, &[], &[]).assert_success();
    write("resumed");
    train(&dir, &["train.max_duration=4ba"], &[]).assert_success();
    let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("resumed from") && out.stderr.contains("ep0-ba4.ckpt"),
        "{}",
        out.dump()
    );
    assert_eq!(metrics(&dir, "straight"), metrics(&dir, "resumed"));
    let evals = |run: &str| read_json(&run_dir(&dir, run).join("run.json"))["evals"].clone();
    assert_eq!(evals("straight"), evals("resumed"));
    // The batch-6 checkpoints: every tensor bit for bit, the RNG, clock, optimizer position and
    // counters equal.
    assert_continues(&dir, "straight", "resumed", 4);
}
