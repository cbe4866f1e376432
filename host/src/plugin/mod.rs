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
mod folders;
mod host_api;
pub mod install;
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

pub use folders::PluginsConfig;

use crate::data::SampleFn;
use crate::engine::{Algorithm, MethodError, MethodSnapshot, Stage};
use crate::model::{Attr, ExportTree, Exported, Layer};

/// A module a plugin put into the model by surgery, with the tensors it registered.
pub struct PluginLayer {
    module: ModuleBox,
    kind: String,
    /// Host reads in the module's forward are charged to `module KIND`.
    source: crate::sync::observer::Source,
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
            source: crate::sync::observer::Source::new(&format!("module {kind}")),
            kind,
            attrs,
            tensors,
        }
    }

    /// The plugin's forward (masked when the batch is padded and the module has one).
    fn forward_plugin(&self, xs: &tch::Tensor, train: bool) -> Result<tch::Tensor, tch::TchError> {
        let failed = |e: tessera_plugin_api::abi::PluginError| {
            tch::TchError::Torch(format!(
                "plugin module `{}`: {}: {}",
                self.kind,
                e.kind.name(),
                e.message
            ))
        };
        // A batch with padding: the module's masked forward (plugin-api 1.7), when it has one.
        if let Some(mask) = crate::model::layers::mask::attention_mask() {
            let input = TensorHandle::from_tensor(xs.shallow_clone());
            match self
                .module
                .forward_masked(input, TensorHandle::from_tensor(mask), train)
            {
                RResult::ROk(ROption::RSome(out)) => return Ok(out.into_tensor()),
                RResult::ROk(ROption::RNone) => {}
                RResult::RErr(e) => return Err(failed(e)),
            }
        }
        let input = TensorHandle::from_tensor(xs.shallow_clone());
        match self.module.forward(input, train) {
            RResult::ROk(out) => Ok(out.into_tensor()),
            RResult::RErr(e) => Err(failed(e)),
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
        self.source.charge(|| self.forward_plugin(xs, train))
    }

    fn is_plugin_code(&self) -> bool {
        true
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
    #[error("plugin `{name}` not found; looked for {candidates} in: {dirs}{hint}")]
    NotFound {
        /// The plugin's name.
        name: String,
        /// File names tried.
        candidates: String,
        /// Folders searched, each with where it comes from.
        dirs: String,
        /// Close names among the plugins found, or what to do.
        hint: String,
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

/// Where a folder of plugins comes from, in search order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `[plugins] dirs` in trainer.toml, or a `--dir` option.
    Configured,
    /// `plugins/` beside the trainer.toml.
    BesideConfig,
    /// A folder of `$TESSERA_PLUGIN_PATH`.
    EnvPath,
    /// The user's folder, `$XDG_DATA_HOME/tessera/plugins` (`tessera plugins install` puts
    /// plugins there).
    User,
    /// The installation's own folder, `lib/tessera/plugins` beside the binary's `bin/`.
    Installation,
    /// The cargo build folder the tessera binary runs from (`target/release`).
    BuildFolder,
}

impl Origin {
    /// How the origin is shown to the user.
    pub fn label(self) -> &'static str {
        match self {
            Origin::Configured => "configured",
            Origin::BesideConfig => "beside trainer.toml",
            Origin::EnvPath => "TESSERA_PLUGIN_PATH",
            Origin::User => "user folder",
            Origin::Installation => "installation",
            Origin::BuildFolder => "build folder",
        }
    }
}

/// A folder searched for plugins, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchDir {
    /// The folder.
    pub path: PathBuf,
    /// Where it comes from.
    pub origin: Origin,
}

impl std::fmt::Display for SearchDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.path.display(), self.origin.label())
    }
}

/// The user's plugin folder: `$XDG_DATA_HOME/tessera/plugins`, by default
/// `~/.local/share/tessera/plugins`; `None` without `XDG_DATA_HOME` and `HOME`.
pub fn user_dir() -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    let data = std::env::var_os("XDG_DATA_HOME")
        .and_then(absolute)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(absolute)
                .map(|h| h.join(".local/share"))
        })?;
    Some(data.join("tessera").join("plugins"))
}

/// The folder of the running `tessera` binary (links resolved): an installation's `bin/`, or a
/// cargo build folder.
pub fn binary_dir() -> Option<PathBuf> {
    let exe = std::fs::canonicalize(std::env::current_exe().ok()?).ok()?;
    exe.parent().map(Path::to_path_buf)
}

/// The installation's own plugin folders: `<bin>/../lib/tessera/plugins` when the running
/// binary sits in an installation's `bin/` (`scripts/install.sh`, the wheel), and the binary's
/// own folder when it is a cargo build folder (it holds cargo's `.cargo-lock`), where the
/// workspace's plugins are built next to it.
pub fn installation_dirs() -> Vec<SearchDir> {
    let Some(bin_dir) = binary_dir() else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    if let Some(prefix) = bin_dir.parent() {
        let installed = prefix.join("lib").join("tessera").join("plugins");
        if installed.is_dir() {
            dirs.push(SearchDir {
                path: installed,
                origin: Origin::Installation,
            });
        }
    }
    if bin_dir.join(".cargo-lock").is_file() {
        dirs.push(SearchDir {
            path: bin_dir,
            origin: Origin::BuildFolder,
        });
    }
    dirs
}

