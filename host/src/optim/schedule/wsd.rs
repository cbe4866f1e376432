//! Warmup-stable-decay (`warmup_stable_decay`): its decay shapes and the resolved phases.

use serde::{Deserialize, Serialize};

use super::count;
use super::current;
use super::warmup_value;
use super::ScheduleError;
use crate::time::{RunLength, Time, TimeUnit, Timestamp};
use std::f64::consts::PI;

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

/// `warmup_stable_decay` resolved for a run: the warmup length `W`, the start of the cooldown
/// `S` = M − D and its length `D` = round(`decay_fraction`·M), all in the unit of the resolved
/// `t_max` (M).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Wsd {
    pub(super) unit: TimeUnit,
    pub(super) warmup: u64,
    pub(super) warmup_time: Time,
    pub(super) decay_start: u64,
    pub(super) decay_len: u64,
}

impl Wsd {
    /// Resolves the times as the other warmup schedules do: `t_warmup` unscaled, `t_max`
    /// scaled by `ssr`, both to the same unit.
    pub(super) fn resolve(
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
    pub(super) fn multiplier(&self, now: &Timestamp, alpha_f: f64, shape: DecayShape) -> f64 {
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
