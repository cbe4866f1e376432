//! Unit tests of `schedule`.
use super::*;

pub(super) const EPS: f64 = 1e-12;

pub(super) fn t(s: &str) -> Time {
    match Time::parse(s) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

pub(super) fn run(max: &str, bpe: u64, spb: u64) -> RunLength {
    match RunLength::new(t(max), bpe, spb) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

pub(super) fn at_batch(batch: u64, bpe: u64) -> Timestamp {
    Timestamp {
        batch,
        epoch: batch / bpe,
        batch_in_epoch: batch % bpe,
        sample: batch * 32,
        ..Timestamp::default()
    }
}

pub(super) fn parse(text: &str) -> Schedule {
    match toml::from_str::<Schedule>(text) {
        Ok(s) => s,
        Err(e) => panic!("{text}: {e}"),
    }
}

/// Checks `(batch, expected)` pairs against `schedule` on `run` with `ssr`.
pub(super) fn assert_curve(schedule: &Schedule, run: &RunLength, ssr: f64, points: &[(u64, f64)]) {
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

pub(super) fn cos_anneal(x: f64, alpha_f: f64) -> f64 {
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
