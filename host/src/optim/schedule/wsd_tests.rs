//! Tests of warmup-stable-decay: defaults and boundaries, its shapes at every batch, epochs and
//! samples, the scale-schedule ratio, errors, round trips.

use super::tests::{assert_curve, at_batch, parse, run, t, EPS};
use super::*;

/// `warmup_stable_decay` from its definition, in plain numbers: `w` warmup steps, `m` steps in
/// all, the cooldown over the last `round(f·m)` of them to `alpha_f` with shape `s(p)`.
fn wsd(t: u64, w: u64, m: u64, f: f64, alpha_f: f64, shape: &str) -> f64 {
    if t < w {
        return t as f64 / w as f64;
    }
    let d = (f * m as f64).round() as u64;
    let start = m - d;
    if t < start || d == 0 {
        return 1.0;
    }
    let p = ((t - start) as f64 / d as f64).min(1.0);
    let s = match shape {
        "linear" => 1.0 - p,
        "sqrt" => 1.0 - p.sqrt(),
        "cosine" => 0.5 * (1.0 + (PI * p).cos()),
        other => panic!("{other}"),
    };
    alpha_f + (1.0 - alpha_f) * s
}

#[test]
fn warmup_stable_decay_defaults_and_boundaries() {
    let r = run("1000ba", 100, 32);
    let s = parse("name = \"warmup_stable_decay\"\nt_warmup = \"100ba\"");
    assert_eq!(
        s,
        Schedule::WarmupStableDecay {
            t_warmup: t("100ba"),
            decay_fraction: 0.2,
            alpha_f: 0.0,
            decay_shape: DecayShape::Linear,
            t_max: t("1dur"),
        }
    );
    // Warmup 0 → 1 over 100 batches, 1 until 800 (the last 20 % of 1000), linear to 0 at 1000.
    assert_curve(
        &s,
        &r,
        1.0,
        &[
            (0, 0.0),
            (1, 0.01),
            (50, 0.5),
            (99, 0.99),
            (100, 1.0),
            (101, 1.0),
            (500, 1.0),
            (799, 1.0),
            (800, 1.0),
            (801, 1.0 - 1.0 / 200.0),
            (900, 0.5),
            (950, 0.25),
            (999, 1.0 / 200.0),
            (1000, 0.0),
            (1500, 0.0),
        ],
    );
}

#[test]
fn warmup_stable_decay_shapes_follow_their_definition_at_every_batch() {
    let r = run("1000ba", 100, 32);
    for (shape, f, alpha_f, warmup) in [
        ("linear", 0.2, 0.0, 100),
        ("sqrt", 0.2, 0.0, 100),
        ("cosine", 0.2, 0.0, 100),
        // modded-nanogpt's long cooldown to a floor, without warmup.
        ("linear", 0.6, 0.15, 0),
        ("sqrt", 0.5, 0.1, 10),
        ("cosine", 0.33, 0.05, 1),
        // No cooldown: constant after the warmup; all cooldown: from the end of the warmup.
        ("linear", 0.0, 0.0, 50),
        ("sqrt", 1.0, 0.0, 0),
    ] {
        let text = format!(
            "name = \"warmup_stable_decay\"\nt_warmup = \"{warmup}ba\"\ndecay_fraction = {f}\n\
             alpha_f = {alpha_f}\ndecay_shape = \"{shape}\""
        );
        let s = parse(&text);
        let points: Vec<(u64, f64)> = (0..=1100)
            .map(|b| (b, wsd(b, warmup, 1000, f, alpha_f, shape)))
            .collect();
        assert_curve(&s, &r, 1.0, &points);
    }
    // Inside each phase, by hand: sqrt at a quarter of a 500-batch cooldown to 0.1 is
    // 0.1 + 0.9·(1 − ½); cosine at its middle is half-way to the floor.
    let s = parse(
        "name = \"warmup_stable_decay\"\nt_warmup = \"0ba\"\ndecay_fraction = 0.5\n\
         alpha_f = 0.1\ndecay_shape = \"sqrt\"",
    );
    assert_curve(
        &s,
        &r,
        1.0,
        &[
            (0, 1.0),
            (499, 1.0),
            (500, 1.0),
            (625, 0.55),
            (750, 0.1 + 0.9 * (1.0 - 0.5f64.sqrt())),
            (1000, 0.1),
        ],
    );
    let s = parse(
        "name = \"warmup_stable_decay\"\nt_warmup = \"0ba\"\nalpha_f = 0.2\n\
         decay_shape = \"cosine\"",
    );
    assert_curve(&s, &r, 1.0, &[(800, 1.0), (900, 0.6), (1000, 0.2)]);
}

#[test]
fn warmup_stable_decay_in_epochs_and_samples() {
    // 10 epochs of 100 batches: t_warmup = 1ep is 100 batches, 1dur 1000 batches.
    let r = run("10ep", 100, 32);
    let s = parse("name = \"warmup_stable_decay\"\nt_warmup = \"1ep\"\ndecay_fraction = 0.3");
    assert_curve(
        &s,
        &r,
        1.0,
        &[
            (50, 0.5),
            (100, 1.0),
            (699, 1.0),
            (700, 1.0),
            (850, 0.5),
            (1000, 0.0),
        ],
    );
    // A run in samples progresses per sample (at_batch: 32 samples a batch).
    let r = run("32000sp", 100, 32);
    let s = parse("name = \"warmup_stable_decay\"\nt_warmup = \"3200sp\"");
    assert_curve(
        &s,
        &r,
        1.0,
        &[(50, 0.5), (100, 1.0), (900, 0.5), (1000, 0.0)],
    );
}

