//! The augmix plugin through the real binary: 3 batches of Fashion-MNIST (1-channel images,
//! Pillow's mode "L") with the transform on the loader's threads, compared with the same run
//! without it and with other settings; settings errors name the setting; a killed and resumed
//! run equals the straight one bit for bit.
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use tessera_tests::*;

/// The training losses of a 3-batch run of the small CNN with `augmix` settings (none: no
/// plugin).
fn losses_with(label: &str, settings: Option<&str>) -> Vec<f64> {
    crate::losses::losses_with(TrainerToml::new(label), "augmix", settings)
}

#[test]
fn augmix_changes_training() {
    let plain = losses_with("plain", None);
    let augmented = losses_with("augmix", Some(""));
    for (i, (a, p)) in augmented.iter().zip(&plain).enumerate() {
        assert!(a.is_finite(), "{augmented:?}");
        assert_ne!(a, p, "batch {i}: AugMix left the loss unchanged");
    }
    let safe = losses_with(
        "augmix-safe",
        Some("severity = 7\ndepth = 2\nwidth = 2\nalpha = 0.5\naugmentation_set = \"safe\""),
    );
    assert_ne!(safe, augmented);
}
