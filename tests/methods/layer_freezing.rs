//! Integration tests of the layer_freezing plugin through the real binary, with short epochs
//! (128 synthetic samples in batches of 64: 2 batches per epoch, 4 epochs, the small CNN whose
//! layers are `features.0`, `features.1`, `features.4`, `features.5`, `classifier.1`,
//! `classifier.3`). With the defaults (start 0.5, level 1) nothing is frozen at the ends of
//! epochs 1 and 2 (elapsed 0.25, 0.5), the first 2 layers at the end of epoch 3 (int(0.5 · 5)) and
//! all but the last at the end of epoch 4: the frozen parameters leave the optimizer and stop
//! changing; a run killed before the freeze and resumed, then resumed again after it, writes the
//! straight run's checkpoints bit for bit.
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).

use std::time::Duration;

use tessera::checkpoint::Checkpoint;
use tessera_tests::resume::{
    assert_continues, ckpt_dir, finish, metrics, names, signal, spawn, wait_for,
};
use tessera_tests::*;

/// The parameters of the first two layers (the CNN's convs have no bias).
const FIRST_TWO_LAYERS: [&str; 3] = ["features.0.weight", "features.1.weight", "features.1.bias"];
const LAST_LAYER: [&str; 2] = ["classifier.3.weight", "classifier.3.bias"];

/// The 4-epoch run with layer freezing (and `extra` algorithms), a checkpoint every epoch.
fn config(run: &str, settings: &str, extra: &[&str]) -> String {
    let mut toml = TrainerToml::new(run).algorithm("layer_freezing", settings);
    for plugin in extra {
        toml = toml.algorithm(plugin, "");
    }
    toml.max_duration = "4ep".to_owned();
    short_epochs(&toml)
}

/// `toml` on 128 synthetic samples (2 batches per epoch), a checkpoint every epoch.
fn short_epochs(toml: &TrainerToml) -> String {
    toml.render()
        .replacen("dataset = \"fashion-mnist\"", "dataset = \"synthetic\"", 1)
        .replacen(
            "[data.transforms]",
            "[data.synthetic]\nsamples = 128\neval_samples = 64\n\n[data.transforms]",
            1,
        )
        + "\n[checkpoint]\ninterval = \"1ep\"\n"
}

fn read(dir: &TempDir, run: &str, name: &str) -> Checkpoint {
    Checkpoint::read(&ckpt_dir(dir, run).join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn model_tensor<'a>(c: &'a Checkpoint, name: &str) -> &'a tch::Tensor {
    c.tensor(&format!("model/{name}"))
        .unwrap_or_else(|| panic!("no model/{name}"))
}

fn changed(a: &Checkpoint, b: &Checkpoint, name: &str) -> bool {
    !model_tensor(a, name).equal(model_tensor(b, name))
}

#[test]
fn frozen_layers_leave_the_optimizer_and_stop_changing() {
    let dir = TempDir::new("lf-freeze");
    dir.write("trainer.toml", &config("f", "", &[]));
    train(&dir, &[], &[]).assert_success();
    assert_eq!(
        names(&ckpt_dir(&dir, "f")),
        [
            "ep1-ba2.ckpt",
            "ep2-ba4.ckpt",
            "ep3-ba6.ckpt",
            "ep4-ba8.ckpt"
        ]
    );
    let lines = read_jsonl(&run_dir(&dir, "f").join("metrics.jsonl"));
    let frozen: Vec<f64> = method_metric(&lines, "layer_freezing/layers_frozen")
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(frozen, [0.0, 0.0, 2.0, 5.0]);
    let percentage: Vec<f64> = method_metric(&lines, "layer_freezing/percentage_frozen")
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(percentage, [0.0, 0.0, 0.5, 1.0]);

    let [e2, e3, e4] = ["ep2-ba4.ckpt", "ep3-ba6.ckpt", "ep4-ba8.ckpt"].map(|n| read(&dir, "f", n));
    let members = |c: &Checkpoint| c.meta.optimizer.members.clone();
    let all = members(&e2);
    assert_eq!(all.len(), 10, "{all:?}");
    let after_epoch_3 = members(&e3);
    for name in FIRST_TWO_LAYERS {
        assert!(all.iter().any(|m| m == name), "{name}");
        assert!(
            !after_epoch_3.iter().any(|m| m == name),
            "{name} still trained"
        );
        // Trained during epoch 3, frozen at its end: unchanged through epoch 4.
        assert!(changed(&e2, &e3, name), "{name}");
        assert!(
            !changed(&e3, &e4, name),
            "{name} changed after it was frozen"
        );
    }
    assert_eq!(after_epoch_3.len(), 7, "{after_epoch_3:?}");
    assert!(changed(&e3, &e4, "features.4.weight"));
    assert_eq!(
        members(&e4),
        LAST_LAYER,
        "everything but the last layer frozen"
    );
    // BatchNorm statistics are buffers: a frozen BatchNorm still tracks them in training.
    assert!(changed(&e3, &e4, "features.1.running_mean"));
}

