//! The factorize plugin through the real binary on Fashion-MNIST (CPU): ResNet-20 (width 4: 4,
//! 8 and 16 channels) with `min_channels = 8` factorizes its 12 convs with at least 8 channels
//! in and out; an MLP with two hidden layers of 64 factorizes both with `min_features = 32`.
//! Training changes, the metrics count the factorized layers, checkpoints hold Composer's
//! `module0`/`module1` tensors instead of the originals; a bad setting is refused naming it; a
//! model with nothing to factorize gets a warning; a killed and resumed run equals the straight
//! run bit for bit (the surgery replayed at `init`, then the weights loaded).
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use factorize::{METRIC_NUM_CONV2D, METRIC_NUM_LINEAR};
use tessera::checkpoint::{self, Checkpoint};
use tessera_tests::*;

const CONVS: &str = "min_channels = 8\nlatent_channels = 0.25";
const LINEARS: &str = "min_features = 32\nlatent_features = 16";

fn resnet(label: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"resnet20\"\nwidth = 4".to_owned();
    toml.device = Some("cpu".to_owned());
    toml
}

fn mlp(label: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"mlp\"\nhidden = [64, 64]".to_owned();
    toml.device = Some("cpu".to_owned());
    toml
}

fn first_checkpoint(dir: &TempDir, run: &str) -> Checkpoint {
    let folder = run_dir(dir, run).join("checkpoints");
    Checkpoint::read(checkpoint::list(&folder).first().expect("a checkpoint")).expect("reads")
}

#[test]
fn resnet_convs_are_factorized_trained_and_saved_under_composers_names() {
    let dir = TempDir::new("fz-resnet");
    resnet("plain").write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    resnet("fz").algorithm("factorize", CONVS).write_to(&dir);
    let out = train(&dir, &["checkpoint.interval=3ba"], &[]);
    out.assert_success();
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        text.contains("factorize factorized 12 conv2d and 0 linear layers"),
        "{}",
        out.dump()
    );
    let lines = |run: &str| read_jsonl(&run_dir(&dir, run).join("metrics.jsonl"));
    // min(in, out) >= 8: in layer2 the 5 convs after the entering one (4 -> 8) and its
    // projection (min 4); in layer3 all 6 and the projection (8 -> 16) — 12 in all. The fc
    // (16 -> 10) is below the default min_features.
    assert_eq!(method_metric(&lines("fz"), METRIC_NUM_CONV2D), [(0, 12.0)]);
    assert_eq!(method_metric(&lines("fz"), METRIC_NUM_LINEAR), [(0, 0.0)]);
    assert_ne!(train_losses(&lines("plain")), train_losses(&lines("fz")));

    let ckpt = first_checkpoint(&dir, "fz");
    // latent = int(0.25 · min(in, out)).
    for (name, shape) in [
        ("model/layer3.1.conv1.module0.weight", vec![4, 16, 3, 3]),
        ("model/layer3.1.conv1.module1.weight", vec![16, 4, 1, 1]),
        ("model/layer3.1.conv1.module1.bias", vec![16]),
        ("model/layer2.0.conv2.module0.weight", vec![2, 8, 3, 3]),
        ("model/layer3.0.shortcut.0.module0.weight", vec![2, 8, 1, 1]),
        (
            "model/layer3.0.shortcut.0.module1.weight",
            vec![16, 2, 1, 1],
        ),
    ] {
        let t = ckpt
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(t.size(), shape, "{name}");
    }
    assert!(ckpt.tensor("model/layer3.1.conv1.weight").is_none());
    assert!(ckpt.tensor("model/layer3.1.conv1.module0.bias").is_none());
    assert!(
        ckpt.tensor("model/layer1.0.conv1.weight").is_some(),
        "4 channels: untouched"
    );
    assert!(
        ckpt.tensor("model/layer2.0.conv1.weight").is_some(),
        "4 -> 8: untouched"
    );
    assert!(ckpt.tensor("model/fc.weight").is_some());
}

#[test]
fn mlp_hidden_layers_are_factorized() {
    let dir = TempDir::new("fz-mlp");
    mlp("plain").write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    mlp("fz").algorithm("factorize", LINEARS).write_to(&dir);
    train(&dir, &["checkpoint.interval=3ba"], &[]).assert_success();
    let lines = |run: &str| read_jsonl(&run_dir(&dir, run).join("metrics.jsonl"));
    // 784 -> 64 and 64 -> 64 are wide enough; 64 -> 10 is not.
    assert_eq!(method_metric(&lines("fz"), METRIC_NUM_LINEAR), [(0, 2.0)]);
    assert_eq!(method_metric(&lines("fz"), METRIC_NUM_CONV2D), [(0, 0.0)]);
    assert_ne!(train_losses(&lines("plain")), train_losses(&lines("fz")));
    let ckpt = first_checkpoint(&dir, "fz");
    for (name, shape) in [
        ("model/layers.0.module0.weight", vec![16, 784]),
        ("model/layers.0.module1.weight", vec![64, 16]),
        ("model/layers.0.module1.bias", vec![64]),
        ("model/layers.2.module0.weight", vec![16, 64]),
        ("model/layers.4.weight", vec![10, 64]),
    ] {
        let t = ckpt
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(t.size(), shape, "{name}");
    }
    assert!(ckpt.tensor("model/layers.0.weight").is_none());
    assert!(ckpt.tensor("model/layers.2.bias").is_none());
}

#[test]
fn nothing_to_factorize_warns() {
    let dir = TempDir::new("fz-none");
    // The small CNN's layers are far below the defaults (256 channels and features).
    TrainerToml::new("none")
        .algorithm("factorize", "")
        .write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        text.contains("factorize: nothing factorized"),
        "{}",
        out.dump()
    );
}
