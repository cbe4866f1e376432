//! Checkpoints and exact resume, through the `tessera` binary on Fashion-MNIST: a run stopped
//! (by its length, SIGTERM, SIGINT or `kill -9`, even in the middle of a checkpoint write) and
//! resumed produces the same checkpoints, bit for bit, as the uninterrupted run; bad
//! checkpoints are refused or skipped with messages that name them.

use std::path::Path;
use std::time::Duration;

use tessera::checkpoint::{self, Checkpoint};
use tessera_tests::resume::{
    assert_continues, assert_same_checkpoint, ckpt_dir, finish, metrics, names, signal, spawn,
    train_straight, wait_for, with_checkpoints,
};
use tessera_tests::{
    lines_of_kind, read_json, read_jsonl, require_fashion_mnist, run_dir, tool, train, TempDir,
    TrainerToml,
};

/// Methods whose state or randomness matter: EMA (shadow weights, swapped in at checkpoints),
/// selective backprop and CutOut (host RNG), label smoothing, the fake plugin (a counter
/// saved through the ABI).
fn config_a(run: &str) -> TrainerToml {
    let mut t = TrainerToml::new(run)
        .algorithm("ema", "half_life = \"2ba\"")
        .algorithm(
            "selective_backprop",
            "start = 0.0\nend = 1.0\nkeep = 0.5\ninterrupt = 0",
        )
        .algorithm("label_smoothing", "smoothing = 0.1")
        .algorithm("cutout", "num_holes = 1\nlength = 0.25")
        .algorithm("fake_plugin", "");
    t.max_duration = "8ba".into();
    t
}

/// Surgery (BlurPool, replayed before the weights load), SAM's extra pass, AdamW.
fn config_b(run: &str) -> TrainerToml {
    let mut t = TrainerToml::new(run)
        .algorithm("blurpool", "min_channels = 1")
        .algorithm("sam", "rho = 0.05")
        .algorithm("fake_plugin", "");
    t.optimizer = "name = \"adamw\"\nlr = 0.003\nweight_decay = 0.01".into();
    t.max_duration = "8ba".into();
    t
}

#[test]
fn stop_and_resume_equals_straight_run_bit_for_bit() {
    for (label, make) in [("a", config_a as fn(&str) -> TrainerToml), ("b", config_b)] {
        let dir = TempDir::new(&format!("resume-{label}"));
        train_straight(&dir, &with_checkpoints(&make("straight"), ""));
        // 4 batches, then the same run continued to 8 with autoresume.
        dir.write("trainer.toml", &with_checkpoints(&make("resumed"), ""));
        train(&dir, &["train.max_duration=4ba"], &[]).assert_success();
        let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
        out.assert_success();
        assert!(
            out.stderr.contains("resumed from") && out.stderr.contains("ep0-ba4.ckpt"),
            "{}",
            out.dump()
        );
        assert_continues(&dir, "straight", "resumed", 4);
        // The metrics file reads as if the run had never stopped (the 4-batch run's final
        // evaluation, written after its last checkpoint, is gone).
        assert_eq!(
            metrics(&dir, "straight"),
            metrics(&dir, "resumed"),
            "config {label}"
        );
        let record = read_json(&run_dir(&dir, "resumed").join("run.json"));
        assert_eq!(record["status"], "completed");
        assert!(record["resumed_from"]
            .as_str()
            .is_some_and(|p| p.ends_with("ep0-ba4.ckpt")));
        assert_eq!(
            record["evals"],
            read_json(&run_dir(&dir, "straight").join("run.json"))["evals"]
        );
    }
}

#[test]
fn kill_9_mid_training_then_autoresume_reproduces_the_straight_run() {
    let dir = TempDir::new("kill9");
    dir.write("trainer.toml", &with_checkpoints(&config_a("straight"), ""));
    train(&dir, &[], &[]).assert_success();

    dir.write("trainer.toml", &with_checkpoints(&config_a("killed"), ""));
    let child = spawn(&dir, &[("TESSERA_FAKE_SLEEP_MS", "250")]);
    let folder = ckpt_dir(&dir, "killed");
    wait_for("the second checkpoint", Duration::from_secs(120), || {
        folder.join("ep0-ba4.ckpt").exists()
    });
    signal(&child, "-KILL");
    let (status, _) = finish(child);
    assert!(!status.success());
    let before = names(&folder);
    assert!(!before.contains(&"ep0-ba8.ckpt".to_owned()), "{before:?}");

    let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
    out.assert_success();
    let from = before
        .iter()
        .filter_map(|n| checkpoint::parse_file_name(n).map(|(_, b)| b))
        .max()
        .unwrap();
    assert_continues(&dir, "straight", "killed", from);
    assert_eq!(metrics(&dir, "straight"), metrics(&dir, "killed"));
}

