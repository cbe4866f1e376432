//! The types that cross the boundary between the `tessera` host and a plugin `.so`.
//!
//! Everything here is `#[repr(C)]` and derives [`StableAbi`], so abi_stable can check at load time
//! that host and plugin agree on every layout. Plugin authors rarely touch this module: the safe
//! layer ([`crate::Method`], [`crate::Context`], [`crate::export_plugin!`]) builds on it.
//!
//! # Evolution rules
//! Within a major version of this crate, only *appending* is allowed: new fields after the last
//! field of a prefix type ([`PluginModule`], [`HostApi`]), new methods at the end of
//! [`MethodObject`] (with a default body), new constants of the open "enums" ([`Event`],
//! [`ErrorKind`]). Removing, reordering or retyping anything is a new major version.
#![allow(non_local_definitions, non_camel_case_types)]

use std::ffi::c_void;

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings, sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, ROption, RResult, RStr, RString, RVec},
    StableAbi,
};

/// A training event, as in Composer (`composer/core/event.py`), in the order the loop fires them.
///
/// This is an open set: a host may fire events a plugin does not know; a plugin only receives
/// the events it hooks.
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Event(pub u32);

macro_rules! events {
    ($($(#[$doc:meta])* $name:ident = $value:literal, $text:literal;)*) => {
        impl Event {
            $( $(#[$doc])* pub const $name: Event = Event($value); )*
            /// Every event, in declaration (and firing) order.
            pub const ALL: &'static [Event] = &[$(Event::$name),*];
            /// The event's lowercase name, as Composer spells it (`"after_loss"`).
            pub fn name(self) -> &'static str {
                match self.0 {
                    $($value => $text,)*
                    _ => "unknown_event",
                }
            }
        }
    };
}

events! {
    /// Once, when the trainer is built; model surgery happens here.
    INIT = 0, "init";
    /// Before a checkpoint is loaded.
    BEFORE_LOAD = 1, "before_load";
    /// After a checkpoint is loaded (or where it would have been).
    AFTER_LOAD = 2, "after_load";
    /// Start of `fit`.
    FIT_START = 3, "fit_start";
    /// Start of an iteration (once per run in practice).
    ITERATION_START = 4, "iteration_start";
    /// Start of an epoch.
    EPOCH_START = 5, "epoch_start";
    /// Before the next batch is taken from the loader.
    BEFORE_DATALOADER = 6, "before_dataloader";
    /// After the batch arrived on the device: batch transforms (CutOut, selective backprop).
    AFTER_DATALOADER = 7, "after_dataloader";
    /// Start of a batch.
    BATCH_START = 8, "batch_start";
    /// Before the forward/backward passes of a batch (once per pass).
    BEFORE_TRAIN_BATCH = 9, "before_train_batch";
    /// Before each microbatch's forward.
    BEFORE_FORWARD = 10, "before_forward";
    /// After each microbatch's forward; `output` is set.
    AFTER_FORWARD = 11, "after_forward";
    /// Before each microbatch's loss.
    BEFORE_LOSS = 12, "before_loss";
    /// After each microbatch's loss; `loss` is set.
    AFTER_LOSS = 13, "after_loss";
    /// Before each microbatch's backward; `loss` may still be replaced.
    BEFORE_BACKWARD = 14, "before_backward";
    /// After each microbatch's backward.
    AFTER_BACKWARD = 15, "after_backward";
    /// After all microbatches: gradients are final, the optimizer has not stepped yet.
    AFTER_TRAIN_BATCH = 16, "after_train_batch";
    /// After the optimizer step; the timestamp already counts this batch.
    BATCH_END = 17, "batch_end";
    /// After `BATCH_END` and any evaluation; a checkpoint may be written.
    BATCH_CHECKPOINT = 18, "batch_checkpoint";
    /// End of an epoch; the timestamp already counts it.
    EPOCH_END = 19, "epoch_end";
    /// After `EPOCH_END` and any evaluation; a checkpoint may be written.
    EPOCH_CHECKPOINT = 20, "epoch_checkpoint";
    /// End of an iteration.
    ITERATION_END = 21, "iteration_end";
    /// After `ITERATION_END`.
    ITERATION_CHECKPOINT = 22, "iteration_checkpoint";
    /// End of `fit`.
    FIT_END = 23, "fit_end";
    /// Before all due evaluators run.
    EVAL_BEFORE_ALL = 24, "eval_before_all";
    /// Start of one evaluator's pass.
    EVAL_START = 25, "eval_start";
    /// Start of an eval batch.
    EVAL_BATCH_START = 26, "eval_batch_start";
    /// Before an eval forward.
    EVAL_BEFORE_FORWARD = 27, "eval_before_forward";
    /// After an eval forward.
    EVAL_AFTER_FORWARD = 28, "eval_after_forward";
    /// End of an eval batch.
    EVAL_BATCH_END = 29, "eval_batch_end";
    /// End of one evaluator's pass.
    EVAL_END = 30, "eval_end";
    /// After all due evaluators ran.
    EVAL_AFTER_ALL = 31, "eval_after_all";
    /// Start of a standalone evaluation.
    EVAL_STANDALONE_START = 32, "eval_standalone_start";
    /// End of a standalone evaluation.
    EVAL_STANDALONE_END = 33, "eval_standalone_end";
    /// Start of prediction.
    PREDICT_START = 34, "predict_start";
    /// Start of a prediction batch.
    PREDICT_BATCH_START = 35, "predict_batch_start";
    /// Before a prediction forward.
    PREDICT_BEFORE_FORWARD = 36, "predict_before_forward";
    /// After a prediction forward.
    PREDICT_AFTER_FORWARD = 37, "predict_after_forward";
    /// End of a prediction batch.
    PREDICT_BATCH_END = 38, "predict_batch_end";
    /// End of prediction.
    PREDICT_END = 39, "predict_end";
    /// Tessera's own (plugin-api 1.6; Composer has none): right after the host's optimizer
    /// stepped the parameters it trains, before `batch_end`. A method that claimed parameters
    /// ([`HostApi::claim_parameters`]) updates them here; [`HostApi::step_info`] gives the
    /// step's learning rate, and the tensor `found_inf` (see `keys::FOUND_INF`) says whether
    /// the host skipped its own update. Fired once per optimizer step, on every rank.
    OPTIMIZER_STEP = 40, "optimizer_step";
}

impl Event {
    /// The event named `name` (`"after_loss"`, case-insensitive), if there is one.
    pub fn from_name(name: &str) -> Option<Event> {
        Event::ALL
            .iter()
            .copied()
            .find(|e| e.name().eq_ignore_ascii_case(name))
    }

    /// Whether methods run in reverse order at this event. As in Composer, these are the
    /// events whose name starts with `after_`, so that e.g. the last method to change the
    /// target before the loss is the first to restore it after.
    pub fn is_after(self) -> bool {
        self.name().starts_with("after_")
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An event a method wants to receive, with its priority there.
///
/// At each event the host runs hooked methods by descending priority; methods with equal
/// priority keep their `trainer.toml` order, reversed at `after_*` events.
#[repr(C)]
#[derive(StableAbi, Copy, Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    /// The event.
    pub event: Event,
    /// Higher runs first; 0 is the default.
    pub priority: i32,
}

impl Hook {
    /// A hook at the default priority 0.
    pub const fn at(event: Event) -> Hook {
        Hook { event, priority: 0 }
    }
}

/// What kind of failure a [`PluginError`] reports.
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, PartialEq, Eq, Debug)]
pub struct ErrorKind(pub u32);

impl ErrorKind {
    /// Anything else.
    pub const OTHER: ErrorKind = ErrorKind(0);
    /// The method's settings are invalid.
    pub const CONFIG: ErrorKind = ErrorKind(1);
    /// A libtorch operation failed.
    pub const TORCH: ErrorKind = ErrorKind(2);
    /// The plugin panicked; the panic was caught at the boundary.
    pub const PANIC: ErrorKind = ErrorKind(3);
    /// A host call made by the plugin was refused (e.g. a tensor of the wrong shape).
    pub const HOST: ErrorKind = ErrorKind(4);

    /// A short lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::CONFIG => "invalid settings",
            ErrorKind::TORCH => "libtorch error",
            ErrorKind::PANIC => "panic",
            ErrorKind::HOST => "host refused",
            _ => "error",
        }
    }
}

