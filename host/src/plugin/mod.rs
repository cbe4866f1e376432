//! Finding, checking and loading plugin `.so` files, and running their methods.
//!
//! Checks at load, in order, each failure naming the file: the file exists and (when pinned in
//! `trainer.toml`) its sha256 matches — before any of its code runs; it is a loadable shared
//! library; it exports a Tessera root module; it was built against a compatible
//! `tessera-plugin-api`; its types' layouts match the host's (abi_stable's check); it was built
//! against the host's exact libtorch version.
//!
//! Plugins are found only in the configured folders and in `TESSERA_PLUGIN_PATH`, never in the
//! working directory implicitly.

mod host_api;
mod sample;
mod wrap;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use abi_stable::abi_stability::abi_checking::{
    check_layout_compatibility_with_globals, CheckingGlobals,
};
use abi_stable::library::{lib_header_from_path, LibraryError};
use abi_stable::std_types::{ROption, RResult, RStr, RVec};
use abi_stable::StableAbi;
use tessera_plugin_api::abi::{MethodBox, ModuleBox, NamedTensor, PluginModule_Ref, TensorHandle};
use tessera_plugin_api::{Event, Hook, API_VERSION, LIBTORCH_VERSION};

use crate::data::SampleFn;
use crate::engine::{Algorithm, MethodError, MethodSnapshot, Stage};
use crate::model::{Attr, ExportTree, Exported, Layer};

/// A module a plugin put into the model by surgery, with the tensors it registered.
pub struct PluginLayer {
    module: ModuleBox,
    kind: String,
    attrs: Vec<(String, f64)>,
    tensors: Vec<(String, tch::Tensor)>,
}

impl PluginLayer {
    /// Wraps a plugin's module holding `tensors` (named relative to the module).
    pub fn new(module: ModuleBox, tensors: Vec<(String, tch::Tensor)>) -> PluginLayer {
        let kind = module.kind().into_string();
        let attrs = module
            .attrs()
            .into_iter()
            .map(|a| (a.key.into_string(), a.value))
            .collect();
        PluginLayer {
            module,
            kind,
            attrs,
            tensors,
        }
    }
}

impl std::fmt::Debug for PluginLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PluginLayer({})", self.kind)
    }
}

impl Layer for PluginLayer {
    fn kind(&self) -> &str {
        &self.kind
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        self.attrs
            .iter()
            .map(|(key, value)| (key.as_str(), Attr::Float(*value)))
            .collect()
    }

    fn tensors(&self) -> Vec<(&str, &tch::Tensor)> {
        self.tensors
            .iter()
            .map(|(name, tensor)| (name.as_str(), tensor))
            .collect()
    }

    fn forward(&self, xs: &tch::Tensor, train: bool) -> Result<tch::Tensor, tch::TchError> {
        let input = TensorHandle::from_tensor(xs.shallow_clone());
        match self.module.forward(input, train) {
            RResult::ROk(out) => Ok(out.into_tensor()),
            RResult::RErr(e) => Err(tch::TchError::Torch(format!(
                "plugin module `{}`: {}: {}",
                self.kind,
                e.kind.name(),
                e.message
            ))),
        }
    }

    fn export(&self) -> Result<Exported, tch::TchError> {
        // A plugin built against plugin-api < 1.4 lacks `export`: abi_stable then runs the
        // default body, which keeps the module.
        match self.module.export() {
            RResult::ROk(ROption::RNone) => Ok(Exported::Kept),
            RResult::ROk(ROption::RSome(tensors)) => Ok(Exported::Folded(ExportTree {
                tensors: from_named(tensors),
                kept: Vec::new(),
            })),
            RResult::RErr(e) => Err(tch::TchError::Torch(format!(
                "plugin module `{}` at export: {}: {}",
                self.kind,
                e.kind.name(),
                e.message
            ))),
        }
    }
}

/// Tensors handed over by a plugin, owned.
pub(crate) fn from_named(tensors: RVec<NamedTensor>) -> Vec<(String, tch::Tensor)> {
    tensors
        .into_iter()
        .map(|t| (t.name.into_string(), t.tensor.into_tensor()))
        .collect()
}

