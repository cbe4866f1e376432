//! A plugin: what describes and builds a method ([`Plugin`]), the adapter that guards every
//! call across the ABI, and [`export_plugin!`](crate::export_plugin).

use std::panic::{catch_unwind, AssertUnwindSafe};

use abi_stable::std_types::{ROption, RResult, RStr, RVec};

use crate::abi::{
    ErrorKind, Event, Hook, HostHandle, MethodBox, MethodObject, MethodObject_TO, MethodState,
    PluginError, PluginInfo, PluginModule, PluginModule_Ref, SampleTransformBox,
};
use crate::{sample, Context, Error, Method, Settings, State, API_VERSION, LIBTORCH_VERSION};

/// Describes a method and builds it from its settings; [`export_plugin!`](crate::export_plugin) exports it.
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
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
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

/// Builds the root module of plugin `P`. Used by [`export_plugin!`](crate::export_plugin).
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
    let settings = settings.with_defaults(P::DEFAULT_SETTINGS)?;
    let method = P::create(&settings)?;
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
