//! The alternating_flip plugin through the real binary on 3 batches of Fashion-MNIST: the
//! loader runs its transform through `apply_at` (a 1.6 host), which changes what the model
//! trains on, deterministically; a run killed and resumed continues bit for bit. (Which image is
//! mirrored in which epoch is pinned by the crate's tests; `tests/distributed/distributed.rs` checks that 2
//! ranks train what one process trains.)
//!
//! Its kill -9 resume is a row of the method table (tests/methods/table.rs).

use tessera_tests::dist::max_difference;
use tessera_tests::*;

fn latest(dir: &TempDir, run: &str) -> std::path::PathBuf {
    run_dir(dir, run).join("checkpoints/latest.ckpt")
}

#[test]
fn it_changes_the_training_and_is_deterministic() {
    let dir = TempDir::new("alternating-flip");
    for run in ["flip", "flip-again"] {
        TrainerToml::new(run)
            .algorithm("alternating_flip", "")
            .write_to(&dir);
        let out = train(&dir, &[], &[]);
        out.assert_success();
        assert!(
            out.stderr.contains("loaded plugin alternating_flip"),
            "{}",
            out.dump()
        );
    }
    TrainerToml::new("plain").write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let (same, name) = max_difference(
        &latest(&dir, "flip"),
        &latest(&dir, "flip-again"),
        &["model/", "method/"],
    );
    assert_eq!(same, 0.0, "`{name}` differs between two runs of one seed");
    // About half of epoch 0's images are mirrored: the weights move away from the plain run's.
    let (diff, _) = max_difference(&latest(&dir, "flip"), &latest(&dir, "plain"), &["model/"]);
    assert!(diff > 1e-4, "the flip changed the weights by only {diff:e}");
}