/// An error returned across the boundary.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct PluginError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// A message for the user.
    pub message: RString,
}

/// An owned libtorch tensor (`at::Tensor*`, tch's `C_tensor*`) crossing the boundary.
///
/// # Ownership
/// A handle owns its tensor: turning it into a `tch::Tensor` with [`TensorHandle::into_tensor`]
/// hands the tensor on, and dropping it unconverted frees the tensor (since plugin-api 1.2;
/// before, such a tensor leaked). At every crossing the *receiver* owns what it is given, as it
/// always did: a function owns the handles passed to it as arguments (`set_tensor`, `forward`,
/// `loss`, `set_batch`, `replace_module`, `load_state`, a plugin module's `forward`), and its
/// caller owns the handles it returns (`get_tensor`, `parameter`, `forward`, `loss`, `state`, a
/// plugin module's `forward`). The layout is unchanged (one pointer): a plugin built against an
/// older 1.x converts every handle it receives and never frees one it gave away, so it and a
/// 1.2 host (or the other way round) free each tensor exactly once.
#[repr(transparent)]
#[derive(StableAbi, Debug)]
pub struct TensorHandle(*mut c_void);

impl TensorHandle {
    /// Gives up ownership of `tensor` and returns its handle.
    pub fn from_tensor(tensor: tch::Tensor) -> TensorHandle {
        let mut tensor = std::mem::ManuallyDrop::new(tensor);
        TensorHandle(tensor.as_mut_ptr() as *mut c_void)
    }

