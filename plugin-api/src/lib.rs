//! # Writing a Tessera plugin
//!
//! A Tessera plugin is a speed-up method (label smoothing, CutOut, BlurPool, ...) compiled as a
//! `cdylib` that the unmodified `tessera` binary loads at run time. You write it against this
//! crate alone:
//!
//! 1. implement [`Method`] (what happens at each event) and [`Plugin`] (name, hooks, settings);
//! 2. call [`export_plugin!`] once;
//! 3. `cargo build --release`, copy `target/release/lib<name>.so` into a plugins folder;
//! 4. list it in `trainer.toml`:
//!
//! ```toml
//! [plugins]
//! dirs = ["plugins"]
//!
//! [[algorithms]]
//! plugin = "scale_input"
//! factor = 0.5
//! ```
//!
//! ## A complete plugin
//!
//! ```no_run
//! use tessera_plugin_api::{export_plugin, keys, Context, Error, Event, Hook, Method, Plugin};
//!
//! /// Multiplies every training input by a constant.
//! pub struct ScaleInput {
//!     factor: f64,
//! }
//!
//! impl Method for ScaleInput {
//!     fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
//!         let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
//!         ctx.set_tensor(keys::INPUT, input.f_mul_scalar(self.factor)?)
//!     }
//! }
//!
//! impl Plugin for ScaleInput {
//!     const NAME: &'static str = "scale_input";
//!     const VERSION: &'static str = env!("CARGO_PKG_VERSION");
//!     const DESCRIPTION: &'static str = "multiplies training inputs by a constant";
//!     const DEFAULT_SETTINGS: &'static str = "factor = 1.0";
//!
//!     fn hooks() -> Vec<Hook> {
//!         vec![Hook::at(Event::AFTER_DATALOADER)]
//!     }
//!
//!     fn create(settings: &Settings) -> Result<Self, Error> {
//!         Ok(ScaleInput { factor: settings.f64_or("factor", 1.0)? })
//!     }
//! }
//! # use tessera_plugin_api::Settings;
//!
//! export_plugin!(ScaleInput);
//! ```
//!
//! with this `Cargo.toml`:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib", "rlib"]
//!
//! [dependencies]
//! tessera-plugin-api = "1.11"
//! tch = "=0.26.0"
//! ```
//!
//! ## Rules
//! - **Tensors** come to you as owned `tch::Tensor`s that share storage with the host's
//!   ([`Context::tensor`], named by the constants in [`keys`]); give a new one back with
//!   [`Context::set_tensor`]. Autograd works across the boundary: host and plugin share one
//!   libtorch. Across the ABI a tensor travels as an owned [`abi::TensorHandle`]; whoever holds
//!   one frees its tensor by dropping it, so the safe layer needs no `unsafe` to receive one.
//! - **libtorch**: a plugin must be built against exactly the host's libtorch version (the host
//!   checks and refuses a mismatch). Use the same `LIBTORCH` you built `tessera` with.
//! - **Errors, not panics**: return [`Error`]; prefer tch's `f_` methods, which return errors.
//!   A panic is caught at the boundary and stops the run with a message naming the plugin and the
//!   event, but a panicking method is not called again.
//! - **Randomness** comes from the host ([`Context::rng_u64`]) so a seed fixes the whole run.
//! - **Ordering**: at each event methods run by descending [`Hook::priority`], then in
//!   `trainer.toml` order, reversed at `after_*` events.
//! - **Times** in settings (`"100ba"`, `"2ep"`, `"0.5dur"`) are read with [`Time::parse`], the
//!   host's own grammar, and compared with the clock by [`Time::reached`].
//!
//! ## Versions
//! - **1.0**: events, batch tensors, random numbers, metrics, logging.
//! - **1.1** (appended to the host's function table): batch keys and whole-batch replacement,
//!   the model's forward and loss, module tree and surgery, parameters, the learning rate, extra
//!   passes, method state in checkpoints.
//! - **1.2** (no change to the ABI's layout): the batch key constants ([`keys`]), time strings
//!   ([`time`]), and [`abi::TensorHandle`] freeing its tensor when dropped; the golden-file
//!   helpers of the `testing` feature (`testing::golden`).
//! - **1.3** (appended): evaluation results and stopping the run ([`Context::eval_results`],
//!   [`Context::request_stop`]); per-sample transforms run on the host's loader threads
//!   ([`Method::sample_transform`], [`SampleTransform`]); Beta draws and permutations from the
//!   host's stream ([`random`], [`Context::rng_beta`], [`Context::rng_permutation`]) and
//!   Composer's one-hot targets ([`targets`]).
//! - **1.4** (appended to the module and wrapper objects): what `tessera export` writes for a
//!   plugin's module ([`Module::export`]) or wrapper ([`Wrapper::export`]): kept as it is, or
//!   folded back into the plain module (weight standardization, Ghost BatchNorm, stochastic
//!   depth's evaluation scaling); [`ModuleInfo::attr`] and [`ModuleInfo::int_attr`] read a
//!   module's attributes (no ABI change); the run's precision ([`Context::precision`],
//!   appended to the host's function table).
//! - **1.5** (appended to the host's function table): the process's place in a data-parallel
//!   run ([`Context::ranks`], [`RankInfo`]); rank 0 of 1 in an older host.
//! - **1.6** (appended to the host's function table and the sample transform object):
//!   optimizer methods ([`Context::claim_parameters`], the `optimizer_step` event, step
//!   information, [`keys::FOUND_INF`]), parameter groups, training samples at `init`, the
//!   evaluation forward, and where a per-sample transform's sample is.
//! - **1.7** (appended to the module object): [`Module::forward_masked`], the forward of a
//!   batch with an attention mask ([`keys::ATTENTION_MASK`]); a module of an older plugin gets
//!   [`Module::forward`].
//! - **1.8** (no change to the ABI's layout): [`device::upload`], a host-made tensor (a
//!   permutation, a mask) to the device without a blocking copy; [`targets::ensure_one_hot`]
//!   no longer reads the targets on the host.
//! - **1.9** (appended to the host's function table): [`Context::all_gather`], a collective
//!   over the ranks, for a method that shares its work between them (Muon's orthogonalisation
//!   by matrix).
//! - **1.10** (appended to the host's function table): this rank's slices of the model's
//!   tensors under `[distributed] sharding` ([`Context::parameter_slice`],
//!   [`Context::gather_slices`], [`ParameterSlice`], [`SliceLayout`]), for a method that keeps a copy of the
//!   weights (EMA, SWA, Lookahead) to keep only its slice; whole tensors in an older host.
//! - **1.11** (no change to the ABI): the plugin [`kit`] — one surgery trait for the host's
//!   context and a test stand-in ([`kit::SurgeryModel`], [`kit::StandIn`]), module-tree walks,
//!   [`kit::ConvSpec`], [`kit::default_init`], and checkpoint state helpers
//!   ([`kit::StateReader`], [`kit::json_state`]); [`random::splitmix64`] outside `testing`.
#![warn(missing_docs)]

