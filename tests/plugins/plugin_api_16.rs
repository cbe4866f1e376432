//! plugin-api 1.6 through the real binary, with the `fake_plugin` fixture's 1.6 modes: a method
//! that takes over the update of the parameters it claims (`claim_parameters`, the
//! `optimizer_step` event, `step_info`, `found_inf`), parameter groups read and changed by a
//! method, training samples at `init`, evaluation outputs replaced by a method (`forward_eval`),
//! and per-sample transforms told which sample they transform.

use serde_json::Value;
use tessera_tests::*;

/// The CNN on Fashion-MNIST with plain SGD (no momentum), 6 batches, an evaluation at the end,
/// and the fake plugin.
fn config(run: &str) -> TrainerToml {
    let mut t = TrainerToml::new(run).algorithm("fake_plugin", "");
    t.optimizer = "name = \"sgd\"\nlr = 0.05\nmomentum = 0.0".into();
    t.max_duration = "6ba".into();
    t
}

/// Trains `toml` in `dir` with `env`; returns run.json and the metrics lines.
fn run(dir: &TempDir, toml: &TrainerToml, env: &[(&str, &str)]) -> (Value, Vec<Value>) {
    toml.write_to(dir);
    train(dir, &[], env).assert_success();
    let folder = run_dir(dir, &toml.run_name);
    (
        read_json(&folder.join("run.json")),
        read_jsonl(&folder.join("metrics.jsonl")),
    )
}

fn final_eval(record: &Value, what: &str) -> f64 {
    record["evals"]
        .as_array()
        .and_then(|e| e.last())
        .and_then(|e| e[what].as_f64())
        .unwrap_or_else(|| panic!("no final evaluation {what} in {record:#}"))
}

/// Relative difference of two numbers.
fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn a_method_that_claims_parameters_updates_them_and_the_host_leaves_them_alone() {
    require_fashion_mnist();
    let dir = TempDir::new("claims");
    let (host, host_lines) = run(&dir, &config("host"), &[]);
    let host_losses = train_losses(&host_lines);
    assert!(host_losses.len() >= 2, "{host_lines:?}");
    // The plugin steps every parameter with plain SGD at the step's rate: the run follows the
    // host's own SGD (up to the rounding of a fused multiply-add in libtorch's kernel). Were
    // the host still stepping them too, each step would be twice as long; were the plugin not
    // called, the model would not move.
    for filter in ["", "conv"] {
        let label = if filter.is_empty() { "all" } else { "conv" };
        let (mine, lines) = run(&dir, &config(label), &[("TESSERA_FAKE_SGD", filter)]);
        let losses = train_losses(&lines);
        assert_eq!(losses.len(), host_losses.len());
        for (a, b) in losses.iter().zip(&host_losses) {
            assert!(
                rel(*a, *b) < 1e-4,
                "{label}: losses {losses:?} vs {host_losses:?}"
            );
        }
        let (a, b) = (
            final_eval(&mine, "cross_entropy"),
            final_eval(&host, "cross_entropy"),
        );
        assert!(rel(a, b) < 1e-4, "{label}: eval {a} vs {b}");
    }
    // A run where nobody updates the claimed parameters is refused before training.
    let toml = config("nohook");
    toml.write_to(&dir);
    train(
        &dir,
        &[],
        &[("TESSERA_FAKE_SGD", ""), ("TESSERA_FAKE_SGD_NO_HOOK", "1")],
    )
    .assert_failure(&["fake_plugin", "does not hook `optimizer_step`"]);
}

#[test]
fn a_method_reads_and_sets_the_parameter_groups() {
    require_fashion_mnist();
    let dir = TempDir::new("groups");
    let mut half = config("half-lr");
    half.optimizer = "name = \"sgd\"\nlr = 0.025\nmomentum = 0.0".into();
    let (reference, ref_lines) = run(&dir, &half, &[]);
    // The default group's multiplier set to 0.5 at `fit_start`: the run of half the rate.
    let (mine, lines) = run(&dir, &config("mult"), &[("TESSERA_FAKE_GROUPS", "0.5")]);
    assert_eq!(train_losses(&lines), train_losses(&ref_lines));
    assert_eq!(
        final_eval(&mine, "cross_entropy").to_bits(),
        final_eval(&reference, "cross_entropy").to_bits()
    );
    let params = method_metric(&lines, "fake_plugin/group_default_params");
    let trainable = mine["model"]["trainable_parameters"].as_u64();
    assert_eq!(params.len(), 1, "{lines:?}");
    assert!(params[0].1 >= 2.0, "{params:?}");
    if let Some(n) = trainable {
        assert!(params[0].1 <= n as f64);
    }
    assert_eq!(
        method_metric(&lines, "fake_plugin/group_default_lr_multiplier"),
        [(0, 1.0)]
    );
}

