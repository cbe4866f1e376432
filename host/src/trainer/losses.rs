//! The training loss and the non-finite guard without host reads in the step.
//!
//! Each step adds its loss (a detached device scalar) and its non-finite flag (agreed over the
//! ranks) to [`Pending`], on the device; the optimizer takes the flag on the device and skips the update when it
//! is set, so no update ever comes from a non-finite loss. [`Trainer::settle_steps`] reads the
//! pending values in one transfer — at log lines, before checkpoints and evaluations, at the end
//! of the run — adds the finite losses to the running loss of the next metrics line and applies
//! `train.nonfinite_loss` to the non-finite ones: `stop` ends the run there, naming the first such
//! batch (its update, and that of any later non-finite step, was skipped); `skip` warns and counts.

use tch::{Kind, Tensor};

use crate::model::NonFiniteLoss;

use super::error::{fail, Result};
use super::Trainer;

/// The steps' values since the last read, accumulated on the device in one float64 tensor of
/// [`SLOTS`] values, updated in place (a step keeps no tensor of its own alive: on the CPU, small
/// long-lived allocations between a step's large ones would fragment the heap):
/// `[loss sum of finite steps, finite steps, non-finite steps, first non-finite step's batch,
/// its epoch, its loss]`.
#[derive(Default)]
pub(super) struct Pending {
    acc: Option<Tensor>,
    /// Steps added since the last read (host count: nothing to read when 0).
    steps: u64,
}

const SLOTS: i64 = 6;

impl Pending {
    /// Adds a step: `loss` (0-dim, this rank's) and `flag` (0-dim, 1.0 when any rank's loss was
    /// not finite). Device operations only; `batch` (1-based) and `epoch` go in as scalars.
    pub(super) fn push(
        &mut self,
        batch: u64,
        epoch: u64,
        loss: &Tensor,
        flag: &Tensor,
    ) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let device = loss.device();
        let acc = match &mut self.acc {
            Some(a) if a.device() == device => a,
            slot => slot.insert(Tensor::f_zeros([SLOTS], (Kind::Double, device))?),
        };
        let value = loss.f_to_kind(Kind::Double)?.f_reshape([1])?;
        let bad_f = flag.f_to_kind(Kind::Double)?.f_reshape([1])?;
        let bad = bad_f.f_gt(0.5)?;
        // NaN-safe: `where` picks, it does not multiply.
        let finite_value = value.f_where_scalarother(&bad.f_logical_not()?, 0.0)?;
        let sums = Tensor::f_cat(
            &[
                finite_value,
                bad_f.f_neg()?.f_add_scalar(1.0)?,
                bad_f.shallow_clone(),
            ],
            0,
        )?;
        // The first non-finite step since the last read: this one if it is bad and none was.
        let first = bad.f_logical_and(&acc.f_narrow(0, 2, 1)?.f_eq(0.0)?)?;
        let marks = Tensor::f_cat(
            &[
                Tensor::f_full([1], batch as f64, (Kind::Double, device))?,
                Tensor::f_full([1], epoch as f64, (Kind::Double, device))?,
                value,
            ],
            0,
        )?;
        let mut kept = acc.f_narrow(0, 3, 3)?;
        let chosen = marks.f_where_self(&first, &kept)?;
        kept.f_copy_(&chosen)?;
        let _ = acc.f_narrow(0, 0, 3)?.f_add_(&sums)?;
        self.steps += 1;
        Ok(())
    }

    /// Reads the accumulated values (one counted transfer) and starts over.
    fn take(&mut self) -> Result<Option<[f64; SLOTS as usize]>> {
        let Some(acc) = &mut self.acc else {
            return Ok(None);
        };
        if self.steps == 0 {
            return Ok(None);
        }
        let values = crate::sync::read(acc)?;
        let _ = acc.f_zero_()?;
        self.steps = 0;
        let mut out = [0.0; SLOTS as usize];
        for (o, v) in out.iter_mut().zip(values) {
            *o = v;
        }
        Ok(Some(out))
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
            let first = !self.tally.scale_logged;
            self.tally.scale_logged = true;
            let mut metrics = Vec::new();
            if first || scale != before.0 {
                metrics.push(("train/loss_scale".to_owned(), scale));
            }
            if skipped != before.1 {
                metrics.push(("train/amp_skipped_steps".to_owned(), skipped as f64));
            }
            self.report_metrics(metrics);
        }
        let Some([sum, finite, bad, batch, epoch, value]) = self.tally.pending.take()? else {
            return Ok(());
        };
        let (finite, bad) = (finite.round() as u64, bad.round() as u64);
        // Data-parallel: every rank holds the mean over the ranks (the flags are agreed, so
        // the ranks count the same finite steps).
        let sum = self.mean_over_ranks(sum)?;
        self.tally.running_loss += sum;
        self.tally.running_batches += finite;
        if bad == 0 {
            return Ok(());
        }
        let (batch, epoch) = (batch.round() as u64, epoch.round() as u64);
        let now = self.state.clock.timestamp.batch;
        match self.config.train.nonfinite_loss {
            NonFiniteLoss::Stop => {
                let kept = match &self.saved.last_checkpoint {
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
                self.tally.skipped_steps += bad;
                tracing::warn!(
                    "the training loss is {} at batch {batch} (epoch {epoch}){}; skipped the update ({} skipped so far)",
                    nonfinite_name(value),
                    if bad > 1 {
                        format!(" and at {} more batches up to batch {now}", bad - 1)
                    } else {
                        String::new()
                    },
                    self.tally.skipped_steps
                );
                self.report_metrics(vec![(
                    "train/skipped_steps".to_owned(),
                    self.tally.skipped_steps as f64,
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