pub mod abi;
pub mod device;
pub mod kit;
pub mod random;
mod sample;
mod settings;
mod slices;
pub mod targets;
#[cfg(feature = "testing")]
pub mod testing;
pub mod time;
mod wrap;

use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use abi_stable;
use abi_stable::std_types::{ROption, RResult, RStr, RString, RVec};
pub use sample::{Sample, SampleRandom, SampleTransform};
pub use settings::Settings;
pub use slices::{gather_for_save, ParameterSlice, SliceLayout, SlicedCopies};
pub use tch;
pub use wrap::{Inner, Wrapper};

pub use abi::{Attribute, EvalResults, Metric, ModuleInfo, ParamInfo};
pub use abi::{ErrorKind, Event, Hook, RankInfo, TimeInfo};
use abi::{
    HostHandle, MethodBox, MethodObject, MethodObject_TO, MethodState, ModuleBox, ModuleObject,
    ModuleObject_TO, NamedTensor, PluginError, PluginInfo, PluginModule, PluginModule_Ref,
    SampleTransformBox, TensorHandle,
};
pub use abi::{ParamGroup, SamplePlace, StepInfo};
pub use time::{Time, TimeError, TimeUnit};

/// The version of this interface crate; plugins report it and the host checks it.
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The names of the tensors the host shares at events (plugin-api 1.2): use them with
/// [`Context::tensor`], [`Context::set_tensor`] and [`Context::set_batch`] instead of spelling
/// the strings.
pub mod keys {
    /// The batch's model input (images: `(N, C, H, W)`); a batch entry.
    pub const INPUT: &str = "input";
    /// The batch's labels (class indices `(N)` or probabilities `(N, C)`); a batch entry.
    pub const TARGET: &str = "target";
    /// The model's output for the current microbatch, set from `after_forward` on.
    pub const OUTPUT: &str = "output";
    /// The training loss of the current microbatch (a floating scalar), set from `after_loss`
    /// on.
    pub const LOSS: &str = "loss";
    /// At `optimizer_step` (plugin-api 1.6): a 0-dim float32 tensor on the training device
    /// holding 1 when the host skipped its own update of this step (a non-finite loss, or
    /// overflowed gradients under `amp_fp16`), else 0. A method updating claimed parameters
    /// skips its update too (read it on the device, e.g. as a mask, to keep the step free of
    /// host reads). Absent when the host never skips.
    pub const FOUND_INF: &str = "found_inf";
    /// The batch's attention mask of token inputs `(N, T)`, int64: 1 where a token is, 0 at
    /// padding; a batch entry of text datasets that pad (labelled text, BERT). Transformer
    /// attention ignores the padded keys. Absent: every position is a token.
    pub const ATTENTION_MASK: &str = "attention_mask";
    /// The batch's token type ids `(N, T)`, int64: 0 on a sentence pair's first text (with
    /// `[CLS]` and its `[SEP]`) and on padding, 1 on the second; a batch entry of labelled text
    /// read as sentence pairs (`data.text.pair_field`). BERT's embeddings add the token-type
    /// embedding of these ids. Absent: every token is of type 0.
    pub const TOKEN_TYPE_IDS: &str = "token_type_ids";
}

