//! MixUp against Composer's golden outputs (`tests/golden/mixup.*`).
//!
//! Everything is read from the JSON and safetensors files. Composer's draws (numpy's Beta,
//! torch's `randperm`) cannot be reproduced, so the recorded mixing and permutations are fed
//! into the functional form and must give Composer's mixed inputs, targets and losses; the
//! method's own Beta draws are checked against the recorded statistics of Composer's draws.

use mixup::{mix_losses, mix_targets, mixing_coefficient, mixup_batch, MixUp};
use tessera_plugin_api::tch::{Kind, Reduction, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, keys, Context, ErrorKind, Event, Hook, Plugin};

const CASE: &str = "mixup";

fn result(g: &Golden, name: &str) -> f64 {
    g.json["results"][name]
        .as_f64()
        .unwrap_or_else(|| panic!("results.{name} is not a number"))
}

/// `F.cross_entropy(logits, index_target)`.
fn cross_entropy(logits: &Tensor, target: &Tensor) -> Tensor {
    logits.cross_entropy_loss::<Tensor>(target, None, Reduction::Mean, -100, 0.0)
}

/// Composer's `soft_cross_entropy` for rows that sum to one: `mean(−Σ t·log_softmax)`.
fn soft_cross_entropy(logits: &Tensor, target: &Tensor) -> Tensor {
    (logits.log_softmax(1, Kind::Float) * target)
        .sum_dim_intlist(1, false, Kind::Float)
        .neg()
        .mean(Kind::Float)
}

/// The number of classes: the JSON's, which must be the logits' width.
fn num_classes(g: &Golden) -> i64 {
    let c = g.json["hyperparameters"]["num_classes"]
        .as_i64()
        .expect("hyperparameters.num_classes");
    assert_eq!(g.tensor("logits").size()[1], c);
    c
}

#[test]
fn explicit_mixing_and_permutation_give_composers_outputs() {
    let g = Golden::load(CASE);
    let mixing = g.json["hyperparameters"]["mixing"]
        .as_f64()
        .expect("hyperparameters.mixing");
    assert_eq!(result(&g, "returned_mixing"), mixing);
    let (x, y, idx) = (g.tensor("input"), g.tensor("target"), g.tensor("indices"));
    let (mixed, y_perm) = mixup_batch(x, y, mixing, idx).unwrap();
    assert_close("x_mixed", &mixed, g.tensor("x_mixed"), 1e-6, 1e-6);
    assert!(y_perm.equal(g.tensor("target_perm")), "target_perm");

    let logits = g.tensor("logits");
    num_classes(&g);
    let target = mix_targets(logits, y, &y_perm, mixing).unwrap();
    assert_close(
        "mixed_target",
        &target,
        g.tensor("mixed_target"),
        1e-6,
        1e-7,
    );
    let loss = mix_losses(
        &cross_entropy(logits, y),
        &cross_entropy(logits, &y_perm),
        mixing,
    )
    .unwrap();
    assert_close("loss_mixed", &loss, g.tensor("loss_mixed"), 1e-6, 1e-7);
    // Invariant: cross-entropy is linear in the target, so both modes give the same loss.
    assert_close(
        "soft CE on mixed_target",
        &soft_cross_entropy(logits, &target),
        g.tensor("loss_mixed"),
        1e-6,
        1e-7,
    );
}

#[test]
fn recorded_algorithm_draw_gives_composers_outputs() {
    let g = Golden::load(CASE);
    let mixing = result(&g, "alg_drawn_mixing");
    let (x, y, logits) = (g.tensor("input"), g.tensor("target"), g.tensor("logits"));
    let perm = g.tensor("alg/drawn_indices");
    let (mixed, y_perm) = mixup_batch(x, y, mixing, perm).unwrap();
    assert_close("alg/x_mixed", &mixed, g.tensor("alg/x_mixed"), 1e-6, 1e-6);
    let target = mix_targets(logits, y, &y_perm, mixing).unwrap();
    assert_close(
        "alg/mixed_target",
        &target,
        g.tensor("alg/mixed_target"),
        1e-6,
        1e-7,
    );
    assert_close(
        "alg/loss_target_mixing",
        &soft_cross_entropy(logits, &target),
        g.tensor("alg/loss_target_mixing"),
        1e-6,
        1e-7,
    );
    let interpolated = mix_losses(
        &cross_entropy(logits, y),
        &cross_entropy(logits, &y_perm),
        mixing,
    )
    .unwrap();
    assert_close(
        "alg/loss_interpolated",
        &interpolated,
        g.tensor("alg/loss_interpolated"),
        1e-6,
        1e-7,
    );
    assert_eq!(
        g.json["results"]["alg_interpolated_equals_target_mixing"],
        true
    );
}

