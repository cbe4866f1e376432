//! Unit tests of `schedule`.
use super::*;

const EPS: f64 = 1e-12;

fn t(s: &str) -> Time {
    match Time::parse(s) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

fn run(max: &str, bpe: u64, spb: u64) -> RunLength {
    match RunLength::new(t(max), bpe, spb) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

fn at_batch(batch: u64, bpe: u64) -> Timestamp {
    Timestamp {
        batch,
        epoch: batch / bpe,
        batch_in_epoch: batch % bpe,
        sample: batch * 32,
        ..Timestamp::default()
    }
}

fn parse(text: &str) -> Schedule {
    match toml::from_str::<Schedule>(text) {
        Ok(s) => s,
        Err(e) => panic!("{text}: {e}"),
    }
}

/// Checks `(batch, expected)` pairs against `schedule` on `run` with `ssr`.
fn assert_curve(schedule: &Schedule, run: &RunLength, ssr: f64, points: &[(u64, f64)]) {
    if let Err(e) = schedule.check(run, ssr) {
        panic!("{schedule:?}: {e}");
    }
    for &(batch, want) in points {
        let got = schedule.multiplier(&at_batch(batch, run.batches_per_epoch), run, ssr);
        assert!(
            (got - want).abs() < EPS,
            "{} at batch {batch}: got {got}, want {want}",
            schedule.name()
        );
    }
}

fn cos_anneal(x: f64, alpha_f: f64) -> f64 {
    alpha_f + (1.0 - alpha_f) * 0.5 * (1.0 + (PI * x.clamp(0.0, 1.0)).cos())
}

#[test]
fn constant() {
    let r = run("1000ba", 100, 32);
    let s = parse("name = \"constant\"\nalpha = 0.5\nt_max = \"0.5dur\"");
    assert_curve(&s, &r, 1.0, &[(0, 0.5), (499, 0.5), (500, 1.0), (900, 1.0)]);
    let s = parse("name = \"constant\"");
    assert_eq!(s, Schedule::default());
    assert_curve(&s, &r, 1.0, &[(0, 1.0), (999, 1.0)]);
}

#[test]
fn step() {
    let r = run("1000ba", 100, 32);
    let s = parse("name = \"step\"\nstep_size = \"100ba\"\ngamma = 0.5");
    assert_curve(
        &s,
        &r,
        1.0,
        &[
            (0, 1.0),
            (99, 1.0),
            (100, 0.5),
            (250, 0.25),
            (999, 0.5f64.powi(9)),
        ],
    );
    // Epochs are converted to batches.
    let s = parse("name = \"step\"\nstep_size = \"1ep\"\ngamma = 0.5");
    assert_curve(&s, &r, 1.0, &[(99, 1.0), (100, 0.5), (250, 0.25)]);
    // Default gamma 0.1.
    let s = parse("name = \"step\"\nstep_size = \"300ba\"");
    assert_curve(&s, &r, 1.0, &[(299, 1.0), (300, 0.1), (600, 0.1 * 0.1)]);
}

#[test]
fn multistep() {
    let r = run("1000ba", 100, 32);
    let s = parse("name = \"multistep\"\nmilestones = [\"200ba\", \"0.5dur\", \"8ep\"]");
    assert_curve(
        &s,
        &r,
        1.0,
        &[
            (0, 1.0),
            (199, 1.0),
            (200, 0.1),
            (500, 0.01),
            (799, 0.01),
            (800, 0.001),
        ],
    );
}

#[test]
fn linear() {
    let r = run("1000ba", 100, 32);
    let s = parse("name = \"linear\"");
    assert_curve(
        &s,
        &r,
        1.0,
        &[(0, 1.0), (250, 0.75), (500, 0.5), (1000, 0.0), (1500, 0.0)],
    );
    let s = parse("name = \"linear\"\nalpha_i = 0.5\nalpha_f = 1.5\nt_max = \"200ba\"");
    assert_curve(&s, &r, 1.0, &[(0, 0.5), (100, 1.0), (200, 1.5), (700, 1.5)]);
}

#[test]
fn cosine() {
    let r = run("1000ba", 100, 32);
    let s = parse("name = \"cosine\"\nalpha_f = 0.1");
    assert_curve(
        &s,
        &r,
        1.0,
        &[
            (0, 1.0),
            (250, 0.1 + 0.9 * (1.0 + (PI / 4.0).cos()) / 2.0),
            (500, 0.55),
            (1000, 0.1),
            (1200, 0.1),
        ],
    );
    let s = parse("name = \"cosine\"\nt_max = \"4ep\"");
    assert_curve(&s, &r, 1.0, &[(100, cos_anneal(0.25, 0.0)), (400, 0.0)]);
}

#[test]
fn constant_with_warmup() {
    let r = run("1000ba", 100, 32);
    let s = parse("name = \"constant_with_warmup\"\nt_warmup = \"100ba\"\nalpha = 0.5");
    // Composer's implementation keeps alpha after t_max (it is linear_with_warmup with
    // alpha_i = alpha_f = alpha).
    assert_curve(
        &s,
        &r,
        1.0,
        &[(0, 0.0), (50, 0.25), (100, 0.5), (999, 0.5), (2000, 0.5)],
    );
}

#[test]
fn linear_with_warmup() {
    let r = run("1000ba", 100, 32);
    let s = parse("name = \"linear_with_warmup\"\nt_warmup = \"0.1dur\"");
    assert_curve(
        &s,
        &r,
        1.0,
        &[
            (0, 0.0),
            (50, 0.5),
            (100, 1.0),
            (550, 0.5),
            (1000, 0.0),
            (1100, 0.0),
        ],
    );
    // Warmup rises to alpha_i, as in Composer.
    let s =
        parse("name = \"linear_with_warmup\"\nt_warmup = \"100ba\"\nalpha_i = 2.0\nalpha_f = 1.0");
    assert_curve(
        &s,
        &r,
        1.0,
        &[(50, 1.0), (100, 2.0), (550, 1.5), (1000, 1.0)],
    );
}

#[test]
fn cosine_with_warmup() {
    let r = run("1000ba", 100, 32);
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"100ba\"\nalpha_f = 0.0");
    assert_curve(
        &s,
        &r,
        1.0,
        &[
            (0, 0.0),
            (25, 0.25),
            (100, 1.0),
            (325, cos_anneal(0.25, 0.0)),
            (550, 0.5),
            (1000, 0.0),
        ],
    );
}

#[test]
fn multistep_with_warmup() {
    let r = run("1000ba", 100, 32);
    let s = parse(
        "name = \"multistep_with_warmup\"\nt_warmup = \"100ba\"\nmilestones = [\"300ba\", \
         \"600ba\"]\ngamma = 0.5",
    );
    assert_curve(
        &s,
        &r,
        1.0,
        &[
            (0, 0.0),
            (50, 0.5),
            (100, 1.0),
            (299, 1.0),
            (300, 0.5),
            (700, 0.25),
        ],
    );
}

#[test]
fn sample_based_schedules_progress_in_samples() {
    let r = run("32000sp", 100, 32);
    let s = parse("name = \"linear\"");
    // at_batch sets sample = 32 × batch.
    assert_curve(&s, &r, 1.0, &[(0, 1.0), (250, 0.75), (1000, 0.0)]);
}

#[test]
fn epoch_max_duration_resolves_dur_to_batches() {
    let r = run("10ep", 100, 32);
    let s = parse("name = \"cosine\"");
    assert_curve(&s, &r, 1.0, &[(500, 0.5), (250, cos_anneal(0.25, 0.0))]);
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"1ep\"");
    assert_curve(&s, &r, 1.0, &[(50, 0.5), (100, 1.0), (550, 0.5)]);
}