/// The libtorch version this crate (and so the plugin or host using it) was compiled against.
pub const LIBTORCH_VERSION: &str = env!("TESSERA_LIBTORCH_VERSION");

/// An error a method returns to the host.
#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An error of the given kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// An error in the method's settings.
    pub fn config(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::CONFIG, message)
    }

    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

impl std::error::Error for Error {}

impl From<tch::TchError> for Error {
    fn from(e: tch::TchError) -> Error {
        Error::new(ErrorKind::TORCH, e.to_string())
    }
}

impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::new(ErrorKind::OTHER, message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Error {
        Error::new(ErrorKind::OTHER, message)
    }
}

impl From<Error> for PluginError {
    fn from(e: Error) -> PluginError {
        PluginError {
            kind: e.kind,
            message: RString::from(e.message),
        }
    }
}

/// The host, as a method sees it during one event.
pub struct Context<'a> {
    host: HostHandle,
    _call: PhantomData<&'a mut ()>,
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

    /// The tensor named `key`: a batch entry ([`keys::INPUT`], [`keys::TARGET`]), the model
    /// [`keys::OUTPUT`] or the [`keys::LOSS`]. It shares storage with the host's tensor. `None`
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
        let entries: RVec<NamedTensor> = entries
            .into_iter()
            .map(|(name, t)| NamedTensor {
                name: name.into(),
                tensor: TensorHandle::from_tensor(t),
            })
            .collect();
        host_result(f(self.host.ctx, entries))
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
        let tensors: RVec<NamedTensor> = tensors
            .into_iter()
            .map(|(name, t)| NamedTensor {
                name: name.into(),
                tensor: TensorHandle::from_tensor(t),
            })
            .collect();
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
    /// original, or modules inside it, through the [`Inner`] its `forward` receives. The
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
        let tensors: RVec<NamedTensor> = tensors
            .into_iter()
            .map(|(name, t)| NamedTensor {
                name: name.into(),
                tensor: TensorHandle::from_tensor(t),
            })
            .collect();
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
    /// optimizer state in [`Method::state`] so checkpoints carry it. Each parameter can be
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

