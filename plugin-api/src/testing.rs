//! A test host for plugin authors: drive a method through its events in a unit test, without
//! the `tessera` binary. Enabled by the `testing` feature:
//!
//! ```toml
//! [dev-dependencies]
//! tessera-plugin-api = { version = "1.11", features = ["testing"] }
//! ```
//!
//! ```no_run
//! # use tessera_plugin_api::{keys, testing::{TestHost, RandomSource}, Event, Settings, tch::Tensor};
//! # fn demo<P: tessera_plugin_api::Plugin>() {
//! let mut method = tessera_plugin_api::boxed_method::<P>(&Settings::from_json("{}").unwrap()).unwrap();
//! let mut host = TestHost::new(RandomSource::Seeded(0)).with(keys::INPUT, &Tensor::zeros([2, 1, 4, 4], tessera_plugin_api::tch::kind::FLOAT_CPU));
//! host.fire(&mut method, Event::AFTER_DATALOADER).unwrap();
//! let out = host.get(keys::INPUT);
//! # }
//! ```
//!
//! The test host keeps named tensors in a map and accepts whatever a method sets (the real
//! host also checks devices and shapes), hands out random numbers from a seed or a script, and
//! records metrics.
//!
//! [`golden`] (plugin-api 1.2) reads reference outputs ("golden files") and compares tensors, so
//! a plugin's tests need nothing but this crate; [`settings`] and [`default_settings_json`] make
//! the settings a test creates a method with.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::c_void;
use std::sync::OnceLock;

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{ROption, RResult, RStr, RString};
use tch::Tensor;

use abi_stable::std_types::RVec;

use crate::abi::{
    EvalResults, HostApi, HostApi_Ref, HostCtx, HostHandle, MethodBox, Metric, ModuleBox,
    ModuleInfo, NamedTensor, ParamInfo, SampleBuf, SampleRng, SampleRngState, SampleShape,
    SliceInfo, TensorHandle, WrapperBox,
};
use crate::{Event, ParamGroup, Sample, SamplePlace, Settings, StepInfo, TimeInfo};

pub mod golden;

/// Settings from JSON text; panics (this is test code) naming the text when it is not a JSON
/// object.
pub fn settings(json: &str) -> Settings {
    Settings::from_json(json).unwrap_or_else(|e| panic!("settings {json}: {e}"))
}

/// Settings from JSON text with plugin `P`'s documented defaults, as the host gives them to
/// [`crate::Plugin::create`] (through [`crate::boxed_method`]); panics when either is malformed.
pub fn settings_for<P: crate::Plugin>(json: &str) -> Settings {
    settings(json)
        .with_defaults(P::DEFAULT_SETTINGS)
        .unwrap_or_else(|e| panic!("{}: {e}", P::NAME))
}

/// A plugin's `DEFAULT_SETTINGS` TOML text as settings JSON, so a test can create a method
/// exactly as documented; panics (this is test code) when the text is not TOML.
pub fn default_settings_json(toml: &str) -> String {
    let map = crate::settings::parse_defaults(toml).unwrap_or_else(|e| panic!("{e}"));
    serde_json::Value::Object(map).to_string()
}

/// Where the test host's random numbers come from.
pub enum RandomSource {
    /// SplitMix64 from a seed.
    Seeded(u64),
    /// Exactly these values, in order; then zeros, counted in [`TestHost::overdrawn`] (a panic
    /// must not unwind out of an `extern "C"` host function).
    Scripted(VecDeque<u64>),
}

/// One SplitMix64 step: the generator behind [`RandomSource::Seeded`].
pub use crate::random::splitmix64;

/// The model `TestHost::forward_eval` runs (plugin-api 1.6).
pub type EvalModel = Box<dyn Fn(&Tensor) -> Tensor>;