    /// Takes ownership of the tensor behind the handle.
    ///
    /// Safe since plugin-api 1.2: a handle can only be made by [`TensorHandle::from_tensor`] (on
    /// either side of the boundary, with the same libtorch; the host checks the version), and
    /// converting consumes it.
    pub fn into_tensor(self) -> tch::Tensor {
        let handle = std::mem::ManuallyDrop::new(self);
        // SAFETY: the pointer came from `from_tensor`, which gave up its ownership, and the
        // handle is consumed here without running `Drop`, so the tensor has one owner again.
        unsafe { tch::Tensor::from_ptr(handle.0 as *mut torch_sys::C_tensor) }
    }
}

impl Drop for TensorHandle {
    /// Frees the tensor of a handle that was never converted.
    fn drop(&mut self) {
        // SAFETY: as in `into_tensor`; `drop` runs at most once and only when `into_tensor` did
        // not take the handle. The tensor is freed at the end of this scope.
        let _tensor = unsafe { tch::Tensor::from_ptr(self.0 as *mut torch_sys::C_tensor) };
    }
}

/// The host's per-call state, opaque to plugins and only valid during the call it is passed to.
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct HostCtx(pub *mut c_void);

/// Counters of the training clock, as seen at the current event (Composer's `Timestamp` plus
/// the run's length).
#[repr(C)]
#[derive(StableAbi, Copy, Clone, Debug, Default, PartialEq)]
pub struct TimeInfo {
    /// Completed epochs.
    pub epoch: u64,
    /// Completed batches (optimizer steps).
    pub batch: u64,
    /// Samples trained on.
    pub sample: u64,
    /// Tokens trained on.
    pub token: u64,
    /// Completed batches in the current epoch.
    pub batch_in_epoch: u64,
    /// Samples in the current epoch.
    pub sample_in_epoch: u64,
    /// Tokens in the current epoch.
    pub token_in_epoch: u64,
    /// Batches per epoch of the training loader.
    pub batches_per_epoch: u64,
    /// The run's length in batches.
    pub max_batches: u64,
    /// Fraction of the run done, in `[0, 1]` (Composer's `get_elapsed_duration`).
    pub elapsed_fraction: f64,
    /// Whether the current event belongs to a training pass (false during evaluation).
    pub training: bool,
}

