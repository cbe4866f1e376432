//! One training step: the batch events, microbatches, forward/backward, the optimizer step.

use std::time::Instant;

use tch::Tensor;

use crate::engine::{Batch, Event};
use crate::model::NonFiniteLoss;
use crate::time::Timestamp;

use super::error::{fail, Context as _, Result};
use super::Trainer;

impl Trainer {
    /// Steps the learning-rate schedule for the current clock.
    pub(super) fn set_scheduled_lr(&mut self) {
        self.state
            .optimizer
            .schedule_step(&self.state.clock.timestamp, &self.state.clock.run);
    }

    /// Trains one batch already in `state.batch`: `before_train_batch`, the microbatch loop
    /// with its forward/loss/backward events, `after_train_batch` — repeated when a method asks
    /// for an extra pass (SAM) — then the optimizer step.
    pub fn train_batch(&mut self) -> Result<()> {
        const MAX_PASSES: u32 = 8;
        self.state.pass_index = 0;
        let mut first_pass_loss = None;
        loop {
            let loss = self.forward_backward()?;
            if first_pass_loss.is_none() {
                first_pass_loss = loss;
            }
            if !std::mem::take(&mut self.state.extra_pass_requested) {
                break;
            }
            self.state.pass_index += 1;
            if self.state.pass_index >= MAX_PASSES {
                fail!(
                    "methods asked for more than {MAX_PASSES} forward/backward passes in one step"
                );
            }
        }
        let local = match &first_pass_loss {
            Some(loss) => Some(loss.f_double_value(&[])?),
            None => None,
        };
        // Data-parallel: the loss, a stop request and the samples trained on, agreed over the
        // ranks (so that every rank skips, steps and stops alike).
        let (agreed, stop, trained) = self.agree_step(local, self.step_samples)?;
        self.agreed_stop = stop;
        self.trained_samples += trained;
        let first_pass_loss = match (first_pass_loss, agreed) {
            (Some(loss), Some(value)) if self.dp.is_some() => Some(
                Tensor::f_from_slice(&[value])?
                    .f_to_device(loss.device())?
                    .f_view([])?,
            ),
            (loss, _) => loss,
        };
        if let Some(value) = agreed {
            if !value.is_finite() && self.skip_nonfinite_step(value)? {
                if let Some(scaler) = &mut self.state.scaler {
                    scaler.update();
                }
                return Ok(());
            }
        }
        match &mut self.state.scaler {
            // amp_fp16: a step whose (unscaled) gradients overflowed is skipped and the scale
            // backs off, as PyTorch's GradScaler does.
            Some(scaler) => {
                let (before, skip) = (scaler.scale, scaler.found_inf());
                if skip {
                    self.state.optimizer.skip_step();
                } else {
                    self.state.optimizer.step()?;
                }
                scaler.update();
                // Logged at the first step and whenever it changes, not every step.
                let (scale, skipped) = (scaler.scale, scaler.skipped_steps);
                if scale != before || self.state.optimizer.steps() <= 1 {
                    self.state
                        .metrics
                        .push(("train/loss_scale".to_owned(), scale));
                }
                if skip {
                    self.state
                        .metrics
                        .push(("train/amp_skipped_steps".to_owned(), skipped as f64));
                }
            }
            None => self.state.optimizer.step()?,
        }
        if let Some(loss) = first_pass_loss {
            self.running_loss = Some(match self.running_loss.take() {
                None => loss,
                Some(sum) => sum.f_add(&loss)?,
            });
            self.running_batches += 1;
        }
        Ok(())
    }

    /// What to do about a non-finite training loss (`train.nonfinite_loss`): an error that stops
    /// the run before the update, or `true` to skip the update (counted, logged).
    fn skip_nonfinite_step(&mut self, value: f64) -> Result<bool> {
        let t = &self.state.clock.timestamp;
        let (batch, epoch) = (t.batch + 1, t.epoch);
        match self.config.train.nonfinite_loss {
            NonFiniteLoss::Stop => {
                let kept = match &self.last_checkpoint {
                    Some(p) => format!("; the last checkpoint, {}, is intact", p.display()),
                    None => String::new(),
                };
                fail!(
                    "the training loss is {value} at batch {batch} (epoch {epoch}); stopped before the update{kept}. Lower the learning rate, check the data, or set train.nonfinite_loss = \"skip\" to skip such steps"
                );
            }
            NonFiniteLoss::Skip => {
                self.skipped_steps += 1;
                tracing::warn!(
                    "the training loss is {value} at batch {batch} (epoch {epoch}); skipping the update ({} skipped so far)",
                    self.skipped_steps
                );
                self.state.optimizer.zero_grad();
                self.state
                    .metrics
                    .push(("train/skipped_steps".to_owned(), self.skipped_steps as f64));
                Ok(true)
            }
        }
    }

