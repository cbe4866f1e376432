//! Learning-rate multiplier schedules (Composer's `composer/optim/scheduler.py`).
//!
//! A [`Schedule`] is a stateless function of the [`Timestamp`]: the learning rate used for a
//! step is `base_lr × schedule.multiplier(now, run, ssr)`. Schedules are read from a TOML table
//! tagged by `name`, e.g.
//!
//! ```toml
//! [schedule]
//! name = "cosine_with_warmup"
//! t_warmup = "0.1dur"
//! alpha_f = 0.0
//! ```
//!
//! Times are resolved with [`RunLength::resolve`] (Composer's `_convert_time`): `dur` is a
//! fraction of `max_duration` in its unit (batches when `max_duration` is in epochs), epochs
//! become batches, and every non-`dur` time except warmups is multiplied by the scale-schedule
//! ratio and floored. Warmups are not scaled (Composer's default `scale_warmup=False`).
//! `run.max_duration` must already be scaled by the same ratio ([`RunLength::scaled`]), as
//! Composer's trainer does. Progress is read from the timestamp counter in the unit of the
//! resolved time, so `ba`/`ep`/`dur` schedules progress per batch and `sp`/`tok` schedules per
//! sample/token.

use std::f64::consts::PI;

use serde::{Deserialize, Serialize};

use crate::time::{RunLength, Time, TimeError, TimeUnit, Timestamp};

fn one() -> f64 {
    1.0
}

fn tenth() -> f64 {
    0.1
}

fn whole_run() -> Time {
    Time::dur(1.0)
}

/// A learning-rate multiplier schedule (α(t) in Composer's notation).
///
/// Deserialized from a table whose `name` field picks the variant; unknown fields are
/// rejected. Field defaults follow Composer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", deny_unknown_fields)]
pub enum Schedule {
    /// α = `alpha` until `t_max`, then 1.0.
    #[serde(rename = "constant")]
    Constant {
        /// Multiplier while active (default 1.0).
        #[serde(default = "one")]
        alpha: f64,
        /// How long the schedule is active (default `"1dur"`).
        #[serde(default = "whole_run")]
        t_max: Time,
    },
    /// α = `gamma`^⌊t / `step_size`⌋.
    #[serde(rename = "step")]
    Step {
        /// Time between decays (required).
        step_size: Time,
        /// Decay factor (default 0.1).
        #[serde(default = "tenth")]
        gamma: f64,
    },
    /// α = `gamma`^(number of milestones reached).
    #[serde(rename = "multistep")]
    MultiStep {
        /// Times at which α is multiplied by `gamma` (required).
        milestones: Vec<Time>,
        /// Decay factor (default 0.1).
        #[serde(default = "tenth")]
        gamma: f64,
    },
    /// α goes linearly from `alpha_i` to `alpha_f` over `t_max`, then stays at `alpha_f`.
    #[serde(rename = "linear")]
    Linear {
        /// Initial multiplier (default 1.0).
        #[serde(default = "one")]
        alpha_i: f64,
        /// Final multiplier (default 0.0).
        #[serde(default)]
        alpha_f: f64,
        /// Length of the ramp (default `"1dur"`).
        #[serde(default = "whole_run")]
        t_max: Time,
    },
    /// α = `alpha_f` + (1 − `alpha_f`)·½(1 + cos(π·min(t / `t_max`, 1))).
    #[serde(rename = "cosine")]
    Cosine {
        /// Length of the decay (default `"1dur"`).
        #[serde(default = "whole_run")]
        t_max: Time,
        /// Final multiplier (default 0.0).
        #[serde(default)]
        alpha_f: f64,
    },
    /// Linear warmup 0 → `alpha` over `t_warmup`, then `alpha` (Composer builds this as
    /// `linear_with_warmup` with `alpha_i = alpha_f = alpha`, so α stays `alpha` after
    /// `t_max` too).
    #[serde(rename = "constant_with_warmup")]
    ConstantWithWarmup {
        /// Warmup length (required; not scaled by SSR).
        t_warmup: Time,
        /// Multiplier after warmup (default 1.0).
        #[serde(default = "one")]
        alpha: f64,
        /// Schedule length (default `"1dur"`).
        #[serde(default = "whole_run")]
        t_max: Time,
    },
    /// Linear warmup 0 → `alpha_i` over `t_warmup`, then linear `alpha_i` → `alpha_f` over the
    /// remaining `t_max − t_warmup`.
    #[serde(rename = "linear_with_warmup")]
    LinearWithWarmup {
        /// Warmup length (required; not scaled by SSR).
        t_warmup: Time,
        /// Multiplier at the end of warmup (default 1.0).
        #[serde(default = "one")]
        alpha_i: f64,
        /// Final multiplier (default 0.0).
        #[serde(default)]
        alpha_f: f64,
        /// Schedule length, warmup included (default `"1dur"`).
        #[serde(default = "whole_run")]
        t_max: Time,
    },
    /// Linear warmup 0 → 1 over `t_warmup`, then cosine decay 1 → `alpha_f` over the remaining
    /// `t_max − t_warmup`.
    #[serde(rename = "cosine_with_warmup")]
    CosineWithWarmup {
        /// Warmup length (required; not scaled by SSR).
        t_warmup: Time,
        /// Schedule length, warmup included (default `"1dur"`).
        #[serde(default = "whole_run")]
        t_max: Time,
        /// Final multiplier (default 0.0).
        #[serde(default)]
        alpha_f: f64,
    },
    /// Linear warmup 0 → 1 over `t_warmup`, then `gamma`^(milestones reached).
    #[serde(rename = "multistep_with_warmup")]
    MultiStepWithWarmup {
        /// Warmup length (required; not scaled by SSR).
        t_warmup: Time,
        /// Times at which α is multiplied by `gamma` (required).
        milestones: Vec<Time>,
        /// Decay factor (default 0.1).
        #[serde(default = "tenth")]
        gamma: f64,
    },
}

