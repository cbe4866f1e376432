//! Finding, checking and loading plugin `.so` files, and running their methods.
//!
//! Checks at load, in order, each failure naming the file: the file exists and (when pinned in
//! `trainer.toml`) its sha256 matches — before any of its code runs; it is a loadable shared
//! library; it exports a Tessera root module; it was built against a compatible
//! `tessera-plugin-api`; its types' layouts match the host's (abi_stable's check); it was built
//! against the host's exact libtorch version.
//!
//! Plugins are found in the folders [`search_dirs`] lists — trainer.toml's `[plugins] dirs` and
//! `plugins/` beside it, `TESSERA_PLUGIN_PATH`, the user's folder, the installation's — never in
//! the working directory implicitly.

mod elf;
mod error;
mod folders;
mod host_api;
pub mod install;
mod layer;
mod method;
mod sample;
mod search;
mod wrap;

use std::path::{Path, PathBuf};

use abi_stable::abi_stability::abi_checking::{
    check_layout_compatibility_with_globals, CheckingGlobals,
};
use abi_stable::library::{lib_header_from_path, LibraryError};
use abi_stable::std_types::{RResult, RStr};
use abi_stable::StableAbi;
use tessera_plugin_api::abi::PluginModule_Ref;
use tessera_plugin_api::{Hook, API_VERSION, LIBTORCH_VERSION};

pub use error::LoadError;
pub use folders::PluginsConfig;
pub(crate) use layer::from_named;
pub use layer::PluginLayer;
pub use method::PluginMethod;
use search::file_names;
pub use search::{
    binary_dir, configured_dirs, find, installation_dirs, list_files, name_of_file, search_dirs,
    user_dir, Origin, SearchDir,
};

/// A plugin that passed every load-time check.
pub struct LoadedPlugin {
    /// The file it was loaded from.
    pub path: PathBuf,
    /// sha256 of the file, hex.
    pub sha256: String,
    /// The method's name.
    pub name: String,
    /// The plugin's version.
    pub version: String,
    /// The interface version it was built with.
    pub api_version: String,
    /// The libtorch version it was built with.
    pub libtorch_version: String,
    /// What it does.
    pub description: String,
    /// The events it hooks.
    pub hooks: Vec<Hook>,
    /// Its default settings (TOML).
    pub default_settings: String,
    module: PluginModule_Ref,
}

fn condense_layout_error(text: &str) -> String {
    // abi_stable's report is hundreds of lines; keep the `Error:` lines and the values it prints
    // on the line after `Expected:` / `Found:`. The whole report is logged at debug level.
    let all: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut kept = Vec::new();
    for (i, line) in all.iter().enumerate() {
        if line.starts_with("Error:") {
            kept.push(line.replacen("Error:", "", 1).trim().to_owned());
        } else if *line == "Expected:" || *line == "Found:" {
            let value = all.get(i + 1).copied().unwrap_or("?");
            kept.push(format!("{} {value}", line.to_lowercase()));
        }
        if kept.len() >= 6 {
            break;
        }
    }
    if kept.is_empty() {
        text.lines().next().unwrap_or("layout mismatch").to_owned()
    } else {
        kept.join(", ")
    }
}