    /// One forward/backward pass over the batch, from `before_train_batch` to
    /// `after_train_batch`; returns the batch loss (detached, on the device).
    pub(super) fn forward_backward(&mut self) -> Result<Option<Tensor>> {
        self.state.in_train_batch = true;
        self.fire(Event::BEFORE_TRAIN_BATCH)?;
        self.state.optimizer.zero_grad();
        let full = self.state.batch.shallow_clone();
        let total = full.len();
        if total == 0 {
            fail!(
                "a method emptied the batch at batch {}",
                self.state.clock.timestamp.batch
            );
        }
        let microbatch = (self.config.train.microbatch_size as i64).clamp(1, total);
        let parts = full.split(microbatch)?;
        let count = parts.len();
        let mut batch_loss: Option<Tensor> = None;
        for (index, part) in parts.into_iter().enumerate() {
            let size = part.len();
            // Data-parallel: gradients are averaged over the ranks in the last microbatch's
            // backward pass (the earlier ones accumulate locally, as DDP's `no_sync`).
            let synced = index + 1 == count;
            self.state.batch = part;
            if synced {
                self.before_synced_forward()?;
            }
            self.fire(Event::BEFORE_FORWARD)?;
            self.state.forward_batch(true)?;
            self.fire(Event::AFTER_FORWARD)?;
            self.fire(Event::BEFORE_LOSS)?;
            let (output, target) = match (&self.state.output, self.state.batch.target()) {
                (Some(o), Some(t)) => (o.shallow_clone(), t.shallow_clone()),
                _ => fail!("the batch has no `target` or the model no output"),
            };
            let loss = self.state.loss(&output, &target, false)?;
            self.state.loss = Some(loss);
            self.fire(Event::AFTER_LOSS)?;
            self.fire(Event::BEFORE_BACKWARD)?;
            let loss = self.state.loss.as_ref().context("the loss was removed")?;
            let weight = size as f64 / total as f64;
            let weighted = loss.f_mul_scalar(weight)?;
            let root = match &self.state.scaler {
                // As Composer: the loss is scaled, then weighted by the microbatch's share.
                Some(scaler) => scaler.scale_loss(loss)?.f_mul_scalar(weight)?,
                None => weighted.shallow_clone(),
            };
            if synced {
                self.before_synced_backward(&root)?;
            }
            root.f_backward()?;
            let detached = weighted.f_detach()?;
            batch_loss = Some(match batch_loss {
                None => detached,
                Some(sum) => sum.f_add(&detached)?,
            });
            self.fire(Event::AFTER_BACKWARD)?;
        }
        self.state.batch = full;
        // amp_fp16: methods and the optimizer see true gradients.
        if let Some(scaler) = &mut self.state.scaler {
            scaler.unscale(self.state.optimizer.params())?;
        }
        self.fire(Event::AFTER_TRAIN_BATCH)?;
        self.state.in_train_batch = false;
        Ok(batch_loss)
    }

    /// One training step on a batch already on the device, from `after_dataloader` to
    /// `batch_end`: the batch's events, forward/backward over its microbatches, the optimizer
    /// step, the schedule and the clock. `started` is when the step began (for wall-clock time
    /// and throughput). Returns the timestamp before the step.
    ///
    /// The clock counts the batch as the loader gave it, as Composer does, even when a method
    /// (selective backprop) trains on fewer samples; those are counted in `trained_samples`.
    /// Tokens (language models) are counted the same way: the loader's `[B, T]` input, before
    /// a method (sequence-length warmup) shortens it.
    pub fn step(&mut self, batch: Batch, started: Instant) -> Result<Timestamp> {
        let samples = batch.len() as u64;
        let tokens = batch.tokens();
        self.state.batch = batch;
        self.fire(Event::AFTER_DATALOADER)?;
        self.step_samples = self.state.batch.len() as u64;
        self.fire(Event::BATCH_START)?;
        self.train_batch()?;
        // As in Composer: the schedule is stepped before the clock advances.
        self.set_scheduled_lr();
        let previous = self.state.clock.timestamp.clone();
        let seconds = started.elapsed().as_secs_f64();
        self.train_seconds += seconds;
        // Data-parallel: the clock counts the global batch (every rank's share is as large).
        let world = self.world() as u64;
        self.state.clock.timestamp =
            self.state
                .clock
                .timestamp
                .to_next_batch(samples * world, tokens * world, seconds);
        let t = &self.state.clock.timestamp;
        let (count, unit) = if tokens > 0 {
            (t.token, "tok")
        } else {
            (t.sample, "img")
        };
        self.reporter
            .batch_done(count as f64 / self.train_seconds.max(1e-9), unit);
        self.fire(Event::BATCH_END)?;
        Ok(previous)
    }
}
