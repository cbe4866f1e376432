//! Integration tests of the lookahead plugin through the real binary, on the CPU: the MLP (and
//! the small CNN, for batch-norm buffers) on Fashion-MNIST for 8 batches, checkpointed after
//! every batch.
//!
//! The plugin logs `lookahead/syncs` at each synchronisation, `lookahead/decay` at each update
//! of airbench's variant and `lookahead/final_copy` when the slow weights go into the model at
//! the end; its state holds the slow weights as `method/lookahead/slow/<name>`. The runs check
//! the timing against the host's clock, that the slow weights are the model's right after a
//! synchronisation and do not move between two, the final copy, that frozen layers stay frozen
//! (with `layer_freezing`), that a run killed mid inner loop and resumed equals the straight run
//! bit for bit, and that 2 data-parallel ranks train what one process trains.
//! `plugins/lookahead/tests/reference.rs` checks the arithmetic against PyTorch.
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use std::path::PathBuf;

use tessera::checkpoint::Checkpoint;
use tessera_tests::dist::{assert_all_succeeded, max_difference, train_ranks};
use tessera_tests::*;

const MLP: &str = "name = \"mlp\"\nhidden = [64, 32]";

/// An 8-batch CPU run of the MLP with the lookahead plugin.
fn eight_batches(run: &str, settings: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(run).algorithm("lookahead", settings);
    toml.model = MLP.to_owned();
    toml.max_duration = "8ba".to_owned();
    toml.device = Some("cpu".to_owned());
    toml
}

/// Trains `toml` in `dir` with a checkpoint after every batch; returns the run folder.
fn train_checkpointed(dir: &TempDir, toml: &TrainerToml) -> PathBuf {
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"1ba\"\n", toml.render()),
    );
    let out = train(dir, &[], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("loaded plugin lookahead"),
        "{}",
        out.dump()
    );
    run_dir(dir, &toml.run_name)
}

fn ckpt(run: &std::path::Path, batch: u64) -> Checkpoint {
    let path = run.join("checkpoints").join(format!("ep0-ba{batch}.ckpt"));
    Checkpoint::read(&path).unwrap_or_else(|e| panic!("checkpoint at batch {batch}: {e}"))
}

/// The model's tensors `(name without "model/", tensor)`.
fn model(c: &Checkpoint) -> Vec<(String, tch::Tensor)> {
    c.tensors
        .iter()
        .filter_map(|(n, t)| n.strip_prefix("model/").map(|n| (n.to_owned(), t.copy())))
        .collect()
}

/// The slow weights of the method's state, by model name.
fn slow(c: &Checkpoint) -> Vec<(String, tch::Tensor)> {
    c.tensors
        .iter()
        .filter_map(|(n, t)| {
            n.strip_prefix("method/lookahead/slow/")
                .map(|n| (n.to_owned(), t.copy()))
        })
        .collect()
}

fn names(v: &[(String, tch::Tensor)]) -> Vec<&str> {
    v.iter().map(|(n, _)| n.as_str()).collect()
}

fn tensor<'a>(v: &'a [(String, tch::Tensor)], name: &str) -> &'a tch::Tensor {
    &v.iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no `{name}`"))
        .1
}

fn same(a: &[(String, tch::Tensor)], b: &[(String, tch::Tensor)]) -> bool {
    names(a) == names(b) && a.iter().zip(b).all(|((_, x), (_, y))| x.equal(y))
}

#[test]
fn slow_weights_sync_every_k_steps_and_go_into_the_model_at_the_end() {
    let dir = TempDir::new("lookahead-sync");
    // k = 3 in an 8-batch run: syncs at 3 and 6; the final copy at 8 puts batch 6's slow
    // weights back (8 is not a multiple of 3).
    let run = train_checkpointed(&dir, &eight_batches("sync", "k = 3\nalpha = 0.5"));
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    assert_eq!(
        method_metric(&lines, "lookahead/syncs"),
        [(3, 1.0), (6, 2.0)]
    );
    assert_eq!(method_metric(&lines, "lookahead/final_copy"), [(8, 1.0)]);
    assert!(method_metric(&lines, "lookahead/decay").is_empty());
    let c: Vec<Checkpoint> = (1..=8).map(|b| ckpt(&run, b)).collect();
    let at = |b: usize| &c[b - 1];
    // The slow weights: every trainable parameter of the MLP (no buffers), the same names.
    let params = model(at(1));
    assert!(!params.is_empty());
    assert_eq!(names(&slow(at(1))), names(&params));
    // Before the first sync they are the weights before the first step, which the first step
    // moved.
    assert!(same(&slow(at(1)), &slow(at(2))));
    assert!(!same(&slow(at(1)), &model(at(1))));
    // Right after a sync the model is the slow weights; they stay until the next one while the
    // model trains on.
    for b in [3, 6] {
        assert!(same(&slow(at(b)), &model(at(b))), "batch {b}");
        assert!(
            !same(&slow(at(b)), &slow(at(b - 1))),
            "batch {b}: not updated"
        );
        assert!(same(&slow(at(b + 1)), &slow(at(b))), "batch {}", b + 1);
        assert!(!same(&model(at(b + 1)), &model(at(b))), "batch {}", b + 1);
    }
    assert!(same(&slow(at(5)), &slow(at(3))));
    // At T the slow weights (batch 6's) replaced the model, and the method ended.
    assert!(same(&model(at(8)), &model(at(6))));
    assert!(slow(at(8)).is_empty());
    assert!(!same(&model(at(7)), &model(at(6))));
}