/// The host state a method sees through its `Context`: named tensors, an RNG, logged metrics.
pub struct TestHost {
    /// The tensors a method can get and set (`input`, `target`, `output`, `loss`, ...).
    pub tensors: HashMap<String, Tensor>,
    /// Where random numbers come from.
    pub rng: RandomSource,
    /// Metrics the method logged, in order.
    pub metrics: Vec<(String, f64)>,
    /// Random numbers handed out.
    pub draws: usize,
    /// Random numbers asked for after a scripted stream ran out.
    pub overdrawn: usize,
    /// Model parameters by name (for `parameter`, `parameters`, `set_trainable`).
    pub params: HashMap<String, Tensor>,
    /// The names in `params` that are buffers (BatchNorm statistics): `parameters` lists them
    /// as buffers, never trainable, and `set_trainable` refuses them, as the host does. Any
    /// other tensor of `params` is a parameter, frozen when it does not require a gradient.
    pub buffers: HashSet<String>,
    /// The learning rate reported by `lr` and changed by `scale_lr`.
    pub lr: f64,
    /// Set when the method calls `request_extra_pass`.
    pub extra_pass_requested: bool,
    /// Reported by `pass_index`.
    pub pass_index: u32,
    /// Reported by `checkpoint_pending`.
    pub checkpoint_pending: bool,
    /// Reported by `eval_results` (1.3).
    pub eval_results: Option<EvalResults>,
    /// The reason of the last `request_stop` (1.3).
    pub stop_requested: Option<String>,
    /// Reported by `precision` (1.4; default `"fp32"`).
    pub precision: String,
    /// Reported by `ranks` (1.5; default rank 0 of 1).
    pub ranks: crate::abi::RankInfo,
    /// Reported by `time` (default: all zero, training).
    pub time: TimeInfo,
    /// The parameters the method claimed with `claim_parameters` (1.6), in order; claiming a
    /// name twice, a buffer or an unknown name fails as in the host.
    pub claimed: Vec<String>,
    /// Reported by `step_info` (1.6; default: `lr` 0.1, factor 1, step 0).
    pub step: StepInfo,
    /// Reported by `param_groups` and changed by `set_param_group` (1.6).
    pub groups: Vec<ParamGroup>,
    /// What `training_sample` (1.6) hands out: every entry cut to the samples asked for.
    pub sample: Vec<(String, Tensor)>,
    /// The model `forward_eval` (1.6) runs; none: `forward_eval` fails.
    pub eval_model: Option<EvalModel>,
    /// Every tensor passed to `all_gather` (1.9), in order. The test host has no other ranks:
    /// `all_gather` answers `ranks.world_size` copies of the input, as if every rank had sent
    /// the same.
    pub gathered: Vec<Tensor>,
}

impl TestHost {
    /// A host with no tensors.
    pub fn new(rng: RandomSource) -> TestHost {
        TestHost {
            tensors: HashMap::new(),
            rng,
            metrics: Vec::new(),
            draws: 0,
            overdrawn: 0,
            params: HashMap::new(),
            buffers: HashSet::new(),
            lr: 0.1,
            extra_pass_requested: false,
            pass_index: 0,
            checkpoint_pending: false,
            eval_results: None,
            stop_requested: None,
            precision: "fp32".to_owned(),
            ranks: crate::abi::RankInfo::SINGLE,
            time: TimeInfo {
                training: true,
                ..TimeInfo::default()
            },
            claimed: Vec::new(),
            step: StepInfo {
                lr: 0.1,
                lr_factor: 1.0,
                initial_lr: 0.1,
                step: 0,
            },
            groups: Vec::new(),
            sample: Vec::new(),
            eval_model: None,
            gathered: Vec::new(),
        }
    }

    /// Sets the evaluation results `eval_results` reports: `metrics` as (name, value) pairs, at
    /// batch `batch` (builder style).
    pub fn with_eval(mut self, batch: u64, metrics: &[(&str, f64)]) -> TestHost {
        self.eval_results = Some(EvalResults {
            epoch: 0,
            batch,
            samples: 0,
            metrics: metrics
                .iter()
                .map(|(name, value)| Metric {
                    name: (*name).into(),
                    value: *value,
                })
                .collect(),
        });
        self
    }

