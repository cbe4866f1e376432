//! PyTorch's `torch.optim.swa_utils.SWALR` as a pure function of the optimizer's current rate.

use serde::{Deserialize, Serialize};

use crate::config::AnnealStrategy;

/// The `SWALR` scheduler's position: the target rate and the steps taken since it was built.
///
/// Each [`Swalr::step`] reads the optimizer's current rate `lr` and returns the new one:
///
/// ```text
/// k = steps taken so far, this one included (the constructor's own step is step 0)
/// prev_alpha = f(clamp((k − 1) / anneal_steps, 0, 1))
/// base = swa_lr if prev_alpha = 1, else (lr − prev_alpha·swa_lr) / (1 − prev_alpha)
/// alpha = f(clamp(k / anneal_steps, 0, 1))
/// new lr = swa_lr·alpha + base·(1 − alpha)
/// ```
///
/// `base` is back-solved from the current rate, so when nothing else touches the rate it is the
/// rate the scheduler was built with, and when a schedule rewrites the rate between steps the
/// two interleave (Composer's quirk).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Swalr {
    /// The rate annealed towards.
    pub swa_lr: f64,
    /// Steps taken since construction (the constructor's own step not counted).
    pub steps: u64,
}

impl Swalr {
    /// A scheduler towards `swa_lr` that has taken no step. (PyTorch's constructor step leaves
    /// the rate unchanged: `f(0) = 0` for both strategies.)
    pub fn new(swa_lr: f64) -> Swalr {
        Swalr { swa_lr, steps: 0 }
    }

    /// One `SWALR.step()`: the rate the optimizer gets, from its current rate `lr`.
    pub fn step(&mut self, lr: f64, strategy: AnnealStrategy, anneal_steps: u64) -> f64 {
        self.steps += 1;
        swalr_lr(lr, self.swa_lr, self.steps, strategy, anneal_steps)
    }
}

/// The rate `SWALR`'s `step`-th step (1-based) sets when the optimizer's rate is `lr`: the
/// functional form of [`Swalr::step`], computed in the order PyTorch 2.7 computes it.
pub fn swalr_lr(
    lr: f64,
    swa_lr: f64,
    step: u64,
    strategy: AnnealStrategy,
    anneal_steps: u64,
) -> f64 {
    let anneal = anneal_steps.max(1) as f64;
    let fraction = |k: f64| (k / anneal).clamp(0.0, 1.0);
    let prev_alpha = strategy.alpha(fraction(step as f64 - 1.0));
    let base = if prev_alpha == 1.0 {
        swa_lr
    } else {
        (lr - prev_alpha * swa_lr) / (1.0 - prev_alpha)
    };
    let alpha = strategy.alpha(fraction(step as f64));
    swa_lr * alpha + base * (1.0 - alpha)
}