/// `n` mixing coefficients drawn as the method draws them, from a host seeded with `seed`.
fn draws(alpha: f64, n: usize, seed: u64) -> Vec<f64> {
    let mut host = TestHost::new(RandomSource::Seeded(seed));
    // SAFETY: the handle is used only while `host` is borrowed here.
    let mut ctx = unsafe { Context::from_host(host.handle()) };
    (0..n)
        .map(|_| mixing_coefficient(alpha, |a, b| ctx.rng_beta(a, b)))
        .collect()
}

#[test]
fn mixing_coefficients_follow_composers_distribution() {
    let g = Golden::load(CASE);
    let stats = &g.json["results"]["mixing_coef_alpha0p2_stats"];
    let stat = |k: &str| stats[k].as_f64().unwrap_or_else(|| panic!("stats.{k}"));
    let n = stat("n") as usize;
    let m = draws(0.2, n, 11);
    // Invariant: m = min(z, 1 − z) lies in [0, 0.5].
    assert!(
        m.iter().all(|v| (0.0..=0.5).contains(v)),
        "m outside [0, 0.5]"
    );
    // Means: both are averages of n draws, so their difference has standard error
    // sd·sqrt(2/n); allow 5 of them.
    let mean = m.iter().sum::<f64>() / n as f64;
    let var = m.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n as f64 - 1.0);
    let tol = 5.0 * (var * 2.0 / n as f64).sqrt();
    assert!(
        (mean - stat("mean")).abs() < tol,
        "mean {mean} vs Composer's {} (tolerance {tol})",
        stat("mean")
    );
    // Medians: the share of our draws below Composer's median is 1/2 up to the binomial error
    // of both samples, sqrt(2 · 0.25/n); allow 5 of them.
    let below = m.iter().filter(|&&v| v < stat("q50")).count() as f64 / n as f64;
    let tol = 5.0 * (0.5 / n as f64).sqrt();
    assert!(
        (below - 0.5).abs() < tol,
        "{below} of the draws below Composer's median {} (tolerance {tol})",
        stat("q50")
    );
    // The extremes: alpha = 0.2 puts much mass near 0 and some near 0.5, so n draws reach
    // within a small distance of both ends, as Composer's did.
    let (lo, hi) = m
        .iter()
        .fold((1.0f64, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
    assert!(
        lo < 1e-6 && stat("min") < 1e-6,
        "min {lo} vs {}",
        stat("min")
    );
    assert!(
        0.5 - hi < 1e-3 && 0.5 - stat("max") < 1e-3,
        "max {hi} vs {}",
        stat("max")
    );
    // alpha = 0: no mixing, and no draw.
    assert_eq!(
        mixing_coefficient(0.0, |_, _| panic!("drew for alpha = 0")),
        result(&g, "mixing_coef_alpha0")
    );
}

#[test]
fn the_same_seed_draws_the_same_coefficients() {
    assert_eq!(draws(0.2, 100, 5), draws(0.2, 100, 5));
    assert_ne!(draws(0.2, 100, 5), draws(0.2, 100, 6));
}

// ------------------------------------------------------------------------------------------
// The method, driven through its events
// ------------------------------------------------------------------------------------------

fn method(json: &str) -> tessera_plugin_api::abi::MethodBox {
    boxed_method::<MixUp>(&settings(json)).unwrap_or_else(|e| panic!("{json}: {e}"))
}

#[test]
fn hooks_defaults_and_bad_settings() {
    assert_eq!(MixUp::NAME, "mixup");
    assert_eq!(
        MixUp::hooks(),
        vec![
            Hook::at(Event::BEFORE_FORWARD),
            Hook::at(Event::BEFORE_LOSS),
            Hook::at(Event::BEFORE_BACKWARD)
        ]
    );
    // Composer's defaults: alpha 0.2, interpolate_loss False.
    let defaults: serde_json::Value =
        serde_json::from_str(&default_settings_json(MixUp::DEFAULT_SETTINGS)).unwrap();
    assert_eq!(
        defaults,
        serde_json::json!({"alpha": 0.2, "interpolate_loss": false})
    );
    for (json, fragment) in [
        (r#"{"alpha": -0.1}"#, "`alpha` must be a finite number >= 0"),
        (r#"{"alpha": "big"}"#, "setting `alpha` must be a number"),
        (r#"{"interpolate_loss": 1}"#, "interpolate_loss"),
        (r#"{"alpah": 0.2}"#, "alpah"),
    ] {
        let err = match boxed_method::<MixUp>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{json}: {err}");
        assert!(err.message().contains(fragment), "{json}: {err}");
    }
}

/// Runs `before_forward` and `before_loss` on the golden batch with a host seeded by `seed`;
/// returns the host.
fn run_method(g: &Golden, settings_json: &str, seed: u64) -> TestHost {
    let mut m = method(settings_json);
    let mut host = TestHost::new(RandomSource::Seeded(seed))
        .with(keys::INPUT, g.tensor("input"))
        .with(keys::TARGET, g.tensor("target"));
    host.fire(&mut m, Event::BEFORE_FORWARD).unwrap();
    host.tensors
        .insert(keys::OUTPUT.to_owned(), g.tensor("logits").copy());
    host.fire(&mut m, Event::BEFORE_LOSS).unwrap();
    host
}

#[test]
fn method_mixes_inputs_and_targets_with_its_own_draw() {
    let g = Golden::load(CASE);
    let (x, y, logits) = (g.tensor("input"), g.tensor("target"), g.tensor("logits"));
    let seed = 21;
    let host = run_method(&g, r#"{"alpha": 1.0}"#, seed);
    // Replay the host's stream: the coefficient first, then the permutation.
    let mut replay = TestHost::new(RandomSource::Seeded(seed));
    // SAFETY: the handle is used only while `replay` is borrowed here.
    let mut ctx = unsafe { Context::from_host(replay.handle()) };
    let mixing = mixing_coefficient(1.0, |a, b| ctx.rng_beta(a, b));
    let perm = Tensor::from_slice(&ctx.rng_permutation(x.size()[0] as usize));
    assert_eq!(host.metric("mixup/mixing"), vec![mixing]);
    assert!(mixing > 0.0 && mixing <= 0.5, "{mixing}");
    let (want_x, y_perm) = mixup_batch(x, y, mixing, &perm).unwrap();
    assert!(host.get(keys::INPUT).equal(&want_x), "mixed input");
    let want_t = mix_targets(logits, y, &y_perm, mixing).unwrap();
    assert!(host.get(keys::TARGET).equal(&want_t), "mixed target");
    // Each mixed row is a distribution weighing the sample's own class by at least 1 − m.
    let own = want_t.gather(1, &y.unsqueeze(1), false);
    assert!(own.ge(1.0 - mixing - 1e-6).all().int64_value(&[]) == 1);

    // Same seed, same batch; another seed mixes differently.
    assert!(run_method(&g, r#"{"alpha": 1.0}"#, seed)
        .get(keys::INPUT)
        .equal(host.get(keys::INPUT)));
    assert!(!run_method(&g, r#"{"alpha": 1.0}"#, seed + 1)
        .get(keys::INPUT)
        .equal(host.get(keys::INPUT)));
}

#[test]
fn alpha_zero_leaves_the_batch_as_it_was() {
    let g = Golden::load(CASE);
    let host = run_method(&g, r#"{"alpha": 0.0}"#, 3);
    assert_eq!(host.metric("mixup/mixing"), vec![0.0]);
    assert!(host.get(keys::INPUT).equal(g.tensor("input")));
    let one_hot = g
        .tensor("target")
        .one_hot(num_classes(&g))
        .to_kind(Kind::Float);
    assert!(host.get(keys::TARGET).equal(&one_hot));
}

#[test]
fn interpolate_loss_leaves_targets_and_needs_the_host_loss() {
    // With interpolate_loss the target is not touched at before_loss; before_backward asks the
    // host for the loss against the permuted targets (the test host has no model: the error
    // names the missing service; the binary-level test runs it for real).
    let g = Golden::load(CASE);
    let mut m = method(r#"{"interpolate_loss": true}"#);
    let mut host = TestHost::new(RandomSource::Seeded(1))
        .with(keys::INPUT, g.tensor("input"))
        .with(keys::TARGET, g.tensor("target"))
        .with(keys::OUTPUT, g.tensor("logits"))
        .with(keys::LOSS, &Tensor::from(1.0f32));
    host.fire(&mut m, Event::BEFORE_FORWARD).unwrap();
    host.fire(&mut m, Event::BEFORE_LOSS).unwrap();
    assert!(host.get(keys::TARGET).equal(g.tensor("target")));
    let err = host.fire(&mut m, Event::BEFORE_BACKWARD).unwrap_err();
    assert!(err.contains("loss"), "{err}");
    // Without a draw (no before_forward) the method says so.
    let mut fresh = method("{}");
    let err = host.fire(&mut fresh, Event::BEFORE_LOSS).unwrap_err();
    assert!(err.contains("before_forward"), "{err}");
}