impl ModuleInfo {
    /// The numeric attribute `key` of the module (`stride`, `out_channels`, `eps`), if it has
    /// one (plugin-api 1.4).
    pub fn attr(&self, key: &str) -> Option<f64> {
        self.attrs
            .iter()
            .find(|a| a.key.as_str() == key)
            .map(|a| a.value)
    }

    /// The integer attribute `key`, or `default` when the module has none (plugin-api 1.4). An
    /// attribute that is not a finite integer, or a missing one without a default, is an error
    /// naming the module and the key.
    pub fn int_attr(&self, key: &str, default: Option<i64>) -> Result<i64, Error> {
        match (self.attr(key), default) {
            (Some(v), _) if v.fract() == 0.0 && v.is_finite() => Ok(v as i64),
            (Some(v), _) => Err(Error::new(
                ErrorKind::HOST,
                format!(
                    "{} `{}`: attribute `{key}` = {v} is not an integer",
                    self.kind, self.path
                ),
            )),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(Error::new(
                ErrorKind::HOST,
                format!("{} `{}` has no `{key}` attribute", self.kind, self.path),
            )),
        }
    }
}

fn host_result<T>(r: RResult<T, RString>) -> Result<T, Error> {
    match r {
        RResult::ROk(v) => Ok(v),
        RResult::RErr(message) => Err(Error::new(ErrorKind::HOST, message.into_string())),
    }
}

/// A module a plugin puts into the model by surgery ([`Context::replace_module`]).
pub trait Module: Send + 'static {
    /// The kind shown in the module tree (`blur_conv2d`); lets surgery recognise its own
    /// modules and stay idempotent.
    fn kind(&self) -> &str;
    /// Numeric attributes shown in the module tree.
    fn attrs(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
    /// Runs the module.
    fn forward(&self, input: &tch::Tensor, train: bool) -> Result<tch::Tensor, Error>;
    /// What `tessera export` writes for this module (plugin-api 1.4; an older host never asks).
    ///
    /// `Ok(None)` (the default): the module is part of the trained network and is exported as
    /// it is, its tensors under the names it registered, its kind and attributes in the
    /// export's `tessera.modules` metadata (BlurPool's `blur_conv2d`). `Ok(Some(tensors))`: the
    /// module is a train-time reparametrisation that folds back into the plain module it
    /// replaced; `tensors`, named relative to the module (`weight`, `bias`), are that plain
    /// module's, computed so that it gives this module's evaluation output (weight
    /// standardization writes the standardized weight).
    fn export(&self) -> Result<Option<Vec<(String, tch::Tensor)>>, Error> {
        Ok(None)
    }
    /// Runs the module on a batch that has an attention mask (plugin-api 1.7; an older host
    /// always calls [`Module::forward`]): `attention_mask` is the batch's
    /// [`keys::ATTENTION_MASK`], `(B, T)` int64, 0 at padded positions. A module computing
    /// attention over the tokens (a replacement of BERT's `bert_self_attention`) gives padded
    /// keys no weight; the default ignores the mask and calls [`Module::forward`].
    fn forward_masked(
        &self,
        input: &tch::Tensor,
        attention_mask: &tch::Tensor,
        train: bool,
    ) -> Result<tch::Tensor, Error> {
        let _ = attention_mask;
        self.forward(input, train)
    }
}

