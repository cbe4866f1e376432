//! The host, as a method sees it during one event ([`Context`]).

use std::marker::PhantomData;

use abi_stable::std_types::{RResult, RStr, RString, RVec};

use crate::abi::{
    ErrorKind, EvalResults, HostHandle, ModuleInfo, ParamGroup, ParamInfo, RankInfo, StepInfo,
    TensorHandle, TimeInfo,
};
use crate::{host_result, module_box, named_tensors, random, sample, wrap, Error, Module, Wrapper};

/// The host, as a method sees it during one event.
pub struct Context<'a> {
    pub(crate) host: HostHandle,
    pub(crate) _call: PhantomData<&'a mut ()>,
}

impl Context<'_> {
    /// Wraps a host handle. Only the plugin's export code and tests need this.
    ///
    /// # Safety
    /// `host` must be the handle the host passed to the current call.
    #[doc(hidden)]
    pub unsafe fn from_host(host: HostHandle) -> Self {
        Context {
            host,
            _call: PhantomData,
        }
    }

    /// The training clock at this event.
    pub fn time(&self) -> TimeInfo {
        (self.host.api.time())(self.host.ctx)
    }

    /// The tensor named `key`: a batch entry ([`keys::INPUT`](crate::keys::INPUT), [`keys::TARGET`](crate::keys::TARGET)), the model
    /// [`keys::OUTPUT`](crate::keys::OUTPUT) or the [`keys::LOSS`](crate::keys::LOSS). It shares storage with the host's tensor. `None`
    /// if there is no such tensor at this event.
    pub fn tensor(&self, key: &str) -> Option<tch::Tensor> {
        let handle = (self.host.api.get_tensor())(self.host.ctx, RStr::from_str(key));
        handle.into_option().map(TensorHandle::into_tensor)
    }

    /// Replaces the tensor named `key`. The host refuses a tensor on another device, or one
    /// whose shape breaks the batch (see the host's documentation for each key).
    pub fn set_tensor(&mut self, key: &str, value: tch::Tensor) -> Result<(), Error> {
        let handle = TensorHandle::from_tensor(value);
        match (self.host.api.set_tensor())(self.host.ctx, RStr::from_str(key), handle) {
            RResult::ROk(()) => Ok(()),
            RResult::RErr(message) => Err(Error::new(ErrorKind::HOST, message.into_string())),
        }
    }

    /// The next 64 random bits of the host's seeded stream.
    pub fn rng_u64(&mut self) -> u64 {
        (self.host.api.rng_u64())(self.host.ctx)
    }

    /// A uniform integer in `0..n` (`n > 0`) from the host's stream, without modulo bias.
    pub fn rng_below(&mut self, n: u64) -> u64 {
        sample::uniform_below(n, || self.rng_u64())
    }

    /// A uniform float in `[0, 1)` from the host's stream.
    pub fn rng_f64(&mut self) -> f64 {
        sample::unit_f64(self.rng_u64())
    }

    /// A `Beta(a, b)` draw (`a, b > 0`) from the host's stream (see [`random::beta`]).
    pub fn rng_beta(&mut self, a: f64, b: f64) -> f64 {
        random::beta(a, b, &mut || self.rng_f64())
    }

    /// A uniformly random permutation of `0..n` from the host's stream (see
    /// [`random::permutation`]).
    pub fn rng_permutation(&mut self, n: usize) -> Vec<i64> {
        random::permutation(n, &mut |k| self.rng_below(k))
    }

    /// Records a metric at the current timestamp.
    pub fn log_metric(&mut self, name: &str, value: f64) {
        (self.host.api.log_metric())(self.host.ctx, RStr::from_str(name), value)
    }

    /// Writes an informational log line through the host's logger.
    pub fn info(&mut self, message: &str) {
        (self.host.api.log())(self.host.ctx, 2, RStr::from_str(message))
    }

    /// Writes a warning through the host's logger.
    pub fn warn(&mut self, message: &str) {
        (self.host.api.log())(self.host.ctx, 1, RStr::from_str(message))
    }

    // ---- plugin-api 1.1 ----

    fn host_fn<F>(&self, f: Option<F>, what: &str) -> Result<F, Error> {
        self.host_fn_since(f, what, "1.1")
    }

    fn host_fn_since<F>(&self, f: Option<F>, what: &str, version: &str) -> Result<F, Error> {
        f.ok_or_else(|| {
            Error::new(
                ErrorKind::HOST,
                format!("this tessera is too old for `{what}` (it needs plugin-api {version})"),
            )
        })
    }

    /// The names of the current batch's tensors.
    pub fn batch_keys(&self) -> Result<Vec<String>, Error> {
        let f = self.host_fn(self.host.api.batch_keys(), "batch_keys")?;
        Ok(f(self.host.ctx)
            .into_iter()
            .map(RString::into_string)
            .collect())
    }

    /// Replaces several batch tensors at once; together they may change the batch size (every
    /// batch tensor must share the first dimension afterwards).
    pub fn set_batch(&mut self, entries: Vec<(&str, tch::Tensor)>) -> Result<(), Error> {
        let f = self.host_fn(self.host.api.set_batch(), "set_batch")?;
        host_result(f(self.host.ctx, named_tensors(entries)))
    }

    /// Runs the model on `input` under the run's precision, with or without gradient. The model
    /// stays in training mode (as in Composer's selective backprop).
    pub fn forward(&mut self, input: &tch::Tensor, grad: bool) -> Result<tch::Tensor, Error> {
        let f = self.host_fn(self.host.api.forward(), "forward")?;
        let handle = TensorHandle::from_tensor(input.shallow_clone());
        host_result(f(self.host.ctx, handle, grad)).map(TensorHandle::into_tensor)
    }

    /// The run's training loss of `output` against `target`: per sample (`(N,)`) or reduced.
    pub fn loss(
        &mut self,
        output: &tch::Tensor,
        target: &tch::Tensor,
        per_sample: bool,
    ) -> Result<tch::Tensor, Error> {
        let f = self.host_fn(self.host.api.loss(), "loss")?;
        let (o, t) = (
            TensorHandle::from_tensor(output.shallow_clone()),
            TensorHandle::from_tensor(target.shallow_clone()),
        );
        host_result(f(self.host.ctx, o, t, per_sample)).map(TensorHandle::into_tensor)
    }

    /// The model's module tree, depth first.
    pub fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        let f = self.host_fn(self.host.api.modules(), "modules")?;
        Ok(f(self.host.ctx).into_vec())
    }

    /// Replaces the module at `path` by `module` (only at `init`). The old module's tensors leave
    /// the model; `tensors` (named relative to `path`) join it — those requiring a gradient as
    /// parameters, the others as buffers — so the optimizer trains them and checkpoints save them.
    pub fn replace_module(
        &mut self,
        path: &str,
        module: impl Module,
        tensors: Vec<(&str, tch::Tensor)>,
    ) -> Result<(), Error> {
        let f = self.host_fn(self.host.api.replace_module(), "replace_module")?;
        let tensors = named_tensors(tensors);
        host_result(f(
            self.host.ctx,
            RStr::from_str(path),
            module_box(module),
            tensors,
        ))
    }

    /// Every parameter and buffer of the model.
    pub fn parameters(&self) -> Result<Vec<ParamInfo>, Error> {
        let f = self.host_fn(self.host.api.parameters(), "parameters")?;
        Ok(f(self.host.ctx).into_vec())
    }

    /// The parameter or buffer `name`, sharing storage with the model: edit it in place under
    /// `tch::no_grad` to change the model.
    pub fn parameter(&self, name: &str) -> Result<Option<tch::Tensor>, Error> {
        let f = self.host_fn(self.host.api.parameter(), "parameter")?;
        Ok(f(self.host.ctx, RStr::from_str(name))
            .into_option()
            .map(TensorHandle::into_tensor))
    }

    /// Freezes (`false`) or unfreezes a parameter: gradient and optimizer membership together.
    pub fn set_trainable(&mut self, name: &str, trainable: bool) -> Result<(), Error> {
        let f = self.host_fn(self.host.api.set_trainable(), "set_trainable")?;
        host_result(f(self.host.ctx, RStr::from_str(name), trainable))
    }

    /// The learning rate of the next optimizer step.
    pub fn lr(&self) -> Result<f64, Error> {
        let f = self.host_fn(self.host.api.lr(), "lr")?;
        Ok(f(self.host.ctx))
    }

    /// Multiplies the learning rate of the next optimizer step by `factor`.
    pub fn scale_lr(&mut self, factor: f64) -> Result<(), Error> {
        let f = self.host_fn(self.host.api.scale_lr(), "scale_lr")?;
        f(self.host.ctx, factor);
        Ok(())
    }

    /// At `after_train_batch`: asks the host to run forward and backward over the batch once
    /// more before the optimizer step (SAM). The train-batch events fire again.
    pub fn request_extra_pass(&mut self) -> Result<(), Error> {
        let f = self.host_fn(self.host.api.request_extra_pass(), "request_extra_pass")?;
        host_result(f(self.host.ctx))
    }

    /// Which forward/backward pass of the current step this is (0 first).
    pub fn pass_index(&self) -> Result<u32, Error> {
        let f = self.host_fn(self.host.api.pass_index(), "pass_index")?;
        Ok(f(self.host.ctx))
    }

    /// Whether a checkpoint is written at the current `*_checkpoint` event.
    pub fn checkpoint_pending(&self) -> Result<bool, Error> {
        let f = self.host_fn(self.host.api.checkpoint_pending(), "checkpoint_pending")?;
        Ok(f(self.host.ctx))
    }

    // ---- plugin-api 1.3 ----

    /// The results of the latest evaluation over the test set, `None` before the first one. At
    /// `eval_end` they are the evaluation that just ran. Read a metric with
    /// [`EvalResults::metric`].
    pub fn eval_results(&self) -> Result<Option<EvalResults>, Error> {
        let f = self.host_fn_since(self.host.api.eval_results(), "eval_results", "1.3")?;
        Ok(f(self.host.ctx).into_option())
    }

    /// Wraps the module at `path` (only at `init`): `wrapper` runs in its place and calls the
    /// original, or modules inside it, through the [`Inner`](crate::Inner) its `forward` receives. The
    /// original stays in the model — its parameters trained and saved as before — under
    /// `inner_name` (`Some("batchnorm")`: `bn1.weight` becomes `bn1.batchnorm.weight`, as
    /// Composer's `GhostBatchNorm2d` names it), or transparently (`None`: every name stays,
    /// the node shows the wrapper's kind and both modules' attributes). `tensors` are the
    /// wrapper's own (named relative to `path`): those that require a gradient are trained and
    /// saved as parameters, the others saved as buffers. A resumed run replays the surgery at
    /// `init` before loading the weights, as for [`Context::replace_module`].
    pub fn wrap_module(
        &mut self,
        path: &str,
        wrapper: impl Wrapper,
        inner_name: Option<&str>,
        tensors: Vec<(&str, tch::Tensor)>,
    ) -> Result<(), Error> {
        let f = self.host_fn_since(self.host.api.wrap_module(), "wrap_module", "1.3")?;
        let tensors = named_tensors(tensors);
        host_result(f(
            self.host.ctx,
            RStr::from_str(path),
            wrap::wrapper_box(wrapper),
            RStr::from_str(inner_name.unwrap_or("")),
            tensors,
        ))
    }

    /// Asks the run to stop (Composer's `State.stop_training()`): its length becomes the
    /// batches done so far, so training ends after the current batch — or, asked at an epoch's
    /// evaluation, after that epoch — and the run finishes normally (`fit_end`, a final
    /// checkpoint when checkpoints are on, `run.json` status `stopped early: <reason>`).
    /// Not possible at `init`.
    pub fn request_stop(&mut self, reason: &str) -> Result<(), Error> {
        let f = self.host_fn_since(self.host.api.request_stop(), "request_stop", "1.3")?;
        host_result(f(self.host.ctx, RStr::from_str(reason)))
    }

    // ---- plugin-api 1.4 ----

    /// The run's numeric precision as `trainer.toml`'s `train.precision` names it: `"fp32"`,
    /// `"amp_bf16"` (the model's forward runs under bfloat16 autocast) or `"amp_fp16"` (float16
    /// autocast with loss scaling); a later host may add names. A method whose effect
    /// depends on it (the low-precision norms) reads it at `init`.
    pub fn precision(&self) -> Result<String, Error> {
        let f = self.host_fn_since(self.host.api.precision(), "precision", "1.4")?;
        Ok(f(self.host.ctx).into_string())
    }

    // ---- plugin-api 1.5 ----

    /// This process's place in a data-parallel run (`tessera launch --nproc N`): its rank, the
    /// number of ranks and its rank on this machine. Each rank trains on its own share of every
    /// batch (batch tensors, outputs and the loss are that share's) and gradients are averaged
    /// over the ranks before `after_train_batch`, so parameters are the same everywhere. A
    /// method that writes files should write them on rank 0 only. Rank 0 of 1 for a single
    /// process, and in a host older than 1.5 (which cannot train data-parallel).
    pub fn ranks(&self) -> RankInfo {
        match self.host.api.ranks() {
            Some(f) => f(self.host.ctx),
            None => RankInfo::SINGLE,
        }
    }

    // ---- plugin-api 1.6 ----

    /// Takes over the update of the parameters `names` (only at `init`), as an optimizer
    /// method does (Muon for the hidden matrices): the host's optimizer leaves them out, and
    /// this method updates them when it receives `optimizer_step` (it must hook that event; the
    /// host refuses the run otherwise). Their gradients are still cleared before each step,
    /// unscaled under `amp_fp16` and averaged over the ranks by the host. Keep the method's
    /// optimizer state in [`Method::state`](crate::Method::state) so checkpoints carry it. Each parameter can be
    /// claimed once; a buffer or an unknown name is an error naming it.
    pub fn claim_parameters(&mut self, names: &[String]) -> Result<(), Error> {
        let f = self.host_fn_since(self.host.api.claim_parameters(), "claim_parameters", "1.6")?;
        let names: RVec<RString> = names.iter().map(|n| RString::from(n.as_str())).collect();
        host_result(f(self.host.ctx, names))
    }

    /// The learning rate of the optimizer step being taken (at `optimizer_step`) or of the next
    /// one: the run's rate with its schedule and the methods' scaling, and that factor alone
    /// ([`StepInfo::lr_factor`]) for a method with its own base rate.
    pub fn step_info(&self) -> Result<StepInfo, Error> {
        let f = self.host_fn_since(self.host.api.step_info(), "step_info", "1.6")?;
        Ok(f(self.host.ctx))
    }

    /// The host optimizer's parameter groups, the default group last (from `fit_start`; not at
    /// `init`, before the optimizer exists).
    pub fn param_groups(&self) -> Result<Vec<ParamGroup>, Error> {
        let f = self.host_fn_since(self.host.api.param_groups(), "param_groups", "1.6")?;
        host_result(f(self.host.ctx)).map(RVec::into_vec)
    }

    /// Sets the learning-rate multiplier and weight decay of the parameter group `name` (as
    /// [`Context::param_groups`] names it) from the next optimizer step on (not at `init`).
    /// A resumed run starts from the configured values, so set them at `fit_start` (which
    /// every run, resumed or not, receives) or later.
    pub fn set_param_group(
        &mut self,
        name: &str,
        lr_multiplier: f64,
        weight_decay: f64,
    ) -> Result<(), Error> {
        let f = self.host_fn_since(self.host.api.set_param_group(), "set_param_group", "1.6")?;
        host_result(f(
            self.host.ctx,
            RStr::from_str(name),
            lr_multiplier,
            weight_decay,
        ))
    }

    /// Up to `samples` training samples as the model sees them — `input` (normalised, on the
    /// training device) and `target` — from the start of the first epoch's order, with the
    /// run's augmentation, without moving the run's loader or clock. Only at `init`: for
    /// data-aware initialisation (whitening the first layer from the images' patches). In a
    /// data-parallel run each rank reads its own share; the host then copies rank 0's model to
    /// every rank.
    pub fn training_sample(&mut self, samples: usize) -> Result<Vec<(String, tch::Tensor)>, Error> {
        let f = self.host_fn_since(self.host.api.training_sample(), "training_sample", "1.6")?;
        let entries = host_result(f(self.host.ctx, samples as u64))?;
        Ok(entries
            .into_iter()
            .map(|e| (e.name.into_string(), e.tensor.into_tensor()))
            .collect())
    }

    /// Runs the model on `input` in evaluation mode (batch-norm statistics, no dropout) under
    /// the run's precision and without gradient. At `eval_after_forward` a method may run
    /// extra forwards (flipped or shifted images: test-time augmentation) and replace `output`
    /// with [`Context::set_tensor`]: the evaluation's metrics score the replaced output.
    pub fn forward_eval(&mut self, input: &tch::Tensor) -> Result<tch::Tensor, Error> {
        let f = self.host_fn_since(self.host.api.forward_eval(), "forward_eval", "1.6")?;
        let handle = TensorHandle::from_tensor(input.shallow_clone());
        host_result(f(self.host.ctx, handle)).map(TensorHandle::into_tensor)
    }

    // ---- plugin-api 1.9 ----

    /// Every rank's `tensor`, stacked in rank order: `(world_size, *tensor.shape)`, of
    /// `tensor`'s kind on its device (a copy; `tensor` is not changed). For a method that
    /// shares work between the ranks: each computes its part, and all of them receive every
    /// part (Muon orthogonalises a share of the matrices on each rank).
    ///
    /// A collective: every rank must call it, at the same point of the run and the same number
    /// of times, with a tensor of the same shape, kind and device; a rank that does not call
    /// it leaves the others waiting until `[distributed] timeout`, which then fails the run
    /// naming the rank behind. Call it only from events every rank receives (not from a
    /// branch on the rank or on a rank's own data). A single process gets `tensor` with a
    /// leading dimension of 1; a host older than 1.9 returns an error naming the version.
    pub fn all_gather(&mut self, tensor: &tch::Tensor) -> Result<tch::Tensor, Error> {
        let f = self.host_fn_since(self.host.api.all_gather(), "all_gather", "1.9")?;
        let handle = TensorHandle::from_tensor(tensor.shallow_clone());
        host_result(f(self.host.ctx, handle)).map(TensorHandle::into_tensor)
    }

    /// Whether the host offers [`Context::all_gather`] (plugin-api 1.9 or later): a method
    /// that shares work between ranks checks it and, in an older host, does all the work on
    /// every rank instead. Every rank of a run has the same host, so every rank gets the
    /// same answer.
    pub fn supports_all_gather(&self) -> bool {
        self.host.api.all_gather().is_some()
    }
}
