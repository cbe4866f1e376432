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

fn fifth() -> f64 {
    0.2
}

/// The shape of `warmup_stable_decay`'s cooldown, as a function of its progress `p` ∈ [0, 1]
/// (`p` = 0 where the cooldown starts, 1 at `t_max`): the multiplier is
/// `alpha_f + (1 − alpha_f)·s(p)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecayShape {
    /// s(p) = 1 − p.
    #[default]
    Linear,
    /// s(p) = 1 − √p (Hägele et al. 2024's "1 − sqrt" cooldown).
    Sqrt,
    /// s(p) = ½(1 + cos(πp)).
    Cosine,
}

impl DecayShape {
    /// s(p), with `p` clamped to [0, 1].
    pub fn value(self, p: f64) -> f64 {
        let p = p.clamp(0.0, 1.0);
        match self {
            DecayShape::Linear => 1.0 - p,
            DecayShape::Sqrt => 1.0 - p.sqrt(),
            DecayShape::Cosine => (1.0 + (p * PI).cos()) / 2.0,
        }
    }
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
    /// Warmup–stable–decay ("WSD", trapezoidal; Hägele et al. 2024, arXiv 2405.18392): linear
    /// warmup 0 → 1 over `t_warmup`, then 1, then a cooldown over the last `decay_fraction` of
    /// `t_max` to `alpha_f`, shaped by `decay_shape`. With `M` = `t_max` resolved and
    /// `D` = round(`decay_fraction`·M) steps, the cooldown starts at `S` = M − D and
    /// α = `alpha_f` + (1 − `alpha_f`)·s((t − S)/D), then `alpha_f` after `t_max`.
    #[serde(rename = "warmup_stable_decay")]
    WarmupStableDecay {
        /// Warmup length (required; not scaled by SSR; `"0ba"` for none).
        t_warmup: Time,
        /// The share of `t_max` the cooldown takes, in [0, 1] (default 0.2).
        #[serde(default = "fifth")]
        decay_fraction: f64,
        /// Final multiplier (default 0.0).
        #[serde(default)]
        alpha_f: f64,
        /// The cooldown's shape (default `"linear"`; `"sqrt"`, `"cosine"`).
        #[serde(default)]
        decay_shape: DecayShape,
        /// Schedule length, warmup and cooldown included (default `"1dur"`).
        #[serde(default = "whole_run")]
        t_max: Time,
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
            Schedule::WarmupStableDecay { .. } => "warmup_stable_decay",
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
            Schedule::WarmupStableDecay {
                t_warmup,
                decay_fraction,
                alpha_f,
                decay_shape,
                t_max,
            } => {
                let w = Wsd::resolve(t_warmup, t_max, *decay_fraction, run, ssr)?;
                Ok(w.multiplier(now, *alpha_f, *decay_shape))
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
            Schedule::Linear { t_max, .. }
            | Schedule::Cosine { t_max, .. }
            | Schedule::WarmupStableDecay { t_max, .. }
                if zero(t_max) =>
            {
                return fail(
                    "t_max",
                    format!("t_max = \"{t_max}\" must be greater than zero"),
                )
            }
            Schedule::WarmupStableDecay { decay_fraction, .. }
                if !(0.0..=1.0).contains(decay_fraction) =>
            {
                return fail(
                    "decay_fraction",
                    format!("decay_fraction must be in [0, 1], got {decay_fraction}"),
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
        if let Schedule::WarmupStableDecay { decay_fraction, .. } = self {
            let w = Wsd::resolve(t_warmup, t_max, *decay_fraction, run, ssr)
                .map_err(|e| e.in_schedule(name))?;
            if w.warmup > w.decay_start {
                return Err(ScheduleError::Coverage(format!(
                    "t_warmup = \"{t_warmup}\" ({warmup}) runs into the cooldown, which starts \
                     at {}{} (the last decay_fraction = {decay_fraction} of t_max = \"{t_max}\", \
                     {max}); shorten the warmup or the cooldown",
                    w.decay_start,
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
            Schedule::WarmupStableDecay {
                alpha_f,
                decay_fraction,
                ..
            } => vec![("alpha_f", *alpha_f), ("decay_fraction", *decay_fraction)],
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
            }
            | Schedule::WarmupStableDecay {
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
            }
            | Schedule::WarmupStableDecay {
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

/// `warmup_stable_decay` resolved for a run: the warmup length `W`, the start of the cooldown
/// `S` = M − D and its length `D` = round(`decay_fraction`·M), all in the unit of the resolved
/// `t_max` (M).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Wsd {
    unit: TimeUnit,
    warmup: u64,
    warmup_time: Time,
    decay_start: u64,
    decay_len: u64,
}

impl Wsd {
    /// Resolves the times as the other warmup schedules do: `t_warmup` unscaled, `t_max`
    /// scaled by `ssr`, both to the same unit.
    fn resolve(
        t_warmup: &Time,
        t_max: &Time,
        decay_fraction: f64,
        run: &RunLength,
        ssr: f64,
    ) -> Result<Wsd, ScheduleError> {
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
        let m = count(&max);
        if m == 0 {
            return Err(ScheduleError::ZeroLength {
                field: "t_max",
                time: *t_max,
                resolved: max,
            });
        }
        // `validate` keeps the fraction in [0, 1]; clamp anyway so that D ≤ M.
        let decay_len = ((decay_fraction.clamp(0.0, 1.0) * m as f64).round() as u64).min(m);
        Ok(Wsd {
            unit: max.unit(),
            warmup: count(&warmup),
            warmup_time: warmup,
            decay_start: m - decay_len,
            decay_len,
        })
    }

    /// α at `now`: the warmup ramp while it lasts, then 1 until `S`, then the cooldown.
    fn multiplier(&self, now: &Timestamp, alpha_f: f64, shape: DecayShape) -> f64 {
        if let Some(alpha) = warmup_value(&self.warmup_time, 1.0, now) {
            return alpha;
        }
        let t = current(now, self.unit);
        if t < self.decay_start || self.decay_len == 0 {
            return 1.0;
        }
        let p = (t - self.decay_start) as f64 / self.decay_len as f64;
        alpha_f + (1.0 - alpha_f) * shape.value(p)
    }
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