#[test]
fn lookahead_changes_training_and_alpha_one_does_not() {
    // α = 1 makes the slow weights the model's at every sync: with T a multiple of k the run
    // is the plain run, bit for bit (the sync touches nothing else, optimizer state included).
    let dir = TempDir::new("lookahead-alpha");
    let plain = {
        let mut toml = TrainerToml::new("plain");
        toml.model = MLP.to_owned();
        toml.max_duration = "8ba".to_owned();
        toml.device = Some("cpu".to_owned());
        toml
    };
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"8ba\"\n", plain.render()),
    );
    train(&dir, &[], &[]).assert_success();
    let plain_run = run_dir(&dir, "plain");
    let one = train_checkpointed(&dir, &eight_batches("one", "k = 4\nalpha = 1.0"));
    let half = train_checkpointed(&dir, &eight_batches("half", "k = 4\nalpha = 0.5"));
    let (p, o, h) = (ckpt(&plain_run, 8), ckpt(&one, 8), ckpt(&half, 8));
    assert!(same(&model(&p), &model(&o)));
    assert!(!same(&model(&p), &model(&h)));
    let optimizer = |c: &Checkpoint| {
        c.tensors
            .iter()
            .filter(|(n, _)| n.starts_with("optim/"))
            .map(|(n, t)| (n.clone(), t.copy()))
            .collect::<Vec<_>>()
    };
    assert!(
        !optimizer(&p).is_empty(),
        "no optimizer state in the checkpoint"
    );
    assert!(same(&optimizer(&p), &optimizer(&o)), "optimizer state");
}

/// airbench's decay `0.95^k · (t/T)^3`, in float32 as PyTorch computes it.
fn airbench_decay(k: u64, t: u64, total: u64) -> f64 {
    let x = t as f32 / total as f32;
    f64::from(x * x * x * 0.95f64.powf(k as f64) as f32)
}

#[test]
fn the_ema_variant_follows_airbenchs_schedule_over_the_runs_length() {
    let dir = TempDir::new("lookahead-ema");
    // The CNN has batch norm: its float running statistics are averaged too, not the count.
    let mut toml = eight_batches("ema", "variant = \"ema\"\nk = 3");
    toml.model = "name = \"cnn\"\nwidth = 8".to_owned();
    let run = train_checkpointed(&dir, &toml);
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    // T is the run's 8 batches.
    let decays = method_metric(&lines, "lookahead/decay");
    assert_eq!(
        decays,
        [(3, airbench_decay(3, 3, 8)), (6, airbench_decay(3, 6, 8))]
    );
    assert_eq!(method_metric(&lines, "lookahead/final_copy"), [(8, 1.0)]);
    let c3 = ckpt(&run, 3);
    let slow3 = slow(&c3);
    let model3 = model(&c3);
    assert!(names(&slow3).iter().any(|n| n.ends_with("running_mean")));
    assert!(names(&slow3).iter().any(|n| n.ends_with("running_var")));
    assert!(!names(&slow3)
        .iter()
        .any(|n| n.ends_with("num_batches_tracked")));
    for (name, t) in &slow3 {
        assert!(t.equal(tensor(&model3, name)), "{name} after the update");
    }
    // The final copy: the model at 8 is the slow weights of batch 6, buffers included; the
    // batch-norm count is the model's own.
    let (m6, m8) = (model(&ckpt(&run, 6)), model(&ckpt(&run, 8)));
    for (name, t) in &m8 {
        if name.ends_with("num_batches_tracked") {
            assert_eq!(t.int64_value(&[]), 8, "{name}");
        } else {
            assert!(t.equal(tensor(&m6, name)), "{name}");
        }
    }
}

