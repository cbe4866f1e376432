//! The randaugment plugin through the real binary: 3 batches of Fashion-MNIST (1-channel images,
//! Pillow's mode "L") with the transform on the loader's threads, compared with the same run
//! without it; `depth = 0` is the very same run as none; settings errors name the setting; a
//! killed and resumed run equals the straight one bit for bit.
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use tessera_tests::*;

/// The training losses of a 3-batch run of the small CNN with `randaugment` settings (none: no
/// plugin).
fn losses_with(label: &str, settings: Option<&str>) -> Vec<f64> {
    crate::losses::losses_with(TrainerToml::new(label), "randaugment", settings)
}

#[test]
fn randaugment_changes_training_and_depth_zero_does_not() {
    let plain = losses_with("plain", None);
    let augmented = losses_with("randaugment", Some(""));
    for (i, (a, p)) in augmented.iter().zip(&plain).enumerate() {
        assert!(a.is_finite(), "{augmented:?}");
        assert_ne!(a, p, "batch {i}: RandAugment left the loss unchanged");
    }
    // The "safe" set at another severity draws other operations: another run.
    let safe = losses_with(
        "randaugment-safe",
        Some("severity = 5\ndepth = 1\naugmentation_set = \"safe\""),
    );
    assert_ne!(safe, augmented);
    // No operation: the images go through the 8-bit grid unchanged, the very same run.
    let none = losses_with("randaugment-none", Some("depth = 0"));
    assert_eq!(none, plain);
}
