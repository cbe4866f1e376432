//! The training loop: epochs, logging and evaluation intervals, the end of a run.

use std::time::Instant;

use serde_json::json;
use tessera_plugin_api::LIBTORCH_VERSION;

use crate::engine::Event;
use crate::files::write_atomic;
use crate::report::RunRecord;
use crate::time::{Time, TimeUnit, Timestamp};
use crate::tracking::mlflow::RunStatus;

use super::error::{fail, Context as _, Result};
use super::input::TrainInput;
use super::{signal_name, FitSummary, Purpose, Trainer};

impl Trainer {
    /// Runs the training loop to `max_duration`, evaluating at `eval_interval` and at the end,
    /// and writes the run record. Data-parallel: a collective that waited past `[distributed]
    /// timeout` fails with which rank is behind, at which step and collective sequence number.
    pub fn fit(&mut self) -> Result<FitSummary> {
        let out = self.fit_loop();
        let Err(e) = out else {
            return out;
        };
        let Some(dp) = &self.dp else {
            return Err(e);
        };
        let chain = crate::with_causes(&e).to_ascii_lowercase();
        if !chain.contains("timed out") && !chain.contains("timeout") {
            return Err(e);
        }
        let why = dp.watch.diagnose();
        tracing::error!("a collective waited past [distributed] timeout: {why}");
        Err(e).with_context(|| {
            format!(
                "a collective waited past [distributed] timeout ({:.0} s): {why}",
                self.config.distributed.timeout
            )
        })
    }

    fn fit_loop(&mut self) -> Result<FitSummary> {
        self.start_fit()?;
        let mut interrupted_by = None;
        // A checkpoint written at `epoch_checkpoint` comes before its iteration's end: a run
        // resumed from it ends that iteration first.
        self.end_iteration_when_due()?;
        while !self.state.clock.run.reached(
            &self.state.clock.timestamp,
            &self.state.clock.run.max_duration,
        ) {
            if let Some(signal) = self.train_epoch()? {
                interrupted_by = Some(signal);
                break;
            }
        }
        self.end_fit(interrupted_by)
    }

    /// What comes before the first epoch: the observer of host reads armed, the loss scaler on
    /// the device, `fit_start`, the learning rate of a new run set.
    fn start_fit(&mut self) -> Result<()> {
        if self.purpose == Purpose::Standalone {
            fail!("this trainer was built to evaluate or predict (Trainer::standalone); build one with Trainer::new to train");
        }
        // The observer of host reads (run.json's `host_reads`); without it the trainer's own
        // count stands in.
        match crate::sync::observer::arm() {
            Ok(()) => self.history.host_reads.observed = true,
            Err(e) => tracing::warn!("{e}; run.json's host_reads holds the trainer's own count"),
        }
        self.history.reads_at_start = (crate::sync::observer::reads(), crate::sync::reads());
        // amp_fp16: the loss scaler's state goes to the device now, not in the first step.
        let device = self.state.device();
        if let Some(scaler) = &mut self.state.scaler {
            scaler.prepare(device)?;
        }
        self.fire(Event::FIT_START)?;
        // A resumed run keeps the learning rate the checkpoint holds: the schedule is stepped
        // before the clock advances, so the next step's rate is a function of the previous
        // batch, not of the restored clock.
        if self.history.resumed_from.is_none() {
            self.set_scheduled_lr();
        }
        self.stop_if_target_already_reached();
        Ok(())
    }

