//! The squeeze_excite plugin through the real binary (plugin-api 1.3's `wrap_module` with
//! Composer's names): ResNet-20 (width 4: 4, 8 and 16 channels) on Fashion-MNIST with
//! `min_channels = 8`; the gates change training and their weights are checkpointed under
//! Composer's names; a killed and resumed run equals the straight run bit for bit.
//!
//! Its kill -9 resume is a row of the method table (tests/methods/table.rs).

use tessera::checkpoint::{self, Checkpoint};
use tessera_tests::*;

const SE: &str = "latent_channels = 0.5\nmin_channels = 8";

fn resnet(label: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"resnet20\"\nwidth = 4".to_owned();
    toml.device = Some("cpu".to_owned());
    toml
}

#[test]
fn gates_are_added_trained_and_saved_under_composers_names() {
    let dir = TempDir::new("se");
    resnet("plain").write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    resnet("se").algorithm("squeeze_excite", SE).write_to(&dir);
    train(&dir, &["checkpoint.interval=3ba"], &[]).assert_success();
    let lines = |run: &str| read_jsonl(&run_dir(&dir, run).join("metrics.jsonl"));
    // min(in, out) >= 8: in layer2 (4 -> 8 entering) the 5 convolutions after the first, not
    // the entering conv or its 1x1 projection (min 4); in layer3 (8 -> 16 entering) all 6 and
    // the projection (min 8) — 12 in all.
    let replaced = method_metric(&lines("se"), "squeeze_excite/replaced");
    assert_eq!(replaced, [(0, 12.0)]);
    assert_ne!(train_losses(&lines("plain")), train_losses(&lines("se")));
    let folder = run_dir(&dir, "se").join("checkpoints");
    let ckpt =
        Checkpoint::read(checkpoint::list(&folder).first().expect("a checkpoint")).expect("reads");
    assert!(ckpt.tensor("model/layer3.1.conv1.conv.weight").is_some());
    let w1 = ckpt
        .tensor("model/layer3.1.conv1.se.pool_and_mlp.2.weight")
        .expect("the gate's first weight");
    assert_eq!(w1.size(), [8, 16]);
    assert!(ckpt.tensor("model/layer3.1.conv1.weight").is_none());
    assert!(
        ckpt.tensor("model/layer1.0.conv1.weight").is_some(),
        "4 channels: untouched"
    );
}