/// Functions the host offers to plugins. A prefix type: later versions append fields.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = HostApi_Ref)))]
pub struct HostApi {
    /// The training clock.
    pub time: extern "C" fn(HostCtx) -> TimeInfo,
    /// A shallow clone (shares storage) of a batch tensor (`input`, `target`, ...), of the
    /// model `output`, or of the `loss`; none if there is no such tensor at this event.
    pub get_tensor: extern "C" fn(HostCtx, key: RStr<'_>) -> ROption<TensorHandle>,
    /// Replaces a tensor; the host takes ownership and checks device and shape rules.
    pub set_tensor:
        extern "C" fn(HostCtx, key: RStr<'_>, value: TensorHandle) -> RResult<(), RString>,
    /// The next value of the host's seeded random stream (reproducible runs).
    pub rng_u64: extern "C" fn(HostCtx) -> u64,
    /// Records a metric (`"label_smoothing/smoothing"`) at the current timestamp.
    pub log_metric: extern "C" fn(HostCtx, name: RStr<'_>, value: f64),
    /// Writes a log line; `level`: 0 error, 1 warn, 2 info, 3 debug.
    #[sabi(last_prefix_field)]
    pub log: extern "C" fn(HostCtx, level: u32, message: RStr<'_>),

    // ---- 1.1: appended; accessors return `None` in a 1.0 host ----
    /// The names of the current batch's tensors.
    pub batch_keys: extern "C" fn(HostCtx) -> RVec<RString>,
    /// Replaces several batch tensors at once. Together they may change the batch size: after
    /// the call every batch tensor must have the same first dimension.
    pub set_batch: extern "C" fn(HostCtx, entries: RVec<NamedTensor>) -> RResult<(), RString>,
    /// Runs the model on `input` (under the run's precision), with or without gradient.
    pub forward:
        extern "C" fn(HostCtx, input: TensorHandle, grad: bool) -> RResult<TensorHandle, RString>,
    /// The training loss of `output` against `target`; per sample (shape `(N,)`) or reduced.
    pub loss: extern "C" fn(
        HostCtx,
        output: TensorHandle,
        target: TensorHandle,
        per_sample: bool,
    ) -> RResult<TensorHandle, RString>,
    /// The model's module tree, depth first.
    pub modules: extern "C" fn(HostCtx) -> RVec<ModuleInfo>,
    /// Replaces the module at `path` by `module`; the old module's tensors leave the model and
    /// `tensors` (named relative to `path`, e.g. `conv.weight`) join it: those that require a
    /// gradient as parameters (trained, checkpointed), the others as buffers. Only at `init`.
    pub replace_module: extern "C" fn(
        HostCtx,
        path: RStr<'_>,
        module: ModuleBox,
        tensors: RVec<NamedTensor>,
    ) -> RResult<(), RString>,
    /// Every parameter and buffer of the model.
    pub parameters: extern "C" fn(HostCtx) -> RVec<ParamInfo>,
    /// The parameter or buffer `name`, sharing storage (in-place edits change the model).
    pub parameter: extern "C" fn(HostCtx, name: RStr<'_>) -> ROption<TensorHandle>,
    /// Freezes or unfreezes a parameter: `requires_grad` and optimizer membership together.
    pub set_trainable:
        extern "C" fn(HostCtx, name: RStr<'_>, trainable: bool) -> RResult<(), RString>,
    /// The learning rate the next optimizer step uses.
    pub lr: extern "C" fn(HostCtx) -> f64,
    /// Multiplies the learning rate of the next optimizer step by `factor`.
    pub scale_lr: extern "C" fn(HostCtx, factor: f64),
    /// At `after_train_batch`: run forward and backward over the batch once more before the
    /// optimizer steps (SAM); the train-batch events fire again.
    pub request_extra_pass: extern "C" fn(HostCtx) -> RResult<(), RString>,
    /// Which forward/backward pass of the current step this is (0 first, 1 after one extra
    /// pass, ...).
    pub pass_index: extern "C" fn(HostCtx) -> u32,
    /// Whether a checkpoint will be written at the current `*_checkpoint` event.
    pub checkpoint_pending: extern "C" fn(HostCtx) -> bool,

    // ---- 1.3: appended; accessors return `None` in an older host ----
    /// The results of the latest evaluation over the test set (from `eval_end` on; none before
    /// the first evaluation).
    pub eval_results: extern "C" fn(HostCtx) -> ROption<EvalResults>,
    /// Asks the run to stop, as Composer's `State.stop_training()`: the run's length becomes the
    /// batches done so far, so the loop ends after the current event's batch (or epoch), and the
    /// run ends normally (`fit_end`, a final checkpoint when checkpoints are on). `reason` goes to
    /// the log and the run record. Not at `init`.
    pub request_stop: extern "C" fn(HostCtx, reason: RStr<'_>) -> RResult<(), RString>,
    /// Wraps the module at `path` (only at `init`): `wrapper` runs in its place and calls the
    /// original module, or any module inside it, through the [`InnerCall`] it is given. The
    /// original stays in the model: as the child `inner_name` of the wrapper (its tensors
    /// renamed `path.inner_name.*`), or, with an empty `inner_name`, transparently (its tensors
    /// and children keep their names, the node shows the wrapper's kind). `tensors` are the
    /// wrapper's own, named relative to `path`; those requiring a gradient are trained.
    pub wrap_module: extern "C" fn(
        HostCtx,
        path: RStr<'_>,
        wrapper: WrapperBox,
        inner_name: RStr<'_>,
        tensors: RVec<NamedTensor>,
    ) -> RResult<(), RString>,

    // ---- 1.4: appended; the accessor returns `None` in an older host ----
    /// The run's numeric precision as `trainer.toml` names it (`fp32`, `amp_bf16`).
    pub precision: extern "C" fn(HostCtx) -> RString,

    // ---- 1.5: appended; the accessor returns `None` in an older host ----
    /// This process's place in a data-parallel run (rank 0 of 1 for a single process).
    pub ranks: extern "C" fn(HostCtx) -> RankInfo,

    // ---- 1.6: appended; accessors return `None` in an older host ----
    /// Takes over the update of the parameters `names` (only at `init`): the host's optimizer
    /// leaves them out (they keep their gradients, which the host still clears, unscales and
    /// averages over the ranks), and the calling method updates them at `optimizer_step`. A
    /// parameter can be claimed once; a buffer or an unknown name is an error naming it.
    pub claim_parameters: extern "C" fn(HostCtx, names: RVec<RString>) -> RResult<(), RString>,
    /// The learning rate of the optimizer step being taken (at `optimizer_step`), or of the next
    /// one (elsewhere).
    pub step_info: extern "C" fn(HostCtx) -> StepInfo,
    /// The host optimizer's parameter groups, the default group last (not at `init`: the
    /// optimizer is built after it).
    pub param_groups: extern "C" fn(HostCtx) -> RResult<RVec<ParamGroup>, RString>,
    /// Sets a parameter group's learning-rate multiplier and weight decay, from the next
    /// optimizer step on (not at `init`). Both must be finite and not negative.
    pub set_param_group: extern "C" fn(
        HostCtx,
        name: RStr<'_>,
        lr_multiplier: f64,
        weight_decay: f64,
    ) -> RResult<(), RString>,
    /// Up to `samples` training samples as the model sees them (on the training device,
    /// normalised; `input` and `target`), read from the start of the first epoch's order without
    /// moving the run's loader or clock. Only at `init` (before training: data-aware
    /// initialisation, such as whitening the first layer).
    pub training_sample:
        extern "C" fn(HostCtx, samples: u64) -> RResult<RVec<NamedTensor>, RString>,
    /// Runs the model on `input` in evaluation mode (batch-norm statistics used, dropout off)
    /// under the run's precision, without gradient: test-time augmentation's extra forwards.
    pub forward_eval: extern "C" fn(HostCtx, input: TensorHandle) -> RResult<TensorHandle, RString>,

    // ---- 1.9: appended; the accessor returns `None` in an older host ----
    /// Every rank's `input` stacked in rank order: `(world_size, *input.shape)`, of `input`'s
    /// kind on its device. Every rank must call it, in the same order, with a tensor of the
    /// same shape, kind and device (a collective). A single process gets `input` with a
    /// leading dimension of 1.
    pub all_gather: extern "C" fn(HostCtx, input: TensorHandle) -> RResult<TensorHandle, RString>,

    // ---- 1.10: appended; accessors return `None` in an older host ----
    /// This rank's slice of the model's tensor `name` ([`SliceInfo`]), `RNone` when the model
    /// has no such tensor. `write`: the caller will change it, and the host makes the whole
    /// parameters agree with every rank's slices once the event is over (a collective under
    /// `[distributed] sharding`: every rank must ask alike).
    pub parameter_slice:
        extern "C" fn(HostCtx, name: RStr<'_>, write: bool) -> RResult<ROption<SliceInfo>, RString>,
    /// The whole tensors of the named model tensors from every rank's slices: `slices[i]` has
    /// the shape of this rank's slice of `names[i]`; the answer has each tensor's whole shape
    /// (a collective: every rank calls it with the same names, in the same order).
    pub gather_slices: extern "C" fn(
        HostCtx,
        names: RVec<RString>,
        slices: RVec<TensorHandle>,
    ) -> RResult<RVec<TensorHandle>, RString>,
}

/// This rank's slice of a model tensor (plugin-api 1.10): under `[distributed] sharding` each
/// rank owns a run of every sharded parameter's elements, in the parameter's memory order.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct SliceInfo {
    /// The slice, sharing the memory this rank keeps of the parameter: a 1-D tensor of the
    /// elements `[start, start + len)` (possibly none) when `sharded`, else the whole tensor.
    pub tensor: TensorHandle,
    /// The ranks hold different parts of this tensor (else every rank holds it whole).
    pub sharded: bool,
    /// The first element of the whole tensor the slice holds, in its memory order.
    pub start: i64,
    /// The whole tensor's size.
    pub size: RVec<i64>,
    /// The whole tensor's strides (its memory order).
    pub strides: RVec<i64>,
}

/// The learning rate of an optimizer step (plugin-api 1.6), for a method that updates the
/// parameters it claimed at `optimizer_step` with the run's schedule.
#[repr(C)]
#[derive(StableAbi, Copy, Clone, Debug, PartialEq)]
pub struct StepInfo {
    /// The default group's learning rate of the step: the optimizer's `lr` × the schedule's
    /// multiplier × the methods' scaling of this step.
    pub lr: f64,
    /// `lr` divided by the optimizer's configured `lr`: the schedule's multiplier times the
    /// methods' scaling. A method with its own base rate multiplies that rate by this factor.
    pub lr_factor: f64,
    /// The optimizer's configured learning rate.
    pub initial_lr: f64,
    /// Optimizer steps attempted before this one (taken or skipped).
    pub step: u64,
}

/// One of the host optimizer's parameter groups (plugin-api 1.6).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct ParamGroup {
    /// The group's name (`[[optimizer.groups]] name`, or `default`).
    pub name: RString,
    /// Multiplies the run's learning rate for the group's parameters.
    pub lr_multiplier: f64,
    /// The group's weight decay.
    pub weight_decay: f64,
    /// The group's trainable parameters, in the optimizer's order.
    pub params: RVec<RString>,
}

/// A process's place in a data-parallel run (plugin-api 1.5): each rank is one process training
/// on its share of every batch; gradients are averaged over the ranks before the optimizer
/// step, so the model is the same on every rank.
#[repr(C)]
#[derive(StableAbi, Copy, Clone, Debug, PartialEq, Eq)]
pub struct RankInfo {
    /// This process's rank, `0..world_size`; rank 0 writes the run's files.
    pub rank: u32,
    /// Number of ranks (1 for a single process).
    pub world_size: u32,
    /// Rank among the processes of this machine.
    pub local_rank: u32,
}

impl RankInfo {
    /// A single process: rank 0 of 1.
    pub const SINGLE: RankInfo = RankInfo {
        rank: 0,
        world_size: 1,
        local_rank: 0,
    };
}

/// The wrapped module, as a wrapper's `forward` may call it (valid during that call).
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct InnerCtx(pub *const c_void);

/// How a wrapper calls the module it wraps (plugin-api 1.3).
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct InnerCall {
    /// Runs the wrapped module (`child` empty) or the module at the dotted path `child` inside
    /// it (`conv1`, `downsample.0`) on `input`; consumes `input`.
    pub call: extern "C" fn(
        InnerCtx,
        child: RStr<'_>,
        input: TensorHandle,
        train: bool,
    ) -> RResult<TensorHandle, RString>,
    /// The wrapped module.
    pub ctx: InnerCtx,
}

/// A module that wraps one of the model's (plugin-api 1.3): StochasticDepth around a residual
/// block, SqueezeExcite after a convolution, GhostBatchNorm around a batch norm.
#[sabi_trait]
pub trait WrapperObject: Send {
    /// The kind shown in the module tree (`squeeze_excite_conv2d`).
    fn kind(&self) -> RString;
    /// Numeric attributes shown in the module tree (besides the wrapped module's).
    fn attrs(&self) -> RVec<Attribute>;
    /// Runs the wrapper; consumes `input`.
    #[sabi(last_prefix_field)]
    fn forward(
        &self,
        input: TensorHandle,
        train: bool,
        inner: InnerCall,
    ) -> RResult<TensorHandle, PluginError>;

    // ---- 1.4: appended with a default body (an older plugin gets it) ----
    /// What `tessera export` writes for this node (plugin-api 1.4). `inner` holds the wrapped
    /// module's exported tensors, named relative to it. `Some(tensors)`: the wrapper is folded
    /// away, the node is exported as the plain wrapped module with `tensors` (named relative to
    /// the node). `None` (the default): the node is exported as it is, with the wrapper's own
    /// tensors and the wrapped module's under the inner name.
    fn export(&self, inner: RVec<NamedTensor>) -> RResult<ROption<RVec<NamedTensor>>, PluginError> {
        let _ = inner;
        RResult::ROk(ROption::RNone)
    }
}

/// An owned wrapper.
pub type WrapperBox = WrapperObject_TO<'static, RBox<()>>;

/// One value of an evaluation (`accuracy`, `cross_entropy`).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct Metric {
    /// The metric's name.
    pub name: RString,
    /// Its value.
    pub value: f64,
}

/// The results of one evaluation over the test set.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct EvalResults {
    /// The epoch count when the evaluation ran.
    pub epoch: u64,
    /// The batch count when the evaluation ran.
    pub batch: u64,
    /// Samples evaluated.
    pub samples: u64,
    /// The metrics: `accuracy` (fraction of correct top-1 predictions) and `cross_entropy`
    /// (mean over samples), and any a later host adds.
    pub metrics: RVec<Metric>,
}

impl EvalResults {
    /// The value of the metric `name`, if the host reported it.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics
            .iter()
            .find(|m| m.name.as_str() == name)
            .map(|m| m.value)
    }
}

/// A tensor with a name (an owned handle).
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct NamedTensor {
    /// The name.
    pub name: RString,
    /// The tensor.
    pub tensor: TensorHandle,
}

/// A parameter or buffer of the model.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct ParamInfo {
    /// Full dotted name (`layer1.0.conv1.weight`).
    pub name: RString,
    /// Shape.
    pub shape: RVec<i64>,
    /// A buffer (not trained), e.g. BatchNorm running statistics.
    pub buffer: bool,
    /// Whether it currently requires a gradient (and is in the optimizer).
    pub trainable: bool,
}

/// A numeric attribute of a module (`stride = 2`).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct Attribute {
    /// Name.
    pub key: RString,
    /// Value (integers and booleans as numbers).
    pub value: f64,
}

/// A node of the module tree.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct ModuleInfo {
    /// Dotted path from the root (`""` for the root).
    pub path: RString,
    /// Kind (`conv2d`, `batch_norm2d`, `linear`, `residual_block`, ... or a plugin module's).
    pub kind: RString,
    /// Attributes.
    pub attrs: RVec<Attribute>,
    /// Names of the tensors the node itself holds (full names).
    pub params: RVec<RString>,
}

