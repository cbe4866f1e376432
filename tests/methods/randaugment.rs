//! The randaugment plugin through the real binary: 3 batches of Fashion-MNIST (1-channel images,
//! Pillow's mode "L") with the transform on the loader's threads, compared with the same run
//! without it; `depth = 0` is the very same run as none; settings errors name the setting; a
//! killed and resumed run equals the straight one bit for bit.

use tessera_tests::resume::assert_killed_and_resumed_is_exact;
use tessera_tests::*;

/// The training loss of every batch of a 3-batch run with `randaugment` settings (none: no
/// plugin).
fn losses_with(label: &str, settings: Option<&str>) -> Vec<f64> {
    let dir = TempDir::new(label);
    let mut toml = TrainerToml::new(label);
    if let Some(settings) = settings {
        toml = toml.algorithm("randaugment", settings);
    }
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    if settings.is_some() {
        assert!(
            out.stderr.contains("loaded plugin randaugment"),
            "{}",
            out.dump()
        );
    }
    let lines = read_jsonl(&run_dir(&dir, label).join("metrics.jsonl"));
    let losses = train_losses(&lines);
    assert_eq!(losses.len(), 3, "{lines:?}");
    let record = read_json(&run_dir(&dir, label).join("run.json"));
    assert_eq!(record["status"], "completed", "{record:#}");
    losses
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

#[test]
fn invalid_settings_stop_the_run_with_the_setting_named() {
    let dir = TempDir::new("randaugment-bad");
    for (settings, fragment) in [
        ("severity = 11", "`severity` must be in [0, 10]"),
        ("depth = -1", "depth"),
        (
            "augmentation_set = \"most\"",
            "`augmentation_set` must be \"all\", \"safe\" or \"original\"",
        ),
        ("sevrity = 3", "`sevrity`"),
    ] {
        TrainerToml::new("bad")
            .algorithm("randaugment", settings)
            .write_to(&dir);
        let out = train(&dir, &[], &[]);
        out.assert_failure(&["plugin `randaugment`", "invalid settings", fragment]);
    }
}

#[test]
fn killed_and_resumed_run_equals_the_straight_run_bit_for_bit() {
    assert_killed_and_resumed_is_exact("randaugment-resume", |run| {
        let mut toml = TrainerToml::new(run).algorithm("randaugment", "depth = 3");
        toml.max_duration = "8ba".to_owned();
        toml
    });
}
