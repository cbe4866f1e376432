//! The early_stopping plugin through the real binary on Fashion-MNIST (CPU): a run whose
//! accuracy cannot improve (an MLP, without batch statistics, at a learning rate of 1e-30, too
//! small to move a weight) stops at the evaluation where the patience runs out, ends normally
//! (`fit_end`, final checkpoint, run.json status naming the reason), and a bad setting is
//! refused naming the key.
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).

use tessera_tests::*;

/// 20 batches with a learning rate of 1e-30, evaluated every 2 batches, checkpoints on, with
/// early stopping on `monitor` and a patience of `patience`.
fn frozen_run(label: &str, monitor: &str, patience: &str) -> (TempDir, Output) {
    let dir = TempDir::new(label);
    let mut toml = TrainerToml::new(label).algorithm(
        "early_stopping",
        &format!("monitor = \"{monitor}\"\npatience = {patience}"),
    );
    toml.max_duration = "20ba".to_owned();
    toml.model = "name = \"mlp\"\nhidden = [16]".to_owned();
    toml.optimizer = "name = \"sgd\"\nlr = 1e-30".to_owned();
    toml.device = Some("cpu".to_owned());
    toml.write_to(&dir);
    let out = train(
        &dir,
        &[
            "train.eval_interval=2ba",
            "checkpoint.interval=100ba",
            "checkpoint.save=true",
        ],
        &[],
    );
    (dir, out)
}

#[test]
fn a_run_that_cannot_improve_stops_when_the_patience_runs_out() {
    // Evaluations at batches 2, 4, 6: the best is batch 2's; at batch 6, 6 - 2 = 4 > 3.
    let (dir, out) = frozen_run("es-batches", "accuracy", "\"3ba\"");
    out.assert_success();
    let run = run_dir(&dir, "es-batches");
    let record = read_json(&run.join("run.json"));
    assert_eq!(record["batches"], 6, "{record:#}");
    let status = record["status"].as_str().unwrap_or_default();
    assert!(
        status.starts_with("stopped early: early_stopping: accuracy has not improved")
            && status.contains("since batch 2"),
        "{record:#}"
    );
    // Evaluations at 2, 4 and 6 only: the stop came at 6 and fit_end did not evaluate again.
    let evals: Vec<u64> = record["evals"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["batch"].as_u64()).collect())
        .unwrap_or_default();
    assert_eq!(evals, [2, 4, 6], "{record:#}");
    // The run ended as a finished run does: a final checkpoint at the stop.
    let last = run.join("checkpoints").join("ep0-ba6.ckpt");
    assert!(last.is_file(), "no {}:\n{}", last.display(), out.dump());
    assert!(
        out.stderr.contains("stopping after batch 6"),
        "{}",
        out.dump()
    );
}

#[test]
fn integer_patience_counts_epochs() {
    // With patience in epochs, evaluations inside the first epoch never stop the run.
    let (dir, out) = frozen_run("es-epochs", "cross_entropy", "1");
    out.assert_success();
    let record = read_json(&run_dir(&dir, "es-epochs").join("run.json"));
    assert_eq!(record["batches"], 20, "{record:#}");
    assert_eq!(record["status"], "completed", "{record:#}");
}
