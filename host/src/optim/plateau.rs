//! A `reduce_on_plateau` schedule's steps: the optimizer holds its state (the rate and
//! `ReduceLROnPlateau`'s counters, [`super::schedule::PlateauState`]) and the trainer steps it
//! after each evaluation with the monitored metric.

use super::schedule::Plateau;
use super::Optimizer;

impl Optimizer {
    /// Steps the `reduce_on_plateau` schedule with an evaluation's `value` of its metric
    /// (`ReduceLROnPlateau.step(value)`). Returns the default group's rate before and after a
    /// reduction; `None` when the rate stays or the schedule is another.
    pub fn plateau_step(&mut self, settings: &Plateau, value: f64) -> Option<(f64, f64)> {
        let reduced = self.plateau.as_mut()?.step(settings, value);
        if reduced.is_some() {
            // Device copies of the rates (CUDA graphs) take the new one at the next step.
            self.lr_staged = false;
        }
        reduced
    }
}