    /// Adds a copy of `t` under `key` (builder style).
    pub fn with(mut self, key: &str, t: &Tensor) -> TestHost {
        self.tensors.insert(key.to_owned(), t.copy());
        self
    }

    /// The values the method logged for metric `name`, in order.
    pub fn metric(&self, name: &str) -> Vec<f64> {
        self.metrics
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .collect()
    }

    /// The tensor under `key`; panics (this is test code) when there is none.
    pub fn get(&self, key: &str) -> &Tensor {
        self.tensors
            .get(key)
            .unwrap_or_else(|| panic!("the host has no `{key}`"))
    }

    /// A handle over `self` for one plugin call; valid while `self` is borrowed.
    pub fn handle(&mut self) -> HostHandle {
        HostHandle {
            api: api(),
            ctx: HostCtx(self as *mut TestHost as *mut c_void),
        }
    }

    /// Sends `event` to a boxed method (as the host does, through the ABI adapter).
    pub fn fire(&mut self, method: &mut MethodBox, event: Event) -> Result<(), String> {
        let handle = self.handle();
        match method.on_event(event, handle) {
            RResult::ROk(()) => Ok(()),
            RResult::RErr(e) => Err(e.message.into_string()),
        }
    }
}

fn api() -> HostApi_Ref {
    static API: OnceLock<HostApi_Ref> = OnceLock::new();
    *API.get_or_init(|| {
        HostApi {
            time,
            get_tensor,
            set_tensor,
            rng_u64,
            log_metric,
            log,
            batch_keys,
            set_batch,
            forward,
            loss,
            modules,
            replace_module,
            parameters,
            parameter,
            set_trainable,
            lr,
            scale_lr,
            request_extra_pass,
            pass_index,
            checkpoint_pending,
            eval_results,
            request_stop,
            wrap_module,
            precision,
            ranks,
            claim_parameters,
            step_info,
            param_groups,
            set_param_group,
            training_sample,
            forward_eval,
            all_gather,
            parameter_slice,
            gather_slices,
        }
        .leak_into_prefix()
    })
}

fn host<'a>(ctx: HostCtx) -> &'a mut TestHost {
    // SAFETY: `ctx` was made by `TestHost::handle` from a `&mut TestHost` borrowed for the call.
    unsafe { &mut *(ctx.0 as *mut TestHost) }
}

extern "C" fn time(ctx: HostCtx) -> TimeInfo {
    host(ctx).time
}

extern "C" fn claim_parameters(ctx: HostCtx, names: RVec<RString>) -> RResult<(), RString> {
    let h = host(ctx);
    for name in names {
        let name = name.into_string();
        if h.buffers.contains(&name) {
            return RResult::RErr(format!("`{name}` is a buffer, not a parameter").into());
        }
        if !h.params.contains_key(&name) {
            return RResult::RErr(format!("the model has no parameter `{name}`").into());
        }
        if h.claimed.contains(&name) {
            return RResult::RErr(format!("`{name}` is already claimed").into());
        }
        h.claimed.push(name);
    }
    RResult::ROk(())
}

extern "C" fn step_info(ctx: HostCtx) -> StepInfo {
    host(ctx).step
}

extern "C" fn param_groups(ctx: HostCtx) -> RResult<RVec<ParamGroup>, RString> {
    RResult::ROk(host(ctx).groups.iter().cloned().collect())
}

extern "C" fn set_param_group(
    ctx: HostCtx,
    name: RStr<'_>,
    lr_multiplier: f64,
    weight_decay: f64,
) -> RResult<(), RString> {
    match host(ctx)
        .groups
        .iter_mut()
        .find(|g| g.name.as_str() == name.as_str())
    {
        Some(g) => {
            g.lr_multiplier = lr_multiplier;
            g.weight_decay = weight_decay;
            RResult::ROk(())
        }
        None => RResult::RErr(format!("there is no parameter group `{name}`").into()),
    }
}

