//! Exact resume through the binary: a run stopped at a checkpoint and resumed writes the same
//! checkpoints, bit for bit, and the same metrics as the uninterrupted run. Used by
//! `tests/trainer/checkpoint.rs` and by the plugins' own resume tests
//! ([`assert_killed_and_resumed_is_exact`]).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;
use tessera::checkpoint::{self, Checkpoint};

use crate::{
    kill, read_json, read_jsonl, require_fashion_mnist, run_dir, tessera_command, train,
    uses_fashion_mnist, wait_with_timeout, TempDir, TrainerToml, COMMAND_TIMEOUT,
};

/// Checkpoints every 2 batches; logs every batch.
pub fn with_checkpoints(toml: &TrainerToml, extra: &str) -> String {
    format!(
        "{}\n[checkpoint]\ninterval = \"2ba\"\n{extra}",
        toml.render()
    )
}

/// A run from a committed checkpoint fixture (`tests/fixtures/<name>`: its `trainer.toml`, the
/// batch-3 checkpoint `ep0-ba3.ckpt` and the batch-6 one `ep1-ba6.ckpt` of the version that
/// wrote it): the fixture's folder, a temporary folder `tag` holding its `trainer.toml`, and
/// the `--set` that loads its batch-3 checkpoint.
pub fn from_fixture(name: &str, tag: &str) -> (PathBuf, TempDir, String) {
    let fixture = crate::repo_root().join("tests/fixtures").join(name);
    let dir = TempDir::new(tag);
    let toml = std::fs::read_to_string(fixture.join("trainer.toml")).expect("the fixture's toml");
    dir.write("trainer.toml", &toml);
    let load = format!(
        "checkpoint.load={}",
        crate::toml_string(&fixture.join("ep0-ba3.ckpt").display().to_string())
    );
    (fixture, dir, load)
}

pub fn ckpt_dir(dir: &TempDir, run: &str) -> PathBuf {
    run_dir(dir, run).join("checkpoints")
}

pub fn names(folder: &Path) -> Vec<String> {
    let mut v: Vec<String> = checkpoint::list(folder)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every tensor equal bit for bit; the clock (without wall time), optimizer position, RNG,
/// evaluations, method list and trainer counters equal.
pub fn assert_same_checkpoint(a: &Path, b: &Path) {
    let (ca, cb) = read_pair(a, b);
    let differ = differing_tensors(&ca, &cb);
    assert!(
        differ.is_empty(),
        "tensor `{}` differs between {} and {}",
        differ.first().map(|d| d.0.as_str()).unwrap_or_default(),
        a.display(),
        b.display()
    );
    assert_same_state(&ca, &cb, 0.0);
}

/// As [`assert_same_checkpoint`] for a checkpoint kept in the repository (`fixture`, written by
/// an earlier version on another machine) against this version's (`ours`): bit for bit where
/// this CPU rounds floating point as the fixture's did. A CPU whose kernels round differently
/// (another vector width or library code path: seen on a Sapphire Rapids host, where the
/// earlier version itself does not reproduce the fixture bit for bit) may differ by float
/// rounding only: every tensor and evaluation within 1e-6 of its scale; a note says so.
pub fn assert_same_checkpoint_as_fixture(fixture: &Path, ours: &Path) {
    let (ca, cb) = read_pair(fixture, ours);
    let differ = differing_tensors(&ca, &cb);
    let mut tolerance = 0.0;
    if !differ.is_empty() {
        for (name, diff, scale) in &differ {
            assert!(
                *diff <= 1e-6 * scale.max(1e-3),
                "tensor `{name}` differs between {} and {} by {diff:e} (scale {scale:e}): more \
                 than float rounding",
                fixture.display(),
                ours.display()
            );
        }
        let worst = differ
            .iter()
            .map(|(_, d, s)| d / s.max(1e-3))
            .fold(0.0, f64::max);
        eprintln!(
            "note: {} of {} tensors differ from the fixture by float rounding only (at most \
             {worst:.1e} of their scale): this CPU's kernels round differently from the machine \
             that wrote it",
            differ.len(),
            ca.tensors.len()
        );
        tolerance = 1e-6;
    }
    assert_same_state(&ca, &cb, tolerance);
}

fn read_pair(a: &Path, b: &Path) -> (Checkpoint, Checkpoint) {
    let ca = Checkpoint::read(a).unwrap_or_else(|e| panic!("{e}"));
    let cb = Checkpoint::read(b).unwrap_or_else(|e| panic!("{e}"));
    let na: Vec<&str> = ca.tensors.iter().map(|(n, _)| n.as_str()).collect();
    let nb: Vec<&str> = cb.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        na,
        nb,
        "{} and {} hold different tensors",
        a.display(),
        b.display()
    );
    for ((name, ta), (_, tb)) in ca.tensors.iter().zip(&cb.tensors) {
        assert_eq!(ta.kind(), tb.kind(), "{name}");
        assert_eq!(ta.size(), tb.size(), "{name}");
    }
    (ca, cb)
}

