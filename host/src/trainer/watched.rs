//! What a run does with its evaluations besides reporting them: the `reduce_on_plateau`
//! schedule's step, and the checkpoints `checkpoint.keep_best` keeps (with `best.ckpt`).

use std::path::{Path, PathBuf};

use crate::checkpoint;
use crate::report::{EvalRecord, Metric};

use super::error::{fail, Context as _, Result};
use super::Trainer;

impl Trainer {
    /// Steps a `reduce_on_plateau` schedule with the evaluation's value of its metric; logs a
    /// reduction. Every rank steps (the evaluation is the same on every rank).
    pub(super) fn plateau_step(&mut self, eval: &EvalRecord) -> Result<()> {
        let Some(monitor) = self.config.scheduler.monitor() else {
            return Ok(());
        };
        let Some(metric) = Metric::from_name(monitor) else {
            fail!("scheduler.monitor: unknown metric {monitor:?}");
        };
        let Some(value) = metric.value_in(eval) else {
            fail!("scheduler.monitor: this run's evaluation does not report {metric}");
        };
        let Some(settings) = self.config.scheduler.plateau(metric.higher_is_better()) else {
            return Ok(());
        };
        if let Some((old, new)) = self.state.optimizer.plateau_step(&settings, value) {
            if self.is_rank0() {
                tracing::info!(
                    "reduce_on_plateau: {metric} did not improve for more than {} evaluation(s) \
                     (last {value:.6}); learning rate {old:e} -> {new:e}",
                    settings.patience
                );
            }
        }
        Ok(())
    }

    /// The checkpoints of `folder` that `keep_best` keeps, best first: those with the best
    /// evaluation at their own batch (none without `keep_best`).
    fn best_checkpoints(&self, folder: &Path) -> Vec<PathBuf> {
        let Some(best) = self.config.checkpoint.keep_best else {
            return Vec::new();
        };
        let evals = &self.history.evals;
        checkpoint::best_of(folder, best.k, best.metric.higher_is_better(), |batch| {
            evals
                .iter()
                .rev()
                .find(|e| e.batch == batch)
                .and_then(|e| best.metric.value_in(e))
        })
    }

    /// After a checkpoint (`current`) or an evaluation: points `best.ckpt` at the best
    /// checkpoint (with `keep_best`) and deletes those neither `keep_last` nor `keep_best`
    /// keeps. Rank 0 only (it writes the folder).
    pub(super) fn apply_retention(&self, folder: &Path, current: &Path) -> Result<()> {
        let kept = self.best_checkpoints(folder);
        if let Some(best) = kept.first() {
            checkpoint::update_link(folder, checkpoint::BEST, best).with_context(|| {
                format!(
                    "pointing {} at the best checkpoint",
                    folder.join(checkpoint::BEST).display()
                )
            })?;
        }
        for old in checkpoint::prune(folder, self.config.checkpoint.keep, current, &kept) {
            tracing::debug!("deleted old checkpoint {}", old.display());
        }
        Ok(())
    }
}