extern "C" fn training_sample(ctx: HostCtx, samples: u64) -> RResult<RVec<NamedTensor>, RString> {
    let h = host(ctx);
    if h.sample.is_empty() {
        return unsupported("training_sample");
    }
    let mut out = RVec::new();
    for (name, t) in &h.sample {
        let n = t.size().first().copied().unwrap_or(0).min(samples as i64);
        match t.f_narrow(0, 0, n) {
            Ok(part) => out.push(NamedTensor {
                name: name.as_str().into(),
                tensor: TensorHandle::from_tensor(part),
            }),
            Err(e) => return RResult::RErr(e.to_string().into()),
        }
    }
    RResult::ROk(out)
}

extern "C" fn forward_eval(ctx: HostCtx, input: TensorHandle) -> RResult<TensorHandle, RString> {
    match &host(ctx).eval_model {
        Some(model) => {
            let input = input.into_tensor();
            let out = tch::no_grad(|| model(&input));
            RResult::ROk(TensorHandle::from_tensor(out))
        }
        None => unsupported("forward_eval"),
    }
}

extern "C" fn all_gather(ctx: HostCtx, input: TensorHandle) -> RResult<TensorHandle, RString> {
    let h = host(ctx);
    let input = input.into_tensor();
    let copies: Vec<Tensor> = (0..h.ranks.world_size.max(1))
        .map(|_| input.shallow_clone())
        .collect();
    match Tensor::f_stack(&copies, 0) {
        Ok(out) => {
            h.gathered.push(input);
            RResult::ROk(TensorHandle::from_tensor(out))
        }
        Err(e) => RResult::RErr(e.to_string().into()),
    }
}

/// The test host shards nothing: a slice is the whole tensor (as in a single process).
extern "C" fn parameter_slice(
    ctx: HostCtx,
    name: RStr<'_>,
    _write: bool,
) -> RResult<ROption<SliceInfo>, RString> {
    RResult::ROk(match host(ctx).params.get(name.as_str()) {
        Some(t) => ROption::RSome(SliceInfo {
            size: t.size().into_iter().collect(),
            strides: t.stride().into_iter().collect(),
            tensor: TensorHandle::from_tensor(t.shallow_clone()),
            sharded: false,
            start: 0,
        }),
        None => ROption::RNone,
    })
}

/// Nothing is sharded: the whole tensors are the slices given (names checked).
extern "C" fn gather_slices(
    ctx: HostCtx,
    names: RVec<RString>,
    slices: RVec<TensorHandle>,
) -> RResult<RVec<TensorHandle>, RString> {
    let h = host(ctx);
    let mut out = RVec::new();
    for (name, slice) in names.into_iter().zip(slices) {
        let slice = slice.into_tensor();
        match h.params.get(name.as_str()) {
            Some(t) if t.size() == slice.size() => out.push(TensorHandle::from_tensor(slice)),
            Some(t) => {
                return RResult::RErr(
                    format!(
                        "gather_slices: `{name}` has size {:?}, the slice {:?}",
                        t.size(),
                        slice.size()
                    )
                    .into(),
                )
            }
            None => return RResult::RErr(format!("the model has no `{name}`").into()),
        }
    }
    RResult::ROk(out)
}

extern "C" fn get_tensor(ctx: HostCtx, key: RStr<'_>) -> ROption<TensorHandle> {
    match host(ctx).tensors.get(key.as_str()) {
        Some(t) => ROption::RSome(TensorHandle::from_tensor(t.shallow_clone())),
        None => ROption::RNone,
    }
}