/// The tensors that differ bit for bit (NaN-safe, -0.0 and 0.0 told apart), with their largest
/// difference and the largest magnitude of the first one's (floating tensors; others 0, 0).
fn differing_tensors(ca: &Checkpoint, cb: &Checkpoint) -> Vec<(String, f64, f64)> {
    let bytes = |t: &tch::Tensor| {
        let t = t.contiguous();
        let mut v = vec![0u8; t.numel() * t.kind().elt_size_in_bytes()];
        t.copy_data_u8(&mut v, t.numel());
        v
    };
    let mut out = Vec::new();
    for ((name, ta), (_, tb)) in ca.tensors.iter().zip(&cb.tensors) {
        if bytes(ta) == bytes(tb) {
            continue;
        }
        let (diff, scale) = if ta.is_floating_point() {
            let a = ta.to_kind(tch::Kind::Double);
            let b = tb.to_kind(tch::Kind::Double);
            (
                (&a - &b).abs().max().double_value(&[]),
                a.abs().max().double_value(&[]),
            )
        } else {
            (f64::INFINITY, 0.0)
        };
        out.push((name.clone(), diff, scale));
    }
    out
}

/// Everything but the tensors equal; evaluations' numbers within `tolerance` of their size.
fn assert_same_state(ca: &Checkpoint, cb: &Checkpoint, tolerance: f64) {
    let clock = |c: &Checkpoint| {
        let mut t = c.meta.timestamp.clone();
        t.total_wall_seconds = 0.0;
        t.epoch_wall_seconds = 0.0;
        t.batch_wall_seconds = 0.0;
        t
    };
    assert_eq!(clock(ca), clock(cb));
    assert_eq!(ca.meta.optimizer, cb.meta.optimizer);
    assert_eq!(ca.meta.rng, cb.meta.rng);
    assert_eq!(ca.meta.methods, cb.meta.methods);
    if tolerance == 0.0 {
        assert_eq!(ca.meta.trainer.evals, cb.meta.trainer.evals);
    } else {
        let (ea, eb) = (&ca.meta.trainer.evals, &cb.meta.trainer.evals);
        assert_eq!(ea.len(), eb.len(), "evaluations");
        for (a, b) in ea.iter().zip(eb) {
            assert_eq!((a.epoch, a.batch, a.samples), (b.epoch, b.batch, b.samples));
            for (x, y) in [(a.accuracy, b.accuracy), (a.cross_entropy, b.cross_entropy)] {
                assert!(
                    (x - y).abs() <= tolerance * x.abs().max(1.0),
                    "{a:?} vs {b:?}"
                );
            }
        }
    }
    assert_eq!(
        ca.meta.trainer.running_batches,
        cb.meta.trainer.running_batches
    );
    assert_eq!(ca.meta.trainer.disabled, cb.meta.trainer.disabled);
    assert_eq!(ca.meta.trainer.skipped_steps, cb.meta.trainer.skipped_steps);
    assert_eq!(
        ca.meta.trainer.trained_samples,
        cb.meta.trainer.trained_samples
    );
    assert_eq!(ca.meta.trainer.grad_scaler, cb.meta.trainer.grad_scaler);
}

/// The metrics file without timing fields.
pub fn metrics(dir: &TempDir, run: &str) -> Vec<Value> {
    let mut lines = read_jsonl(&run_dir(dir, run).join("metrics.jsonl"));
    for l in &mut lines {
        if let Some(d) = l.get_mut("data").and_then(Value::as_object_mut) {
            d.remove("samples_per_second");
            d.remove("tokens_per_second");
        }
        // When an evaluation ran (seconds) differs from run to run.
        if let Some(o) = l.as_object_mut() {
            o.remove("train_seconds");
            o.remove("wall_seconds");
        }
    }
    lines
}

/// Checkpoints of `resumed` from batch `from` on equal the straight run's.
pub fn assert_continues(dir: &TempDir, straight: &str, resumed: &str, from: u64) {
    let s = names(&ckpt_dir(dir, straight));
    let r = names(&ckpt_dir(dir, resumed));
    let later: Vec<&String> = s
        .iter()
        .filter(|n| checkpoint::parse_file_name(n).is_some_and(|(_, b)| b > from))
        .collect();
    assert!(
        !later.is_empty(),
        "no checkpoint after batch {from} in {s:?}"
    );
    for name in later {
        assert!(
            r.contains(name),
            "the resumed run did not write {name}: {r:?}"
        );
        assert_same_checkpoint(
            &ckpt_dir(dir, straight).join(name),
            &ckpt_dir(dir, resumed).join(name),
        );
    }
}