#[test]
fn scale_schedule_ratio() {
    // The trainer scales max_duration once; schedules scale their own non-dur times.
    let base = run("1000ba", 100, 32);
    let r = match base.scaled(0.5) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(r.max_duration, t("500ba"));
    // Step size 100ba → 50ba.
    let s = parse("name = \"step\"\nstep_size = \"100ba\"\ngamma = 0.5");
    assert_curve(&s, &r, 0.5, &[(49, 1.0), (50, 0.5), (120, 0.25)]);
    // Epoch step size: 1ep → 100ba → 50ba.
    let s = parse("name = \"step\"\nstep_size = \"1ep\"\ngamma = 0.5");
    assert_curve(&s, &r, 0.5, &[(49, 1.0), (50, 0.5)]);
    // Multistep milestones scale too, dur milestones follow max_duration.
    let s = parse("name = \"multistep\"\nmilestones = [\"200ba\", \"0.8dur\"]");
    assert_curve(
        &s,
        &r,
        0.5,
        &[(99, 1.0), (100, 0.1), (399, 0.1), (400, 0.01)],
    );
    // 1dur follows the scaled max_duration; the warmup is NOT scaled.
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"100ba\"");
    assert_curve(
        &s,
        &r,
        0.5,
        &[(50, 0.5), (100, 1.0), (300, 0.5), (500, 0.0)],
    );
    // α_σ(t) = α(t / σ) for an absolute t_max.
    let s = parse("name = \"linear\"\nt_max = \"1000ba\"");
    let r2 = match base.scaled(2.0) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    for batch in [0, 100, 400, 1000, 1998] {
        let scaled = s.multiplier(&at_batch(batch, 100), &r2, 2.0);
        let plain = s.multiplier(&at_batch(batch / 2, 100), &base, 1.0);
        assert!((scaled - plain).abs() < EPS, "batch {batch}");
    }
    // Epoch-based runs: 10ep × 0.36 → 3ep (floored), so 1dur = 300ba.
    let r = match run("10ep", 100, 32).scaled(0.36) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    let s = parse("name = \"cosine\"");
    assert_curve(&s, &r, 0.36, &[(150, 0.5), (300, 0.0)]);
    // 2ep → 200ba × 0.36 = 72ba.
    let s = parse("name = \"step\"\nstep_size = \"2ep\"\ngamma = 0.5");
    assert_curve(&s, &r, 0.36, &[(71, 1.0), (72, 0.5), (144, 0.25)]);
}