#[test]
fn kill_9_while_writing_a_checkpoint_leaves_the_previous_one_usable() {
    let dir = TempDir::new("kill-write");
    dir.write("trainer.toml", &with_checkpoints(&config_a("straight"), ""));
    train(&dir, &[], &[]).assert_success();

    dir.write("trainer.toml", &with_checkpoints(&config_a("torn"), ""));
    // The checkpoint is larger than a pipe holds (64 KiB on Linux unless the writer asks for
    // more, which the trainer does not), so the writer below blocks in the middle of it.
    let size = std::fs::metadata(ckpt_dir(&dir, "straight").join("ep0-ba4.ckpt"))
        .expect("the straight run's ep0-ba4")
        .len();
    assert!(size > 2 * 65536, "ep0-ba4.ckpt has only {size} bytes");
    let child = spawn(&dir, &[]);
    let folder = ckpt_dir(&dir, "torn");
    // The write of ep0-ba4 goes through `.tmp-ep0-ba4.ckpt.<pid>`. A FIFO put there first (the
    // process needs seconds to reach batch 4) holds the write where the test wants it: the
    // writer blocks until the test opens the other end, then again once the pipe is full, in
    // the middle of the checkpoint's bytes; no hook in the trainer is needed.
    std::fs::create_dir_all(&folder).expect("create the checkpoint folder");
    let fifo = folder.join(format!(".tmp-ep0-ba4.ckpt.{}", child.id()));
    tool("mkfifo", &[fifo.to_str().expect("a UTF-8 temp path")]);
    let temporary = || {
        std::fs::read_dir(&folder)
            .map(|d| {
                d.filter_map(Result::ok).any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(".tmp-ep0-ba4.ckpt")
                })
            })
            .unwrap_or(false)
    };
    let (opened, reader) = std::sync::mpsc::channel();
    let reading = fifo.clone();
    std::thread::spawn(move || {
        // Blocks until the trainer opens the temporary file for writing.
        let mut pipe = std::fs::File::open(&reading).expect("open the FIFO");
        let mut first = vec![0u8; 4096];
        let got = std::io::Read::read(&mut pipe, &mut first).expect("read the FIFO");
        let _ = opened.send(got);
        // Keep the read end open, unread: the writer blocks on the full pipe until killed.
        std::thread::sleep(Duration::from_secs(600));
        drop(pipe);
    });
    let got = reader
        .recv_timeout(Duration::from_secs(120))
        .expect("the trainer started writing ep0-ba4");
    assert!(got > 0, "the checkpoint's first bytes came through");
    signal(&child, "-KILL");
    let (status, stderr) = finish(child);
    // Killed in the middle of the write, not stopped by an error of its own.
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status:?}: {stderr}"
    );
    assert_eq!(
        names(&folder),
        ["ep0-ba2.ckpt"],
        "the torn write must not appear"
    );
    Checkpoint::read(&folder.join("ep0-ba2.ckpt")).expect("the previous checkpoint reads");
    assert_eq!(
        std::fs::read_link(folder.join(checkpoint::LATEST)).unwrap(),
        Path::new("ep0-ba2.ckpt")
    );

    let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
    out.assert_success();
    assert!(!temporary(), "the stale temporary file was not cleaned up");
    assert_continues(&dir, "straight", "torn", 2);
}

