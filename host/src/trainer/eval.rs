//! Evaluation over the test set, with its events.

use std::time::Instant;

use tch::{Kind, Reduction, Tensor};
use tessera_plugin_api::keys;

use crate::engine::Event;
use crate::report::{EvalRecord, EvalTime};

use super::error::{fail, Context as _, Result};
use super::metrics::{MetricSet, Tally};
use super::Trainer;

impl Trainer {
    /// Runs evaluation over the test set during training: the evaluation loop inside
    /// `eval_before_all`/`eval_after_all`, recorded in the metrics and the run record, and
    /// checked against `train.target`.
    pub fn evaluate(&mut self) -> Result<EvalRecord> {
        let started = Instant::now();
        // Data-parallel: every rank evaluates rank 0's batch-norm statistics (PyTorch DDP
        // broadcasts buffers from rank 0 before each forward pass; only rank 0's are ever used).
        self.broadcast_model(false, true)?;
        // Fully sharded: the ranks may evaluate different numbers of batches, so the units are
        // gathered once for the whole evaluation rather than per forward pass.
        self.whole_parameters()?;
        self.fire_as(Event::EVAL_BEFORE_ALL, false)?;
        let record = self.eval_loop()?;
        self.fire_as(Event::EVAL_AFTER_ALL, false)?;
        let time = EvalTime {
            batch: record.batch,
            train_seconds: self.wall.train_seconds,
            wall_seconds: self.wall_seconds(),
        };
        self.reporter.eval(&record, &time);
        self.history.evals.push(record.clone());
        self.history.eval_times.push(time);
        self.history.last_eval_batch = Some(self.state.clock.timestamp.batch);
        self.check_target(&record);
        self.plateau_step(&record)?;
        tracing::debug!("evaluation took {:.2}s", started.elapsed().as_secs_f64());
        Ok(record)
    }

    /// The evaluation loop (Composer's `_eval_loop`): `eval_start`, each test batch with its
    /// events, `eval_end`; over the fixed subset of `train.eval_subset_batches` when set.
    pub(super) fn eval_loop(&mut self) -> Result<EvalRecord> {
        self.fire_as(Event::EVAL_START, false)?;
        let _no_grad = tch::no_grad_guard();
        let saved_batch = std::mem::take(&mut self.state.batch);
        let mut correct = Tensor::f_zeros([], (Kind::Int64, self.state.device()))?;
        let mut loss_sum = Tensor::f_zeros([], (Kind::Double, self.state.device()))?;
        // Targets scored: all but those equal to `train.ignore_index`.
        let mut scored = Tensor::f_zeros([], (Kind::Int64, self.state.device()))?;
        let ignore_index = self.state.loss_fn.ignore_index;
        let language = self.data.eval_loader.is_language();
        // Top-k and F1 counts, set up at the first batch (when the class count is known).
        let mut tally: Option<Tally> = None;
        let mut samples = 0u64;
        let mut tokens = 0u64;
        let loader = match &self.data.eval_subset {
            Some((subset, _)) => subset.clone(),
            None => self.data.eval_loader.clone(),
        };
        for batch in loader.epoch(0, 0) {
            let batch = batch?;
            self.state.batch = self.device_batch(batch)?;
            self.fire_as(Event::EVAL_BATCH_START, false)?;
            self.fire_as(Event::EVAL_BEFORE_FORWARD, false)?;
            self.state.forward_batch(false)?;
            self.fire_as(Event::EVAL_AFTER_FORWARD, false)?;
            // As Composer: the metrics score `output` as the methods left it (test-time
            // augmentation replaces it by an average over augmented views).
            let output = self.state.tensor(keys::OUTPUT).context("no output")?;
            let target = self
                .state
                .batch
                .target()
                .map(Tensor::shallow_clone)
                .context("no target")?;
            let n = target.size().first().copied().unwrap_or(0);
            let mut output = output.f_to_kind(Kind::Float)?;
            let mut target = target;
            // A language model's [B, T, V] logits are scored per token.
            if output.dim() == 3 {
                let v = output.size()[2];
                output = output.f_reshape([-1, v])?;
                target = target.f_reshape([-1])?;
                tokens += target.numel() as u64;
            }
            let ce = output.f_cross_entropy_loss::<Tensor>(
                &target,
                None,
                Reduction::Sum,
                ignore_index,
                0.0,
            )?;
            loss_sum = loss_sum.f_add(&ce.f_to_kind(Kind::Double)?)?;
            let valid = target.f_ne(ignore_index)?;
            let hits = output
                .f_argmax(1, false)?
                .f_eq_tensor(&target)?
                .f_logical_and(&valid)?
                .f_sum(Kind::Int64)?;
            correct = correct.f_add(&hits)?;
            scored = scored.f_add(&valid.f_sum(Kind::Int64)?)?;
            if tally.is_none() {
                let classes = output.size().get(1).copied().unwrap_or(0);
                let set = MetricSet::resolve(
                    self.config.train.metrics.as_deref(),
                    &self.config.watched_metrics(),
                    classes,
                    language,
                );
                let set = match set {
                    Ok(set) => set,
                    Err(why) => fail!("train.metrics: {why}"),
                };
                tally = Some(Tally::new(set, classes, self.state.device())?);
            }
            if let Some(tally) = &mut tally {
                tally.add(&output, &target, ignore_index)?;
            }
            samples += n as u64;
            self.fire_as(Event::EVAL_BATCH_END, false)?;
        }
        // The device totals in one read: hits, loss sum, scored targets, then the tally's.
        let mut parts = vec![
            correct.f_to_kind(Kind::Double)?.f_reshape([1])?,
            loss_sum.f_reshape([1])?,
            scored.f_to_kind(Kind::Double)?.f_reshape([1])?,
        ];
        if let Some(tally) = &tally {
            parts.push(tally.totals()?);
        }
        let device_totals = crate::sync::read(&Tensor::f_cat(&parts, 0)?)?;
        let mut totals = vec![samples as f64, tokens as f64];
        totals.extend(device_totals);
        // Data-parallel: each rank evaluated its share of the test set.
        self.sum_over_ranks(&mut totals)?;
        let (fixed, counts) = totals.split_at(5);
        let [samples, tokens, correct, loss_sum, scored] = [0, 1, 2, 3, 4].map(|i| fixed[i]);
        let (samples, tokens) = (samples.round() as u64, tokens.round() as u64);
        let denom = scored.max(1.0);
        let cross_entropy = loss_sum / denom;
        let extra = tally.map(|t| t.values(counts, scored)).unwrap_or_default();
        let record = EvalRecord {
            epoch: self.state.clock.timestamp.epoch,
            batch: self.state.clock.timestamp.batch,
            accuracy: correct / denom,
            cross_entropy,
            samples,
            tokens: language.then_some(tokens),
            perplexity: language.then(|| cross_entropy.exp()),
            extra,
        };
        self.state.batch = saved_batch;
        self.state.output = None;
        self.state.last_eval = Some(record.clone());
        self.fire_as(Event::EVAL_END, false)?;
        Ok(record)
    }
}