#[test]
fn unknown_fields_names_and_missing_fields_are_rejected() {
    let bad = [
        "name = \"cosine\"\nt_max = \"1dur\"\nwarmup = \"1ep\"",
        "name = \"cosine_with_warmup\"\nt_warmup = \"1ep\"\nalpha_i = 0.0",
        "name = \"step\"\nstep_size = \"1ep\"\nextra = 1",
        "name = \"cosine_annealing\"",
        "name = \"step\"",
        "name = \"cosine_with_warmup\"",
        "name = \"multistep\"",
        "t_max = \"1dur\"",
        "name = \"cosine\"\nt_max = 5",
    ];
    for text in bad {
        assert!(toml::from_str::<Schedule>(text).is_err(), "{text}");
    }
    let msg = toml::from_str::<Schedule>("name = \"cosine\"\nwarmup = \"1ep\"")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("warmup"), "{msg}");
    let msg = toml::from_str::<Schedule>("name = \"cosine\"\nt_max = 5")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("durations are strings with a unit"), "{msg}");
}

#[test]
fn defaults_follow_composer() {
    assert_eq!(
        parse("name = \"cosine_with_warmup\"\nt_warmup = \"0.1dur\"\nalpha_f = 0.0"),
        Schedule::CosineWithWarmup {
            t_warmup: t("0.1dur"),
            t_max: t("1dur"),
            alpha_f: 0.0
        }
    );
    assert_eq!(
        parse("name = \"linear_with_warmup\"\nt_warmup = \"1ep\""),
        Schedule::LinearWithWarmup {
            t_warmup: t("1ep"),
            alpha_i: 1.0,
            alpha_f: 0.0,
            t_max: t("1dur")
        }
    );
    assert_eq!(
        parse("name = \"multistep_with_warmup\"\nt_warmup = \"1ep\"\nmilestones = []"),
        Schedule::MultiStepWithWarmup {
            t_warmup: t("1ep"),
            milestones: vec![],
            gamma: 0.1
        }
    );
    assert_eq!(
        parse("name = \"linear\""),
        Schedule::Linear {
            alpha_i: 1.0,
            alpha_f: 0.0,
            t_max: t("1dur")
        }
    );
}

#[test]
fn serialize_round_trips() {
    let all = [
        Schedule::default(),
        parse("name = \"step\"\nstep_size = \"2ep\""),
        parse("name = \"multistep\"\nmilestones = [\"30ep\", \"0.9dur\"]\ngamma = 0.2"),
        parse("name = \"linear\"\nalpha_f = 0.1"),
        parse("name = \"cosine\""),
        parse("name = \"constant_with_warmup\"\nt_warmup = \"10ba\""),
        parse("name = \"linear_with_warmup\"\nt_warmup = \"10ba\""),
        parse("name = \"cosine_with_warmup\"\nt_warmup = \"0.1dur\""),
        parse("name = \"multistep_with_warmup\"\nt_warmup = \"1ep\"\nmilestones = [\"5ep\"]"),
    ];
    for s in all {
        let text = match toml::to_string(&s) {
            Ok(text) => text,
            Err(e) => panic!("{s:?}: {e}"),
        };
        assert!(text.contains(&format!("name = \"{}\"", s.name())), "{text}");
        assert_eq!(parse(&text), s, "{text}");
    }
}