#[test]
fn sigterm_and_sigint_finish_the_step_write_a_checkpoint_and_exit() {
    for (sig, code, name) in [("-TERM", 143, "SIGTERM"), ("-INT", 130, "SIGINT")] {
        let dir = TempDir::new(&format!("signal{code}"));
        dir.write("trainer.toml", &with_checkpoints(&config_a("straight"), ""));
        train(&dir, &[], &[]).assert_success();

        // Checkpoints only at the end, so the one written is the signal's.
        dir.write(
            "trainer.toml",
            &format!(
                "{}\n[checkpoint]\ninterval = \"100ba\"\n",
                config_a("stopped").render()
            ),
        );
        let child = spawn(&dir, &[("TESSERA_FAKE_SLEEP_MS", "300")]);
        let metrics_file = run_dir(&dir, "stopped").join("metrics.jsonl");
        wait_for("training to start", Duration::from_secs(120), || {
            std::fs::metadata(&metrics_file).is_ok_and(|m| m.len() > 0)
                || std::fs::read_dir(run_dir(&dir, "stopped")).is_ok()
        });
        std::thread::sleep(Duration::from_millis(900));
        signal(&child, sig);
        let (status, stderr) = finish(child);
        assert_eq!(status.code(), Some(code), "{stderr}");
        assert!(
            stderr.contains(&format!("interrupted by {name}")),
            "{stderr}"
        );
        let written = names(&ckpt_dir(&dir, "stopped"));
        assert_eq!(written.len(), 1, "{written:?}\n{stderr}");
        let (_, batch) = checkpoint::parse_file_name(&written[0]).unwrap();
        assert!(batch < 8, "stopped at {batch}");
        let record = read_json(&run_dir(&dir, "stopped").join("run.json"));
        assert_eq!(record["status"], format!("interrupted by {name}"));

        // Continuing gives the straight run's final state.
        let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
        out.assert_success();
        assert_same_checkpoint(
            &ckpt_dir(&dir, "straight").join("ep0-ba8.ckpt"),
            &ckpt_dir(&dir, "stopped").join("ep0-ba8.ckpt"),
        );
        assert_eq!(metrics(&dir, "straight"), metrics(&dir, "stopped"));
    }
}

#[test]
fn corrupt_newest_checkpoint_is_skipped_with_a_warning() {
    let dir = TempDir::new("corrupt");
    dir.write("trainer.toml", &with_checkpoints(&config_a("straight"), ""));
    train(&dir, &[], &[]).assert_success();
    dir.write("trainer.toml", &with_checkpoints(&config_a("c"), ""));
    train(&dir, &["train.max_duration=6ba"], &[]).assert_success();
    // Flip one byte in the middle of the newest checkpoint's data.
    let newest = ckpt_dir(&dir, "c").join("ep0-ba6.ckpt");
    let mut bytes = std::fs::read(&newest).unwrap();
    let i = bytes.len() * 2 / 3;
    bytes[i] ^= 0x01;
    std::fs::write(&newest, &bytes).unwrap();
    let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("skipping checkpoint")
            && out.stderr.contains("ep0-ba6.ckpt")
            && out.stderr.contains("checksum mismatch"),
        "{}",
        out.dump()
    );
    assert!(out.stderr.contains("resumed from"), "{}", out.dump());
    assert_continues(&dir, "straight", "c", 4);
}

#[test]
fn bad_checkpoints_are_refused_with_the_cause() {
    let dir = TempDir::new("refused");
    dir.write("trainer.toml", &with_checkpoints(&config_a("src"), ""));
    train(&dir, &["train.max_duration=2ba"], &[]).assert_success();
    let good = ckpt_dir(&dir, "src").join("ep0-ba2.ckpt");
    let good_arg = format!("checkpoint.load={}", good.display());

    // Another model (wider CNN).
    let mut wide = config_a("wide");
    wide.model = "name = \"cnn\"\nwidth = 16".into();
    dir.write("trainer.toml", &with_checkpoints(&wide, ""));
    train(&dir, &[&good_arg], &[]).assert_failure(&[
        "ep0-ba2.ckpt",
        "does not fit this model",
        "features.0.weight",
        "\"width\":8",
    ]);

    // A method whose state it holds is missing from this run.
    let mut fewer = TrainerToml::new("fewer");
    fewer.max_duration = "8ba".into();
    dir.write("trainer.toml", &with_checkpoints(&fewer, ""));
    train(&dir, &[&good_arg], &[]).assert_failure(&["method `ema`", "does not load"]);

    // Truncated (a partial copy) and missing files.
    let partial = dir.join("partial.ckpt");
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&partial, &bytes[..bytes.len() / 2]).unwrap();
    dir.write("trainer.toml", &with_checkpoints(&config_a("p"), ""));
    train(
        &dir,
        &[&format!("checkpoint.load={}", partial.display())],
        &[],
    )
    .assert_failure(&["partial.ckpt", "corrupt or partial checkpoint"]);
    train(&dir, &["checkpoint.load=nowhere.ckpt"], &[])
        .assert_failure(&["nowhere.ckpt", "No such file"]);
    // Nothing the user had was touched.
    Checkpoint::read(&good).expect("the source checkpoint still reads");
}

