//! Integration tests of the swa plugin through the real binary: 8 batches of Fashion-MNIST on
//! the CPU (deterministic), with `swa_start`/`swa_end` as fractions of that run.
//!
//! The plugin logs `swa/n_averaged` at each update, `swa/lr` at each `SWALR` step and
//! `swa/replaced` when the average goes into the model. The runs check the timing, the rates
//! the optimizer really used (the `lr` of the train lines is the next step's rate), that the
//! model after the replacement is the mean of the checkpointed weights at the updates, and that
//! a run killed inside the annealing window and resumed equals the straight run bit for bit.
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use tessera::checkpoint::Checkpoint;
use tessera_tests::*;

/// The plain SGD rate of [`TrainerToml::new`].
const LR: f64 = 0.05;

/// An 8-batch CPU run with the swa plugin.
fn eight_batches(run: &str, settings: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(run).algorithm("swa", settings);
    toml.max_duration = "8ba".to_owned();
    toml.device = Some("cpu".to_owned());
    toml
}

/// The `(batch, lr)` of every train line.
fn train_lrs(lines: &[serde_json::Value]) -> Vec<(u64, f64)> {
    lines_of_kind(lines, "train")
        .iter()
        .map(|l| {
            (
                l["data"]["batch"].as_u64().expect("batch"),
                l["data"]["lr"].as_f64().expect("lr"),
            )
        })
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1e-300)
}

#[test]
fn the_model_after_swa_end_is_the_mean_of_the_weights_at_the_updates() {
    let dir = TempDir::new("swa-mean");
    // Start at batch 2 (0.25 of 8), every 2 batches: updates at 2, 4, 6; end at batch 7.
    let toml = eight_batches(
        "mean",
        "swa_start = \"0.25dur\"\nswa_end = \"0.875dur\"\nupdate_interval = \"2ba\"",
    );
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"1ba\"\n", toml.render()),
    );
    let out = train(&dir, &[], &[]);
    out.assert_success();
    assert!(out.stderr.contains("loaded plugin swa"), "{}", out.dump());
    let run = run_dir(&dir, "mean");
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    assert_eq!(
        method_metric(&lines, "swa/n_averaged"),
        vec![(2, 1.0), (4, 2.0), (6, 3.0)]
    );
    assert_eq!(method_metric(&lines, "swa/replaced"), vec![(7, 1.0)]);
    assert!(method_metric(&lines, "swa/lr").is_empty());
    // Without `schedule_swa_lr` the rate is the optimizer's throughout.
    assert!(train_lrs(&lines).iter().all(|(_, lr)| *lr == LR));

    let ckpt = |b: u64| {
        Checkpoint::read(&run.join("checkpoints").join(format!("ep0-ba{b}.ckpt")))
            .unwrap_or_else(|e| panic!("checkpoint at batch {b}: {e}"))
    };
    let (c2, c4, c6, c7) = (ckpt(2), ckpt(4), ckpt(6), ckpt(7));
    let mut params = 0;
    for (name, t7) in c7.tensors.iter().filter(|(n, _)| n.starts_with("model/")) {
        let at = |c: &Checkpoint| c.tensor(name).expect(name).shallow_clone();
        let buffer = name.contains("running_") || name.ends_with("num_batches_tracked");
        if buffer {
            // Buffers are not averaged: the live ones at the last update (batch 6).
            assert!(t7.equal(&at(&c6)), "{name}: not batch 6's buffer");
            continue;
        }
        params += 1;
        let mean = (at(&c2) + at(&c4) + at(&c6)) / 3.0;
        let err = (t7 - &mean).abs().max().double_value(&[]);
        let scale = mean.abs().max().double_value(&[]).max(1e-6);
        assert!(err <= 1e-6 * scale, "{name}: |model − mean| = {err:e}");
        assert!(!t7.equal(&at(&c6)), "{name}: still the trained weights");
        // The method state's average is what went into the model.
        let avg = c7
            .tensor(&format!("method/swa/average/{}", &name["model/".len()..]))
            .unwrap_or_else(|| panic!("no average of {name}"));
        assert!(
            avg.equal(t7),
            "{name}: the saved average differs from the model"
        );
    }
    assert!(params > 0, "no parameters in the checkpoint");
    // Training goes on from the average: batch 8 changes the weights again.
    let c8 = ckpt(8);
    let moved = c7
        .tensors
        .iter()
        .filter(|(n, _)| n.starts_with("model/") && n.ends_with("weight"))
        .any(|(n, t)| !c8.tensor(n).expect(n).equal(t));
    assert!(moved, "batch 8 did not train");
}