#[test]
fn frozen_layers_stay_frozen_under_lookahead() {
    // layer_freezing on 4 epochs of 2 synthetic batches freezes the CNN's first two layers at
    // the end of epoch 3 (batch 6); lookahead syncs every step and must not move them after.
    let dir = TempDir::new("lookahead-freezing");
    let mut toml = TrainerToml::new("lf")
        .algorithm("layer_freezing", "")
        .algorithm("lookahead", "k = 1\ntotal_steps = 100");
    toml.max_duration = "4ep".to_owned();
    let text = toml
        .render()
        .replacen("dataset = \"fashion-mnist\"", "dataset = \"synthetic\"", 1)
        .replacen(
            "[data.transforms]",
            "[data.synthetic]\nsamples = 128\neval_samples = 64\n\n[data.transforms]",
            1,
        )
        + "\n[checkpoint]\ninterval = \"1ep\"\n";
    dir.write("trainer.toml", &text);
    train(&dir, &[], &[]).assert_success();
    let folder = run_dir(&dir, "lf").join("checkpoints");
    let read = |n: &str| Checkpoint::read(&folder.join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
    let (c6, c8) = (read("ep3-ba6.ckpt"), read("ep4-ba8.ckpt"));
    let (m6, m8) = (model(&c6), model(&c8));
    let first_two = ["features.0.weight", "features.1.weight", "features.1.bias"];
    for name in first_two {
        assert!(tensor(&m6, name).equal(tensor(&m8, name)), "{name} moved");
        // Tracked until the freeze, dropped at the next sync.
        assert!(names(&slow(&c6)).contains(&name), "{name}");
        assert!(!names(&slow(&c8)).contains(&name), "{name}");
    }
    for name in ["classifier.3.weight", "classifier.3.bias"] {
        assert!(
            !tensor(&m6, name).equal(tensor(&m8, name)),
            "{name} did not train"
        );
    }
    let lines = read_jsonl(&run_dir(&dir, "lf").join("metrics.jsonl"));
    assert_eq!(method_metric(&lines, "lookahead/syncs").len(), 8);
    // The run ended before T = 100: the slow weights went in at fit_end.
    assert_eq!(method_metric(&lines, "lookahead/final_copy").len(), 1);
}

#[test]
fn two_ranks_train_what_one_process_trains() {
    // 2 ranks of 64 and 1 process of 128, 3 batches, both variants: syncs at 2 and the final
    // copy at 3 happen on every rank alike (the host checks that the ranks end with the same
    // model), and the models and slow weights agree with one process's to float rounding.
    for (label, settings) in [
        ("lookahead", "k = 2\nalpha = 0.5"),
        ("ema", "variant = \"ema\"\nk = 2"),
    ] {
        let dir = TempDir::new(&format!("lookahead-dp-{label}"));
        let mut toml = TrainerToml::new("dp").algorithm("lookahead", settings);
        toml.model = MLP.to_owned();
        dir.write(
            "trainer.toml",
            &format!("{}\n[checkpoint]\ninterval = \"2ba\"\n", toml.render()),
        );
        let outputs = train_ranks(
            &dir,
            2,
            &["run_name=ranks", "data.batch_size=64", "train.threads=1"],
        );
        assert_all_succeeded(&outputs);
        train(
            &dir,
            &["run_name=one", "data.batch_size=128", "train.threads=1"],
            &[],
        )
        .assert_success();
        let lines = read_jsonl(&run_dir(&dir, "ranks").join("metrics.jsonl"));
        assert_eq!(
            method_metric(&lines, "lookahead/syncs"),
            [(2, 1.0)],
            "{label}"
        );
        let ckpt = |run: &str, name: &str| run_dir(&dir, run).join("checkpoints").join(name);
        for name in ["ep0-ba2.ckpt", "ep0-ba3.ckpt"] {
            let (diff, at) = max_difference(
                &ckpt("ranks", name),
                &ckpt("one", name),
                &["model/", "method/"],
            );
            assert!(diff <= 1e-6, "{label} {name}: differ by {diff:e} at `{at}`");
        }
        let c2 = Checkpoint::read(&ckpt("ranks", "ep0-ba2.ckpt")).expect("ba2");
        assert!(!slow(&c2).is_empty(), "{label}: no slow weights saved");
    }
}
