//! Integration tests of the gradient_clipping plugin through the real binary (Fashion-MNIST, the
//! small CNN): clipping changes the run; with plain SGD (no momentum) the update between two
//! checkpoints is bounded as each mode says — per element by `lr · threshold` with `value`, in
//! global L2 norm equal to `lr · threshold` with `norm` — and with 2 microbatches the norm is
//! clipped once, on the summed gradient; a bad setting is refused; kill -9 and resume is exact.
//!
//! Its kill -9 resume is a row of the method table (tests/methods/table.rs).

use tessera::checkpoint::Checkpoint;
use tessera_tests::resume::ckpt_dir;
use tessera_tests::*;

const LR: f64 = 0.05;

fn clipped(run: &str, settings: &str) -> TrainerToml {
    TrainerToml::new(run).algorithm("gradient_clipping", settings)
}

/// Plain SGD (no momentum: the step is `lr · g`), 2 batches, a checkpoint after each.
fn two_steps(dir: &TempDir, toml: TrainerToml, overrides: &[&str]) -> (Checkpoint, Checkpoint) {
    let mut toml = toml;
    toml.optimizer = format!("name = \"sgd\"\nlr = {LR}\nmomentum = 0.0");
    toml.max_duration = "2ba".to_owned();
    let run = toml.run_name.clone();
    let text = format!("{}\n[checkpoint]\ninterval = \"1ba\"\n", toml.render());
    dir.write("trainer.toml", &text);
    train(dir, overrides, &[]).assert_success();
    let folder = ckpt_dir(dir, &run);
    let read =
        |name: &str| Checkpoint::read(&folder.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    (read("ep0-ba1.ckpt"), read("ep0-ba2.ckpt"))
}

/// The change of every trained parameter (weights and biases; not BatchNorm's statistics)
/// from one checkpoint to the next, as float64.
fn updates(a: &Checkpoint, b: &Checkpoint) -> Vec<(String, tch::Tensor)> {
    let out: Vec<(String, tch::Tensor)> = a
        .with_prefix("model/")
        .filter(|(name, _)| name.ends_with(".weight") || name.ends_with(".bias"))
        .map(|(name, before)| {
            let after = b
                .tensor(&format!("model/{name}"))
                .unwrap_or_else(|| panic!("{name} missing"));
            let d = after.to_kind(tch::Kind::Double) - before.to_kind(tch::Kind::Double);
            (name.to_owned(), d)
        })
        .collect();
    assert!(
        out.len() >= 8,
        "{:?}",
        out.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    out
}

fn max_abs(updates: &[(String, tch::Tensor)]) -> f64 {
    updates
        .iter()
        .map(|(_, d)| d.abs().max().double_value(&[]))
        .fold(0.0, f64::max)
}

fn l2(updates: &[(String, tch::Tensor)]) -> f64 {
    updates
        .iter()
        .map(|(_, d)| d.square().sum(tch::Kind::Double).double_value(&[]))
        .sum::<f64>()
        .sqrt()
}

fn losses(dir: &TempDir, run: &str) -> Vec<f64> {
    train_losses(&read_jsonl(&run_dir(dir, run).join("metrics.jsonl")))
}

fn run_3_batches(label: &str, toml: TrainerToml) -> Vec<f64> {
    let dir = TempDir::new(label);
    let run = toml.run_name.clone();
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let record = read_json(&run_dir(&dir, &run).join("run.json"));
    assert_eq!(record["batches"], 3, "{record:#}");
    losses(&dir, &run)
}

#[test]
fn clipping_changes_the_run() {
    let plain = run_3_batches("gc-plain", TrainerToml::new("plain"));
    for settings in [
        "clipping_type = \"norm\"\nclipping_threshold = 0.05",
        "clipping_type = \"value\"\nclipping_threshold = 0.001",
        "clipping_type = \"adaptive\"\nclipping_threshold = 0.001",
    ] {
        let with = run_3_batches("gc-clipped", clipped("clipped", settings));
        // The first loss is computed before any update: the same weights.
        assert_eq!(with[0], plain[0], "{settings}");
        assert_ne!(with[1..], plain[1..], "{settings}: {with:?} vs {plain:?}");
    }
}

#[test]
fn a_tiny_value_threshold_bounds_every_update() {
    let threshold = 1e-3;
    let dir = TempDir::new("gc-value");
    let (a, b) = two_steps(
        &dir,
        clipped(
            "value",
            &format!("clipping_type = \"value\"\nclipping_threshold = {threshold}"),
        ),
        &[],
    );
    let bound = LR * threshold;
    let clipped_max = max_abs(&updates(&a, &b));
    // Float32 rounding of `w − lr·g` adds at most half an ulp of the weight.
    assert!(
        clipped_max <= bound * (1.0 + 1e-3) + 1e-7,
        "{clipped_max} > {bound}"
    );
    assert!(
        clipped_max >= 0.5 * bound,
        "{clipped_max}: nothing was clipped?"
    );
    let (a, b) = two_steps(&dir, TrainerToml::new("plain"), &[]);
    let plain_max = max_abs(&updates(&a, &b));
    assert!(
        plain_max > 10.0 * bound,
        "plain {plain_max} vs bound {bound}"
    );
}

#[test]
fn norm_clipping_sets_the_step_length_and_microbatches_clip_the_summed_gradient() {
    let threshold = 0.1;
    let settings = format!("clipping_type = \"norm\"\nclipping_threshold = {threshold}");
    let dir = TempDir::new("gc-norm");
    let (a, b) = two_steps(&dir, TrainerToml::new("plain"), &[]);
    let plain = l2(&updates(&a, &b));
    assert!(
        plain > 2.0 * LR * threshold,
        "clipping would not act: {plain}"
    );
    // The step is lr · g · threshold / (‖g‖ + 1e-6): its length is lr · threshold.
    let expected = LR * threshold;
    let (a, b) = two_steps(&dir, clipped("whole", &settings), &[]);
    let whole = l2(&updates(&a, &b));
    assert!(
        (whole - expected).abs() <= 1e-3 * expected,
        "{whole} vs {expected}"
    );
    // Two microbatches of 32: the host sums their gradients and fires `after_train_batch` once,
    // so the clipped step has the same length. Clipping each microbatch's half would give
    // lr · threshold · ‖u₁ + u₂‖ / 2, shorter unless both gradients point the same way.
    let (a, b) = two_steps(
        &dir,
        clipped("micro", &settings),
        &["train.microbatch_size=32"],
    );
    let micro = l2(&updates(&a, &b));
    assert!(
        (micro - expected).abs() <= 1e-3 * expected,
        "{micro} vs {expected}"
    );
    assert_ne!(
        whole, micro,
        "BatchNorm sees other batches: other gradients"
    );
}

#[test]
fn a_missing_or_bad_setting_stops_the_run_naming_it() {
    let dir = TempDir::new("gc-bad");
    clipped("bad", "clipping_threshold = 1.0").write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["gradient_clipping", "clipping_type"]);
    clipped("bad", "clipping_type = \"norm\"\nclipping_threshold = -1").write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["gradient_clipping", "clipping_threshold"]);
}