/// A schedule value out of range, found by [`Schedule::validate`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("schedule {schedule}: {message}")]
pub struct InvalidSchedule {
    /// The schedule's `name`.
    pub schedule: &'static str,
    /// The offending field.
    pub field: &'static str,
    /// What is wrong, naming the field.
    pub message: String,
}

/// A schedule that cannot be evaluated for a run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    /// A value out of range ([`Schedule::validate`]).
    #[error(transparent)]
    Invalid(#[from] InvalidSchedule),
    /// A time that cannot be resolved for this run.
    #[error(transparent)]
    Time(#[from] TimeError),
    /// `scale_schedule_ratio` is not a positive number.
    #[error("scale_schedule_ratio must be a positive number, got {0}")]
    Ratio(f64),
    /// A length that resolves to zero steps (Composer divides by it).
    #[error("{field} {time} resolves to {resolved}; it must be at least 1")]
    ZeroLength {
        /// `t_max` or `step_size`.
        field: &'static str,
        /// The configured time.
        time: Time,
        /// What it resolves to for this run.
        resolved: Time,
    },
    /// `t_warmup` and `t_max` resolve to different units.
    #[error(
        "t_warmup {t_warmup} ({warmup}) and t_max {t_max} ({max}) must resolve to the same unit"
    )]
    Units {
        /// The configured warmup.
        t_warmup: Time,
        /// It, resolved.
        warmup: Time,
        /// The configured length.
        t_max: Time,
        /// It, resolved.
        max: Time,
    },
    /// The resolved times do not cover the run as they must; the message says how.
    #[error("{0}")]
    Coverage(String),
    /// One of the above, in schedule `name`.
    #[error("schedule {name}: {source}")]
    In {
        /// The schedule's `name`.
        name: &'static str,
        /// What is wrong.
        source: Box<ScheduleError>,
    },
}

