//! Exact resume through the binary: a run stopped at a checkpoint and resumed writes the same
//! checkpoints, bit for bit, and the same metrics as the uninterrupted run. Used by
//! `tests/checkpoint.rs` and by the plugins' own resume tests.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera::checkpoint::{self, Checkpoint};

use crate::{read_json, read_jsonl, run_dir, train, TempDir, TrainerToml};

/// Checkpoints every 2 batches; logs every batch.
pub fn with_checkpoints(toml: &TrainerToml, extra: &str) -> String {
    format!(
        "{}\n[checkpoint]\ninterval = \"2ba\"\n{extra}",
        toml.render()
    )
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
        // Bitwise: compare the raw bytes (NaN-safe, -0.0 vs 0.0 distinguished).
        let bytes = |t: &tch::Tensor| {
            let t = t.contiguous();
            let mut v = vec![0u8; t.numel() * t.kind().elt_size_in_bytes()];
            t.copy_data_u8(&mut v, t.numel());
            v
        };
        assert!(
            bytes(ta) == bytes(tb),
            "tensor `{name}` differs between {} and {}",
            a.display(),
            b.display()
        );
    }
    let clock = |c: &Checkpoint| {
        let mut t = c.meta.timestamp.clone();
        t.total_wall_seconds = 0.0;
        t.epoch_wall_seconds = 0.0;
        t.batch_wall_seconds = 0.0;
        t
    };
    assert_eq!(clock(&ca), clock(&cb));
    assert_eq!(ca.meta.optimizer, cb.meta.optimizer);
    assert_eq!(ca.meta.rng, cb.meta.rng);
    assert_eq!(ca.meta.methods, cb.meta.methods);
    assert_eq!(ca.meta.trainer.evals, cb.meta.trainer.evals);
    assert_eq!(
        ca.meta.trainer.running_batches,
        cb.meta.trainer.running_batches
    );
    assert_eq!(ca.meta.trainer.disabled, cb.meta.trainer.disabled);
}

/// The metrics file without timing fields.
pub fn metrics(dir: &TempDir, run: &str) -> Vec<Value> {
    let mut lines = read_jsonl(&run_dir(dir, run).join("metrics.jsonl"));
    for l in &mut lines {
        if let Some(d) = l.get_mut("data").and_then(Value::as_object_mut) {
            d.remove("samples_per_second");
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

/// Trains `make`'s 8-batch run straight, checkpointing every 2 batches; then the same run
/// stopped after 4 batches and continued with autoresume. The resumed run must write the same
/// checkpoints from batch 4 on, bit for bit, the same metrics and evaluations, and record where
/// it resumed from. `label` names the temporary folder.
pub fn assert_stop_and_resume_is_exact(label: &str, make: impl Fn(&str) -> TrainerToml) {
    let dir = TempDir::new(label);
    // 8 batches straight.
    dir.write("trainer.toml", &with_checkpoints(&make("straight"), ""));
    train(&dir, &[], &[]).assert_success();
    assert_eq!(
        names(&ckpt_dir(&dir, "straight")),
        [
            "ep0-ba2.ckpt",
            "ep0-ba4.ckpt",
            "ep0-ba6.ckpt",
            "ep0-ba8.ckpt"
        ]
    );
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
        "{label}"
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
