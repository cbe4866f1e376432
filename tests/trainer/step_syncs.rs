//! The training step without host reads, and `train.microbatch_size = "auto"`, through the real
//! binary on the CPU.
//!
//! - A default run makes no device→host read inside its steps: the loss and the non-finite guard
//!   stay on the device and are read at log lines and checkpoints (run.json's `host_reads`,
//!   counted by the observer of libtorch's calls, see host/src/sync.rs; tests/methods/host_reads.rs runs
//!   every model and plugin). Logging every batch reads once per batch,
//!   outside the steps.
//! - `microbatch_size = "auto"` halves the microbatch when a pass runs out of memory: the fixture
//!   plugin makes every forward pass over more than N samples ask libtorch's allocator for 2^50
//!   bytes (a real out-of-memory error, recognised by the allocator's report), and the run
//!   trains on with the largest power-of-two fraction of the batch that fits, logs it, keeps it
//!   in checkpoints and run.json; the same error without "auto" stops the run.

use tessera::checkpoint::{self, Checkpoint};
use tessera_tests::*;

fn logged_every(toml: &TrainerToml, interval: &str) -> String {
    toml.render().replace(
        "log_interval = \"1ba\"",
        &format!("log_interval = \"{interval}\""),
    )
}

#[test]
fn default_steps_read_nothing_on_the_host() {
    let dir = TempDir::new("syncs");
    let mut toml = TrainerToml::new("quiet");
    toml.max_duration = "6ba".to_owned();
    let text = logged_every(&toml, "50ba");
    assert!(text.contains("log_interval = \"50ba\""), "{text}");
    dir.write("trainer.toml", &text);
    train(&dir, &[], &[]).assert_success();
    let record = read_json(&run_dir(&dir, "quiet").join("run.json"));
    let reads = &record["host_reads"];
    assert_eq!(reads["steps"], 6, "{record}");
    assert_eq!(reads["in_steps"], 0, "{record}");
    // The end of the run reads the six losses once (and the evaluation its totals).
    assert!(reads["total"].as_u64().unwrap() >= 1, "{record}");
    let lines = read_jsonl(&run_dir(&dir, "quiet").join("metrics.jsonl"));
    let losses = train_losses(&lines);
    assert_eq!(losses.len(), 1, "one line, at the end: {losses:?}");
    assert!(losses[0].is_finite() && losses[0] > 0.0, "{losses:?}");

    // Logging every batch: still nothing inside the steps, and the same losses as a run whose
    // loss is read at every line.
    let mut every = TrainerToml::new("every");
    every.max_duration = "6ba".to_owned();
    every.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let record = read_json(&run_dir(&dir, "every").join("run.json"));
    assert_eq!(record["host_reads"]["in_steps"], 0, "{record}");
    let every_losses = train_losses(&read_jsonl(&run_dir(&dir, "every").join("metrics.jsonl")));
    assert_eq!(every_losses.len(), 6);
    let mean = every_losses.iter().sum::<f64>() / 6.0;
    assert!(
        (mean - losses[0]).abs() <= 1e-9 * mean.abs().max(1.0),
        "the 6-batch line is the mean of the batch losses: {mean} vs {}",
        losses[0]
    );
}

#[test]
fn amp_fp16_steps_read_nothing_on_the_host() {
    let dir = TempDir::new("syncs-fp16");
    let mut toml = TrainerToml::new("fp16");
    toml.max_duration = "5ba".to_owned();
    toml.precision = Some("amp_fp16".to_owned());
    toml.device = Some("cpu".to_owned());
    dir.write("trainer.toml", &logged_every(&toml, "50ba"));
    train(&dir, &[], &[]).assert_success();
    let record = read_json(&run_dir(&dir, "fp16").join("run.json"));
    assert_eq!(record["host_reads"]["in_steps"], 0, "{record}");
    assert_eq!(record["host_reads"]["steps"], 5, "{record}");
}

fn auto(run: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(run).algorithm("fake_plugin", "");
    toml.max_duration = "4ba".to_owned();
    toml
}

#[test]
fn auto_microbatch_halves_on_out_of_memory_and_keeps_the_size() {
    let dir = TempDir::new("auto-mb");
    let text = auto("auto")
        .render()
        .replace("[train]\n", "[train]\nmicrobatch_size = \"auto\"\n");
    assert!(text.contains("microbatch_size = \"auto\""), "{text}");
    dir.write("trainer.toml", &text);
    // Batches of 64; passes over more than 20 samples run out of memory: 64 → 32 → 16.
    let out = train(
        &dir,
        &["checkpoint.save=true", "checkpoint.interval=2ba"],
        &[("TESSERA_FAKE_OOM_ABOVE", "20")],
    );
    out.assert_success();
    assert!(
        out.stderr
            .contains("with a microbatch of 64 samples; training the batch again with 32")
            && out
                .stderr
                .contains("with a microbatch of 32 samples; training the batch again with 16"),
        "{}",
        out.dump()
    );
    let run = run_dir(&dir, "auto");
    let record = read_json(&run.join("run.json"));
    assert_eq!(record["microbatch_size"], 16, "{record}");
    assert_eq!(record["config"]["train"]["microbatch_size"], "auto");
    assert_eq!(record["batches"], 4);
    let sizes = method_metric(
        &read_jsonl(&run.join("metrics.jsonl")),
        "train/microbatch_size",
    );
    assert_eq!(
        sizes.iter().map(|(_, s)| *s).collect::<Vec<_>>(),
        [32.0, 16.0],
        "{sizes:?}"
    );
    let folder = run.join("checkpoints");
    let last = checkpoint::list(&folder);
    let ckpt = Checkpoint::read(last.first().expect("a checkpoint")).expect("it reads");
    assert_eq!(ckpt.meta.trainer.microbatch_size, Some(16));

    // The same batches with a fixed microbatch of 16 train the same model: the gradient of a
    // batch does not depend on how it was split (within float rounding of the sums).
    let fixed = auto("fixed")
        .render()
        .replace("[train]\n", "[train]\nmicrobatch_size = 16\n");
    dir.write("trainer.toml", &fixed);
    train(&dir, &[], &[("TESSERA_FAKE_OOM_ABOVE", "20")]).assert_success();
    let a = train_losses(&read_jsonl(&run.join("metrics.jsonl")));
    let b = train_losses(&read_jsonl(&run_dir(&dir, "fixed").join("metrics.jsonl")));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{a:?} vs {b:?}");
    }

    // Without "auto" the out-of-memory error stops the run.
    dir.write("trainer.toml", &auto("plain").render());
    train(&dir, &[], &[("TESSERA_FAKE_OOM_ABOVE", "20")]).assert_failure(&["fake_plugin"]);
}

#[test]
fn auto_microbatch_gives_up_at_one_sample() {
    let dir = TempDir::new("auto-mb-one");
    let text = auto("tiny")
        .render()
        .replace("[train]\n", "[train]\nmicrobatch_size = \"auto\"\n");
    dir.write("trainer.toml", &text);
    train(&dir, &[], &[("TESSERA_FAKE_OOM_ABOVE", "0")]).assert_failure(&[
        "out of memory at batch 1 with a microbatch of 1 sample",
        "microbatch_size = \"auto\"",
    ]);
}