impl ScheduleError {
    fn in_schedule(self, name: &'static str) -> ScheduleError {
        ScheduleError::In {
            name,
            source: Box::new(self),
        }
    }
}

impl Default for Schedule {
    /// `constant` with α = 1: the learning rate is never changed.
    fn default() -> Self {
        Schedule::Constant {
            alpha: 1.0,
            t_max: whole_run(),
        }
    }
}

/// Composer's `_cosine_anneal`: cos on [0, π] stretched onto x ∈ [0, 1] (clamped) and onto
/// the range [`min_y`, 1]. Evaluated in Composer's operation order.
fn cosine_anneal(x: f64, min_y: f64) -> f64 {
    let max_y = 1.0;
    let x = x.clamp(0.0, 1.0);
    min_y + (max_y - min_y) * (1.0 + (x * PI).cos()) / 2.0
}

/// The timestamp counter in a resolved (never `dur`) time's unit.
fn current(now: &Timestamp, unit: TimeUnit) -> u64 {
    now.get(unit).unwrap_or(0)
}

/// The count of a resolved time (resolution never yields `dur`).
fn count(t: &Time) -> u64 {
    t.count().unwrap_or(0)
}

impl Schedule {
    /// The `name` this schedule has in config files.
    pub fn name(&self) -> &'static str {
        match self {
            Schedule::Constant { .. } => "constant",
            Schedule::Step { .. } => "step",
            Schedule::MultiStep { .. } => "multistep",
            Schedule::Linear { .. } => "linear",
            Schedule::Cosine { .. } => "cosine",
            Schedule::ConstantWithWarmup { .. } => "constant_with_warmup",
            Schedule::LinearWithWarmup { .. } => "linear_with_warmup",
            Schedule::CosineWithWarmup { .. } => "cosine_with_warmup",
            Schedule::MultiStepWithWarmup { .. } => "multistep_with_warmup",
        }
    }

    /// The learning-rate multiplier at `now`.
    ///
    /// `run.max_duration` must already be scaled by `scale_schedule_ratio`
    /// ([`RunLength::scaled`]). Call [`Schedule::check`] once before training: when it passes,
    /// this equals [`Schedule::try_multiplier`]; if the schedule cannot be evaluated at all
    /// (e.g. an epoch time with an unknown epoch length), this returns 1.0, leaving the
    /// learning rate unchanged.
    pub fn multiplier(&self, now: &Timestamp, run: &RunLength, scale_schedule_ratio: f64) -> f64 {
        self.try_multiplier(now, run, scale_schedule_ratio)
            .unwrap_or(1.0)
    }

    /// The learning-rate multiplier at `now`, or why it cannot be computed: a time that cannot
    /// be resolved (`sec`, or epochs with an unknown epoch length), a step size or `t_max` that
    /// resolves to zero (Composer divides by it), or `t_warmup` and `t_max` resolving to
    /// different units. None of these depend on `now`.
    pub fn try_multiplier(
        &self,
        now: &Timestamp,
        run: &RunLength,
        scale_schedule_ratio: f64,
    ) -> Result<f64, ScheduleError> {
        let ssr = scale_schedule_ratio;
        let resolve = |t: &Time, ssr: f64| run.resolve(t, ssr);
        match self {
            Schedule::Constant { alpha, t_max } => {
                let t_max = resolve(t_max, ssr)?;
                Ok(if now.reached(&t_max) { 1.0 } else { *alpha })
            }
            Schedule::Step { step_size, gamma } => {
                let step = resolve(step_size, ssr)?;
                let size = count(&step);
                if size == 0 {
                    return Err(ScheduleError::ZeroLength {
                        field: "step_size",
                        time: *step_size,
                        resolved: step,
                    });
                }
                let steps = current(now, step.unit()) / size;
                Ok(gamma.powf(steps as f64))
            }
            Schedule::MultiStep { milestones, gamma } => {
                multistep(milestones, *gamma, now, run, ssr)
            }
            Schedule::Linear {
                alpha_i,
                alpha_f,
                t_max,
            } => {
                let t = resolve(t_max, ssr)?;
                let frac = fraction_of(now, t_max, &t)?.min(1.0);
                Ok(alpha_i + frac * (alpha_f - alpha_i))
            }
            Schedule::Cosine { t_max, alpha_f } => {
                let t = resolve(t_max, ssr)?;
                let frac = fraction_of(now, t_max, &t)?;
                Ok(cosine_anneal(frac, *alpha_f))
            }
            Schedule::ConstantWithWarmup {
                t_warmup,
                alpha,
                t_max,
            } => warmup_then(t_warmup, t_max, *alpha, now, run, ssr, |_| *alpha),
            Schedule::LinearWithWarmup {
                t_warmup,
                alpha_i,
                alpha_f,
                t_max,
            } => warmup_then(t_warmup, t_max, *alpha_i, now, run, ssr, |frac| {
                alpha_i + frac * (alpha_f - alpha_i)
            }),
            Schedule::CosineWithWarmup {
                t_warmup,
                t_max,
                alpha_f,
            } => warmup_then(t_warmup, t_max, 1.0, now, run, ssr, |frac| {
                cosine_anneal(frac, *alpha_f)
            }),
            Schedule::MultiStepWithWarmup {
                t_warmup,
                milestones,
                gamma,
            } => {
                let warmup = resolve(t_warmup, 1.0)?;
                if let Some(alpha) = warmup_value(&warmup, 1.0, now) {
                    // Composer resolves the milestones only after warmup; resolve them anyway
                    // so that errors do not depend on `now`.
                    multistep(milestones, *gamma, now, run, ssr)?;
                    return Ok(alpha);
                }
                multistep(milestones, *gamma, now, run, ssr)
            }
        }
    }

    /// Checks the schedule's own values, without a run: finite multipliers ≥ 0 and
    /// `gamma` ≥ 0; no wall-clock (`sec`) times; a non-zero `step_size`; a non-zero `t_max`
    /// for `linear` and `cosine`; `t_warmup` ≤ `t_max` when both are in the same unit.
    pub fn validate(&self) -> Result<(), InvalidSchedule> {
        let name = self.name();
        let fail = |field: &'static str, message: String| {
            Err(InvalidSchedule {
                schedule: name,
                field,
                message,
            })
        };
        for (field, value) in self.factors() {
            if !value.is_finite() || value < 0.0 {
                return fail(
                    field,
                    format!("{field} must be a finite number ≥ 0, got {value}"),
                );
            }
        }
        for (field, t) in self.times() {
            if t.unit() == TimeUnit::Second {
                return fail(
                    field,
                    format!(
                        "{field} = \"{t}\": wall-clock time (sec) is not a schedule unit; use ba, \
                     ep, sp, tok or dur"
                    ),
                );
            }
            if t.fraction().is_some_and(|f| !f.is_finite() || f < 0.0) {
                return fail(
                    field,
                    format!("{field} = \"{t}\" must be a non-negative fraction"),
                );
            }
        }
        let zero = |t: &Time| t.value_f64() == 0.0;
        match self {
            Schedule::Step { step_size, .. } if zero(step_size) => {
                return fail(
                    "step_size",
                    format!("step_size = \"{step_size}\" must be greater than zero"),
                )
            }
            Schedule::Linear { t_max, .. } | Schedule::Cosine { t_max, .. } if zero(t_max) => {
                return fail(
                    "t_max",
                    format!("t_max = \"{t_max}\" must be greater than zero"),
                )
            }
            _ => {}
        }
        if let Some((t_warmup, t_max)) = self.warmup_and_max() {
            if t_warmup.unit() == t_max.unit() && t_warmup.value_f64() > t_max.value_f64() {
                return fail(
                    "t_warmup",
                    format!("t_warmup = \"{t_warmup}\" is longer than t_max = \"{t_max}\""),
                );
            }
        }
        Ok(())
    }

    /// Checks the schedule against a run before training: [`Schedule::validate`], a positive
    /// ratio, a valid run, every time resolvable ([`Schedule::try_multiplier`] succeeds), and,
    /// after resolution, `t_warmup` ≤ `t_max` and (for the warmup schedules with a `t_max`,
    /// as Composer checks) `t_max` ≥ `max_duration` whenever the units are comparable, so the
    /// schedule covers the whole run. `run` is the SSR-scaled run, as for
    /// [`Schedule::multiplier`].
    pub fn check(&self, run: &RunLength, scale_schedule_ratio: f64) -> Result<(), ScheduleError> {
        self.validate()?;
        let ssr = scale_schedule_ratio;
        if !(ssr.is_finite() && ssr > 0.0) {
            return Err(ScheduleError::Ratio(ssr));
        }
        run.validate()?;
        let name = self.name();
        self.try_multiplier(&Timestamp::default(), run, ssr)
            .map_err(|e| e.in_schedule(name))?;
        let Some((t_warmup, t_max)) = self.warmup_and_max() else {
            return Ok(());
        };
        let resolve = |t: &Time, ssr: f64| {
            run.resolve(t, ssr)
                .map_err(|e| ScheduleError::from(e).in_schedule(name))
        };
        let warmup = resolve(t_warmup, 1.0)?;
        let max = resolve(t_max, ssr)?;
        if warmup.unit() == max.unit() && count(&warmup) > count(&max) {
            return Err(ScheduleError::Coverage(format!(
                "t_warmup = \"{t_warmup}\" ({warmup}) is longer than t_max = \"{t_max}\" \
                 ({max}) for max_duration {} and scale_schedule_ratio {ssr}",
                run.max_duration
            ))
            .in_schedule(name));
        }
        if let Some(needed) = run.to_unit(&run.max_duration, max.unit()) {
            if count(&max) < needed {
                return Err(ScheduleError::Coverage(format!(
                    "t_max = \"{t_max}\" ({max}) is shorter than max_duration {} \
                     ({needed}{}); the learning rate would not be defined for the whole run",
                    run.max_duration,
                    max.unit()
                ))
                .in_schedule(name));
            }
        }
        Ok(())
    }

    /// The multiplier-like fields, named, for validation.
    fn factors(&self) -> Vec<(&'static str, f64)> {
        match self {
            Schedule::Constant { alpha, .. } | Schedule::ConstantWithWarmup { alpha, .. } => {
                vec![("alpha", *alpha)]
            }
            Schedule::Step { gamma, .. }
            | Schedule::MultiStep { gamma, .. }
            | Schedule::MultiStepWithWarmup { gamma, .. } => vec![("gamma", *gamma)],
            Schedule::Linear {
                alpha_i, alpha_f, ..
            }
            | Schedule::LinearWithWarmup {
                alpha_i, alpha_f, ..
            } => vec![("alpha_i", *alpha_i), ("alpha_f", *alpha_f)],
            Schedule::Cosine { alpha_f, .. } | Schedule::CosineWithWarmup { alpha_f, .. } => {
                vec![("alpha_f", *alpha_f)]
            }
        }
    }

    /// Every time field, named, for validation.
    fn times(&self) -> Vec<(&'static str, &Time)> {
        match self {
            Schedule::Constant { t_max, .. }
            | Schedule::Linear { t_max, .. }
            | Schedule::Cosine { t_max, .. } => vec![("t_max", t_max)],
            Schedule::Step { step_size, .. } => vec![("step_size", step_size)],
            Schedule::MultiStep { milestones, .. } => {
                milestones.iter().map(|m| ("milestones", m)).collect()
            }
            Schedule::ConstantWithWarmup {
                t_warmup, t_max, ..
            }
            | Schedule::LinearWithWarmup {
                t_warmup, t_max, ..
            }
            | Schedule::CosineWithWarmup {
                t_warmup, t_max, ..
            } => vec![("t_warmup", t_warmup), ("t_max", t_max)],
            Schedule::MultiStepWithWarmup {
                t_warmup,
                milestones,
                ..
            } => std::iter::once(("t_warmup", t_warmup))
                .chain(milestones.iter().map(|m| ("milestones", m)))
                .collect(),
        }
    }

    /// `(t_warmup, t_max)` for the warmup schedules that have a `t_max`.
    fn warmup_and_max(&self) -> Option<(&Time, &Time)> {
        match self {
            Schedule::ConstantWithWarmup {
                t_warmup, t_max, ..
            }
            | Schedule::LinearWithWarmup {
                t_warmup, t_max, ..
            }
            | Schedule::CosineWithWarmup {
                t_warmup, t_max, ..
            } => Some((t_warmup, t_max)),
            _ => None,
        }
    }
}