/// Tensors across the ABI, named.
pub(crate) fn named_tensors(tensors: Vec<(String, tch::Tensor)>) -> RVec<NamedTensor> {
    tensors
        .into_iter()
        .map(|(name, t)| NamedTensor {
            name: name.into(),
            tensor: TensorHandle::from_tensor(t),
        })
        .collect()
}

/// The export answer of a plugin module or wrapper, across the ABI.
pub(crate) fn export_answer(
    answer: Result<Option<Vec<(String, tch::Tensor)>>, Error>,
) -> RResult<ROption<RVec<NamedTensor>>, PluginError> {
    match answer {
        Ok(Some(tensors)) => RResult::ROk(ROption::RSome(named_tensors(tensors))),
        Ok(None) => RResult::ROk(ROption::RNone),
        Err(e) => RResult::RErr(PluginError::from(e)),
    }
}

struct ModuleAdapter<M: Module>(M);

impl<M: Module> ModuleObject for ModuleAdapter<M> {
    fn kind(&self) -> RString {
        self.0.kind().into()
    }

    fn attrs(&self) -> RVec<Attribute> {
        self.0
            .attrs()
            .into_iter()
            .map(|(key, value)| Attribute {
                key: key.into(),
                value,
            })
            .collect()
    }

    fn forward(&self, input: TensorHandle, train: bool) -> RResult<TensorHandle, PluginError> {
        let input = input.into_tensor();
        guard(|| self.0.forward(&input, train))
            .map(TensorHandle::from_tensor)
            .map_err(PluginError::from)
            .into()
    }

    fn export(&self) -> RResult<ROption<RVec<NamedTensor>>, PluginError> {
        export_answer(guard(|| self.0.export()))
    }

    fn forward_masked(
        &self,
        input: TensorHandle,
        attention_mask: TensorHandle,
        train: bool,
    ) -> RResult<ROption<TensorHandle>, PluginError> {
        let input = input.into_tensor();
        let mask = attention_mask.into_tensor();
        guard(|| self.0.forward_masked(&input, &mask, train))
            .map(|t| ROption::RSome(TensorHandle::from_tensor(t)))
            .map_err(PluginError::from)
            .into()
    }
}

fn module_box(module: impl Module) -> ModuleBox {
    ModuleObject_TO::from_value(ModuleAdapter(module), abi_stable::sabi_trait::TD_Opaque)
}

/// A speed-up method: reacts to the events it hooks.
pub trait Method: Send + 'static {
    /// Called at each hooked event, in the order described in the crate docs.
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error>;

    /// The method's own state for checkpoints (counters, shadow weights...). Default: none.
    fn state(&self) -> Result<State, Error> {
        Ok(State::default())
    }

    /// Restores state returned by [`Method::state`].
    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let _ = state;
        Ok(())
    }

    /// A transform of single training images for the host to run on its loader's worker
    /// threads (plugin-api 1.3; see [`SampleTransform`]). Asked once, right after the method is
    /// created. Default: none.
    fn sample_transform(&self) -> Option<Box<dyn SampleTransform>> {
        None
    }
}

/// A method's own state in a checkpoint.
#[derive(Debug, Default)]
pub struct State {
    /// The method's own version of this layout, to migrate old checkpoints.
    pub format_version: u32,
    /// Serialized counters or settings, in a format the method chooses.
    pub bytes: Vec<u8>,
    /// Named tensors.
    pub tensors: Vec<(String, tch::Tensor)>,
}

impl From<State> for MethodState {
    fn from(s: State) -> MethodState {
        MethodState {
            format_version: s.format_version,
            blob: RVec::from(s.bytes),
            tensors: s
                .tensors
                .into_iter()
                .map(|(name, t)| NamedTensor {
                    name: name.into(),
                    tensor: TensorHandle::from_tensor(t),
                })
                .collect(),
        }
    }
}

