//! Checking a [`Schedule`]: its values on their own (`validate`, `InvalidSchedule`) and
//! against a run's length (`check`, `ScheduleError`).

use super::count;
use super::wsd::Wsd;
use super::Schedule;
use crate::time::{RunLength, Time, TimeError, TimeUnit, Timestamp};

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

impl Schedule {
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
            // PyTorch refuses a factor of 1 or more ("Factor should be < 1.0"); 0 would drop
            // the rate to min_lr at once.
            Schedule::ReduceOnPlateau { factor, .. } if !(*factor > 0.0 && *factor < 1.0) => {
                return fail(
                    "factor",
                    format!("factor must be in (0, 1): the rate is multiplied by it, got {factor}"),
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
            Schedule::ReduceOnPlateau {
                factor,
                threshold,
                min_lr,
                eps,
                ..
            } => vec![
                ("factor", *factor),
                ("threshold", *threshold),
                ("min_lr", *min_lr),
                ("eps", *eps),
            ],
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
            Schedule::ReduceOnPlateau { .. } => Vec::new(),
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