#[test]
fn warmup_stable_decay_respects_scale_schedule_ratio() {
    // The run and t_max (1dur) halve; the warmup does not (Composer's scale_warmup=False); the
    // cooldown is the last 20 % of the scaled run.
    let base = run("1000ba", 100, 32);
    let r = match base.scaled(0.5) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    let s = parse("name = \"warmup_stable_decay\"\nt_warmup = \"100ba\"");
    assert_curve(
        &s,
        &r,
        0.5,
        &[
            (50, 0.5),
            (100, 1.0),
            (399, 1.0),
            (400, 1.0),
            (450, 0.5),
            (500, 0.0),
        ],
    );
    for b in [0, 120, 399, 400, 437, 499, 500] {
        let got = s.multiplier(&at_batch(b, 100), &r, 0.5);
        let want = wsd(b, 100, 500, 0.2, 0.0, "linear");
        assert!((got - want).abs() < EPS, "batch {b}: {got} vs {want}");
    }
    // Without warmup, α_σ(t) = α(t / σ) for an absolute t_max.
    let s = parse(
        "name = \"warmup_stable_decay\"\nt_warmup = \"0ba\"\nt_max = \"1000ba\"\n\
         decay_shape = \"sqrt\"\nalpha_f = 0.1",
    );
    let r2 = match base.scaled(2.0) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    if let Err(e) = s.check(&r2, 2.0) {
        panic!("{e}");
    }
    for batch in [0, 100, 1598, 1600, 1700, 1900, 1998, 2000] {
        let scaled = s.multiplier(&at_batch(batch, 100), &r2, 2.0);
        let plain = s.multiplier(&at_batch(batch / 2, 100), &base, 1.0);
        assert!((scaled - plain).abs() < EPS, "batch {batch}");
    }
}

#[test]
fn warmup_stable_decay_errors() {
    // Missing warmup, unknown shape, out-of-range values.
    assert!(toml::from_str::<Schedule>("name = \"warmup_stable_decay\"").is_err());
    let msg = toml::from_str::<Schedule>(
        "name = \"warmup_stable_decay\"\nt_warmup = \"1ba\"\ndecay_shape = \"quadratic\"",
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(msg.contains("quadratic") && msg.contains("sqrt"), "{msg}");
    for (text, field) in [
        ("decay_fraction = 1.5", "decay_fraction"),
        ("decay_fraction = -0.1", "decay_fraction"),
        ("decay_fraction = nan", "decay_fraction"),
        ("alpha_f = -1.0", "alpha_f"),
        ("t_max = \"0ba\"", "t_max"),
        ("t_warmup = \"200ba\"\nt_max = \"100ba\"", "t_warmup"),
    ] {
        let text = if text.contains("t_warmup") {
            format!("name = \"warmup_stable_decay\"\n{text}")
        } else {
            format!("name = \"warmup_stable_decay\"\nt_warmup = \"1ba\"\n{text}")
        };
        let e = parse(&text).validate().err();
        assert_eq!(e.as_ref().map(|e| e.field), Some(field), "{text}: {e:?}");
    }
    // Against a run: the warmup must end before the cooldown starts, t_max must cover the
    // run, and warmup and t_max must resolve to one unit.
    let r = run("1000ba", 100, 32);
    let s = parse("name = \"warmup_stable_decay\"\nt_warmup = \"801ba\"");
    let msg = s
        .check(&r, 1.0)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("runs into the cooldown"), "{msg}");
    let s = parse("name = \"warmup_stable_decay\"\nt_warmup = \"800ba\"");
    assert_eq!(s.check(&r, 1.0), Ok(()));
    let s = parse("name = \"warmup_stable_decay\"\nt_warmup = \"10ba\"\nt_max = \"500ba\"");
    let msg = s
        .check(&r, 1.0)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("shorter than max_duration"), "{msg}");
    let s = parse("name = \"warmup_stable_decay\"\nt_warmup = \"100sp\"");
    assert!(s.check(&r, 1.0).is_err());
    // After scaling, a fixed warmup may run into the cooldown.
    let s = parse("name = \"warmup_stable_decay\"\nt_warmup = \"500ba\"");
    assert_eq!(s.check(&r, 1.0), Ok(()));
    let half = match r.scaled(0.5) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    assert!(s.check(&half, 0.5).is_err());
}

#[test]
fn warmup_stable_decay_round_trips() {
    for text in [
        "name = \"warmup_stable_decay\"\nt_warmup = \"10ba\"",
        "name = \"warmup_stable_decay\"\nt_warmup = \"0.1dur\"\ndecay_fraction = 0.6\n\
         alpha_f = 0.15\ndecay_shape = \"sqrt\"\nt_max = \"2ep\"",
        "name = \"warmup_stable_decay\"\nt_warmup = \"1ep\"\ndecay_shape = \"cosine\"",
    ] {
        let s = parse(text);
        let out = match toml::to_string(&s) {
            Ok(out) => out,
            Err(e) => panic!("{s:?}: {e}"),
        };
        assert!(out.contains("name = \"warmup_stable_decay\""), "{out}");
        assert_eq!(parse(&out), s, "{out}");
    }
}