#[test]
fn nonfinite_loss_stops_keeping_checkpoints_or_skips_the_step() {
    let dir = TempDir::new("nan");
    dir.write("trainer.toml", &with_checkpoints(&config_a("stop"), ""));
    let out = train(&dir, &[], &[("TESSERA_FAKE_NAN_AT_BATCH", "5")]);
    out.assert_failure(&[
        "the training loss is NaN at batch 5",
        "its update was skipped",
        "ep0-ba4.ckpt",
        "nonfinite_loss",
    ]);
    assert_eq!(
        names(&ckpt_dir(&dir, "stop")),
        ["ep0-ba2.ckpt", "ep0-ba4.ckpt"]
    );
    let last = Checkpoint::read(&ckpt_dir(&dir, "stop").join("ep0-ba4.ckpt")).unwrap();
    for (name, t) in last.with_prefix("model/") {
        if t.is_floating_point() {
            assert!(
                bool::try_from(t.isfinite().all()).unwrap(),
                "{name} is not finite"
            );
        }
    }

    dir.write("trainer.toml", &with_checkpoints(&config_a("skip"), ""));
    let out = train(
        &dir,
        &["train.nonfinite_loss=\"skip\""],
        &[("TESSERA_FAKE_NAN_AT_BATCH", "5")],
    );
    out.assert_success();
    assert!(out.stderr.contains("skipped the update"), "{}", out.dump());
    let record = read_json(&run_dir(&dir, "skip").join("run.json"));
    assert_eq!(record["skipped_steps"], 1);
    assert_eq!(record["batches"], 8);
}

#[test]
fn keep_prunes_old_checkpoints_and_latest_points_at_the_newest() {
    let dir = TempDir::new("keep");
    dir.write(
        "trainer.toml",
        &with_checkpoints(&config_a("k"), "keep = 2\n"),
    );
    train(&dir, &[], &[]).assert_success();
    let folder = ckpt_dir(&dir, "k");
    assert_eq!(names(&folder), ["ep0-ba6.ckpt", "ep0-ba8.ckpt"]);
    assert_eq!(
        std::fs::read_link(folder.join(checkpoint::LATEST)).unwrap(),
        Path::new("ep0-ba8.ckpt")
    );
}

#[test]
fn a_plugin_panic_after_checkpoints_leaves_them_intact() {
    let dir = TempDir::new("panic-keeps");
    dir.write("trainer.toml", &with_checkpoints(&config_a("p"), ""));
    let out = train(&dir, &[], &[("TESSERA_FAKE_PANIC_AT", "fit_end")]);
    out.assert_failure(&["fake_plugin", "fit_end", "panic"]);
    let folder = ckpt_dir(&dir, "p");
    assert_eq!(
        names(&folder),
        [
            "ep0-ba2.ckpt",
            "ep0-ba4.ckpt",
            "ep0-ba6.ckpt",
            "ep0-ba8.ckpt"
        ]
    );
    for name in names(&folder) {
        Checkpoint::read(&folder.join(&name)).unwrap_or_else(|e| panic!("{e}"));
    }
    // And the failed run can be continued (here: it had finished training; fit_end runs
    // again and the final evaluation is written).
    let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
    out.assert_success();
    assert_eq!(
        read_json(&run_dir(&dir, "p").join("run.json"))["status"],
        "completed"
    );
}