/// A module provided by a plugin (surgery), run by the host inside the model.
#[sabi_trait]
pub trait ModuleObject: Send {
    /// The kind shown in the module tree (`blur_conv2d`).
    fn kind(&self) -> RString;
    /// Numeric attributes shown in the module tree.
    fn attrs(&self) -> RVec<Attribute>;
    /// Runs the module; consumes `input`.
    #[sabi(last_prefix_field)]
    fn forward(&self, input: TensorHandle, train: bool) -> RResult<TensorHandle, PluginError>;

    // ---- 1.4: appended with a default body (an older plugin gets it) ----
    /// What `tessera export` writes for this module (plugin-api 1.4). `Some(tensors)`: the
    /// module is folded back into the plain module it replaced, with `tensors` (named relative
    /// to it). `None` (the default): the module is exported as it is, with its tensors.
    fn export(&self) -> RResult<ROption<RVec<NamedTensor>>, PluginError> {
        RResult::ROk(ROption::RNone)
    }

    // ---- 1.7: appended with a default body (an older plugin gets it) ----
    /// Runs the module on a batch that has an `attention_mask` (plugin-api 1.7): `(B, T)`
    /// int64, 0 at padded positions; consumes both handles. `None` (the default, and every
    /// module of a plugin built before 1.7): the module has no masked forward, and the host
    /// calls [`forward`](ModuleObject::forward) instead.
    fn forward_masked(
        &self,
        input: TensorHandle,
        attention_mask: TensorHandle,
        train: bool,
    ) -> RResult<ROption<TensorHandle>, PluginError> {
        let _ = (input, attention_mask, train);
        RResult::ROk(ROption::RNone)
    }
}