/// Why a plugin could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No file for the plugin in any folder.
    #[error("plugin `{name}` not found; looked for {candidates} in: {dirs}")]
    NotFound {
        /// The plugin's name.
        name: String,
        /// File names tried.
        candidates: String,
        /// Folders searched.
        dirs: String,
    },
    /// The file could not be read or loaded as a shared library.
    #[error("{path}: not a loadable shared library: {reason}")]
    NotALibrary {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// A shared library without a Tessera root module.
    #[error("{path}: not a Tessera plugin (it exports no Tessera plugin module)")]
    NotAPlugin {
        /// The file.
        path: PathBuf,
    },
    /// Built against an incompatible `tessera-plugin-api`.
    #[error("{path}: built against tessera-plugin-api {found}, but this tessera needs a {required}.x plugin; rebuild the plugin against tessera-plugin-api {API_VERSION}")]
    ApiVersion {
        /// The file.
        path: PathBuf,
        /// The plugin's interface version.
        found: String,
        /// The compatible major version.
        required: String,
    },
    /// Built against another libtorch.
    #[error("{path}: built against libtorch {found}, but this tessera runs libtorch {LIBTORCH_VERSION}; rebuild the plugin with the same LIBTORCH (tensors cross the boundary as libtorch objects, so the versions must match exactly)")]
    LibtorchVersion {
        /// The file.
        path: PathBuf,
        /// The plugin's libtorch version.
        found: String,
    },
    /// abi_stable's layout check failed.
    #[error("{path}: its plugin interface layout does not match this tessera's: {summary}")]
    Layout {
        /// The file.
        path: PathBuf,
        /// The mismatch, condensed.
        summary: String,
    },
    /// The pinned sha256 differs.
    #[error("{path}: sha256 is {actual}, but trainer.toml pins {expected}; refusing to load it")]
    Sha256Mismatch {
        /// The file.
        path: PathBuf,
        /// The pinned hash.
        expected: String,
        /// The file's hash.
        actual: String,
    },
    /// The file's name and the plugin's declared name differ.
    #[error("{path}: the file is named for `{expected}` but the plugin calls itself `{found}`")]
    NameMismatch {
        /// The file.
        path: PathBuf,
        /// The name asked for.
        expected: String,
        /// The name the plugin reports.
        found: String,
    },
    /// The plugin refused its settings.
    #[error("plugin `{name}` ({path}): {message}")]
    Create {
        /// The plugin's name.
        name: String,
        /// The file.
        path: PathBuf,
        /// The plugin's message.
        message: String,
    },
}

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

/// The folders searched for plugins: the configured ones, then those in `TESSERA_PLUGIN_PATH`
/// (colon-separated).
pub fn search_dirs(configured: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = configured.to_vec();
    if let Some(extra) = std::env::var_os("TESSERA_PLUGIN_PATH") {
        dirs.extend(std::env::split_paths(&extra).filter(|p| !p.as_os_str().is_empty()));
    }
    dirs
}

/// File names a plugin called `name` may have.
fn file_names(name: &str) -> [String; 2] {
    [format!("lib{name}.so"), format!("{name}.so")]
}

/// Finds the file of plugin `name` in `dirs` (first match wins).
pub fn find(name: &str, dirs: &[PathBuf]) -> Result<PathBuf, LoadError> {
    let candidates = file_names(name);
    for dir in dirs {
        for file in &candidates {
            let path = dir.join(file);
            if path.is_file() {
                return Ok(path);
            }
        }
    }
    Err(LoadError::NotFound {
        name: name.to_owned(),
        candidates: candidates.join(" or "),
        dirs: if dirs.is_empty() {
            "(no folders: set [plugins] dirs in trainer.toml or TESSERA_PLUGIN_PATH)".to_owned()
        } else {
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        },
    })
}

/// Every plugin file (`*.so`) in `dirs`, sorted by folder then name.
pub fn list_files(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "so") && p.is_file())
            .collect();
        files.sort();
        out.extend(files);
    }
    out
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
        // An absolute path makes dlopen load exactly this file, never search for it.
        let path = std::fs::canonicalize(path).map_err(|e| LoadError::NotALibrary {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let sha256 = crate::files::sha256_file(&path).map_err(|e| LoadError::NotALibrary {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if let Some(expected) = pinned_sha256 {
            if !expected.eq_ignore_ascii_case(&sha256) {
                return Err(LoadError::Sha256Mismatch {
                    path,
                    expected: expected.to_owned(),
                    actual: sha256,
                });
            }
        }
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
        dirs: &[PathBuf],
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

/// A method instance living in a plugin.
pub struct PluginMethod {
    name: String,
    version: String,
    settings: serde_json::Value,
    hooks: Vec<Hook>,
    object: MethodBox,
}

impl Algorithm for PluginMethod {
    fn name(&self) -> &str {
        &self.name
    }

    fn hooks(&self) -> Vec<Hook> {
        self.hooks.clone()
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn settings(&self) -> serde_json::Value {
        self.settings.clone()
    }

    fn on_event(&mut self, event: Event, stage: &mut Stage<'_>) -> Result<(), MethodError> {
        let handle = host_api::handle(stage);
        self.object
            .on_event(event, handle)
            .into_result()
            .map_err(reported)
    }

    fn state(&self) -> Result<Option<MethodSnapshot>, MethodError> {
        let s = MethodSnapshot::from(self.object.state().into_result().map_err(reported)?);
        let empty = s.format_version == 0 && s.bytes.is_empty() && s.tensors.is_empty();
        Ok((!empty).then_some(s))
    }

    fn load_state(&mut self, state: MethodSnapshot) -> Result<(), MethodError> {
        self.object
            .load_state(state.into())
            .into_result()
            .map_err(reported)
    }

    fn sample_transform(&self) -> Option<Arc<dyn SampleFn>> {
        let object = self.object.sample_transform().into_option()?;
        Some(Arc::new(sample::PluginSampleTransform { object }))
    }
}

/// A plugin's error value as the engine reports it: its kind and message.
fn reported(e: tessera_plugin_api::abi::PluginError) -> MethodError {
    MethodError(format!("{}: {}", e.kind.name(), e.message))
}
