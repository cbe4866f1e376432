//! A test host for plugin authors: drive a method through its events in a unit test, without
//! the `tessera` binary. Enabled by the `testing` feature:
//!
//! ```toml
//! [dev-dependencies]
//! tessera-plugin-api = { version = "1", features = ["testing"] }
//! ```
//!
//! ```no_run
//! # use tessera_plugin_api::{testing::{TestHost, RandomSource}, Event, Settings, tch::Tensor};
//! # fn demo<P: tessera_plugin_api::Plugin>() {
//! let mut method = tessera_plugin_api::boxed_method::<P>(&Settings::from_json("{}").unwrap()).unwrap();
//! let mut host = TestHost::new(RandomSource::Seeded(0)).with("input", &Tensor::zeros([2, 1, 4, 4], tessera_plugin_api::tch::kind::FLOAT_CPU));
//! host.fire(&mut method, Event::AFTER_DATALOADER).unwrap();
//! let out = host.get("input");
//! # }
//! ```
//!
//! The test host keeps named tensors in a map and accepts whatever a method sets (the real
//! host also checks devices and shapes), hands out random numbers from a seed or a script, and
//! records metrics.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::OnceLock;

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{ROption, RResult, RStr, RString};
use tch::Tensor;

use crate::abi::{HostApi, HostApi_Ref, HostCtx, HostHandle, MethodBox, TensorHandle};
use crate::{Event, TimeInfo};

/// Where the test host's random numbers come from.
pub enum RandomSource {
    /// SplitMix64 from a seed.
    Seeded(u64),
    /// Exactly these values, in order; then zeros, counted in [`TestHost::overdrawn`] (a panic
    /// must not unwind out of an `extern "C"` host function).
    Scripted(VecDeque<u64>),
}

/// One SplitMix64 step: the generator behind [`RandomSource::Seeded`].
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

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
        }
    }

    /// Adds a copy of `t` under `key` (builder style).
    pub fn with(mut self, key: &str, t: &Tensor) -> TestHost {
        self.tensors.insert(key.to_owned(), t.copy());
        self
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
        }
        .leak_into_prefix()
    })
}

fn host<'a>(ctx: HostCtx) -> &'a mut TestHost {
    // SAFETY: `ctx` was made by `TestHost::handle` from a `&mut TestHost` borrowed for the call.
    unsafe { &mut *(ctx.0 as *mut TestHost) }
}

extern "C" fn time(_ctx: HostCtx) -> TimeInfo {
    TimeInfo {
        training: true,
        ..TimeInfo::default()
    }
}

extern "C" fn get_tensor(ctx: HostCtx, key: RStr<'_>) -> ROption<TensorHandle> {
    match host(ctx).tensors.get(key.as_str()) {
        Some(t) => ROption::RSome(TensorHandle::from_tensor(t.shallow_clone())),
        None => ROption::RNone,
    }
}

extern "C" fn set_tensor(ctx: HostCtx, key: RStr<'_>, value: TensorHandle) -> RResult<(), RString> {
    // SAFETY: the plugin made the handle with `TensorHandle::from_tensor` and gave it up.
    let value = unsafe { value.into_tensor() };
    host(ctx).tensors.insert(key.as_str().to_owned(), value);
    RResult::ROk(())
}

extern "C" fn rng_u64(ctx: HostCtx) -> u64 {
    let h = host(ctx);
    h.draws += 1;
    match &mut h.rng {
        RandomSource::Seeded(state) => splitmix64(state),
        RandomSource::Scripted(values) => values.pop_front().unwrap_or_else(|| {
            h.overdrawn += 1;
            0
        }),
    }
}

extern "C" fn log_metric(ctx: HostCtx, name: RStr<'_>, value: f64) {
    host(ctx).metrics.push((name.as_str().to_owned(), value));
}

extern "C" fn log(_ctx: HostCtx, _level: u32, _message: RStr<'_>) {}