/// An owned plugin module.
pub type ModuleBox = ModuleObject_TO<'static, RBox<()>>;

/// What a method receives with each event: the host's function table and its call state.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HostHandle {
    /// The function table.
    pub api: HostApi_Ref,
    /// The state those functions act on.
    pub ctx: HostCtx,
}

/// A method instance, as the host sees it.
#[sabi_trait]
pub trait MethodObject: Send {
    /// Called at each event the plugin hooks.
    #[sabi(last_prefix_field)]
    fn on_event(&mut self, event: Event, host: HostHandle) -> RResult<(), PluginError>;

    // ---- 1.1: appended with default bodies (an older plugin gets these) ----
    /// The method's own state, saved in checkpoints.
    fn state(&self) -> RResult<MethodState, PluginError> {
        RResult::ROk(MethodState::default())
    }

    /// Restores state saved by [`MethodObject::state`].
    fn load_state(&mut self, state: MethodState) -> RResult<(), PluginError> {
        let _ = state;
        RResult::ROk(())
    }

    // ---- 1.3: appended with a default body ----
    /// A per-sample transform for the training images, which the host runs on its loader's
    /// worker threads; asked once, after the method is created. None by default.
    fn sample_transform(&self) -> ROption<SampleTransformBox> {
        ROption::RNone
    }
}