impl LoadedPlugin {
    /// Loads and checks the plugin file at `path`. `pinned_sha256`, when given, is checked
    /// before the file is opened as a library (so none of its code runs on a mismatch).
    pub fn load(path: &Path, pinned_sha256: Option<&str>) -> Result<LoadedPlugin, LoadError> {
        let (path, sha256) = checked_file(path, pinned_sha256)?;
        let header = lib_header_from_path(&path).map_err(|e| match e {
            LibraryError::GetSymbolError { .. } => LoadError::NotAPlugin { path: path.clone() },
            LibraryError::OpenError { err, .. } => LoadError::NotALibrary {
                path: path.clone(),
                reason: err.to_string(),
            },
            LibraryError::InvalidAbiHeader(h) => LoadError::Layout {
                path: path.clone(),
                summary: format!("built with an incompatible abi_stable ({h:?})"),
            },
            other => LoadError::NotALibrary {
                path: path.clone(),
                reason: other.to_string(),
            },
        })?;
        let required_major = API_VERSION.split('.').next().unwrap_or("1").to_owned();
        let api_mismatch = |found: String| LoadError::ApiVersion {
            path: path.clone(),
            found,
            required: required_major.clone(),
        };
        let plugin_api = header.version_strings().version.to_string();
        if plugin_api.split('.').next() != Some(required_major.as_str()) {
            return Err(api_mismatch(plugin_api));
        }
        let module = match header.init_root_module::<PluginModule_Ref>() {
            Ok(module) => module,
            // abi_stable only accepts plugins built against the same or a newer interface: a
            // plugin built against an older 1.x is refused once the host's prefix types have
            // grown (abi_stable issue #118). Prefix types only ever grow by appending, so such a
            // plugin is compatible when the check passes the other way round; the fields it
            // lacks read as missing, and its trait objects fall back to default methods.
            Err(LibraryError::AbiInstability(err)) => {
                // The reverse check gets its own checking state: abi_stable's global one remembers
                // prefix types it has seen and would then refuse plugins built against the
                // host's own, newer interface.
                let older_is_compatible = header.layout().is_some_and(|plugin| {
                    check_layout_compatibility_with_globals(
                        plugin,
                        <PluginModule_Ref as StableAbi>::LAYOUT,
                        &CheckingGlobals::new(),
                    )
                    .is_ok()
                });
                if !older_is_compatible {
                    tracing::debug!("{}: abi_stable's full report:\n{err}", path.display());
                    return Err(LoadError::Layout {
                        path: path.clone(),
                        summary: condense_layout_error(&err.to_string()),
                    });
                }
                // SAFETY: the layout was checked above, in the direction that fits an older
                // plugin; the version check still runs inside.
                unsafe { header.init_root_module_with_unchecked_layout::<PluginModule_Ref>() }
                    .map_err(|e| LoadError::NotALibrary {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?
            }
            Err(LibraryError::IncompatibleVersionNumber { actual_version, .. }) => {
                return Err(api_mismatch(actual_version.to_string()))
            }
            Err(other) => {
                return Err(LoadError::NotALibrary {
                    path: path.clone(),
                    reason: other.to_string(),
                })
            }
        };
        let info = (module.info())();
        let api_version = info.api_version.to_string();
        if api_version.split('.').next() != Some(required_major.as_str()) {
            return Err(api_mismatch(api_version));
        }
        let libtorch_version = info.libtorch_version.to_string();
        if libtorch_version != LIBTORCH_VERSION {
            return Err(LoadError::LibtorchVersion {
                path,
                found: libtorch_version,
            });
        }
        Ok(LoadedPlugin {
            path,
            sha256,
            name: info.name.to_string(),
            version: info.version.to_string(),
            api_version,
            libtorch_version,
            description: info.description.to_string(),
            hooks: info.hooks.to_vec(),
            default_settings: info.default_settings.to_string(),
            module,
        })
    }

    /// Loads plugin `name` from `dirs`, checking that the file really is that plugin.
    pub fn load_named(
        name: &str,
        dirs: &[SearchDir],
        pinned_sha256: Option<&str>,
    ) -> Result<LoadedPlugin, LoadError> {
        let path = find(name, dirs)?;
        let plugin = LoadedPlugin::load(&path, pinned_sha256)?;
        if plugin.name != name {
            return Err(LoadError::NameMismatch {
                path: plugin.path,
                expected: name.to_owned(),
                found: plugin.name,
            });
        }
        Ok(plugin)
    }

    /// Creates a method instance from its settings (a JSON object).
    pub fn create(&self, settings_json: &str) -> Result<PluginMethod, LoadError> {
        match (self.module.create())(RStr::from_str(settings_json)) {
            RResult::ROk(object) => Ok(PluginMethod {
                name: self.name.clone(),
                version: self.version.clone(),
                settings: serde_json::from_str(settings_json).unwrap_or(serde_json::Value::Null),
                hooks: self.hooks.clone(),
                object,
            }),
            RResult::RErr(e) => Err(LoadError::Create {
                name: self.name.clone(),
                path: self.path.clone(),
                message: format!("{}: {}", e.kind.name(), e.message),
            }),
        }
    }
}

/// The plugin file at `path` made absolute (so that dlopen loads exactly this file, never
/// searches for it) and its sha256, checked against `pinned_sha256` and read as an ELF shared
/// library exporting the root module, before anything maps it.
fn checked_file(path: &Path, pinned_sha256: Option<&str>) -> Result<(PathBuf, String), LoadError> {
    // An absolute path makes dlopen load exactly this file, never search for it.
    let path = std::fs::canonicalize(path).map_err(|e| LoadError::NotALibrary {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let bytes = std::fs::read(&path).map_err(|e| LoadError::NotALibrary {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let sha256 = crate::files::sha256_hex(&bytes);
    if let Some(expected) = pinned_sha256 {
        if !expected.eq_ignore_ascii_case(&sha256) {
            return Err(LoadError::Sha256Mismatch {
                path,
                expected: expected.to_owned(),
                actual: sha256,
            });
        }
    }
    // Read as plain bytes first: only a complete shared library for this machine that
    // exports the root module is mapped, so nothing truncated is touched and no code of a
    // file that is not a plugin runs.
    elf::check_plugin_library(&bytes, abi_stable::library::ROOT_MODULE_LOADER_NAME).map_err(
        |e| match e {
            elf::ElfError::NoRootModule(_) => LoadError::NotAPlugin { path: path.clone() },
            other => LoadError::NotALibrary {
                path: path.clone(),
                reason: other.to_string(),
            },
        },
    )?;
    drop(bytes);
    Ok((path, sha256))
}