extern "C" fn set_tensor(ctx: HostCtx, key: RStr<'_>, value: TensorHandle) -> RResult<(), RString> {
    host(ctx)
        .tensors
        .insert(key.as_str().to_owned(), value.into_tensor());
    RResult::ROk(())
}

impl RandomSource {
    /// The next value; `None` when a scripted stream has run out.
    pub fn next_u64(&mut self) -> Option<u64> {
        match self {
            RandomSource::Seeded(state) => Some(splitmix64(state)),
            RandomSource::Scripted(values) => values.pop_front(),
        }
    }
}

extern "C" fn rng_u64(ctx: HostCtx) -> u64 {
    let h = host(ctx);
    h.draws += 1;
    h.rng.next_u64().unwrap_or_else(|| {
        h.overdrawn += 1;
        0
    })
}

/// Runs a method's per-sample transform (plugin-api 1.3) on a copy of `sample` through the ABI,
/// as the host's loader does, drawing from `rng` (a scripted stream that runs out yields zeros).
/// Errs when the method has no transform, or with the transform's error.
pub fn apply_sample_transform(
    method: &MethodBox,
    sample: &Sample,
    rng: &mut RandomSource,
) -> Result<Sample, String> {
    run_sample_transform(method, sample, rng, None)
}

/// Runs a method's per-sample transform as a 1.6 host does, telling it which sample of which
/// epoch it is (`apply_at`); otherwise as [`apply_sample_transform`].
pub fn apply_sample_transform_at(
    method: &MethodBox,
    sample: &Sample,
    rng: &mut RandomSource,
    at: SamplePlace,
) -> Result<Sample, String> {
    run_sample_transform(method, sample, rng, Some(at))
}

/// One call of the transform through the ABI: `apply`, or `apply_at` when `at` is given.
fn run_sample_transform(
    method: &MethodBox,
    sample: &Sample,
    rng: &mut RandomSource,
    at: Option<SamplePlace>,
) -> Result<Sample, String> {
    let transform = method
        .sample_transform()
        .into_option()
        .ok_or("the method has no sample transform")?;
    let shape = SampleShape::new(sample.shape())?;
    let buf = SampleBuf {
        channels: shape.channels,
        height: shape.height,
        width: shape.width,
        data: RVec::from(sample.data.clone()),
    };
    let state = SampleRngState(rng as *mut RandomSource as *mut c_void);
    let rng = SampleRng {
        next_u64: sample_rng_next,
        state,
    };
    let out = match at {
        Some(at) => transform.apply_at(buf, rng, at),
        None => transform.apply(buf, rng),
    }
    .into_result()
    .map_err(|e| e.message.into_string())?;
    Ok(Sample {
        channels: out.channels as usize,
        height: out.height as usize,
        width: out.width as usize,
        data: out.data.into_vec(),
    })
}

extern "C" fn sample_rng_next(state: SampleRngState) -> u64 {
    // SAFETY: made by `run_sample_transform` from a `&mut RandomSource` borrowed for the call.
    let rng = unsafe { &mut *(state.0 as *mut RandomSource) };
    rng.next_u64().unwrap_or(0)
}

extern "C" fn ranks(ctx: HostCtx) -> crate::abi::RankInfo {
    host(ctx).ranks
}

extern "C" fn precision(ctx: HostCtx) -> RString {
    host(ctx).precision.as_str().into()
}

extern "C" fn log_metric(ctx: HostCtx, name: RStr<'_>, value: f64) {
    host(ctx).metrics.push((name.as_str().to_owned(), value));
}

