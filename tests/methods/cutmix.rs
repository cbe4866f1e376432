//! The cutmix plugin through the real binary on Fashion-MNIST (CPU, deterministic): it cuts a
//! box into every batch (its `cutmix/lambda` metric, training losses unlike the plain run's),
//! both modes (mixed targets, interpolated loss) train through the host's loss, a bad setting
//! is refused with its key named, and a run stopped at a checkpoint and resumed ends exactly as
//! the straight run.
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).

use crate::mixing::{assert_stopped_and_resumed_ends_as_the_straight_run, Run};

/// A run with `cutmix` and `settings` (none: no plugin).
fn run(label: &str, settings: Option<&str>) -> Run {
    crate::mixing::run("cutmix", label, settings)
}

/// Fashion-MNIST images are 28×28.
const SIDE: i64 = 28;

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
    let l = targets.metric("cutmix/lambda");
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
    assert_eq!(
        losses.metric("cutmix/lambda"),
        l,
        "the same seed draws the same boxes"
    );

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
    assert_stopped_and_resumed_ends_as_the_straight_run("cutmix", "alpha = 0.5");
}
