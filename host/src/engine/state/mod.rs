//! What methods can see and change during an event: the [`SetupState`] of `init` (the model,
//! before the optimizer exists; surgery happens here) and the complete [`RunState`] of every
//! later event, reached through one [`Stage`].

mod batch;
mod setup;

pub use batch::Batch;
pub use setup::{Sampler, SetupState};

use rand::RngCore;
use rand_chacha::ChaCha8Rng;
use tch::{Device, TchError, Tensor};
use tessera_plugin_api::{keys, TimeInfo};

use crate::model::{Model, Role};
use crate::optim::Optimizer;
use crate::precision::AutocastGuard;
use crate::precision::{GradScaler, Precision};
use crate::report::EvalRecord;
use crate::time::{RunLength, Time, TimeUnit, Timestamp};

/// A request a method made of the host that cannot be granted; the message says why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct CallError(pub String);

impl From<TchError> for CallError {
    fn from(e: TchError) -> Self {
        CallError(e.to_string())
    }
}

/// The run's clock as methods see it: where training is and how long it runs.
#[derive(Debug, Clone)]
pub struct Clock {
    /// The training clock (the one source of truth for the trainer too).
    pub timestamp: Timestamp,
    /// The run's length.
    pub run: RunLength,
    /// Whether the current event belongs to training (false during evaluation).
    pub training: bool,
}

impl Clock {
    /// The clock in the ABI's terms.
    pub fn info(&self) -> TimeInfo {
        let t = &self.timestamp;
        TimeInfo {
            epoch: t.epoch,
            batch: t.batch,
            sample: t.sample,
            token: t.token,
            batch_in_epoch: t.batch_in_epoch,
            sample_in_epoch: t.sample_in_epoch,
            token_in_epoch: t.token_in_epoch,
            batches_per_epoch: self.run.batches_per_epoch,
            max_batches: self.run.max_batches().unwrap_or(0),
            elapsed_fraction: self.run.elapsed_fraction(t),
            training: self.training,
        }
    }
}

/// The host state methods act on from `before_load` on (Composer's `State`): the model, the
/// optimizer, the batch, outputs and loss, the clock. Complete from the moment it exists.
pub struct RunState {
    /// The model.
    pub model: Model,
    /// The optimizer (it owns the learning rate and the schedule).
    pub optimizer: Optimizer,
    /// The run's precision.
    pub precision: Precision,
    /// The clock.
    pub clock: Clock,
    /// A method asked for one more forward/backward pass in this step.
    pub extra_pass_requested: bool,
    /// The index of the current forward/backward pass within the step.
    pub pass_index: u32,
    /// Whether the current `*_checkpoint` event writes a checkpoint.
    pub checkpoint_pending: bool,
    /// Whether the current event is inside the microbatch loop or at `after_train_batch`.
    pub in_train_batch: bool,
    /// The current batch (a microbatch between `before_forward` and `after_backward`).
    pub batch: Batch,
    /// The model output of the current (micro)batch.
    pub output: Option<Tensor>,
    /// The loss of the current (micro)batch.
    pub loss: Option<Tensor>,
    /// The training loss function (`train.loss`, `train.ignore_index`).
    pub loss_fn: crate::model::Loss,
    /// Metrics methods logged since the trainer last collected them.
    pub metrics: Vec<(String, f64)>,
    /// The latest evaluation's results (set before `eval_end` fires).
    pub last_eval: Option<EvalRecord>,
    /// Why a method stopped the run (`request_stop`), if one did.
    pub stop_reason: Option<String>,
    /// Dynamic loss scaling, under `amp_fp16` only.
    pub scaler: Option<GradScaler>,
    /// The optimizer step being taken, while `optimizer_step` fires (plugin-api 1.6).
    pub step: Option<tessera_plugin_api::StepInfo>,
    /// Whether the host skipped its update of the step being taken (a device flag), while
    /// `optimizer_step` fires.
    pub found_inf: Option<Tensor>,
    rng: ChaCha8Rng,
}

