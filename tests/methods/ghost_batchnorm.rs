//! The ghost_batchnorm plugin through the real binary (plugin-api 1.3's `wrap_module`): every
//! batch norm of ResNet-20 is wrapped at `init`, keeping its parameters under `batchnorm`;
//! training differs from the plain run while evaluation uses the plain batch norm; a batch
//! smaller than a ghost batch stops the run with Composer's message; a killed and resumed run
//! replays the surgery and equals the straight run bit for bit.
//!
//! Its kill -9 resume is a row of the method table (tests/methods/table.rs).

use serde_json::Value;
use tessera::checkpoint::{self, Checkpoint};
use tessera_tests::*;

fn resnet(label: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"resnet20\"\nwidth = 4".to_owned();
    toml.device = Some("cpu".to_owned());
    toml
}

/// A 3-batch run (batches of 64) with the plugin's `settings` (none: no plugin); returns the
/// run folder's metrics lines and the output.
fn run(dir: &TempDir, label: &str, settings: Option<&str>) -> (Vec<Value>, Output) {
    let mut toml = resnet(label);
    if let Some(s) = settings {
        toml = toml.algorithm("ghost_batchnorm", s);
    }
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"3ba\"\n", toml.render()),
    );
    let out = train(dir, &[], &[]);
    let lines = read_jsonl(&run_dir(dir, label).join("metrics.jsonl"));
    (lines, out)
}

#[test]
fn wraps_every_batch_norm_and_changes_training() {
    let dir = TempDir::new("gbn");
    let (plain, out) = run(&dir, "plain", None);
    out.assert_success();
    let (ghost, out) = run(&dir, "ghost", Some("ghost_batch_size = 16"));
    out.assert_success();
    // ResNet-20: the stem's batch norm, two per block (9 blocks), two projection shortcuts.
    assert!(
        out.stderr
            .contains("ghost_batchnorm: 21 batch norms in ghost batches of 16"),
        "{}",
        out.dump()
    );
    assert_eq!(
        method_metric(&ghost, "ghost_batchnorm/replaced"),
        [(0, 21.0)]
    );
    let (p, g) = (train_losses(&plain), train_losses(&ghost));
    assert_eq!(p.len(), 3);
    // The first batch's loss is computed before any update: ghost statistics change it.
    assert_ne!(p[0], g[0]);

    // The checkpoint holds the wrapped batch norms under `batchnorm`, with the counter
    // advanced by 4 chunks per batch (64 / 16).
    let folder = run_dir(&dir, "ghost").join("checkpoints");
    let newest = checkpoint::list(&folder);
    let ckpt = Checkpoint::read(newest.first().expect("a checkpoint")).expect("reads");
    let tracked = ckpt
        .tensor("model/bn1.batchnorm.num_batches_tracked")
        .expect("bn1 moved under `batchnorm`");
    assert_eq!(tracked.int64_value(&[]), 3 * 4);
    assert!(ckpt.tensor("model/bn1.weight").is_none());
    assert!(ckpt
        .tensor("model/layer2.0.shortcut.1.batchnorm.running_var")
        .is_some());
}

#[test]
fn a_batch_smaller_than_a_ghost_batch_is_an_error() {
    let dir = TempDir::new("gbn-small");
    let (_, out) = run(&dir, "small", Some("ghost_batch_size = 128"));
    out.assert_failure(&[
        "ghost_batch_norm2d",
        "Worker batch size 64 < ghost_batch_size 128",
    ]);
}
