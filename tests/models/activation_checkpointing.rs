//! `train.activation_checkpointing` through the binary: a GPT-2 with dropout whose blocks are
//! recomputed in backward resumes exactly from a checkpoint (its generators' states are put
//! back after each recompute), and a model without blocks is refused at start.

use tessera_tests::resume::assert_killed_and_resumed_is_exact;
use tessera_tests::{synthetic_rgb_data, train, TempDir, TrainerToml};

#[test]
fn a_checkpointed_gpt2_with_dropout_resumes_exactly() {
    assert_killed_and_resumed_is_exact("activation-checkpointing-resume", |run| {
        let mut toml = TrainerToml::tiny_gpt(run);
        toml.model.push_str("\ndropout = 0.1");
        toml.train = "activation_checkpointing = { unit = \"block\", every = 1 }".to_owned();
        toml.max_duration = "8ba".to_owned();
        toml
    });
}

#[test]
fn a_model_without_blocks_is_refused_naming_it_and_the_key() {
    let dir = TempDir::new("activation-checkpointing-mlp");
    let mut toml = TrainerToml::new("mlp");
    toml.model = "name = \"mlp\"".to_owned();
    toml.data = synthetic_rgb_data(32);
    toml.train = "activation_checkpointing = {}".to_owned();
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&[
        "train.activation_checkpointing",
        "model \"mlp\" has no block",
    ]);
}
