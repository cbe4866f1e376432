//! The mixup plugin through the real binary on Fashion-MNIST (CPU, deterministic): it mixes
//! every batch (its `mixup/mixing` metric, training losses unlike the plain run's), both modes
//! (mixed targets, interpolated loss) train through the host's loss, a bad setting is refused
//! with its key named, and a run stopped at a checkpoint and resumed ends exactly as the
//! straight run.
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).

use crate::mixing::{assert_stopped_and_resumed_ends_as_the_straight_run, Run};

/// A run with `mixup` and `settings` (none: no plugin).
fn run(label: &str, settings: Option<&str>) -> Run {
    crate::mixing::run("mixup", label, settings)
}

#[test]
fn both_modes_mix_every_batch_and_agree() {
    let plain = run("plain", None);
    let targets = run("mix-targets", Some("alpha = 1.0"));
    let losses = run("mix-loss", Some("alpha = 1.0\ninterpolate_loss = true"));
    assert_eq!(targets.record["plugins"][0]["name"], "mixup");
    assert_eq!(targets.record["plugins"][0]["settings"]["alpha"], 1.0);

    // One coefficient per batch (one microbatch each), in (0, 0.5] for alpha = 1.
    let m = targets.metric("mixup/mixing");
    assert_eq!(
        m.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "{m:?}"
    );
    assert!(m.iter().all(|(_, v)| *v > 0.0 && *v <= 0.5), "{m:?}");
    // The same seed draws the same coefficients in both modes.
    assert_eq!(losses.metric("mixup/mixing"), m);

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
    assert_stopped_and_resumed_ends_as_the_straight_run("mixup", "alpha = 0.4");
}
