//! The host side of the ABI: the function table plugins call, over the engine's [`State`].

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{ROption, RResult, RStr, RString};
use tessera_plugin_api::abi::{HostApi, HostApi_Ref, HostCtx, HostHandle, TensorHandle};
use tessera_plugin_api::TimeInfo;

use crate::engine::State;

/// A handle for one call into a plugin, over `state`. Valid while `state` is borrowed.
pub fn handle(state: &mut State) -> HostHandle {
    HostHandle {
        api: api(),
        ctx: HostCtx(state as *mut State as *mut c_void),
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

/// Runs `f` on the state behind `ctx`. A host panic must not unwind into plugin code, so it is
/// caught here and the process aborts with a message (it would be a host bug).
fn with_state<T>(ctx: HostCtx, f: impl FnOnce(&mut State) -> T) -> T {
    // SAFETY: `ctx` was made by `handle` from a `&mut State` that outlives the plugin call, and
    // plugins are called from one thread at a time.
    let state = unsafe { &mut *(ctx.0 as *mut State) };
    match catch_unwind(AssertUnwindSafe(|| f(state))) {
        Ok(v) => v,
        Err(_) => {
            eprintln!("tessera: internal error in a host function called by a plugin; aborting");
            std::process::abort()
        }
    }
}

extern "C" fn time(ctx: HostCtx) -> TimeInfo {
    with_state(ctx, |s| s.time)
}

extern "C" fn get_tensor(ctx: HostCtx, key: RStr<'_>) -> ROption<TensorHandle> {
    with_state(ctx, |s| match s.tensor(key.as_str()) {
        Some(t) => ROption::RSome(TensorHandle::from_tensor(t)),
        None => ROption::RNone,
    })
}

extern "C" fn set_tensor(ctx: HostCtx, key: RStr<'_>, value: TensorHandle) -> RResult<(), RString> {
    // SAFETY: plugins make handles with `TensorHandle::from_tensor` and give up ownership.
    let value = unsafe { value.into_tensor() };
    with_state(ctx, |s| match s.set_tensor(key.as_str(), value) {
        Ok(()) => RResult::ROk(()),
        Err(message) => RResult::RErr(RString::from(message)),
    })
}

extern "C" fn rng_u64(ctx: HostCtx) -> u64 {
    with_state(ctx, State::next_u64)
}

extern "C" fn log_metric(ctx: HostCtx, name: RStr<'_>, value: f64) {
    with_state(ctx, |s| s.metrics.push((name.as_str().to_owned(), value)))
}

extern "C" fn log(_ctx: HostCtx, level: u32, message: RStr<'_>) {
    let message = message.as_str();
    match level {
        0 => tracing::error!(target: "plugin", "{message}"),
        1 => tracing::warn!(target: "plugin", "{message}"),
        2 => tracing::info!(target: "plugin", "{message}"),
        _ => tracing::debug!(target: "plugin", "{message}"),
    }
}
