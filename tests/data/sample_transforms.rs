//! Per-sample transforms from plugins (plugin-api 1.3) through the real binary on Fashion-MNIST:
//! the fixture plugin's transform (invert each training image with probability 1/2, drawn from
//! the sample's random stream) runs on loader threads — also when `data.workers = 0` — gives
//! the same batches for any number of workers, continues exactly after a resume, and a panic
//! inside it stops the run with an error naming the plugin instead of crashing.

use serde_json::Value;
use tessera_tests::*;

const INVERT: &str = "sample_transform = \"invert\"";

/// The training loss of each batch of a finished run.
fn losses(dir: &TempDir, run: &str) -> Vec<f64> {
    let lines = read_jsonl(&run_dir(dir, run).join("metrics.jsonl"));
    lines_of_kind(&lines, "train")
        .iter()
        .map(|l| l["data"]["loss"].as_f64().expect("loss"))
        .collect()
}

/// 6 batches with the fixture plugin (`settings`), `workers` loader threads, checkpoints every
/// 3 batches; returns the output.
fn run(dir: &TempDir, name: &str, settings: &str, workers: u32, extra: &[&str]) -> Output {
    let mut toml = TrainerToml::new(name).algorithm("fake_plugin", settings);
    toml.max_duration = "6ba".to_owned();
    toml.device = Some("cpu".to_owned());
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"3ba\"\n", toml.render()),
    );
    let workers = format!("data.workers={workers}");
    let mut overrides = vec![workers.as_str()];
    overrides.extend_from_slice(extra);
    train(dir, &overrides, &[])
}

#[test]
fn batches_are_the_same_for_any_worker_count_and_differ_without_the_transform() {
    let dir = TempDir::new("sample-workers");
    let out = run(&dir, "w0", INVERT, 0, &[]);
    out.assert_success();
    assert!(
        out.stderr
            .contains("fake_plugin transform(s) every training sample")
            && out.stderr.contains("1 loader thread"),
        "{}",
        out.dump()
    );
    run(&dir, "w1", INVERT, 1, &[]).assert_success();
    run(&dir, "w3", INVERT, 3, &[]).assert_success();
    run(&dir, "plain", "", 0, &[]).assert_success();
    let w0 = losses(&dir, "w0");
    assert_eq!(w0.len(), 6);
    assert_eq!(w0, losses(&dir, "w1"), "1 worker");
    assert_eq!(w0, losses(&dir, "w3"), "3 workers");
    let plain = losses(&dir, "plain");
    assert_ne!(w0, plain, "the transform changed nothing");
    // Inverting about half of the images makes the first batch's loss differ, not the model.
    assert_ne!(w0[0], plain[0]);
}

#[test]
fn a_resumed_run_draws_the_same_transforms() {
    let dir = TempDir::new("sample-resume");
    run(&dir, "straight", INVERT, 2, &[]).assert_success();
    // The same run stopped after 3 batches, then continued from its checkpoint.
    run(&dir, "resumed", INVERT, 2, &["train.max_duration=3ba"]).assert_success();
    let out = run(&dir, "resumed", INVERT, 2, &["checkpoint.autoresume=true"]);
    out.assert_success();
    assert!(out.stderr.contains("ep0-ba3.ckpt"), "{}", out.dump());
    let straight = losses(&dir, "straight");
    let resumed = losses(&dir, "resumed");
    assert_eq!(straight.len(), 6);
    assert_eq!(resumed[resumed.len() - 3..], straight[3..], "batches 4-6");
    let record: Value = read_json(&run_dir(&dir, "resumed").join("run.json"));
    assert_eq!(record["batches"], 6, "{record:#}");
}

#[test]
fn a_panic_inside_a_sample_transform_is_an_error_naming_the_plugin() {
    let dir = TempDir::new("sample-panic");
    let mut toml = TrainerToml::new("panics").algorithm("fake_plugin", INVERT);
    toml.device = Some("cpu".to_owned());
    toml.write_to(&dir);
    let out = train(
        &dir,
        &["data.workers=2"],
        &[("TESSERA_FAKE_PANIC_IN_TRANSFORM", "1")],
    );
    let line = out.assert_failure(&["fake_plugin", "panic", "told to panic"]);
    assert!(line.contains("transform"), "{line}");
}
