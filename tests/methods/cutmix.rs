//! The cutmix plugin through the real binary on Fashion-MNIST (CPU, deterministic): it cuts a
//! box into every batch (its `cutmix/lambda` metric, training losses unlike the plain run's),
//! both modes (mixed targets, interpolated loss) train through the host's loss, a bad setting
//! is refused with its key named, and a run stopped at a checkpoint and resumed ends exactly as
//! the straight run.

use serde_json::Value;
use tessera::checkpoint::Checkpoint;
use tessera_tests::resume::metrics;
use tessera_tests::*;

/// Fashion-MNIST images are 28×28.
const SIDE: i64 = 28;

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

    /// `(batch, λ)` of every `cutmix/lambda` line.
    fn lambdas(&self) -> Vec<(u64, f64)> {
        lines_of_kind(&self.lines, "method")
            .iter()
            .filter(|l| l["name"] == "cutmix/lambda")
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
        toml = toml.algorithm("cutmix", s);
    }
    toml
}

fn run(label: &str, settings: Option<&str>) -> Run {
    let dir = TempDir::new(label);
    config(label, settings).write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    if settings.is_some() {
        assert!(
            out.stderr.contains("loaded plugin cutmix"),
            "{}",
            out.dump()
        );
    }
    let path = run_dir(&dir, label);
    Run {
        lines: read_jsonl(&path.join("metrics.jsonl")),
        record: read_json(&path.join("run.json")),
    }
}

#[test]
fn both_modes_cut_every_batch_and_agree() {
    let plain = run("plain", None);
    let targets = run("cut-targets", Some("uniform_sampling = true"));
    let losses = run(
        "cut-loss",
        Some("uniform_sampling = true\ninterpolate_loss = true"),
    );
    assert_eq!(targets.record["plugins"][0]["name"], "cutmix");
    assert_eq!(
        targets.record["plugins"][0]["settings"]["uniform_sampling"],
        true
    );

    // One λ per batch: the kept share of a 28×28 image, a whole number of pixels out of 784.
    let l = targets.lambdas();
    assert_eq!(
        l.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "{l:?}"
    );
    for (_, v) in &l {
        let cut = (1.0 - v) * (SIDE * SIDE) as f64;
        assert!(
            (cut - cut.round()).abs() < 1e-9,
            "λ {v} is not a pixel count"
        );
    }
    assert_eq!(losses.lambdas(), l, "the same seed draws the same boxes");

    let (p, t, i) = (
        plain.train_losses(),
        targets.train_losses(),
        losses.train_losses(),
    );
    assert_eq!(p.len(), 3);
    // A batch whose box is empty (λ = 1) trains as the plain run would; the others differ.
    for (k, (a, b)) in p.iter().zip(&t).enumerate() {
        if l[k].1 < 1.0 {
            assert_ne!(a, b, "batch {k}: the cut loss equals the plain loss");
        }
    }
    assert!(l.iter().any(|(_, v)| *v < 1.0), "no box was cut: {l:?}");
    // Cross-entropy is linear in the target: both modes give the same loss up to rounding.
    for (k, (a, b)) in t.iter().zip(&i).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "batch {k}: mixed targets give {a}, interpolated loss {b}"
        );
    }
}

#[test]
fn a_resumed_run_ends_exactly_as_the_straight_run() {
    let dir = TempDir::new("cutmix-resume");
    let write = |run: &str| {
        let mut toml = config(run, Some("alpha = 0.5"));
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
    assert_eq!(metrics(&dir, "straight"), metrics(&dir, "resumed"));
    let evals = |run: &str| read_json(&run_dir(&dir, run).join("run.json"))["evals"].clone();
    assert_eq!(evals("straight"), evals("resumed"));
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