    /// The rest of the current epoch (its events, steps, logs, evaluations and checkpoints);
    /// the signal that stopped the run in it, if one did.
    fn train_epoch(&mut self) -> Result<Option<i32>> {
        let log_every = self.config.train.log_interval;
        let eval_every = self.config.train.eval_interval;
        let max_epochs = match self.state.clock.run.max_duration.unit() {
            TimeUnit::Epoch => self.state.clock.run.max_duration.count(),
            _ => None,
        };
        if self.state.clock.timestamp.epoch_in_iteration == 0
            && self.state.clock.timestamp.batch_in_epoch == 0
        {
            self.fire(Event::ITERATION_START)?;
        }
        if self.state.clock.timestamp.batch_in_epoch == 0 {
            self.fire(Event::EPOCH_START)?;
        }
        let epoch = self.state.clock.timestamp.epoch;
        let start = self.state.clock.timestamp.batch_in_epoch;
        self.reporter.start_epoch(
            epoch,
            max_epochs,
            self.state.clock.run.batches_per_epoch,
            start,
        );
        // The next batch is copied while the current step runs (see `input`).
        let mut batches = TrainInput::new(
            self.data.train_loader.epoch(epoch, start),
            self.state.device(),
            self.uploader.token_rows(),
        )?;
        let mut finished_early = false;
        loop {
            // Training time counts from the request for data to the end of the step.
            let step_started = Instant::now();
            self.fire(Event::BEFORE_DATALOADER)?;
            let Some(batch) = batches.next_batch() else {
                break;
            };
            let previous = self.step(batch?, step_started)?;
            if self.due(&log_every, &previous, Event::BATCH_END) {
                self.log_train_line()?;
            }
            if self.due(&eval_every, &previous, Event::BATCH_END) {
                self.evaluate()?;
            }
            self.checkpoint_event(Event::BATCH_CHECKPOINT, &previous)?;
            if let Some(signal) = self.stop_requested() {
                return Ok(Some(signal));
            }
            if self.state.clock.run.reached(
                &self.state.clock.timestamp,
                &self.state.clock.run.max_duration,
            ) {
                finished_early = true;
                break;
            }
        }
        drop(batches);
        if !finished_early
            || self.state.clock.timestamp.batch_in_epoch == self.state.clock.run.batches_per_epoch
        {
            let previous = self.state.clock.timestamp.clone();
            self.state.clock.timestamp = self.state.clock.timestamp.to_next_epoch();
            self.fire(Event::EPOCH_END)?;
            self.log_train_line()?;
            if self.due(&eval_every, &previous, Event::EPOCH_END) {
                self.evaluate()?;
            }
            self.checkpoint_event(Event::EPOCH_CHECKPOINT, &previous)?;
            self.end_iteration_when_due()?;
        }
        if self.state.clock.run.batches_per_epoch == 0 {
            fail!("the training set gives no batch (batch_size larger than the set with drop_last = true?)");
        }
        Ok(None)
    }

    /// After the last epoch or a stop: the end of the run logged, checked and recorded
    /// (run.json), its tracking ended.
    fn end_fit(&mut self, interrupted_by: Option<i32>) -> Result<FitSummary> {
        if let Some(signal) = interrupted_by {
            let name = signal_name(signal);
            match &self.saved.last_checkpoint {
                Some(p) if self.saved.last_checkpoint_batch == Some(self.state.clock.timestamp.batch) => {
                    tracing::warn!(
                        "{name}: stopped after batch {} with a checkpoint at {}; continue with checkpoint.autoresume = true",
                        self.state.clock.timestamp.batch,
                        p.display()
                    )
                }
                _ => tracing::warn!(
                    "{name}: stopped after batch {}; checkpoints are off (checkpoint.save = false), so this progress is not saved",
                    self.state.clock.timestamp.batch
                ),
            }
        } else {
            self.fire(Event::FIT_END)?;
            if self.history.last_eval_batch != Some(self.state.clock.timestamp.batch) {
                self.evaluate()?;
                // The last checkpoint was written before this evaluation: rank it now.
                if let (Some(last), true) = (&self.saved.last_checkpoint, self.is_rank0()) {
                    self.apply_retention(&self.config.checkpoint.folder, last)?;
                }
            }
            self.log_train_line()?;
            self.report_target_missed();
        }
        // The last steps' losses are checked (a stop, a skip) before the record is written.
        self.settle_steps()?;
        // Data-parallel: every rank must end with the same model.
        self.check_ranks_agree()?;
        self.reporter.finish();
        let mut record = self.run_record();
        if let Some(signal) = interrupted_by {
            record.status = format!("interrupted by {}", signal_name(signal));
        } else if let Some(reason) = &self.state.stop_reason {
            record.status = format!("stopped early: {reason}");
        }
        if self.is_rank0() {
            let path = self.config.run_dir().join("run.json");
            let text = serde_json::to_vec_pretty(&record)?;
            write_atomic(&path, &text).with_context(|| format!("writing {}", path.display()))?;
            self.end_tracking(match interrupted_by {
                Some(_) => RunStatus::Killed,
                None => RunStatus::Finished,
            });
        }
        Ok(FitSummary {
            record,
            interrupted_by,
        })
    }

    /// After an epoch: when the iteration's epochs (`train.iteration_length`) are done,
    /// advances the clock to the next iteration and fires `iteration_end` and
    /// `iteration_checkpoint`, as Composer does. Without an iteration length the run is one
    /// iteration and neither fires.
    fn end_iteration_when_due(&mut self) -> Result<()> {
        let Some(length) = self.config.train.iteration_length.and_then(|l| l.count()) else {
            return Ok(());
        };
        if self.state.clock.timestamp.epoch_in_iteration < length {
            return Ok(());
        }
        let previous = self.state.clock.timestamp.clone();
        self.state.clock.timestamp = previous.to_next_iteration();
        self.fire(Event::ITERATION_END)?;
        self.checkpoint_event(Event::ITERATION_CHECKPOINT, &previous)
    }

