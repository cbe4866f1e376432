//! The training loss and the non-finite guard without host reads in the step.
//!
//! Each step leaves its loss (a detached device scalar) and its non-finite flag (agreed over the
//! ranks) in [`Pending`]; the optimizer takes the flag on the device and skips the update when it
//! is set, so no update ever comes from a non-finite loss. [`Trainer::settle_steps`] reads the
//! pending values in one transfer — at log lines, before checkpoints and evaluations, at the end
//! of the run — adds the finite losses to the running loss of the next metrics line and applies
//! `train.nonfinite_loss` to the non-finite ones: `stop` ends the run there, naming the first such
//! batch (its update, and that of any later non-finite step, was skipped); `skip` warns and counts.

use tch::{Kind, Tensor};

use crate::model::NonFiniteLoss;

use super::error::{fail, Result};
use super::Trainer;

/// One step's values, still on the device.
pub(super) struct PendingStep {
    /// The batch number of the step (1-based, as messages print it) and its epoch.
    batch: u64,
    epoch: u64,
    /// This rank's loss, a 0-dim float tensor.
    loss: Tensor,
    /// 1.0 when the loss of any rank was not finite (the update was skipped), else 0.0.
    flag: Tensor,
}

/// Steps whose loss has not been read yet.
#[derive(Default)]
pub(super) struct Pending {
    steps: Vec<PendingStep>,
}

impl Pending {
    pub(super) fn push(&mut self, batch: u64, epoch: u64, loss: Tensor, flag: Tensor) {
        self.steps.push(PendingStep {
            batch,
            epoch,
            loss,
            flag,
        });
    }

    pub(super) fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

/// The device flag of a loss: a 0-dim float32 tensor, 1 when it is NaN or infinite.
pub(super) fn nonfinite_flag(loss: &Tensor) -> Result<Tensor> {
    Ok(loss
        .f_isfinite()?
        .f_logical_not()?
        .f_to_kind(Kind::Float)?
        .f_view([])?)
}

impl Trainer {
    /// Reads the pending steps' losses and flags (one counted transfer, see [`crate::sync`]),
    /// adds the finite losses to the running loss, applies `train.nonfinite_loss` to the others,
    /// and brings the loss scaler's host fields (checkpointed, logged) up to date.
    pub(super) fn settle_steps(&mut self) -> Result<()> {
        if let Some(scaler) = &mut self.state.scaler {
            let before = (scaler.scale, scaler.skipped_steps);
            scaler.sync()?;
            let (scale, skipped) = (scaler.scale, scaler.skipped_steps);
            let first = !self.scale_logged;
            self.scale_logged = true;
            let mut metrics = Vec::new();
            if first || scale != before.0 {
                metrics.push(("train/loss_scale".to_owned(), scale));
            }
            if skipped != before.1 {
                metrics.push(("train/amp_skipped_steps".to_owned(), skipped as f64));
            }
            self.report_metrics(metrics);
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        let steps = std::mem::take(&mut self.pending.steps);
        let mut parts = Vec::with_capacity(2 * steps.len());
        for s in &steps {
            parts.push(s.loss.f_to_kind(Kind::Double)?.f_view([1])?);
        }
        for s in &steps {
            parts.push(s.flag.f_to_kind(Kind::Double)?.f_view([1])?);
        }
        let values = crate::sync::read(&Tensor::f_cat(&parts, 0)?)?;
        let (losses, flags) = values.split_at(steps.len());
        let mut sum = 0.0;
        let mut finite = 0;
        let mut first_bad = None;
        let mut bad = 0;
        for ((step, &loss), &flag) in steps.iter().zip(losses).zip(flags) {
            if flag > 0.0 {
                bad += 1;
                first_bad.get_or_insert((step.batch, step.epoch, loss));
            } else {
                sum += loss;
                finite += 1;
            }
        }
        // Data-parallel: every rank holds the mean over the ranks (the flags are agreed, so
        // the ranks count the same finite steps).
        let sum = self.mean_over_ranks(sum)?;
        self.running_loss += sum;
        self.running_batches += finite;
        let Some((batch, epoch, value)) = first_bad else {
            return Ok(());
        };
        let now = self.state.clock.timestamp.batch;
        match self.config.train.nonfinite_loss {
            NonFiniteLoss::Stop => {
                let kept = match &self.last_checkpoint {
                    Some(p) => format!("; the last checkpoint, {}, is intact", p.display()),
                    None => String::new(),
                };
                let value = nonfinite_name(value);
                let later = if bad > 1 {
                    format!(" ({bad} such steps since the last check, all skipped)")
                } else {
                    String::new()
                };
                fail!(
                    "the training loss is {value} at batch {batch} (epoch {epoch}); its update was skipped{later} and the run stopped at batch {now}, where the loss is checked{kept}. Lower the learning rate, check the data, or set train.nonfinite_loss = \"skip\" to skip such steps"
                );
            }
            NonFiniteLoss::Skip => {
                self.skipped_steps += bad;
                tracing::warn!(
                    "the training loss is {} at batch {batch} (epoch {epoch}){}; skipped the update ({} skipped so far)",
                    nonfinite_name(value),
                    if bad > 1 {
                        format!(" and at {} more batches up to batch {now}", bad - 1)
                    } else {
                        String::new()
                    },
                    self.skipped_steps
                );
                self.report_metrics(vec![(
                    "train/skipped_steps".to_owned(),
                    self.skipped_steps as f64,
                )]);
                Ok(())
            }
        }
    }

    /// Writes trainer metrics (not a method's) at the current batch.
    pub(super) fn report_metrics(&mut self, metrics: Vec<(String, f64)>) {
        if !metrics.is_empty() && !self.quiet_metrics {
            self.reporter
                .method_metrics(self.state.clock.timestamp.batch, &metrics);
        }
    }
}

/// `NaN`, `inf` or `-inf`, as the messages print a loss.
fn nonfinite_name(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else {
        format!("{value}")
    }
}