/// `current / resolved` in the resolved time's unit; errors when `resolved` is zero.
fn fraction_of(now: &Timestamp, original: &Time, resolved: &Time) -> Result<f64, ScheduleError> {
    let total = count(resolved);
    if total == 0 {
        return Err(ScheduleError::ZeroLength {
            field: "t_max",
            time: *original,
            resolved: *resolved,
        });
    }
    Ok(current(now, resolved.unit()) as f64 / total as f64)
}

/// Composer's `MultiStepScheduler`: multiply by `gamma` once per milestone reached.
fn multistep(
    milestones: &[Time],
    gamma: f64,
    now: &Timestamp,
    run: &RunLength,
    ssr: f64,
) -> Result<f64, ScheduleError> {
    let mut factor = 1.0;
    for milestone in milestones {
        let m = run.resolve(milestone, ssr)?;
        if now.reached(&m) {
            factor *= gamma;
        }
    }
    Ok(factor)
}

/// During warmup (`now` before the resolved `warmup`), Composer's
/// `LinearScheduler(alpha_i=0, alpha_f=peak, t_max=t_warmup)`: `peak × min(t / t_warmup, 1)`.
/// `None` once warmup is over.
fn warmup_value(warmup: &Time, peak: f64, now: &Timestamp) -> Option<f64> {
    if now.reached(warmup) {
        return None;
    }
    // Not reached, so the warmup count is at least 1.
    let total = count(warmup) as f64;
    let frac = (current(now, warmup.unit()) as f64 / total).min(1.0);
    Some(frac * peak)
}

