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

mod check;
mod plateau;
mod wsd;

pub use check::{InvalidSchedule, ScheduleError};
pub use plateau::{Plateau, PlateauMode, PlateauState, ThresholdMode};
pub use wsd::DecayShape;

use std::f64::consts::PI;

use serde::{Deserialize, Serialize};

use crate::time::{RunLength, Time, TimeUnit, Timestamp};
use wsd::Wsd;

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

fn cross_entropy() -> String {
    "cross_entropy".to_owned()
}

fn ten() -> u64 {
    10
}

fn ten_thousandth() -> f64 {
    1e-4
}

fn torch_eps() -> f64 {
    1e-8
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
    /// PyTorch's `ReduceLROnPlateau`, stepped after each evaluation with the `monitor`ed
    /// metric: when it has not improved (by `threshold`) for more than `patience` evaluations,
    /// the rate becomes `max(lr × factor, min_lr)`, and the next `cooldown` evaluations do not
    /// count. The rate is a state, not a function of the clock ([`PlateauState`]).
    #[serde(rename = "reduce_on_plateau")]
    ReduceOnPlateau {
        /// The evaluation metric watched (default `"cross_entropy"`; `accuracy`, `perplexity`,
        /// `topK` and `f1` as `train.metrics` names them).
        #[serde(default = "cross_entropy")]
        monitor: String,
        /// `"min"` or `"max"`: whether lower or higher values are better (default: the
        /// metric's own direction, `max` for accuracies and F1, `min` for the losses; PyTorch's
        /// default is always `min`).
        #[serde(
            default,
            deserialize_with = "plateau::some_mode",
            skip_serializing_if = "Option::is_none"
        )]
        mode: Option<PlateauMode>,
        /// The rate's factor at a reduction, in (0, 1) (default 0.1).
        #[serde(default = "tenth")]
        factor: f64,
        /// Evaluations without improvement tolerated before a reduction (default 10).
        #[serde(default = "ten")]
        patience: u64,
        /// The least change that counts as an improvement (default 1e-4).
        #[serde(default = "ten_thousandth")]
        threshold: f64,
        /// `"rel"` (better than `best × (1 ∓ threshold)`, the default) or `"abs"` (better
        /// than `best ∓ threshold`).
        #[serde(default)]
        threshold_mode: ThresholdMode,
        /// Evaluations after a reduction whose lack of improvement is not counted (default 0).
        #[serde(default)]
        cooldown: u64,
        /// The lowest rate of the default group (default 0).
        #[serde(default)]
        min_lr: f64,
        /// A reduction by less than this is not applied (default 1e-8).
        #[serde(default = "torch_eps")]
        eps: f64,
    },
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
            Schedule::ReduceOnPlateau { .. } => "reduce_on_plateau",
        }
    }

    /// A `reduce_on_plateau` schedule's settings, with `mode` from `higher_is_better` (the
    /// monitored metric's direction) when not given; `None` for the other schedules.
    pub fn plateau(&self, higher_is_better: bool) -> Option<Plateau> {
        let Schedule::ReduceOnPlateau {
            mode,
            factor,
            patience,
            threshold,
            threshold_mode,
            cooldown,
            min_lr,
            eps,
            ..
        } = self
        else {
            return None;
        };
        let natural = if higher_is_better {
            PlateauMode::Max
        } else {
            PlateauMode::Min
        };
        Some(Plateau {
            mode: mode.unwrap_or(natural),
            factor: *factor,
            patience: *patience,
            threshold: *threshold,
            threshold_mode: *threshold_mode,
            cooldown: *cooldown,
            min_lr: *min_lr,
            eps: *eps,
        })
    }

    /// The metric a `reduce_on_plateau` schedule watches.
    pub fn monitor(&self) -> Option<&str> {
        match self {
            Schedule::ReduceOnPlateau { monitor, .. } => Some(monitor),
            _ => None,
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
            // The rate is the plateau's state (`Optimizer::plateau_step`), not the clock's.
            Schedule::ReduceOnPlateau { .. } => Ok(1.0),
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
mod check_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod wsd_tests;