/// One training image as a per-sample transform sees it (plugin-api 1.3): channel-major `f32`
/// values in `[0, 1]` (pixel / 255, as torchvision's `ToTensor` gives), after the host's crop and
/// flip and before its normalization.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct SampleBuf {
    /// Channels.
    pub channels: u32,
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// `channels × height × width` values.
    pub data: RVec<f32>,
}

/// The host's random generator of one sample, opaque to plugins, valid during one `apply`.
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct SampleRngState(pub *mut c_void);

/// The random stream of one sample (plugin-api 1.3): a pure function of the run's seed, the
/// epoch and the sample's position in it, so batches do not depend on the number of loader
/// workers and a resumed run draws the same numbers.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct SampleRng {
    /// The next 64 random bits.
    pub next_u64: extern "C" fn(SampleRngState) -> u64,
    /// The generator.
    pub state: SampleRngState,
}

/// The output shape of a per-sample transform.
#[repr(C)]
#[derive(StableAbi, Copy, Clone, Debug, PartialEq, Eq)]
pub struct SampleShape {
    /// Channels.
    pub channels: u32,
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
}

impl SampleShape {
    /// The shape `(channels, height, width)`; an error naming the dimension that does not fit
    /// in a `u32`.
    pub fn new((c, h, w): (usize, usize, usize)) -> Result<SampleShape, String> {
        let dim = |v: usize| u32::try_from(v).map_err(|_| format!("dimension {v} is too large"));
        Ok(SampleShape {
            channels: dim(c)?,
            height: dim(h)?,
            width: dim(w)?,
        })
    }

    /// The shape as `(channels, height, width)`.
    pub fn dims(self) -> (usize, usize, usize) {
        (
            self.channels as usize,
            self.height as usize,
            self.width as usize,
        )
    }
}

/// A per-sample transform a plugin provides (plugin-api 1.3), shared by the loader's worker
/// threads.
#[sabi_trait]
pub trait SampleTransformObject: Send + Sync {
    /// The shape it makes of an input of `shape` (the same for every sample), or why it cannot
    /// run on it.
    fn output_shape(&self, shape: SampleShape) -> RResult<SampleShape, PluginError>;
    /// Transforms one sample, drawing any randomness from `rng`.
    #[sabi(last_prefix_field)]
    fn apply(&self, sample: SampleBuf, rng: SampleRng) -> RResult<SampleBuf, PluginError>;