    pub(super) fn due(&self, interval: &Time, previous: &Timestamp, event: Event) -> bool {
        let unit = interval.unit();
        let at = match unit {
            TimeUnit::Epoch => Event::EPOCH_END,
            TimeUnit::Iteration => Event::ITERATION_END,
            _ => Event::BATCH_END,
        };
        if at != event {
            return false;
        }
        let (step_unit, every) = if interval.is_dur() {
            match self.state.clock.run.resolve(interval, 1.0) {
                Ok(t) => (t.unit(), t.count().unwrap_or(0)),
                Err(_) => return false,
            }
        } else {
            (unit, interval.count().unwrap_or(0))
        };
        if every == 0 {
            return false;
        }
        match (
            previous.get(step_unit),
            self.state.clock.timestamp.get(step_unit),
        ) {
            (Some(before), Some(now)) => before / every != now / every,
            _ => false,
        }
    }

    pub(super) fn log_train_line(&mut self) -> Result<()> {
        self.settle_steps()?;
        if self.tally.running_batches == 0 {
            return Ok(());
        }
        let loss = std::mem::take(&mut self.tally.running_loss) / self.tally.running_batches as f64;
        self.tally.running_batches = 0;
        let t = &self.state.clock.timestamp;
        let per_second = |n: u64| {
            if self.wall.train_seconds > 0.0 {
                n as f64 / self.wall.train_seconds
            } else {
                0.0
            }
        };
        let mut line = json!({
            "epoch": t.epoch,
            "batch": t.batch,
            "sample": t.sample,
            "loss": loss,
            "lr": self.state.optimizer.lr(),
            "samples_per_second": per_second(t.sample),
        });
        if self.data.train_loader.is_tokens() {
            line["token"] = json!(t.token);
            line["tokens_per_second"] = json!(per_second(t.token));
        }
        // Steps with a non-finite loss never reach the running loss: they stop the run or are
        // skipped (`settle_steps`), so the average is finite.
        self.reporter.train_line(line);
        Ok(())
    }

    /// The cost of `wall_seconds` on the run's nodes at `usd_per_hour` each, when it is given.
    pub(super) fn estimated_cost_usd(&self, wall_seconds: f64) -> Option<f64> {
        self.config
            .usd_per_hour
            .map(|usd| crate::cost::cost_usd(usd, wall_seconds, self.nodes()))
    }

    /// Wall-clock seconds of the run: this process's, plus those recorded in the checkpoint
    /// it resumed from.
    pub(super) fn wall_seconds(&self) -> f64 {
        self.wall.wall_before + self.wall.started.elapsed().as_secs_f64()
    }

    pub(super) fn run_record(&self) -> RunRecord {
        let wall_seconds = self.wall_seconds();
        let t = &self.state.clock.timestamp;
        RunRecord {
            run_name: self.config.run_name.clone(),
            recipe: self.config.recipe_label(),
            tessera_version: env!("CARGO_PKG_VERSION").to_owned(),
            libtorch_version: LIBTORCH_VERSION.to_owned(),
            device: format!("{:?}", self.state.device()),
            config: serde_json::to_value(&self.config).unwrap_or(serde_json::Value::Null),
            plugins: self.history.plugins.clone(),
            evals: self.history.evals.clone(),
            eval_times: self.history.eval_times.clone(),
            epochs: t.epoch,
            batches: t.batch,
            samples: t.sample,
            tokens: self.data.train_loader.is_tokens().then_some(t.token),
            tokens_per_second: self.data.train_loader.is_tokens().then(|| {
                if self.wall.train_seconds > 0.0 {
                    t.token as f64 / self.wall.train_seconds
                } else {
                    0.0
                }
            }),
            wall_seconds,
            train_seconds: self.wall.train_seconds,
            samples_per_second: if self.wall.train_seconds > 0.0 {
                t.sample as f64 / self.wall.train_seconds
            } else {
                0.0
            },
            nodes: self.nodes(),
            estimated_cost_usd: self.estimated_cost_usd(wall_seconds),
            final_accuracy: self.history.evals.last().map(|e| e.accuracy),
            final_perplexity: self.history.evals.last().and_then(|e| e.perplexity),
            target_reached: self.history.target_reached.clone(),
            status: "completed".to_owned(),
            resumed_from: self.history.resumed_from.clone(),
            init_weights: self.history.init_weights.clone(),
            weights_from: self.history.weights_from.clone(),
            last_checkpoint: self.saved.last_checkpoint.clone(),
            skipped_steps: self.tally.skipped_steps,
            trained_samples: self.tally.trained_samples,
            data_parallel: self.data_parallel_record(),
            memory_peak_bytes: crate::memory::peak::bytes(self.state.device()),
            memory_after_step_bytes: self.history.memory_after_step,
            microbatch_size: Some(self.microbatch),
            eval_subset: self
                .data
                .eval_subset
                .as_ref()
                .map(|(_, choice)| choice.clone()),
            text_data: self.data.text_facts.clone(),
            host_reads: Some(self.history.host_reads.record(self.history.reads_at_start)),
        }
    }
}