impl RunState {
    /// The run state that follows `setup`, with the optimizer built over the model as surgery
    /// left it (a rate scaling asked for at `init` applies to the first step).
    pub fn new(setup: SetupState, mut optimizer: Optimizer) -> RunState {
        let SetupState {
            model,
            precision,
            clock,
            metrics,
            lr_scale,
            rng,
            ..
        } = setup;
        optimizer.scale_lr(lr_scale);
        RunState {
            model,
            optimizer,
            scaler: (precision == Precision::AmpFp16).then(GradScaler::default),
            precision,
            clock,
            extra_pass_requested: false,
            pass_index: 0,
            checkpoint_pending: false,
            in_train_batch: false,
            batch: Batch::default(),
            output: None,
            loss: None,
            loss_fn: crate::model::Loss::default(),
            metrics,
            last_eval: None,
            stop_reason: None,
            step: None,
            found_inf: None,
            rng,
        }
    }

    /// Stops the run as Composer's `State.stop_training()` does: its length becomes the batches
    /// done so far, so the loop ends after the current batch (or the epoch whose evaluation
    /// asked) and the run finishes normally. The first reason is the one recorded.
    pub fn request_stop(&mut self, reason: String) {
        let done = self.clock.timestamp.batch;
        self.clock.run.max_duration = Time::new(done, TimeUnit::Batch);
        if self.stop_reason.is_none() {
            tracing::info!("stopping after batch {done}: {reason}");
            self.stop_reason = Some(reason);
        }
    }

    /// The training device (the model's).
    pub fn device(&self) -> Device {
        self.model.params.device()
    }

    /// The methods' random stream (saved in checkpoints).
    pub fn rng(&self) -> &ChaCha8Rng {
        &self.rng
    }

    /// Replaces the methods' random stream (restoring a checkpoint).
    pub fn set_rng(&mut self, rng: ChaCha8Rng) {
        self.rng = rng;
    }

    /// A shallow clone of the tensor named `key`: a batch entry, `output` or `loss`.
    pub fn tensor(&self, key: &str) -> Option<Tensor> {
        match key {
            keys::OUTPUT => self.output.as_ref().map(Tensor::shallow_clone),
            keys::LOSS => self.loss.as_ref().map(Tensor::shallow_clone),
            keys::FOUND_INF => self.found_inf.as_ref().map(Tensor::shallow_clone),
            _ => self.batch.get(key).map(Tensor::shallow_clone),
        }
    }

    /// A tensor handed back by a method must be defined and live on the training device.
    fn check_device(&self, key: &str, value: &Tensor) -> Result<(), CallError> {
        if !value.defined() {
            return Err(CallError(format!("`{key}`: the tensor is undefined")));
        }
        if value.device() != self.device() {
            return Err(CallError(format!(
                "`{key}` is on {:?} but training runs on {:?}",
                value.device(),
                self.device()
            )));
        }
        Ok(())
    }

    /// Replaces the tensor named `key`, after checking it fits: same device as training, a
    /// one-element floating loss, an output of unchanged shape, batch entries keeping the batch
    /// size. The error says what was expected.
    pub fn set_tensor(&mut self, key: &str, value: Tensor) -> Result<(), CallError> {
        self.check_device(key, &value)?;
        match key {
            keys::LOSS => {
                if value.numel() != 1 || !value.is_floating_point() {
                    return Err(CallError(format!(
                        "`loss` must be a floating scalar, got shape {:?} of {:?}",
                        value.size(),
                        value.kind()
                    )));
                }
                self.loss = Some(value);
            }
            keys::OUTPUT => {
                let expected = self.output.as_ref().map(Tensor::size);
                if expected.as_ref().is_some_and(|e| *e != value.size()) {
                    return Err(CallError(format!(
                        "`output` must keep its shape {:?}, got {:?}",
                        expected.unwrap_or_default(),
                        value.size()
                    )));
                }
                self.output = Some(value);
            }
            _ => {
                let Some(current) = self.batch.get(key) else {
                    return Err(CallError(format!(
                        "the batch has no `{key}` (it has {})",
                        self.batch.keys().join(", ")
                    )));
                };
                let (now, new) = (current.size(), value.size());
                if now.first() != new.first() {
                    return Err(CallError(format!(
                        "`{key}` must keep the batch size {:?}, got shape {new:?}",
                        now.first().copied().unwrap_or(0)
                    )));
                }
                self.batch.set(key, value);
            }
        }
        Ok(())
    }