impl From<MethodState> for State {
    fn from(s: MethodState) -> State {
        State {
            format_version: s.format_version,
            bytes: s.blob.into_vec(),
            tensors: s
                .tensors
                .into_iter()
                .map(|n| (n.name.into_string(), n.tensor.into_tensor()))
                .collect(),
        }
    }
}

/// Describes a method and builds it from its settings; [`export_plugin!`] exports it.
pub trait Plugin: Method + Sized {
    /// The name users write in `trainer.toml` (`plugin = "..."`); snake_case.
    const NAME: &'static str;
    /// The plugin's version; use `env!("CARGO_PKG_VERSION")`.
    const VERSION: &'static str;
    /// One line saying what the method does.
    const DESCRIPTION: &'static str;
    /// The default settings as TOML text, shown by `tessera plugins list`.
    const DEFAULT_SETTINGS: &'static str;

    /// The events the method receives, with their priorities.
    fn hooks() -> Vec<Hook>;

    /// Builds an instance from the user's settings (the plugin's `[[algorithms]]` table, less
    /// the host's own keys). Reject unknown keys and bad values with [`Error::config`].
    fn create(settings: &Settings) -> Result<Self, Error>;
}

thread_local! {
    static PANIC_LOCATION: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Installs (once) this plugin's panic hook: instead of printing to stderr, it records where the
/// panic happened, and [`guard`] puts that into the error the host reports. Each plugin has its
/// own copy of std, so this affects only the plugin.
#[doc(hidden)]
pub fn install_quiet_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let location = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()));
            PANIC_LOCATION.with(|p| *p.borrow_mut() = location);
        }));
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let message = if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    };
    match PANIC_LOCATION.with(|p| p.borrow_mut().take()) {
        Some(location) => format!("{message} (at {location})"),
        None => message,
    }
}

/// Runs `f`, turning a panic into an [`ErrorKind::PANIC`] error.
fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(Error::new(ErrorKind::PANIC, panic_message(&*payload))),
    }
}

/// Adapts a [`Method`] to the ABI, guarding every call.
struct Adapter<M: Method> {
    method: M,
    poisoned: bool,
}

impl<M: Method> MethodObject for Adapter<M> {
    fn on_event(&mut self, event: Event, host: HostHandle) -> RResult<(), PluginError> {
        if self.poisoned {
            return RResult::RErr(
                Error::new(
                    ErrorKind::PANIC,
                    "the method panicked earlier and is disabled",
                )
                .into(),
            );
        }
        // SAFETY: `host` is the handle of this very call.
        let mut ctx = unsafe { Context::from_host(host) };
        let result = guard(|| self.method.on_event(event, &mut ctx));
        if matches!(&result, Err(e) if e.kind == ErrorKind::PANIC) {
            self.poisoned = true;
        }
        result.map_err(PluginError::from).into()
    }

    fn state(&self) -> RResult<MethodState, PluginError> {
        guard(|| self.method.state())
            .map(MethodState::from)
            .map_err(PluginError::from)
            .into()
    }

    fn load_state(&mut self, state: MethodState) -> RResult<(), PluginError> {
        let state = State::from(state);
        guard(|| self.method.load_state(state))
            .map_err(PluginError::from)
            .into()
    }

    fn sample_transform(&self) -> ROption<SampleTransformBox> {
        // A panic here means no transform; the method's events still report it.
        catch_unwind(AssertUnwindSafe(|| self.method.sample_transform()))
            .ok()
            .flatten()
            .map(sample::sample_box)
            .into()
    }
}

extern "C" fn info<P: Plugin>() -> PluginInfo {
    PluginInfo {
        name: P::NAME.into(),
        version: P::VERSION.into(),
        api_version: API_VERSION.into(),
        libtorch_version: LIBTORCH_VERSION.into(),
        description: P::DESCRIPTION.into(),
        hooks: RVec::from(P::hooks()),
        default_settings: P::DEFAULT_SETTINGS.into(),
    }
}