/// Starts `tessera train trainer.toml` in `dir` without waiting; [`finish`] waits for it.
pub fn spawn(dir: &TempDir, env: &[(&str, &str)]) -> Child {
    if uses_fashion_mnist(dir) {
        require_fashion_mnist();
    }
    let config = dir.join("trainer.toml");
    let config = config.to_str().expect("a UTF-8 temp path");
    tessera_command(&["train", config], dir.path(), env)
        .spawn()
        .expect("start tessera")
}

/// Starts `tessera train` in `dir` as [`spawn`] does, with the fake plugin (which the run must
/// load) holding it at the end of batch `at` (`TESSERA_FAKE_HOLD_DIR`, `TESSERA_FAKE_HOLD_AT`);
/// returns once it is held there, for the test to signal it at that point.
pub fn spawn_held_at(dir: &TempDir, at: u64) -> Child {
    let hold = dir.join("hold");
    std::fs::create_dir_all(&hold).expect("the hold folder");
    let hold_dir = hold.display().to_string();
    let at = at.to_string();
    let child = spawn(
        dir,
        &[
            ("TESSERA_FAKE_HOLD_DIR", &hold_dir),
            ("TESSERA_FAKE_HOLD_AT", &at),
        ],
    );
    wait_for(
        &format!("the run held at the end of batch {at}"),
        COMMAND_TIMEOUT,
        || {
            std::fs::read_dir(&hold)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("held-"))
        },
    );
    child
}

/// Waits until `done` holds, checking every 20 ms; fails after `timeout`, naming `what`.
pub fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a `tessera` process started with piped output (by [`spawn`] or
/// [`tessera_command`]) and returns its exit status and stderr; one still running after
/// [`COMMAND_TIMEOUT`] is killed and fails the test.
pub fn finish(child: Child) -> (std::process::ExitStatus, String) {
    let out = wait_with_timeout(child, "the spawned tessera", COMMAND_TIMEOUT);
    (out.status, out.stderr)
}

/// Sends `sig` (`-TERM`, `-KILL`) to `child`.
pub fn signal(child: &Child, sig: &str) {
    kill(sig, child.id());
}

/// Trains the 8-batch run `config` (a `trainer.toml` with checkpoints every 2 batches, run
/// name `straight`) in `dir`, checking it wrote its four checkpoints.
pub fn train_straight(dir: &TempDir, config: &str) {
    dir.write("trainer.toml", config);
    train(dir, &[], &[]).assert_success();
    assert_eq!(
        names(&ckpt_dir(dir, "straight")),
        [
            "ep0-ba2.ckpt",
            "ep0-ba4.ckpt",
            "ep0-ba6.ckpt",
            "ep0-ba8.ckpt"
        ]
    );
}

/// Trains `make`'s 8-batch run straight, checkpointing every 2 batches; then the same run
/// killed (`kill -9`) once its batch-4 checkpoint is written, and continued with autoresume.
/// The continued run must write the straight run's later checkpoints bit for bit and the same
/// metrics. Unlike stopping a shorter run, killing keeps `max_duration`, so methods on a
/// schedule of the elapsed fraction see the same clock. Both runs also load `fake_plugin`,
/// which holds the killed run at the end of batch 5 (`TESSERA_FAKE_HOLD_DIR`, after the
/// batch-4 checkpoint, before the batch-6 one) until it is killed there. `label` names the
/// temporary folder.
pub fn assert_killed_and_resumed_is_exact(label: &str, make: impl Fn(&str) -> TrainerToml) {
    let dir = TempDir::new(label);
    let config = |run: &str| with_checkpoints(&make(run).algorithm("fake_plugin", ""), "");
    train_straight(&dir, &config("straight"));
    dir.write("trainer.toml", &config("killed"));
    let child = spawn_held_at(&dir, 5);
    let folder = ckpt_dir(&dir, "killed");
    assert!(
        folder.join("ep0-ba4.ckpt").exists(),
        "held at batch 5 without the batch-4 checkpoint"
    );
    signal(&child, "-KILL");
    let (status, _) = finish(child);
    assert!(!status.success(), "the run finished before it was killed");
    let before = names(&folder);
    assert!(
        !before.contains(&"ep0-ba8.ckpt".to_owned()),
        "killed too late: {before:?}"
    );
    let from = before
        .iter()
        .filter_map(|n| checkpoint::parse_file_name(n).map(|(_, b)| b))
        .max()
        .expect("a checkpoint before the kill");
    let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
    out.assert_success();
    assert!(out.stderr.contains("resumed from"), "{}", out.dump());
    assert_continues(&dir, "straight", "killed", from);
    assert_eq!(
        metrics(&dir, "straight"),
        metrics(&dir, "killed"),
        "{label}"
    );
    assert_eq!(
        read_json(&run_dir(&dir, "killed").join("run.json"))["evals"],
        read_json(&run_dir(&dir, "straight").join("run.json"))["evals"]
    );
}
