//! `tessera sweep`: every combination of the axes runs in its own folder from one command; a
//! sweep run again skips what is done; a killed sweep continues where it stopped (the
//! half-finished run from its checkpoint, bit for bit); a failing run does not stop the others.
//!
//! The runs that a test stops mid-way are held by the fake plugin (`TESSERA_FAKE_HOLD_DIR`) at
//! a batch end until the test lets them go, and the signals reach them while they are stopped
//! (SIGSTOP), seen pending in `/proc`: which run is where when the signal lands never depends
//! on how fast the machine is.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::Value;
use tessera_tests::resume::{assert_same_checkpoint, finish, names, signal, wait_for};
use tessera_tests::*;

/// A sweep over recipes (`plain`: the fake plugin; `smooth`: it and label smoothing) and two
/// seeds, 6 batches each with a checkpoint every 2, over a small CNN on Fashion-MNIST.
fn sweep_dir(label: &str, extra: &str) -> TempDir {
    let dir = TempDir::new(label);
    let mut base = TrainerToml::new("base").with_both_plugins();
    base.max_duration = "6ba".into();
    base.write_to(&dir);
    dir.write(
        "sweep.toml",
        &format!(
            r#"base = "trainer.toml"
set = ["checkpoint.interval=2ba"]
{extra}
[axes]
recipe = ["plain", "smooth"]
seed = [1, 2]

[recipes.plain]
algorithms = [{{ plugin = "fake_plugin" }}]

[[recipes.smooth.algorithms]]
plugin = "fake_plugin"

[[recipes.smooth.algorithms]]
plugin = "label_smoothing"
smoothing = 0.1
"#
        ),
    );
    dir
}

const RUNS: [&str; 4] = ["plain-seed1", "plain-seed2", "smooth-seed1", "smooth-seed2"];

fn sweep_folder(dir: &TempDir) -> PathBuf {
    dir.join("runs").join("sweep")
}

fn record(dir: &TempDir, run: &str) -> Value {
    read_json(&sweep_folder(dir).join(run).join("run.json"))
}

fn sweep(dir: &TempDir, args: &[&str], env: &[(&str, &str)]) -> Output {
    require_fashion_mnist();
    let mut all = vec!["sweep", "sweep.toml"];
    all.extend_from_slice(args);
    tessera(&all, dir.path(), env)
}

/// The processes held by the fake plugin in `hold` (`held-<pid>` files), in no order.
fn held(hold: &TempDir) -> Vec<u32> {
    std::fs::read_dir(hold.path())
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("held-")?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `n` processes are held in `hold`; returns them.
fn wait_until_held(hold: &TempDir, n: usize, what: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    wait_for(what, COMMAND_TIMEOUT, || {
        pids = held(hold);
        pids.len() >= n
    });
    pids
}

/// Whether process `pid` has a SIGTERM pending (it is stopped, so it cannot handle it yet).
fn sigterm_pending(pid: u32) -> bool {
    const SIGTERM_BIT: u64 = 1 << (15 - 1);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().any(|line| {
        ["SigPnd:", "ShdPnd:"].iter().any(|key| {
            line.strip_prefix(key)
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & SIGTERM_BIT != 0)
        })
    })
}

/// Whether process `pid` still runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        !s.lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
    })
}

/// With `pids` held and stopped (SIGSTOP), and `send` making the sweep pass a SIGTERM on to
/// each: waits until every one has it pending, lets them go on from where they are held, and
/// continues them. Each handles the signal as it continues, and stops after its step.
fn release_with_sigterm(hold: &TempDir, pids: &[u32], send: impl FnOnce()) {
    send();
    wait_for("SIGTERM to reach the held runs", COMMAND_TIMEOUT, || {
        pids.iter().all(|pid| sigterm_pending(*pid))
    });
    std::fs::write(hold.join("release"), "").expect("write the release file");
    for pid in pids {
        kill("-CONT", *pid);
    }
}