/// The folders named by a configuration's `[plugins]` (`dirs`, then `plugins/` beside the
/// trainer.toml).
pub fn configured_dirs(plugins: &PluginsConfig) -> Vec<SearchDir> {
    let mut dirs: Vec<SearchDir> = plugins
        .dirs
        .iter()
        .map(|path| SearchDir {
            path: path.clone(),
            origin: Origin::Configured,
        })
        .collect();
    if let Some(beside) = &plugins.beside {
        dirs.push(SearchDir {
            path: beside.clone(),
            origin: Origin::BesideConfig,
        });
    }
    dirs
}

/// Every folder searched for plugins, in order (the first file found wins): `configured`
/// (trainer.toml's `[plugins] dirs` and `plugins/` beside it, or `--dir` options), the folders
/// of `$TESSERA_PLUGIN_PATH` (colon-separated), the user's folder ([`user_dir`]), then the
/// installation's ([`installation_dirs`]). A folder listed twice is searched once.
pub fn search_dirs(configured: Vec<SearchDir>) -> Vec<SearchDir> {
    let mut all = configured;
    if let Some(extra) = std::env::var_os("TESSERA_PLUGIN_PATH") {
        all.extend(
            std::env::split_paths(&extra)
                .filter(|p| !p.as_os_str().is_empty())
                .map(|path| SearchDir {
                    path,
                    origin: Origin::EnvPath,
                }),
        );
    }
    if let Some(path) = user_dir() {
        all.push(SearchDir {
            path,
            origin: Origin::User,
        });
    }
    all.extend(installation_dirs());
    let mut seen: Vec<PathBuf> = Vec::new();
    all.retain(|dir| {
        let key = std::fs::canonicalize(&dir.path).unwrap_or_else(|_| dir.path.clone());
        if seen.contains(&key) {
            false
        } else {
            seen.push(key);
            true
        }
    });
    all
}

/// File names a plugin called `name` may have.
fn file_names(name: &str) -> [String; 2] {
    [format!("lib{name}.so"), format!("{name}.so")]
}

/// The plugin name a file name stands for (`libcutout.so` and `cutout.so` for `cutout`).
pub fn name_of_file(path: &Path) -> Option<String> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".so")?;
    let name = stem.strip_prefix("lib").unwrap_or(stem);
    (!name.is_empty()).then(|| name.to_owned())
}

/// Names among `found` close to `name` (edit distance), best first, at most three.
fn close_names(name: &str, found: &[String]) -> Vec<String> {
    let mut scored: Vec<(f64, &String)> = found
        .iter()
        .map(|f| (strsim::normalized_damerau_levenshtein(name, f), f))
        .filter(|(score, f)| *score >= 0.75 || f.contains(name) || name.contains(f.as_str()))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let mut names: Vec<String> = Vec::new();
    for (_, f) in scored {
        if !names.contains(f) {
            names.push(f.clone());
        }
    }
    names.truncate(3);
    names
}

/// Finds the file of plugin `name` in `dirs` (first match wins).
pub fn find(name: &str, dirs: &[SearchDir]) -> Result<PathBuf, LoadError> {
    let candidates = file_names(name);
    for dir in dirs {
        for file in &candidates {
            let path = dir.path.join(file);
            if path.is_file() {
                return Ok(path);
            }
        }
    }
    let found: Vec<String> = list_files(dirs)
        .iter()
        .filter_map(|(path, _)| name_of_file(path))
        .collect();
    let close = close_names(name, &found);
    let hint = if !close.is_empty() {
        let quoted: Vec<String> = close.iter().map(|n| format!("`{n}`")).collect();
        format!("; did you mean {}?", quoted.join(" or "))
    } else if found.is_empty() {
        "; no plugin files are there: `tessera plugins install FILE` installs one, or add its \
         folder to [plugins] dirs (see docs/install.md)"
            .to_owned()
    } else {
        "; `tessera plugins list` shows the plugins found".to_owned()
    };
    Err(LoadError::NotFound {
        name: name.to_owned(),
        candidates: candidates.join(" or "),
        dirs: if dirs.is_empty() {
            "(no folders)".to_owned()
        } else {
            dirs.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        },
        hint,
    })
}

/// Every plugin file (`*.so`) in `dirs` with its folder, sorted by folder (in search order)
/// then name.
pub fn list_files(dirs: &[SearchDir]) -> Vec<(PathBuf, &SearchDir)> {
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir.path) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "so") && p.is_file())
            .collect();
        files.sort();
        out.extend(files.into_iter().map(|f| (f, dir)));
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