#[test]
fn training_samples_at_init_do_not_move_the_loader() {
    require_fashion_mnist();
    let dir = TempDir::new("sample");
    let (_, plain) = run(&dir, &config("plain"), &[]);
    let (_, lines) = run(&dir, &config("sampled"), &[("TESSERA_FAKE_SAMPLE", "100")]);
    assert_eq!(train_losses(&lines), train_losses(&plain));
    assert_eq!(
        method_metric(&lines, "fake_plugin/sample_input_rows"),
        [(0, 100.0)]
    );
    assert_eq!(
        method_metric(&lines, "fake_plugin/sample_target_rows"),
        [(0, 100.0)]
    );
    // Labels are classes 0..9: their sum is a number of that order, the same in every run.
    let sum = method_metric(&lines, "fake_plugin/sample_target_sum");
    assert!(sum[0].1 > 0.0 && sum[0].1 <= 900.0, "{sum:?}");
    let (_, again) = run(&dir, &config("again"), &[("TESSERA_FAKE_SAMPLE", "100")]);
    assert_eq!(
        method_metric(&again, "fake_plugin/sample_input_sum"),
        method_metric(&lines, "fake_plugin/sample_input_sum")
    );
}

#[test]
fn evaluation_scores_the_output_a_method_leaves() {
    require_fashion_mnist();
    let dir = TempDir::new("eval-output");
    let (plain, _) = run(&dir, &config("plain"), &[]);
    // `forward_eval` is the evaluation's own forward: the same scores.
    let (same, _) = run(
        &dir,
        &config("same"),
        &[("TESSERA_FAKE_EVAL_OUTPUT", "eval_forward")],
    );
    for what in ["cross_entropy", "accuracy"] {
        assert_eq!(
            final_eval(&same, what).to_bits(),
            final_eval(&plain, what).to_bits(),
            "{what}"
        );
    }
    // All-zero logits: the cross-entropy of a uniform guess over 10 classes.
    let (zeros, _) = run(
        &dir,
        &config("zeros"),
        &[("TESSERA_FAKE_EVAL_OUTPUT", "zeros")],
    );
    let ce = final_eval(&zeros, "cross_entropy");
    assert!((ce - 10f64.ln()).abs() < 1e-6, "{ce}");
}

#[test]
fn per_sample_transforms_are_told_which_sample_of_which_epoch() {
    require_fashion_mnist();
    let dir = TempDir::new("places");
    let places = dir.path().join("places");
    std::fs::create_dir_all(&places).unwrap();
    let mut toml =
        TrainerToml::new("places").algorithm("fake_plugin", "sample_transform = \"invert\"");
    toml.max_duration = "2ba".into();
    let places_env = places.to_string_lossy().into_owned();
    run(&dir, &toml, &[("TESSERA_FAKE_PLACES_DIR", &places_env)]);
    let mut seen: Vec<(u64, u64)> = std::fs::read_dir(&places)
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let (e, i) = name
                .strip_prefix('e')
                .and_then(|r| r.split_once("-i"))
                .unwrap_or_else(|| panic!("{name}"));
            (e.parse().unwrap(), i.parse().unwrap())
        })
        .collect();
    seen.sort();
    // At least the two batches trained on (the loader may prepare more ahead), all of epoch
    // 0, indices of the 60000 training images, not positions 0..n of the shuffled order.
    assert!(seen.len() >= 128, "{}", seen.len());
    assert!(seen.iter().all(|&(e, i)| e == 0 && i < 60_000));
    let positions = seen.iter().filter(|&&(_, i)| i < seen.len() as u64).count();
    assert!(
        positions < seen.len() / 2,
        "indices look like positions: {seen:?}"
    );
}
