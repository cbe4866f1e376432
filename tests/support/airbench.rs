//! Runs of the zoo's airbench net for the tests of airbench's methods (tests/methods/patch_whitening.rs,
//! tests/methods/dirac_init.rs, tests/methods/batchnorm_tricks.rs, as a `#[path]` module): the configs, the
//! kill -9 and resume check, and reading checkpoint tensors.

#![allow(dead_code)]

use tessera::checkpoint::Checkpoint;
use tessera_plugin_api::tch::Tensor;
use tessera_tests::resume::{
    assert_continues, ckpt_dir, finish, metrics, names, signal, spawn_held_at,
};
use tessera_tests::*;

/// A small airbench (conv groups of 8, 16, 16 channels) on Fashion-MNIST, 3 batches of 64,
/// with `plugin` and its `settings`.
pub fn airbench(run: &str, plugin: &str, settings: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(run).algorithm(plugin, settings);
    toml.model = "name = \"airbench\"\nwidths = [8, 16, 16]".to_owned();
    toml
}

/// `toml` on 128 synthetic 1×28×28 images (2 batches of 64 per epoch), a checkpoint every
/// epoch.
pub fn short_epochs(toml: &TrainerToml) -> String {
    toml.render()
        .replacen("dataset = \"fashion-mnist\"", "dataset = \"synthetic\"", 1)
        .replacen(
            "[data.transforms]",
            "[data.synthetic]\nsamples = 128\neval_samples = 64\n\n[data.transforms]",
            1,
        )
        + "\n[checkpoint]\ninterval = \"1ep\"\n"
}

/// The checkpoint `name` of run `run`.
pub fn read(dir: &TempDir, run: &str, name: &str) -> Checkpoint {
    Checkpoint::read(&ckpt_dir(dir, run).join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The model tensor `name` of a checkpoint.
pub fn model_tensor(c: &Checkpoint, name: &str) -> Tensor {
    c.tensor(&format!("model/{name}"))
        .unwrap_or_else(|| panic!("no model/{name}"))
        .shallow_clone()
}

/// The 4-epoch run `config(run)` (2 batches an epoch, a checkpoint each) straight, then killed
/// with SIGKILL once its first checkpoint is written and resumed from it: every later
/// checkpoint, the metrics and the evaluations equal the straight run's bit for bit.
pub fn assert_killed_and_resumed_exactly(label: &str, config: impl Fn(&str) -> String) {
    let dir = TempDir::new(label);
    dir.write("trainer.toml", &config("straight"));
    train(&dir, &[], &[]).assert_success();
    let all = names(&ckpt_dir(&dir, "straight"));
    assert_eq!(all.len(), 4, "{all:?}");

    dir.write("trainer.toml", &config("resumed"));
    // Held at the end of batch 3: after the first epoch's checkpoint, before the second's.
    let child = spawn_held_at(&dir, 3);
    let folder = ckpt_dir(&dir, "resumed");
    assert!(
        folder.join("ep1-ba2.ckpt").exists(),
        "held without the first epoch's checkpoint"
    );
    signal(&child, "-KILL");
    finish(child);
    for later in &all[1..] {
        let _ = std::fs::remove_file(folder.join(later));
    }
    let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
    out.assert_success();
    assert!(out.stderr.contains("ep1-ba2.ckpt"), "{}", out.dump());
    assert_continues(&dir, "straight", "resumed", 2);
    assert_eq!(metrics(&dir, "straight"), metrics(&dir, "resumed"));
    let evals = |run: &str| read_json(&run_dir(&dir, run).join("run.json"))["evals"].clone();
    assert_eq!(evals("straight"), evals("resumed"));
}

/// The 4-epoch airbench run with `plugin` (and the fake plugin, which sleeps when asked so the
/// run can be killed mid-way), as [`short_epochs`], `extra` appended.
pub fn resumable(run: &str, plugin: &str, settings: &str, extra: &str) -> String {
    let mut toml = airbench(run, plugin, settings).algorithm("fake_plugin", "");
    toml.max_duration = "4ep".to_owned();
    short_epochs(&toml) + extra
}