/// Composer's `*WithWarmupScheduler` pattern: linear warmup 0 → `peak` over the unscaled
/// `t_warmup`, then `decay(frac)` with frac = (t − t_warmup) / (t_max − t_warmup), capped at 1
/// (0 when `t_max` ≤ `t_warmup`).
fn warmup_then(
    t_warmup: &Time,
    t_max: &Time,
    peak: f64,
    now: &Timestamp,
    run: &RunLength,
    ssr: f64,
    decay: impl Fn(f64) -> f64,
) -> Result<f64, ScheduleError> {
    let warmup = run.resolve(t_warmup, 1.0)?;
    let max = run.resolve(t_max, ssr)?;
    if warmup.unit() != max.unit() {
        return Err(ScheduleError::Units {
            t_warmup: *t_warmup,
            warmup,
            t_max: *t_max,
            max,
        });
    }
    if let Some(alpha) = warmup_value(&warmup, peak, now) {
        return Ok(alpha);
    }
    let (w, m) = (count(&warmup), count(&max));
    let frac = if m > w {
        let done = current(now, warmup.unit()).saturating_sub(w);
        done as f64 / (m - w) as f64
    } else {
        0.0
    };
    Ok(decay(frac.min(1.0)))
}

#[cfg(test)]
mod tests {
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
        let s = parse(
            "name = \"linear_with_warmup\"\nt_warmup = \"100ba\"\nalpha_i = 2.0\nalpha_f = 1.0",
        );
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
}