#[test]
fn hold_mode_anneals_to_swa_lr_and_holds_it() {
    let dir = TempDir::new("swa-hold");
    // Updates at batches 2..6, annealed over 4 of them: 0.05 → 0.01 linearly.
    let toml = eight_batches(
        "hold",
        "swa_start = \"0.25dur\"\nswa_end = \"0.75dur\"\nupdate_interval = \"1ba\"\n\
         schedule_swa_lr = true\nanneal_steps = 4\nswa_lr = 0.01\nswa_lr_mode = \"hold\"",
    );
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let lines = read_jsonl(&run_dir(&dir, "hold").join("metrics.jsonl"));
    let swa_lr = 0.01;
    let annealed = |k: u64| {
        let a = (k as f64 / 4.0).min(1.0);
        swa_lr * a + LR * (1.0 - a)
    };
    let logged = method_metric(&lines, "swa/lr");
    assert_eq!(
        logged.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        [2, 3, 4, 5, 6]
    );
    for (k, (b, lr)) in logged.iter().enumerate() {
        assert!(close(*lr, annealed(k as u64 + 1)), "batch {b}: {lr}");
    }
    // The next step's rate, from the train lines: the optimizer's before the start, then the
    // annealed rate, then `swa_lr` to the end (after the replacement too).
    for (b, lr) in train_lrs(&lines) {
        let want = if b < 2 { LR } else { annealed(b - 1) };
        assert!(close(lr, want), "after batch {b}: {lr}, want {want}");
    }
    assert_eq!(method_metric(&lines, "swa/replaced"), vec![(6, 1.0)]);
}

#[test]
fn composer_mode_sets_only_the_step_after_each_update() {
    let dir = TempDir::new("swa-composer");
    // A linear schedule 1 → 0.2 over the run; the target is the schedule's rate at batch 2.
    let mut toml = eight_batches(
        "composer",
        "swa_start = \"0.25dur\"\nswa_end = \"0.75dur\"\nupdate_interval = \"2ba\"\n\
         schedule_swa_lr = true\nanneal_steps = 2\nanneal_strategy = \"cos\"",
    );
    toml.optimizer
        .push_str("\n\n[scheduler]\nname = \"linear\"\nalpha_i = 1.0\nalpha_f = 0.2\n");
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let lines = read_jsonl(&run_dir(&dir, "composer").join("metrics.jsonl"));
    // The schedule's rate for the step after batch b: stepped at b − 1 finished batches.
    let scheduled = |b: u64| LR * (1.0 - 0.8 * (b - 1) as f64 / 8.0);
    let swa_lr = scheduled(2);
    let logged = method_metric(&lines, "swa/lr");
    assert_eq!(
        logged.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        [2, 4, 6]
    );
    for (b, lr) in train_lrs(&lines) {
        let want = match logged.iter().find(|(u, _)| *u == b) {
            // SWALR set this step's rate; the cos annealing towards the starting rate reaches
            // it again after 2 steps, so every SWALR rate is swa_lr.
            Some(_) => swa_lr,
            None => scheduled(b),
        };
        assert!(
            (lr - want).abs() <= 1e-12 * want,
            "after batch {b}: {lr}, want {want}"
        );
    }
    for (_, lr) in &logged {
        assert!((lr - swa_lr).abs() <= 1e-12 * swa_lr, "{logged:?}");
    }
}
