//! Time-to-target: after each evaluation, whether `train.target` is met for the first time;
//! if so, what it took (recorded in run.json and checkpoints), and with `stop_at_target` the
//! end of the run. Every rank of a data-parallel run decides from the same reduced
//! evaluation, so all stop after the same batch.

use crate::report::{EvalRecord, TargetReached};

use super::Trainer;

impl Trainer {
    /// Records the first evaluation that meets `train.target`, logs it and, with
    /// `stop_at_target`, stops the run as a method's `request_stop` does (a final checkpoint,
    /// status `stopped early: ...`). At the run's end there is nothing left to stop.
    pub(super) fn check_target(&mut self, eval: &EvalRecord) {
        let Some(target) = self.config.train.target else {
            return;
        };
        if self.history.target_reached.is_some() {
            return;
        }
        let Some(reached_value) = target.met_by(eval) else {
            return;
        };
        let wall_seconds = self.wall_seconds();
        let t = &self.state.clock.timestamp;
        let reached = TargetReached {
            metric: target.metric,
            op: target.op,
            value: target.value,
            reached_value,
            epoch: eval.epoch,
            batch: eval.batch,
            samples: t.sample,
            tokens: self.data.train_loader.is_tokens().then_some(t.token),
            train_seconds: self.wall.train_seconds,
            wall_seconds,
            estimated_cost_usd: self.estimated_cost_usd(wall_seconds),
        };
        if self.is_rank0() {
            let cost = reached
                .estimated_cost_usd
                .map(|usd| format!(", ${usd:.4}"))
                .unwrap_or_default();
            tracing::info!(
                "target {target} reached at batch {} (epoch {}): {reached_value:.4} after {:.1} s of training, {wall_seconds:.1} s wall{cost}",
                reached.batch,
                reached.epoch,
                reached.train_seconds,
            );
        }
        self.history.target_reached = Some(reached);
        let at_end = self.state.clock.run.reached(
            &self.state.clock.timestamp,
            &self.state.clock.run.max_duration,
        );
        if self.config.train.stop_at_target && !at_end {
            self.state.request_stop(format!("target {target} reached"));
        }
    }

    /// A run resumed from a checkpoint written after the target was met stops at once with
    /// `stop_at_target` (as the run that wrote it did), instead of training on.
    pub(super) fn stop_if_target_already_reached(&mut self) {
        let (Some(target), Some(reached)) =
            (self.config.train.target, &self.history.target_reached)
        else {
            return;
        };
        if self.config.train.stop_at_target {
            let reason = format!("target {target} reached at batch {}", reached.batch);
            self.state.request_stop(reason);
        }
    }

    /// The record of a checkpoint, kept when it is about this run's target; a run resumed with
    /// another target checks it afresh from its next evaluation.
    pub(super) fn restored_target(&self, saved: Option<TargetReached>) -> Option<TargetReached> {
        let saved = saved?;
        match self.config.train.target {
            Some(target) if target.is_recorded_by(&saved) => Some(saved),
            ours => {
                if self.is_rank0() {
                    let ours = ours.map_or_else(|| "none".to_owned(), |t| format!("\"{t}\""));
                    tracing::info!(
                        "the checkpoint records target \"{}\" reached at batch {}; this run's target is {ours}, checked from the next evaluation on",
                        saved.target(),
                        saved.batch
                    );
                }
                None
            }
        }
    }

    /// At the end of a run that never met its target: says so, with the best value seen.
    pub(super) fn report_target_missed(&self) {
        let Some(target) = self.config.train.target else {
            return;
        };
        if self.history.target_reached.is_some() || !self.is_rank0() {
            return;
        }
        match target.best_in(&self.history.evals) {
            Some((best, batch)) => tracing::info!(
                "target {target} not reached; best {} {best:.4} at batch {batch}",
                target.metric.as_str()
            ),
            None => tracing::info!(
                "target {target} not reached; no evaluation gave {}",
                target.metric.as_str()
            ),
        }
    }
}
