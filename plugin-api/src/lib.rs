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
//! use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Method, Plugin};
//!
//! /// Multiplies every training input by a constant.
//! pub struct ScaleInput {
//!     factor: f64,
//! }
//!
//! impl Method for ScaleInput {
//!     fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
//!         let input = ctx.tensor("input").ok_or("the batch has no `input`")?;
//!         ctx.set_tensor("input", input.f_mul_scalar(self.factor)?)
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
//! tessera-plugin-api = "1"
//! tch = "=0.26.0"
//! ```
//!
//! ## Rules
//! - **Tensors** come to you as owned `tch::Tensor`s that share storage with the host's
//!   ([`Context::tensor`]); give a new one back with [`Context::set_tensor`]. Autograd works
//!   across the boundary: host and plugin share one libtorch.
//! - **libtorch**: a plugin must be built against exactly the host's libtorch version (the host
//!   checks and refuses a mismatch). Use the same `LIBTORCH` you built `tessera` with.
//! - **Errors, not panics**: return [`Error`]; prefer tch's `f_` methods, which return errors.
//!   A panic is caught at the boundary and stops the run with a message naming the plugin and the
//!   event, but a panicking method is not called again.
//! - **Randomness** comes from the host ([`Context::rng_u64`]) so a seed fixes the whole run.
//! - **Ordering**: at each event methods run by descending [`Hook::priority`], then in
//!   `trainer.toml` order, reversed at `after_*` events.
#![warn(missing_docs)]

pub mod abi;
mod settings;
#[cfg(feature = "testing")]
pub mod testing;

use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use abi_stable;
use abi_stable::std_types::{RResult, RStr, RString, RVec};
pub use settings::Settings;
pub use tch;

pub use abi::{ErrorKind, Event, Hook, TimeInfo};
use abi::{
    HostHandle, MethodBox, MethodObject, MethodObject_TO, PluginError, PluginInfo, PluginModule,
    PluginModule_Ref, TensorHandle,
};

/// The version of this interface crate; plugins report it and the host checks it.
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");

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

    /// The tensor named `key`: a batch entry (`"input"`, `"target"`), the model `"output"` or
    /// the `"loss"`. It shares storage with the host's tensor. `None` if there is no such tensor
    /// at this event.
    pub fn tensor(&self, key: &str) -> Option<tch::Tensor> {
        let handle = (self.host.api.get_tensor())(self.host.ctx, RStr::from_str(key));
        // SAFETY: the host hands out a fresh owned handle made by `TensorHandle::from_tensor`.
        handle.into_option().map(|h| unsafe { h.into_tensor() })
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
        if n <= 1 {
            return 0;
        }
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let v = self.rng_u64();
            if v < zone {
                return v % n;
            }
        }
    }

    /// A uniform float in `[0, 1)` from the host's stream.
    pub fn rng_f64(&mut self) -> f64 {
        (self.rng_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
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
}

/// A speed-up method: reacts to the events it hooks.
pub trait Method: Send + 'static {
    /// Called at each hooked event, in the order described in the crate docs.
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error>;
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

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
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
    fn export_symbol_matches_abi_stable() {
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }

    #[test]
    fn events_round_trip_by_name() {
        assert_eq!(Event::ALL.len(), 40);
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
