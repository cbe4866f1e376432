//! The colout plugin through the real binary: 3 batches of Fashion-MNIST on ResNet-20 (global
//! pooling, so it accepts the 23×23 images ColOut leaves of 28×28), compared with the same run
//! without it; settings errors name the setting; a killed and resumed run equals the straight
//! one bit for bit.
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use tessera_tests::*;

fn resnet(label: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"resnet20\"\nwidth = 4".to_owned();
    toml.device = Some("cpu".to_owned());
    toml
}

/// The training losses of a 3-batch run of ResNet-20 with `colout` settings (none: no plugin).
fn losses_with(label: &str, colout: Option<&str>) -> Vec<f64> {
    crate::losses::losses_with(resnet(label), "colout", colout)
}

#[test]
fn colout_changes_training_and_dropping_nothing_does_not() {
    let plain = losses_with("plain", None);
    let colout = losses_with("colout", Some(""));
    for (i, (c, p)) in colout.iter().zip(&plain).enumerate() {
        assert!(c.is_finite(), "{colout:?}");
        assert_ne!(c, p, "batch {i}: ColOut left the loss unchanged");
    }
    // p_row = p_col = 0 keeps every row and column: the very same run.
    let none = losses_with("colout-none", Some("p_row = 0.0\np_col = 0.0"));
    assert_eq!(none, plain);
}

#[test]
fn a_fixed_size_model_rejects_the_smaller_images() {
    // The CNN's linear layer expects 28×28 inputs: ColOut's 23×23 reach it and the run stops.
    let dir = TempDir::new("colout-cnn");
    TrainerToml::new("cnn")
        .algorithm("colout", "")
        .write_to(&dir);
    let out = train(&dir, &[], &[]);
    assert!(!out.status.success(), "{}", out.dump());
    // 16 channels × 5 × 5 = 400 features after two poolings of 23×23, where the classifier
    // wants 16 × 7 × 7 = 784 (libtorch's message).
    assert!(
        out.stderr.contains("loaded plugin colout")
            && out
                .stderr
                .contains("shapes cannot be multiplied (64x400 and 784x32)"),
        "{}",
        out.dump()
    );
}

#[test]
fn sample_wise_colout_runs_on_the_loader_and_differs_from_batch_wise() {
    let sample = losses_with(
        "colout-sample",
        Some("batch = false\np_row = 0.2\np_col = 0.1"),
    );
    let batch = losses_with(
        "colout-batch",
        Some("batch = true\np_row = 0.2\np_col = 0.1"),
    );
    assert_ne!(sample, batch, "sample-wise ColOut drew the batch-wise rows");
    let plain = losses_with("colout-sample-plain", None);
    assert_ne!(sample, plain);
}
