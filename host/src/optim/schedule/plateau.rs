//! `reduce_on_plateau`: PyTorch's `torch.optim.lr_scheduler.ReduceLROnPlateau`, stepped with
//! an evaluation metric after each evaluation.
//!
//! Unlike the other schedules it is not a function of the clock: the learning rate is a state
//! ([`PlateauState`], saved in checkpoints with the optimizer) that falls by `factor` when the
//! monitored metric has not improved for more than `patience` evaluations. Each step below
//! follows `ReduceLROnPlateau.step` (torch 2.x) operation for operation, so the rates are
//! PyTorch's to the bit.

use serde::{Deserialize, Deserializer, Serialize};

/// Whether smaller (`min`) or larger (`max`) values of the monitored metric are improvements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlateauMode {
    /// Lower is better (losses).
    Min,
    /// Higher is better (accuracies).
    Max,
}

/// How `threshold` measures an improvement: relative to the best value, or absolute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThresholdMode {
    /// Better than `best × (1 ∓ threshold)` (the default).
    #[default]
    Rel,
    /// Better than `best ∓ threshold`.
    Abs,
}

/// `mode`, given: a present value is `Some` (the field's default is `None`).
pub(super) fn some_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PlateauMode>, D::Error> {
    PlateauMode::deserialize(d).map(Some)
}

/// The settings of a `reduce_on_plateau` schedule, as one value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plateau {
    /// Lower or higher values are improvements.
    pub mode: PlateauMode,
    /// The rate's factor at a reduction, in (0, 1).
    pub factor: f64,
    /// Evaluations without improvement tolerated before a reduction.
    pub patience: u64,
    /// The least change that counts as an improvement.
    pub threshold: f64,
    /// Relative or absolute `threshold`.
    pub threshold_mode: ThresholdMode,
    /// Evaluations after a reduction during which bad ones are not counted.
    pub cooldown: u64,
    /// The rate never falls below this.
    pub min_lr: f64,
    /// A reduction smaller than this is not applied.
    pub eps: f64,
}

/// Where a `reduce_on_plateau` schedule stands: the default group's learning rate and
/// `ReduceLROnPlateau`'s counters. Saved in checkpoints with the optimizer's position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlateauState {
    /// The default group's learning rate (`param_group["lr"]`).
    pub lr: f64,
    /// The best value seen (`None` before the first evaluation: PyTorch's ±inf).
    pub best: Option<f64>,
    /// Evaluations since the last improvement (`num_bad_epochs`).
    pub num_bad: u64,
    /// Evaluations of cooldown left (`cooldown_counter`).
    pub cooldown_counter: u64,
    /// Evaluations seen (`last_epoch`).
    pub evaluations: u64,
}

impl PlateauState {
    /// The state before any evaluation, at the rate `lr`.
    pub fn new(lr: f64) -> PlateauState {
        PlateauState {
            lr,
            best: None,
            num_bad: 0,
            cooldown_counter: 0,
            evaluations: 0,
        }
    }

    /// `ReduceLROnPlateau.step(current)`: records the evaluation's value and reduces the rate
    /// when the plateau has lasted longer than `patience`. Returns the rate before and after a
    /// reduction, `None` when the rate stays.
    pub fn step(&mut self, p: &Plateau, current: f64) -> Option<(f64, f64)> {
        self.evaluations += 1;
        if is_better(p, current, self.best) {
            self.best = Some(current);
            self.num_bad = 0;
        } else {
            self.num_bad += 1;
        }
        if self.cooldown_counter > 0 {
            self.cooldown_counter -= 1;
            // Bad evaluations during cooldown are not counted.
            self.num_bad = 0;
        }
        if self.num_bad > p.patience {
            let reduced = self.reduce(p);
            self.cooldown_counter = p.cooldown;
            self.num_bad = 0;
            return reduced;
        }
        None
    }

    /// `_reduce_lr`: `max(lr × factor, min_lr)`, applied only when it lowers the rate by more
    /// than `eps`.
    fn reduce(&mut self, p: &Plateau) -> Option<(f64, f64)> {
        let old = self.lr;
        let new = (old * p.factor).max(p.min_lr);
        if old - new > p.eps {
            self.lr = new;
            return Some((old, new));
        }
        None
    }
}

/// `ReduceLROnPlateau.is_better` (`best` `None` is PyTorch's initial ±inf, which every number
/// beats and NaN does not).
fn is_better(p: &Plateau, a: f64, best: Option<f64>) -> bool {
    let Some(best) = best else {
        return !a.is_nan();
    };
    match (p.mode, p.threshold_mode) {
        (PlateauMode::Min, ThresholdMode::Rel) => a < best * (1.0 - p.threshold),
        (PlateauMode::Min, ThresholdMode::Abs) => a < best - p.threshold,
        (PlateauMode::Max, ThresholdMode::Rel) => a > best * (p.threshold + 1.0),
        (PlateauMode::Max, ThresholdMode::Abs) => a > best + p.threshold,
    }
}