    /// Replaces several batch tensors at once. Afterwards every batch tensor must share the
    /// first dimension (which may differ from before: methods may shrink or grow the batch).
    pub fn set_batch(&mut self, entries: Vec<(String, Tensor)>) -> Result<(), CallError> {
        let mut batch = self.batch.shallow_clone();
        for (key, value) in entries {
            self.check_device(&key, &value)?;
            if batch.get(&key).is_none() {
                return Err(CallError(format!(
                    "the batch has no `{key}` (it has {})",
                    batch.keys().join(", ")
                )));
            }
            batch.set(&key, value);
        }
        let sizes: Vec<(String, i64)> = batch
            .entries
            .iter()
            .map(|(k, t)| (k.clone(), t.size().first().copied().unwrap_or(-1)))
            .collect();
        let first = sizes.first().map(|(_, n)| *n).unwrap_or(0);
        if first <= 0 || sizes.iter().any(|(_, n)| *n != first) {
            return Err(CallError(format!(
                "batch tensors must share a non-empty first dimension, got {}",
                sizes
                    .iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        self.batch = batch;
        Ok(())
    }

    /// Runs the model on `input` under the run's precision, in training mode or not, with the
    /// batch's `attention_mask` and `token_type_ids` when it has them. The one forward of the host: the training
    /// step, evaluation and methods' extra forwards use it. Gradients follow the caller's grad
    /// mode.
    pub fn forward(&self, input: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let _autocast = AutocastGuard::new(self.precision, self.device());
        let mask = self.batch.get(keys::ATTENTION_MASK);
        let types = self.batch.get(keys::TOKEN_TYPE_IDS);
        self.model.forward_masked(input, mask, types, train)
    }

    /// Runs the model on the batch's `input` (as [`RunState::forward`] does) and keeps the result
    /// as `output`.
    pub fn forward_batch(&mut self, train: bool) -> Result<(), CallError> {
        let input = self
            .batch
            .input()
            .map(Tensor::shallow_clone)
            .ok_or_else(|| CallError(format!("the batch has no `{}`", keys::INPUT)))?;
        self.output = Some(self.forward(&input, train)?);
        Ok(())
    }

    /// A method's extra forward in evaluation mode, without gradient (test-time augmentation).
    pub fn eval_forward(&self, input: &Tensor) -> Result<Tensor, CallError> {
        self.check_device(keys::INPUT, input)?;
        tch::no_grad(|| self.forward(input, false))
            .map_err(|e| CallError(format!("forward failed: {e}")))
    }

    /// A method's extra forward in training mode, with or without gradient.
    pub fn extra_forward(&self, input: &Tensor, grad: bool) -> Result<Tensor, CallError> {
        self.check_device(keys::INPUT, input)?;
        let run = || self.forward(input, true);
        let out = if grad { run() } else { tch::no_grad(run) };
        out.map_err(|e| CallError(format!("forward failed: {e}")))
    }

    /// The training loss (`loss_fn`) of `output` against `target`, under the run's precision:
    /// the reduced value, or one value per sample.
    pub fn loss(
        &self,
        output: &Tensor,
        target: &Tensor,
        per_sample: bool,
    ) -> Result<Tensor, TchError> {
        let _autocast = AutocastGuard::new(self.precision, self.device());
        self.loss_fn.compute(output, target, per_sample)
    }
}

/// The state an event is fired on: [`SetupState`] at `init`, [`RunState`] afterwards. What
/// methods may ask for depends on it: surgery only at set-up, batches and the optimizer only
/// in the run.
pub enum Stage<'a> {
    /// `init`.
    Setup(&'a mut SetupState),
    /// Every later event.
    Run(&'a mut RunState),
}

impl Stage<'_> {
    /// Notes which method (its index in configuration order) the engine calls next.
    pub fn set_current_method(&mut self, index: usize) {
        if let Stage::Setup(s) = self {
            s.current_method = index;
        }
    }

    /// The calling method takes over the update of parameters `names` (only at `init`).
    pub fn claim_parameters(&mut self, names: Vec<String>) -> Result<(), CallError> {
        let Stage::Setup(s) = self else {
            return Err(CallError(
                "claim_parameters is only possible at `init`, before the optimizer is built".into(),
            ));
        };
        for name in names {
            let Some(entry) = s.model.params.get(&name) else {
                return Err(CallError(format!("the model has no parameter `{name}`")));
            };
            if entry.role != Role::Parameter {
                return Err(CallError(format!("`{name}` is a buffer, not a parameter")));
            }
            if s.claims.iter().any(|(_, n)| *n == name) {
                return Err(CallError(format!(
                    "`{name}` is already claimed by a method"
                )));
            }
            s.claims.push((s.current_method, name));
        }
        Ok(())
    }

    /// The learning rate of the step being taken (at `optimizer_step`) or of the next one.
    pub fn step_info(&self) -> tessera_plugin_api::StepInfo {
        match self {
            Stage::Setup(s) => tessera_plugin_api::StepInfo {
                lr: s.initial_lr * s.lr_scale,
                lr_factor: s.lr_scale,
                initial_lr: s.initial_lr,
                step: 0,
            },
            Stage::Run(s) => s.step.unwrap_or_else(|| {
                let (lr, initial) = (s.optimizer.lr(), s.optimizer.initial_lr());
                tessera_plugin_api::StepInfo {
                    lr,
                    lr_factor: if initial != 0.0 { lr / initial } else { 0.0 },
                    initial_lr: initial,
                    step: s.optimizer.attempted_steps(),
                }
            }),
        }
    }

    /// Up to `n` training samples as the model sees them (only at `init`).
    pub fn training_sample(&mut self, n: usize) -> Result<Vec<(String, Tensor)>, CallError> {
        match self {
            Stage::Setup(s) => match &mut s.sampler {
                Some(read) => read(n),
                None => Err(CallError("this run has no training data to sample".into())),
            },
            Stage::Run(_) => Err(CallError(
                "training_sample is only possible at `init`, before the loader runs".into(),
            )),
        }
    }

    /// Notes that a method listed the model's modules (at set-up, where surgery happens).
    pub fn note_modules_listed(&mut self) {
        if let Stage::Setup(s) = self {
            s.modules_listed = true;
        }
    }

    /// The model.
    pub fn model(&self) -> &Model {
        match self {
            Stage::Setup(s) => &s.model,
            Stage::Run(s) => &s.model,
        }
    }

    /// The run's precision.
    pub fn precision(&self) -> Precision {
        match self {
            Stage::Setup(s) => s.precision,
            Stage::Run(s) => s.precision,
        }
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        match self {
            Stage::Setup(s) => &s.clock,
            Stage::Run(s) => &s.clock,
        }
    }

    /// Records a metric a method logged.
    pub fn log_metric(&mut self, name: String, value: f64) {
        match self {
            Stage::Setup(s) => s.metrics.push((name, value)),
            Stage::Run(s) => s.metrics.push((name, value)),
        }
    }

    /// The next value of the methods' random stream.
    pub fn next_u64(&mut self) -> u64 {
        match self {
            Stage::Setup(s) => s.rng.next_u64(),
            Stage::Run(s) => s.rng.next_u64(),
        }
    }

    /// The run state, or an error naming `what` was asked at `init`.
    pub fn run(&mut self, what: &str) -> Result<&mut RunState, CallError> {
        match self {
            Stage::Run(s) => Ok(s),
            Stage::Setup(_) => Err(CallError(format!(
                "{what} is not available at `init`: there is no batch, output, loss or optimizer before training starts"
            ))),
        }
    }

    /// The model for surgery, which only `init` allows.
    pub fn model_for_surgery(&mut self, what: &str) -> Result<&mut Model, CallError> {
        match self {
            Stage::Setup(s) => Ok(&mut s.model),
            Stage::Run(_) => Err(CallError(format!(
                "{what}: modules can only be replaced at `init`"
            ))),
        }
    }

    /// The learning rate of the next step.
    pub fn lr(&self) -> f64 {
        match self {
            Stage::Setup(s) => s.initial_lr * s.lr_scale,
            Stage::Run(s) => s.optimizer.lr(),
        }
    }

    /// Scales the learning rate of the next step (see [`Optimizer::scale_lr`]).
    pub fn scale_lr(&mut self, factor: f64) {
        match self {
            Stage::Setup(s) => s.lr_scale *= factor,
            Stage::Run(s) => s.optimizer.scale_lr(factor),
        }
    }

    /// Freezes or unfreezes parameter `name`: `requires_grad`, and in the run the optimizer's
    /// membership (at `init` the optimizer, built afterwards, takes what requires a gradient).
    pub fn set_trainable(&mut self, name: &str, trainable: bool) -> Result<(), CallError> {
        let entry = self
            .model()
            .params
            .get(name)
            .ok_or_else(|| CallError(format!("the model has no parameter `{name}`")))?;
        if entry.role != Role::Parameter {
            return Err(CallError(format!("`{name}` is a buffer, not a parameter")));
        }
        let tensor = entry.tensor.shallow_clone();
        let _ = tensor.set_requires_grad(trainable);
        if let Stage::Run(s) = self {
            s.optimizer.set_member(name, &tensor, trainable);
        }
        Ok(())
    }
}