/// Checks that `run` of the sweep in `dir` stopped on SIGTERM after a batch before its last,
/// with that batch's checkpoint.
fn assert_interrupted_with_checkpoint(dir: &TempDir, run: &str) {
    let r = record(dir, run);
    assert_eq!(r["status"], "interrupted by SIGTERM", "{run}: {r:#}");
    let batch = r["batches"].as_u64().expect("batches");
    assert!(batch < 6, "{run} trained to its end: {r:#}");
    let checkpoints = names(&sweep_folder(dir).join(run).join("checkpoints"));
    assert!(
        checkpoints.contains(&format!("ep0-ba{batch}.ckpt")),
        "{run} stopped after batch {batch} without its checkpoint: {checkpoints:?}"
    );
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_sweep_runs_every_combination_and_skips_them_when_run_again() {
    let dir = sweep_dir("sweep-all", "");
    let out = sweep(&dir, &["--dry-run"], &[]);
    out.assert_success();
    for run in RUNS {
        assert!(
            out.stdout.contains(&format!("{run:<32} starts")),
            "{}",
            out.dump()
        );
    }
    assert!(!sweep_folder(&dir).exists(), "a dry run wrote files");

    let out = sweep(&dir, &[], &[]);
    out.assert_success();
    let summary = read_json(&sweep_folder(&dir).join("sweep.json"));
    let entries = summary["runs"].as_array().expect("runs");
    assert_eq!(entries.len(), RUNS.len(), "{summary:#}");
    for (entry, run) in entries.iter().zip(RUNS) {
        let (recipe, seed) = run.split_once("-seed").expect("a run name");
        let r = record(&dir, run);
        assert_eq!(entry["id"], run);
        assert_eq!(entry["status"], "done", "{entry:#}");
        assert_eq!(entry["axes"]["recipe"], recipe);
        assert_eq!(entry["axes"]["seed"], seed);
        assert_eq!(entry["final_accuracy"], r["final_accuracy"]);
        // Each run trained its recipe's methods with its seed, in its own folder.
        assert_eq!(r["status"], "completed");
        assert_eq!(r["recipe"], recipe);
        assert_eq!(r["config"]["seed"].to_string(), seed);
        assert_eq!(r["batches"], 6);
        let plugins: Vec<&str> = r["plugins"]
            .as_array()
            .expect("plugins")
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect();
        let expected: &[&str] = if recipe == "plain" {
            &["fake_plugin"]
        } else {
            &["fake_plugin", "label_smoothing"]
        };
        assert_eq!(plugins, expected, "{run}");
        let folder = sweep_folder(&dir).join(run);
        assert_eq!(
            names(&folder.join("checkpoints")),
            ["ep0-ba2.ckpt", "ep0-ba4.ckpt", "ep0-ba6.ckpt"]
        );
        assert!(std::fs::read_to_string(folder.join("train.log"))
            .expect("train.log")
            .contains("run "));
        assert!(out.stdout.contains(run), "{}", out.dump());
    }
    // The two seeds differ; the same seed of two recipes starts alike but trains differently.
    assert_ne!(
        record(&dir, "plain-seed1")["evals"],
        record(&dir, "plain-seed2")["evals"]
    );
    // Each recipe over its two seeds: the mean ± half the range of the final accuracy.
    let over_seeds = out
        .stdout
        .split_once("over seeds")
        .unwrap_or_else(|| panic!("no seed spread:\n{}", out.dump()))
        .1;
    for recipe in ["plain", "smooth"] {
        let accuracy = |seed: u32| {
            record(&dir, &format!("{recipe}-seed{seed}"))["final_accuracy"]
                .as_f64()
                .expect("final_accuracy")
        };
        let (a, b) = (accuracy(1), accuracy(2));
        let want = format!(
            "acc {:.4} ± {:.4}",
            (a + b) / 2.0,
            (a.max(b) - a.min(b)) / 2.0
        );
        let line = over_seeds
            .lines()
            .find(|l| l.split_whitespace().next() == Some(recipe))
            .unwrap_or_else(|| panic!("no {recipe} line:\n{over_seeds}"));
        assert!(
            line.contains(&want) && line.split_whitespace().nth(1) == Some("2"),
            "{recipe}: want {want} over 2 seeds:\n{line}"
        );
    }

    let before: Vec<SystemTime> = RUNS
        .iter()
        .map(|r| modified(&sweep_folder(&dir).join(r).join("run.json")))
        .collect();
    let again = sweep(&dir, &[], &[]);
    again.assert_success();
    assert!(
        again.stderr.contains("4 of 4 runs already done"),
        "{}",
        again.dump()
    );
    let after: Vec<SystemTime> = RUNS
        .iter()
        .map(|r| modified(&sweep_folder(&dir).join(r).join("run.json")))
        .collect();
    assert_eq!(before, after, "finished runs were trained again");

    // A sweep whose settings changed under a finished run refuses to mix results.
    let changed = sweep(&dir, &["--set", "optimizer.lr=0.01"], &[]);
    changed.assert_failure(&["settings of run `plain-seed1` changed", "delete"]);
}

#[test]
fn a_killed_sweep_continues_where_it_stopped_and_ends_as_an_uninterrupted_one() {
    let straight = sweep_dir("sweep-straight", "");
    sweep(&straight, &[], &[]).assert_success();

    let dir = sweep_dir("sweep-killed", "");
    // Every run holds at the end of its third batch (after its batch-2 checkpoint): the first
    // is let go at once and finishes; the second is killed there, mid-run.
    let hold = TempDir::new("sweep-killed-hold");
    let hold_dir = hold.path().to_str().expect("a UTF-8 temp path");
    let child = tessera_command(
        &["sweep", "sweep.toml"],
        dir.path(),
        &[
            ("TESSERA_FAKE_HOLD_DIR", hold_dir),
            ("TESSERA_FAKE_HOLD_AT", "3"),
        ],
    )
    .spawn()
    .expect("start tessera sweep");
    let first = wait_until_held(&hold, 1, "the first run to reach batch 3")[0];
    std::fs::write(hold.join(&format!("release-{first}")), "").expect("release the first run");
    let second = *wait_until_held(&hold, 2, "the second run to reach batch 3")
        .iter()
        .find(|pid| **pid != first)
        .expect("the second run's pid");
    assert!(
        sweep_folder(&dir)
            .join("plain-seed2")
            .join("checkpoints")
            .join("ep0-ba2.ckpt")
            .exists(),
        "the second run is held after its batch-2 checkpoint"
    );
    // The sweep is killed; Linux sends its run SIGTERM (the sweep asked for it) as the sweep
    // exits, before the test can reap it. The run's main thread, waiting in the hold, handles
    // it before it goes on: it writes a checkpoint and stops by itself. (Not stopped with
    // SIGSTOP here: a stopped process in a process group that loses its parent gets SIGHUP.)
    signal(&child, "-KILL");
    let (status, _) = finish(child);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    std::fs::write(hold.join("release"), "").expect("release the second run");
    wait_for("the orphaned run to stop", COMMAND_TIMEOUT, || {
        !alive(second)
    });
    assert_interrupted_with_checkpoint(&dir, "plain-seed2");
    let first_done = modified(&sweep_folder(&dir).join("plain-seed1").join("run.json"));
    assert_eq!(record(&dir, "plain-seed1")["status"], "completed");
    assert!(!sweep_folder(&dir).join("smooth-seed1").exists());

    let out = sweep(&dir, &[], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("1 of 4 runs already done"),
        "{}",
        out.dump()
    );
    assert_eq!(
        modified(&sweep_folder(&dir).join("plain-seed1").join("run.json")),
        first_done,
        "the finished run was trained again"
    );
    let log = std::fs::read_to_string(sweep_folder(&dir).join("plain-seed2").join("train.log"))
        .expect("train.log");
    assert!(log.contains("resumed from"), "{log}");
    for run in RUNS {
        let (a, b) = (record(&straight, run), record(&dir, run));
        assert_eq!(b["status"], "completed", "{run}");
        assert_eq!(a["evals"], b["evals"], "{run}");
        assert_same_checkpoint(
            &sweep_folder(&straight)
                .join(run)
                .join("checkpoints")
                .join("ep0-ba6.ckpt"),
            &sweep_folder(&dir)
                .join(run)
                .join("checkpoints")
                .join("ep0-ba6.ckpt"),
        );
    }
}

#[test]
fn sigterm_stops_the_running_runs_with_a_checkpoint_and_a_failing_run_not_the_others() {
    let dir = sweep_dir("sweep-sigterm", "parallel = 2");
    // Both running runs hold at the end of their third batch (after their batch-2 checkpoints):
    // mid-run, and neither can finish, so the other two cannot start.
    let hold = TempDir::new("sweep-sigterm-hold");
    let child = tessera_command(
        &["sweep", "sweep.toml"],
        dir.path(),
        &[
            (
                "TESSERA_FAKE_HOLD_DIR",
                hold.path().to_str().expect("a UTF-8 temp path"),
            ),
            ("TESSERA_FAKE_HOLD_AT", "3"),
        ],
    )
    .spawn()
    .expect("start tessera sweep");
    let running = wait_until_held(&hold, 2, "both runs to reach batch 3");
    for pid in &running {
        kill("-STOP", *pid);
    }
    release_with_sigterm(&hold, &running, || signal(&child, "-TERM"));
    let (status, stderr) = finish(child);
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("run the same command again"), "{stderr}");
    let summary = read_json(&sweep_folder(&dir).join("sweep.json"));
    let statuses: Vec<&str> = summary["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|r| r["status"].as_str())
        .collect();
    assert_eq!(
        statuses,
        ["interrupted", "interrupted", "pending", "pending"]
    );
    for run in ["plain-seed1", "plain-seed2"] {
        assert_interrupted_with_checkpoint(&dir, run);
    }
    for run in ["smooth-seed1", "smooth-seed2"] {
        assert!(!sweep_folder(&dir).join(run).exists(), "{run} started");
    }
    // Two at a time: each run had half the cores.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let written =
        std::fs::read_to_string(sweep_folder(&dir).join("plain-seed1").join("trainer.toml"))
            .expect("the run's trainer.toml");
    assert!(
        written.contains(&format!("threads = {}", (cores / 2).max(1))),
        "{written}"
    );

    // A recipe whose plugin does not exist fails its runs; the others finish.
    let text = std::fs::read_to_string(dir.join("sweep.toml")).expect("sweep.toml");
    dir.write(
        "sweep.toml",
        &text.replace(
            "smoothing = 0.1",
            "smoothing = 0.1\n\n[[recipes.smooth.algorithms]]\nplugin = \"no_such_method\"",
        ),
    );
    let out = sweep(&dir, &[], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", out.dump());
    assert!(out.stderr.contains("no_such_method"), "{}", out.dump());
    for run in ["plain-seed1", "plain-seed2"] {
        assert_eq!(record(&dir, run)["status"], "completed");
    }
    for run in ["smooth-seed1", "smooth-seed2"] {
        assert!(
            out.stdout
                .lines()
                .any(|l| l.starts_with(run) && l.contains("FAILED")),
            "{}",
            out.dump()
        );
    }
}

#[test]
fn the_example_sweeps_plan_their_runs() {
    // The committed recipe sweeps read and check (configs, recipe files, plugins' settings'
    // syntax) without running anything.
    for (file, runs) in [
        ("examples/recipes/sweep.toml", 8),
        ("examples/recipes/sweep-lengths.toml", 8),
        ("examples/recipes/gpt/sweep.toml", 4),
        ("examples/recipes/speedrun/sweep.toml", 6),
        ("examples/recipes/speedrun/sweep-baseline.toml", 3),
        ("examples/recipes/gpt/speedrun/sweep.toml", 3),
        ("examples/recipes/gpt/speedrun/sweep-baseline.toml", 6),
    ] {
        let path = repo_root().join(file);
        let out = tessera(
            &["sweep", path.to_str().expect("a UTF-8 path"), "--dry-run"],
            &repo_root(),
            &[],
        );
        out.assert_success();
        assert_eq!(out.stdout.lines().count(), runs, "{}", out.dump());
    }
}