extern "C" fn create<P: Plugin>(settings_json: RStr<'_>) -> RResult<MethodBox, PluginError> {
    let result = guard(|| {
        let settings = Settings::from_json(settings_json.as_str())?;
        boxed_method::<P>(&settings)
    });
    result.map_err(PluginError::from).into()
}

/// Builds the root module of plugin `P`. Used by [`export_plugin!`].
#[doc(hidden)]
pub fn root_module<P: Plugin>() -> PluginModule_Ref {
    use abi_stable::prefix_type::PrefixTypeTrait;
    install_quiet_panic_hook();
    PluginModule {
        info: info::<P>,
        create: create::<P>,
    }
    .leak_into_prefix()
}

/// Creates a method instance of plugin `P` directly, without a `.so` in between, wrapped exactly
/// as the host receives it (panics caught, unknown settings rejected). For a plugin's own tests
/// (see the `testing` feature) and for Rust programs that call methods in-process.
pub fn boxed_method<P: Plugin>(settings: &Settings) -> Result<MethodBox, Error> {
    let method = P::create(settings)?;
    settings.reject_unused()?;
    Ok(MethodObject_TO::from_value(
        Adapter {
            method,
            poisoned: false,
        },
        abi_stable::sabi_trait::TD_Opaque,
    ))
}

/// Exports a type implementing [`Plugin`] as this library's plugin. Call it once per crate.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        /// The plugin's root module: the one symbol a Tessera plugin exports.
        #[no_mangle]
        pub static _1as_0lib_1header_0root_bmodule_bloader:
            $crate::abi_stable::library::LibHeader = {
            extern "C" fn __tessera_erased_root() -> $crate::abi_stable::library::RootModuleResult {
                $crate::abi_stable::library::__call_root_module_loader(|| {
                    $crate::root_module::<$plugin>()
                })
            }
            unsafe {
                $crate::abi_stable::library::LibHeader::from_constructor::<
                    $crate::abi::PluginModule_Ref,
                >(
                    __tessera_erased_root,
                    $crate::abi_stable::library::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_attributes_are_read_by_key() {
        let info = ModuleInfo {
            path: "layer1.0.conv1".into(),
            kind: "conv2d".into(),
            attrs: vec![
                Attribute {
                    key: "stride".into(),
                    value: 2.0,
                },
                Attribute {
                    key: "eps".into(),
                    value: 1e-5,
                },
            ]
            .into(),
            params: RVec::new(),
        };
        assert_eq!(info.attr("eps"), Some(1e-5));
        assert_eq!(info.attr("groups"), None);
        assert_eq!(info.int_attr("stride", None).ok(), Some(2));
        assert_eq!(info.int_attr("groups", Some(1)).ok(), Some(1));
        let e = info.int_attr("groups", None).unwrap_err().to_string();
        assert!(e.contains("conv2d `layer1.0.conv1` has no `groups`"), "{e}");
        let e = info.int_attr("eps", None).unwrap_err().to_string();
        assert!(e.contains("`eps` = 0.00001 is not an integer"), "{e}");
    }

    #[test]
    fn export_symbol_matches_abi_stable() {
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }

    #[test]
    fn events_round_trip_by_name() {
        // Composer's 40 events and Tessera's `optimizer_step` (1.6).
        assert_eq!(Event::ALL.len(), 41);
        assert_eq!(Event::OPTIMIZER_STEP.name(), "optimizer_step");
        for (i, e) in Event::ALL.iter().enumerate() {
            assert_eq!(e.0 as usize, i);
            assert_eq!(Event::from_name(e.name()), Some(*e));
        }
        assert!(Event::AFTER_LOSS.is_after());
        assert!(!Event::EVAL_AFTER_ALL.is_after());
        assert!(!Event::BATCH_END.is_after());
    }

    #[test]
    fn panics_become_errors() {
        let err = guard::<()>(|| panic!("boom")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PANIC);
        assert_eq!(err.message(), "boom");
    }
}