#[test]
fn killed_before_the_freeze_and_resumed_is_exact() {
    let dir = TempDir::new("lf-resume");
    let settings = "freeze_start = 0.5\nfreeze_level = 1.0";
    dir.write(
        "trainer.toml",
        &config("straight", settings, &["fake_plugin"]),
    );
    train(&dir, &[], &[]).assert_success();
    let all = names(&ckpt_dir(&dir, "straight"));
    assert_eq!(all.len(), 4, "{all:?}");

    // Killed once the first epoch's checkpoint is written; any later one removed, so the run
    // resumes from batch 2 and both freezes (ends of epochs 3 and 4) happen after the resume.
    dir.write(
        "trainer.toml",
        &config("resumed", settings, &["fake_plugin"]),
    );
    let child = spawn(&dir, &[("TESSERA_FAKE_SLEEP_MS", "300")]);
    let folder = ckpt_dir(&dir, "resumed");
    wait_for(
        "the first epoch's checkpoint",
        Duration::from_secs(120),
        || folder.join("ep1-ba2.ckpt").exists(),
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

    // Resumed again from the checkpoint written after the first freeze: the optimizer's
    // membership (and the frozen parameters' requires_grad) come back from the checkpoint.
    std::fs::remove_file(folder.join("ep4-ba8.ckpt")).expect("remove the last checkpoint");
    let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
    out.assert_success();
    assert!(out.stderr.contains("ep3-ba6.ckpt"), "{}", out.dump());
    assert_continues(&dir, "straight", "resumed", 6);
    assert_eq!(metrics(&dir, "straight"), metrics(&dir, "resumed"));
    let evals = |run: &str| read_json(&run_dir(&dir, run).join("run.json"))["evals"].clone();
    assert_eq!(evals("straight"), evals("resumed"));
}

/// EMA with layer freezing, as Composer: the average holds the parameters trainable when it
/// starts. Freezing starts at once (`freeze_start = 0`: one more layer frozen at the end of each
/// of the 5 epochs), the average at half the run — with `max_duration` in epochs the elapsed
/// fraction moves at epoch ends, so at the first batch after epoch 3 (0.6). The average never
/// holds the three layers frozen before, a frozen weight is the model's own in the checkpoints,
/// and a run resumed from a checkpoint taken after the start (whose `init` sees every parameter
/// trainable again) continues bit for bit.
#[test]
fn ema_leaves_out_layers_frozen_before_it_starts_and_resumes_exactly() {
    let dir = TempDir::new("lf-ema");
    let config = |run: &str| {
        let mut toml = TrainerToml::new(run)
            .algorithm("layer_freezing", "freeze_start = 0.0")
            .algorithm("ema", "half_life = \"2ba\"\nema_start = \"0.5dur\"");
        toml.max_duration = "5ep".to_owned();
        short_epochs(&toml)
    };
    for run in ["straight", "resumed"] {
        dir.write("trainer.toml", &config(run));
        train(&dir, &[], &[]).assert_success();
    }
    let last = read(&dir, "straight", "ep5-ba10.ckpt");
    let averaged: Vec<&str> = last
        .with_prefix("method/ema/ema/")
        .map(|(n, _)| n)
        .collect();
    // Frozen at the ends of epochs 1 to 3, before the start: left out.
    for name in [
        "features.0.weight",
        "features.1.weight",
        "features.4.weight",
    ] {
        assert!(!averaged.contains(&name), "{name}: {averaged:?}");
    }
    // Buffers are always averaged; `features.5` was frozen after the start (end of epoch 4).
    for name in ["features.1.running_mean", "features.5.weight"] {
        assert!(averaged.contains(&name), "{name}: {averaged:?}");
    }
    let first = read(&dir, "straight", "ep1-ba2.ckpt");
    let frozen_at_1 = model_tensor(&first, "features.0.weight");
    assert!(model_tensor(&last, "features.0.weight").equal(frozen_at_1));
    let members = last.meta.optimizer.members.clone();
    assert_eq!(members, LAST_LAYER, "everything but the last layer frozen");

    // Resumed from the checkpoint after the start (epoch 4).
    let folder = ckpt_dir(&dir, "resumed");
    std::fs::remove_file(folder.join("ep5-ba10.ckpt")).expect("remove the last checkpoint");
    dir.write("trainer.toml", &config("resumed"));
    let out = train(&dir, &["checkpoint.autoresume=true"], &[]);
    out.assert_success();
    assert!(out.stderr.contains("ep4-ba8.ckpt"), "{}", out.dump());
    assert_continues(&dir, "straight", "resumed", 8);
    assert_eq!(metrics(&dir, "straight"), metrics(&dir, "resumed"));
}