extern "C" fn log(_ctx: HostCtx, _level: u32, _message: RStr<'_>) {}

fn unsupported<T>(what: &str) -> RResult<T, RString> {
    RResult::RErr(format!("the test host has no model: `{what}` is not available").into())
}

extern "C" fn batch_keys(ctx: HostCtx) -> RVec<RString> {
    let mut keys: Vec<&String> = host(ctx).tensors.keys().collect();
    keys.sort();
    keys.into_iter()
        .map(|k| RString::from(k.as_str()))
        .collect()
}

extern "C" fn set_batch(ctx: HostCtx, entries: RVec<NamedTensor>) -> RResult<(), RString> {
    let h = host(ctx);
    for n in entries {
        h.tensors
            .insert(n.name.into_string(), n.tensor.into_tensor());
    }
    RResult::ROk(())
}

extern "C" fn forward(
    _ctx: HostCtx,
    _input: TensorHandle,
    _grad: bool,
) -> RResult<TensorHandle, RString> {
    unsupported("forward")
}

extern "C" fn loss(
    _ctx: HostCtx,
    _output: TensorHandle,
    _target: TensorHandle,
    _per_sample: bool,
) -> RResult<TensorHandle, RString> {
    unsupported("loss")
}

extern "C" fn modules(_ctx: HostCtx) -> RVec<ModuleInfo> {
    RVec::new()
}

extern "C" fn replace_module(
    _ctx: HostCtx,
    _path: RStr<'_>,
    _module: ModuleBox,
    _tensors: RVec<NamedTensor>,
) -> RResult<(), RString> {
    unsupported("replace_module")
}

extern "C" fn wrap_module(
    _ctx: HostCtx,
    _path: RStr<'_>,
    _wrapper: WrapperBox,
    _inner_name: RStr<'_>,
    _tensors: RVec<NamedTensor>,
) -> RResult<(), RString> {
    unsupported("wrap_module")
}

extern "C" fn parameters(ctx: HostCtx) -> RVec<ParamInfo> {
    let host = host(ctx);
    let mut names: Vec<(&String, &Tensor)> = host.params.iter().collect();
    names.sort_by(|a, b| a.0.cmp(b.0));
    names
        .into_iter()
        .map(|(name, t)| {
            let buffer = host.buffers.contains(name);
            ParamInfo {
                name: name.as_str().into(),
                shape: t.size().into_iter().collect(),
                buffer,
                trainable: !buffer && t.requires_grad(),
            }
        })
        .collect()
}

extern "C" fn parameter(ctx: HostCtx, name: RStr<'_>) -> ROption<TensorHandle> {
    match host(ctx).params.get(name.as_str()) {
        Some(t) => ROption::RSome(TensorHandle::from_tensor(t.shallow_clone())),
        None => ROption::RNone,
    }
}

extern "C" fn set_trainable(ctx: HostCtx, name: RStr<'_>, trainable: bool) -> RResult<(), RString> {
    let host = host(ctx);
    if host.buffers.contains(name.as_str()) {
        return RResult::RErr(format!("`{name}` is a buffer, not a parameter").into());
    }
    match host.params.get(name.as_str()) {
        Some(t) => {
            let _ = t.set_requires_grad(trainable);
            RResult::ROk(())
        }
        None => RResult::RErr(format!("no parameter `{name}`").into()),
    }
}

extern "C" fn lr(ctx: HostCtx) -> f64 {
    host(ctx).lr
}

extern "C" fn scale_lr(ctx: HostCtx, factor: f64) {
    host(ctx).lr *= factor;
}

extern "C" fn request_extra_pass(ctx: HostCtx) -> RResult<(), RString> {
    host(ctx).extra_pass_requested = true;
    RResult::ROk(())
}

extern "C" fn pass_index(ctx: HostCtx) -> u32 {
    host(ctx).pass_index
}

extern "C" fn checkpoint_pending(ctx: HostCtx) -> bool {
    host(ctx).checkpoint_pending
}

extern "C" fn eval_results(ctx: HostCtx) -> ROption<EvalResults> {
    host(ctx).eval_results.clone().into()
}

extern "C" fn request_stop(ctx: HostCtx, reason: RStr<'_>) -> RResult<(), RString> {
    host(ctx).stop_requested = Some(reason.as_str().to_owned());
    RResult::ROk(())
}