#[test]
fn resume_at_epoch_boundaries_with_a_schedule_and_evaluations() {
    // 4 batches per epoch (256 synthetic samples of 64), 3 epochs, a warmup + cosine schedule
    // measured in `dur`, an evaluation and a checkpoint every epoch.
    let config = |run: &str| {
        let mut t = config_a(run);
        t.max_duration = "3ep".into();
        t.render()
            .replacen("dataset = \"fashion-mnist\"", "dataset = \"synthetic\"", 1)
            .replacen(
                "[data.transforms]",
                "[data.synthetic]\nsamples = 256\neval_samples = 64\n\n[data.transforms]",
                1,
            )
            .replacen(
                "[train]",
                "[scheduler]\nname = \"cosine_with_warmup\"\nt_warmup = \"0.25dur\"\n\n[train]",
                1,
            )
            + "\n[checkpoint]\ninterval = \"1ep\"\n"
    };
    let dir = TempDir::new("epochs");
    dir.write("trainer.toml", &config("straight"));
    train(&dir, &[], &[]).assert_success();
    assert_eq!(
        names(&ckpt_dir(&dir, "straight")),
        ["ep1-ba4.ckpt", "ep2-ba8.ckpt", "ep3-ba12.ckpt"]
    );
    // Killed right after the first epoch's checkpoint: keep only that one.
    dir.write("trainer.toml", &config("resumed"));
    let child = spawn(&dir, &[("TESSERA_FAKE_SLEEP_MS", "200")]);
    let folder = ckpt_dir(&dir, "resumed");
    wait_for(
        "the first epoch's checkpoint",
        Duration::from_secs(120),
        || folder.join("ep1-ba4.ckpt").exists(),
    );
    signal(&child, "-KILL");
    finish(child);
    for later in ["ep2-ba8.ckpt", "ep3-ba12.ckpt"] {
        let _ = std::fs::remove_file(folder.join(later));
    }
    let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
    out.assert_success();
    assert!(out.stderr.contains("ep1-ba4.ckpt"), "{}", out.dump());
    assert_continues(&dir, "straight", "resumed", 4);
    assert_eq!(metrics(&dir, "straight"), metrics(&dir, "resumed"));
    let evals = |run: &str| read_json(&run_dir(&dir, run).join("run.json"))["evals"].clone();
    assert_eq!(evals("straight").as_array().map(Vec::len), Some(3));
    assert_eq!(evals("straight"), evals("resumed"));
}

#[test]
fn ema_weights_are_what_a_checkpoint_holds_and_training_weights_come_back() {
    let dir = TempDir::new("ema-ckpt");
    dir.write("trainer.toml", &with_checkpoints(&config_a("e"), ""));
    train(&dir, &["train.max_duration=4ba"], &[]).assert_success();
    let c = Checkpoint::read(&ckpt_dir(&dir, "e").join("ep0-ba4.ckpt")).unwrap();
    let state = |prefix: &str| -> Vec<(String, tch::Tensor)> {
        c.with_prefix(prefix)
            .map(|(n, t)| (n.to_owned(), t.shallow_clone()))
            .collect()
    };
    let (ema, training) = (state("method/ema/ema/"), state("method/ema/training/"));
    assert!(!ema.is_empty());
    assert_eq!(
        ema.len(),
        training.len(),
        "training weights are saved while swapped in"
    );
    let mut differ = 0;
    for (name, e) in &ema {
        let model = c.tensor(&format!("model/{name}")).expect("model tensor");
        assert!(
            model.equal(e),
            "`{name}`: the checkpoint's model must hold the EMA weights"
        );
        let t = &training
            .iter()
            .find(|(n, _)| n == name)
            .expect("training copy")
            .1;
        if !t.equal(e) {
            differ += 1;
        }
    }
    assert!(
        differ > 0,
        "after 4 steps the EMA and training weights differ"
    );
}

#[test]
fn a_fresh_run_never_silently_replaces_an_earlier_runs_checkpoints() {
    let dir = TempDir::new("overwrite");
    dir.write("trainer.toml", &with_checkpoints(&config_a("o"), ""));
    train(&dir, &[], &[]).assert_success();
    let folder = ckpt_dir(&dir, "o");
    let before = names(&folder);
    let metrics_before = std::fs::read(run_dir(&dir, "o").join("metrics.jsonl")).unwrap();
    // Same run again, shorter: refused, nothing touched.
    train(&dir, &["train.max_duration=2ba"], &[]).assert_failure(&[
        "already holds 4 checkpoint(s) of an earlier run",
        "ep0-ba8.ckpt",
        "checkpoint.autoresume = true",
        "checkpoint.overwrite = true",
    ]);
    assert_eq!(names(&folder), before);
    assert_eq!(
        std::fs::read(run_dir(&dir, "o").join("metrics.jsonl")).unwrap(),
        metrics_before
    );
    // With overwrite: the old checkpoints go, the new run's are the only ones.
    train(
        &dir,
        &["train.max_duration=2ba", "checkpoint.overwrite=true"],
        &[],
    )
    .assert_success();
    assert_eq!(names(&folder), ["ep0-ba2.ckpt"]);
    assert_eq!(
        std::fs::read_link(folder.join(checkpoint::LATEST)).unwrap(),
        Path::new("ep0-ba2.ckpt")
    );
}