#[test]
fn validate_rejects_bad_values() {
    let bad = [
        "name = \"step\"\nstep_size = \"1ep\"\ngamma = -0.1",
        "name = \"step\"\nstep_size = \"0ba\"",
        "name = \"step\"\nstep_size = \"30sec\"",
        "name = \"constant\"\nalpha = nan",
        "name = \"constant\"\nalpha = -1.0",
        "name = \"linear\"\nt_max = \"0ba\"",
        "name = \"cosine\"\nt_max = \"0.0dur\"",
        "name = \"linear\"\nalpha_f = inf",
        "name = \"multistep\"\nmilestones = [\"1ep\", \"1h\"]",
        "name = \"cosine_with_warmup\"\nt_warmup = \"0.2dur\"\nt_max = \"0.1dur\"",
        "name = \"linear_with_warmup\"\nt_warmup = \"200ba\"\nt_max = \"100ba\"",
    ];
    for text in bad {
        let s = parse(text);
        assert!(s.validate().is_err(), "{text}");
    }
    let msg = parse("name = \"step\"\nstep_size = \"1ep\"\ngamma = -0.1")
        .validate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("step") && msg.contains("gamma"), "{msg}");
    let good = [
        "name = \"cosine_with_warmup\"\nt_warmup = \"0.1dur\"",
        "name = \"cosine_with_warmup\"\nt_warmup = \"10ep\"\nt_max = \"0.1dur\"",
        "name = \"constant\"\nt_max = \"0ba\"",
        "name = \"multistep\"\nmilestones = []",
    ];
    for text in good {
        assert_eq!(parse(text).validate(), Ok(()), "{text}");
    }
}

#[test]
fn check_against_a_run() {
    let r = run("1000ba", 100, 32);
    // Warmup in samples, t_max in batches: Composer refuses mixed units.
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"100sp\"");
    assert!(s.check(&r, 1.0).is_err());
    assert!(s.try_multiplier(&Timestamp::default(), &r, 1.0).is_err());
    assert_eq!(s.multiplier(&Timestamp::default(), &r, 1.0), 1.0);
    // t_max shorter than max_duration (Composer checks this for warmup schedules).
    let s = parse("name = \"linear_with_warmup\"\nt_warmup = \"10ba\"\nt_max = \"500ba\"");
    let msg = s
        .check(&r, 1.0)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("shorter than max_duration"), "{msg}");
    let r_ep = run("10ep", 100, 32);
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"1ep\"\nt_max = \"9ep\"");
    assert!(s.check(&r_ep, 1.0).is_err());
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"1ep\"\nt_max = \"10ep\"");
    assert_eq!(s.check(&r_ep, 1.0), Ok(()));
    // Epoch times need a known epoch length.
    let unsized_run = run("1000ba", 0, 32);
    let s = parse("name = \"step\"\nstep_size = \"1ep\"");
    assert!(s.check(&unsized_run, 1.0).is_err());
    // The ratio must be positive; a step that scales to zero is refused.
    let s = parse("name = \"step\"\nstep_size = \"1ba\"");
    assert!(s.check(&r, 0.0).is_err());
    assert!(s.check(&r, 0.5).is_err());
    // After scaling, a fixed warmup may exceed t_max.
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"600ba\"");
    let r_half = match r.scaled(0.5) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(s.check(&r, 1.0), Ok(()));
    assert!(s.check(&r_half, 0.5).is_err());
}

#[test]
fn warmup_equal_to_t_max_holds_the_peak() {
    let r = run("100ba", 10, 32);
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"1dur\"\nt_max = \"1dur\"");
    assert_curve(&s, &r, 1.0, &[(50, 0.5), (100, 1.0), (150, 1.0)]);
    let s = parse("name = \"linear_with_warmup\"\nt_warmup = \"0ba\"\nt_max = \"100ba\"");
    assert_curve(&s, &r, 1.0, &[(0, 1.0), (50, 0.5), (100, 0.0)]);
}

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
