//! One training step: the batch events, microbatches, forward/backward, the optimizer step.

use std::time::Instant;

use tch::Tensor;

use crate::engine::{Batch, Event};
use crate::time::Timestamp;

use super::error::{fail, Context as _, Result};
use super::{losses, Trainer};

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
        if self.graphs.is_some() {
            return self.train_batch_graphed();
        }
        self.train_batch_eager()
    }

    /// [`Trainer::train_batch`] without CUDA graphs.
    pub(super) fn train_batch_eager(&mut self) -> Result<()> {
        let (loss, flag) = self.step_body()?;
        self.finish_step(loss.as_ref(), flag.as_ref())
    }

    /// The step on the device, what a CUDA graph captures: the passes, the agreement of the
    /// ranks, the non-finite guard, the optimizer step and the loss scaler's update. Returns
    /// the first pass's loss and its non-finite flag (device tensors).
    pub(super) fn step_body(&mut self) -> Result<(Option<Tensor>, Option<Tensor>)> {
        const MAX_PASSES: u32 = 8;
        self.state.pass_index = 0;
        let mut first_pass_loss = None;
        loop {
            let loss = self.forward_backward_fitting()?;
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
        // Data-parallel: a stop request and the samples trained on, agreed over the ranks
        // (host numbers), so that every rank steps and stops alike.
        let (stop, trained) = self.agree_step(self.tally.step_samples)?;
        self.agreed_stop = stop;
        self.tally.trained_samples += trained;
        // The non-finite guard, on the device: the flag (agreed over the ranks) goes to the
        // optimizer, which leaves the parameters and its state as they were when it is set;
        // `settle_steps` reads it later with the loss and applies `train.nonfinite_loss`.
        let loss_flag = match &first_pass_loss {
            Some(loss) => Some(self.agree_flag(losses::nonfinite_flag(loss)?)?),
            None => None,
        };
        // amp_fp16: a step whose (unscaled) gradients overflowed is skipped too, and the scale
        // backs off, as PyTorch's GradScaler does.
        let grads_flag = match &self.state.scaler {
            Some(scaler) => scaler.found_inf(),
            None => None,
        };
        // Sharded gradients: each rank unscaled its own share before the reduce-scatter.
        let grads_flag = match grads_flag {
            Some(flag) if self.local_gradients() => Some(self.agree_flag(flag)?),
            other => other,
        };
        let skip = match (&loss_flag, grads_flag) {
            (Some(a), Some(b)) => Some(a.f_maximum(&b)?),
            (Some(a), None) => Some(a.shallow_clone()),
            (None, b) => b,
        };
        let step = crate::engine::Stage::Run(&mut self.state).step_info();
        // Sharding: this rank's pieces get their gradients, are stepped, and reach every rank.
        self.shard_gradients()?;
        self.state.optimizer.step_masked(skip.as_ref())?;
        self.gather_parameters()?;
        // Methods that claimed parameters update them now, with this step's rate and flag.
        self.state.step = Some(step);
        self.state.found_inf = skip.as_ref().map(Tensor::shallow_clone);
        let fired = self.fire(Event::OPTIMIZER_STEP);
        self.state.step = None;
        self.state.found_inf = None;
        fired?;
        if let Some(scaler) = &mut self.state.scaler {
            scaler.update()?;
        }
        Ok((first_pass_loss, loss_flag))
    }

    /// Keeps the step's loss and flag (on the device) for the next read.
    pub(super) fn finish_step(
        &mut self,
        loss: Option<&Tensor>,
        flag: Option<&Tensor>,
    ) -> Result<()> {
        if let (Some(loss), Some(flag)) = (loss, flag) {
            let t = &self.state.clock.timestamp;
            self.tally.pending.push(t.batch + 1, t.epoch, loss, flag)?;
        }
        Ok(())
    }

    /// One forward/backward pass over the batch, from `before_train_batch` to
    /// `after_train_batch`; returns the batch loss (detached, on the device).
    pub(super) fn forward_backward(&mut self) -> Result<Option<Tensor>> {
        self.state.in_train_batch = true;
        self.fire(Event::BEFORE_TRAIN_BATCH)?;
        self.state.optimizer.zero_grad();
        self.start_sharded_pass()?;
        let full = self.state.batch.shallow_clone();
        let total = full.len();
        if total == 0 {
            fail!(
                "a method emptied the batch at batch {}",
                self.state.clock.timestamp.batch
            );
        }
        let microbatch = (self.microbatch as i64).clamp(1, total);
        let parts = full.split(microbatch)?;
        let count = parts.len();
        // A language model's loss is a mean over the scored tokens (targets other than
        // `train.ignore_index`): with microbatches, each weighs by its share of the batch's
        // scored tokens, so that the step's loss and gradient are those of the whole batch (a
        // mean over its tokens, not the mean of the microbatches' means: the Hugging Face
        // Trainer's gradient-accumulation bug). Counted on the device: no read.
        //
        // Data-parallel, the same over the ranks: DDP averages the ranks' gradients, so each
        // rank's passes weigh by `world ×` their share of the global batch's scored tokens (one
        // all-reduce of the count, on the device), and the step is the mean over every rank's
        // tokens, not the mean of the ranks' means.
        let ignore_index = self.state.loss_fn.ignore_index;
        let world = self.world();
        let token_total = match full.target() {
            Some(t) if count > 1 || world > 1 => super::microbatch::scored_tokens(t, ignore_index)?,
            _ => None,
        };
        let token_total = match token_total {
            Some(local) if world > 1 => Some(
                self.sum_tensor_over_ranks(local)?
                    .f_div_scalar(world as f64)?,
            ),
            other => other,
        };
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
            let tokens = match (&token_total, self.state.batch.target()) {
                (Some(all), Some(t)) => super::microbatch::scored_tokens(t, ignore_index)?
                    .map(|mine| mine.f_div(all))
                    .transpose()?,
                _ => None,
            };
            let weight = size as f64 / total as f64;
            let weigh = |l: &Tensor| -> Result<Tensor, tch::TchError> {
                match &tokens {
                    Some(share) => l.f_mul(&share.f_to_kind(l.kind())?),
                    None => l.f_mul_scalar(weight),
                }
            };
            let weighted = weigh(loss)?;
            let root = match &mut self.state.scaler {
                // As Composer: the loss is scaled, then weighted by the microbatch's share.
                Some(scaler) => weigh(&scaler.scale_loss(loss)?)?,
                None => weighted.shallow_clone(),
            };
            if synced {
                self.before_synced_backward(&root)?;
            }
            self.before_sharded_backward()?;
            root.f_backward()?;
            self.after_sharded_backward()?;
            let detached = weighted.f_detach()?;
            batch_loss = Some(match batch_loss {
                None => detached,
                Some(sum) => sum.f_add(&detached)?,
            });
            self.fire(Event::AFTER_BACKWARD)?;
        }
        self.state.batch = full;
        // Sharded gradients: the loss scaler and the methods here see whole gradients, gathered
        // for them.
        let gathered = self.gradients_for_methods()?;
        // amp_fp16: methods and the optimizer see true gradients.
        if let Some(scaler) = &mut self.state.scaler {
            scaler.unscale(self.state.optimizer.params())?;
        }
        self.fire(Event::AFTER_TRAIN_BATCH)?;
        if gathered {
            self.gradients_after_methods()?;
        }
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
        let reads = self.history.host_reads.step_started();
        if let Some(dp) = &self.dp {
            dp.watch.at_step(self.state.clock.timestamp.batch);
        }
        self.state.batch = batch;
        self.fire(Event::AFTER_DATALOADER)?;
        self.tally.step_samples = self.state.batch.len() as u64;
        self.fire(Event::BATCH_START)?;
        self.train_batch()?;
        self.history.memory_after_step = crate::memory::peak::now(self.state.device());
        // As in Composer: the schedule is stepped before the clock advances.
        self.set_scheduled_lr();
        let previous = self.state.clock.timestamp.clone();
        let seconds = started.elapsed().as_secs_f64();
        self.wall.train_seconds += seconds;
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
            .batch_done(count as f64 / self.wall.train_seconds.max(1e-9), unit);
        self.fire(Event::BATCH_END)?;
        self.history.host_reads.step_done(reads);
        Ok(previous)
    }
}