    // ---- 1.6: appended with a default body (an older plugin gets it) ----
    /// Transforms one sample knowing which it is (plugin-api 1.6): a 1.6 host calls this
    /// instead of [`SampleTransformObject::apply`]. By default it calls `apply`.
    fn apply_at(
        &self,
        sample: SampleBuf,
        rng: SampleRng,
        at: SamplePlace,
    ) -> RResult<SampleBuf, PluginError> {
        let _ = at;
        self.apply(sample, rng)
    }
}

/// Which sample a per-sample transform is working on (plugin-api 1.6).
#[repr(C)]
#[derive(StableAbi, Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct SamplePlace {
    /// The epoch (0 for the first).
    pub epoch: u64,
    /// The sample's index in the training set (the same in every epoch).
    pub index: u64,
}

/// An owned per-sample transform.
pub type SampleTransformBox = SampleTransformObject_TO<'static, RBox<()>>;

/// A method's own state in a checkpoint: bytes the method interprets plus named tensors.
#[repr(C)]
#[derive(StableAbi, Debug, Default)]
pub struct MethodState {
    /// The method's own version of this layout, so it can migrate old checkpoints.
    pub format_version: u32,
    /// Serialized settings/counters (the method chooses the format).
    pub blob: RVec<u8>,
    /// Tensors (owned handles).
    pub tensors: RVec<NamedTensor>,
}

/// An owned method instance.
pub type MethodBox = MethodObject_TO<'static, RBox<()>>;

/// Describes a plugin; returned by [`PluginModule::info`].
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct PluginInfo {
    /// The method's name, as written in `trainer.toml` (`"label_smoothing"`).
    pub name: RString,
    /// The plugin's own version.
    pub version: RString,
    /// The version of `tessera-plugin-api` the plugin was built with.
    pub api_version: RString,
    /// The libtorch version the plugin was built with; must equal the host's.
    pub libtorch_version: RString,
    /// One line saying what the method does.
    pub description: RString,
    /// The events the method receives.
    pub hooks: RVec<Hook>,
    /// The default settings, as TOML text.
    pub default_settings: RString,
}

/// The root module every plugin exports (one per `.so`). A prefix type: later versions append
/// fields.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModule_Ref)))]
#[sabi(missing_field(panic))]
pub struct PluginModule {
    /// Describes the plugin.
    pub info: extern "C" fn() -> PluginInfo,
    /// Creates a method instance from its settings (a JSON object).
    #[sabi(last_prefix_field)]
    pub create: extern "C" fn(settings_json: RStr<'_>) -> RResult<MethodBox, PluginError>,
}

impl RootModule for PluginModule_Ref {
    declare_root_module_statics! {PluginModule_Ref}
    const BASE_NAME: &'static str = "tessera_plugin";
    const NAME: &'static str = "tessera_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

#[cfg(test)]
mod tests {
    use super::TensorHandle;
    use tch::{Device, Kind, Tensor};

    /// 256 MiB: far above glibc's mmap threshold, so freeing it returns the pages at once.
    const BYTES: i64 = 256 << 20;

    /// This process's resident memory in bytes (`VmRSS` of `/proc/self/status`).
    fn resident() -> i64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let kib: i64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("a VmRSS line in kB");
        kib * 1024
    }

    /// A tensor of `BYTES` ones (written, so resident).
    fn big() -> Tensor {
        Tensor::ones([BYTES / 4], (Kind::Float, Device::Cpu))
    }

    #[test]
    fn a_dropped_handle_frees_its_tensor() {
        let base = resident();
        let handle = TensorHandle::from_tensor(big());
        let held = resident();
        assert!(
            held - base > BYTES * 3 / 4,
            "the tensor is not resident: {base} → {held}"
        );
        drop(handle);
        let freed = resident();
        assert!(
            held - freed > BYTES * 3 / 4,
            "dropping the handle did not free its tensor: {held} → {freed} bytes resident"
        );

        // A handle holds one reference: dropping one made from a shallow clone leaves the
        // original's storage alone.
        let original = big();
        drop(TensorHandle::from_tensor(original.shallow_clone()));
        assert!(resident() - freed > BYTES * 3 / 4);
        assert_eq!(
            original.sum(Kind::Double).double_value(&[]),
            (BYTES / 4) as f64
        );
        drop(original);

        // Converting hands the tensor on instead of freeing it.
        let tensor = TensorHandle::from_tensor(big()).into_tensor();
        assert!(resident() - freed > BYTES * 3 / 4);
        assert_eq!(
            tensor.sum(Kind::Double).double_value(&[]),
            (BYTES / 4) as f64
        );
    }
}