/// A checkpoint written by an earlier version (format 1, tests/fixtures/checkpoint-format-1:
/// an MLP with AdamW on synthetic data, written at batch 3 of 6) resumes in this one and writes
/// the batch-6 checkpoint that version wrote, bit for bit (within float rounding on a CPU that
/// rounds differently from the one that wrote it). Replace the fixture only with a format change
/// that keeps reading it.
#[test]
fn a_checkpoint_of_an_earlier_version_resumes_exactly() {
    let (fixture, dir, load) =
        tessera_tests::resume::from_fixture("checkpoint-format-1", "ckpt-fixture");
    train(&dir, &["run_name=resumed", &load], &[]).assert_success();
    tessera_tests::resume::assert_same_checkpoint_as_fixture(
        &fixture.join("ep1-ba6.ckpt"),
        &run_dir(&dir, "resumed").join("checkpoints/ep1-ba6.ckpt"),
    );
}

/// `[checkpoint] keep_best = { metric, k }` beside `keep_last`: after a run checkpointed and
/// evaluated at every batch, the folder holds the newest checkpoint (`keep_last = 1`) and the
/// `k` checkpoints with the best evaluation at their batch (larger accuracies, smaller
/// cross-entropies; the newer of equals), and `best.ckpt` points at the best.
#[test]
fn keep_best_keeps_the_best_evaluated_checkpoints_and_links_the_best() {
    let dir = TempDir::new("keep-best");
    for (metric, higher_is_better) in [("accuracy", true), ("cross_entropy", false)] {
        let mut toml = TrainerToml::new(metric);
        toml.max_duration = "8ba".to_owned();
        toml.device = Some("cpu".to_owned());
        toml.train = "eval_interval = \"1ba\"".to_owned();
        let text = format!(
            "{}\n[checkpoint]\ninterval = \"1ba\"\nkeep_last = 1\n\
             keep_best = {{ metric = \"{metric}\", k = 2 }}\n",
            toml.render()
        );
        dir.write("trainer.toml", &text);
        require_fashion_mnist();
        train(&dir, &[], &[]).assert_success();
        let lines = read_jsonl(&run_dir(&dir, metric).join("metrics.jsonl"));
        // Newest first, so that a stable sort puts the newer of equals first.
        let mut evals: Vec<(u64, f64)> = lines_of_kind(&lines, "eval")
            .iter()
            .map(|l| {
                let batch = l["data"]["batch"].as_u64().expect("batch");
                (batch, l["data"][metric].as_f64().expect("the metric"))
            })
            .collect();
        assert_eq!(evals.len(), 8, "{metric}");
        evals.reverse();
        evals.sort_by(|a, b| {
            if higher_is_better {
                b.1.total_cmp(&a.1)
            } else {
                a.1.total_cmp(&b.1)
            }
        });
        let best: Vec<String> = evals[..2]
            .iter()
            .map(|(batch, _)| format!("ep0-ba{batch}.ckpt"))
            .collect();
        let mut want: Vec<String> = best.clone();
        want.push("ep0-ba8.ckpt".to_owned());
        want.sort();
        want.dedup();
        let folder = ckpt_dir(&dir, metric);
        let mut kept: Vec<String> = names(&folder)
            .into_iter()
            .filter(|n| checkpoint::parse_file_name(n).is_some())
            .collect();
        kept.sort();
        assert_eq!(kept, want, "{metric}: evaluations {evals:?}");
        assert_eq!(
            std::fs::read_link(folder.join(checkpoint::BEST)).expect("best.ckpt"),
            Path::new(&best[0]),
            "{metric}"
        );
    }
}

#[test]
fn bad_keep_best_settings_are_refused_naming_the_key() {
    let dir = TempDir::new("keep-best-bad");
    for (settings, words) in [
        ("keep_best = { k = 2 }", &["keep_best", "metric"][..]),
        (
            "keep_best = { metric = \"accuracy\", k = 0 }",
            &["keep_best.k", ">= 1"],
        ),
        (
            "keep_best = { metric = \"perplexity\" }",
            &["keep_best.metric", "perplexity exists only"],
        ),
        (
            "keep_best = { metric = \"acc\" }",
            &["keep_best.metric", "unknown metric"],
        ),
        (
            "keep_best = { metric = \"accuracy\", best = 2 }",
            &["keep_best", "best"],
        ),
        ("keep = 2\nkeep_last = 2", &["keep_last", "not both"]),
    ] {
        let toml = TrainerToml::new("bad");
        let text = format!("{}\n[checkpoint]\n{settings}\n", toml.render());
        dir.write("trainer.toml", &text);
        train(&dir, &[], &[]).assert_failure(words);
    }
}
