//! What a plugin failed at, naming its file (`LoadError`).

use std::path::PathBuf;

use tessera_plugin_api::{API_VERSION, LIBTORCH_VERSION};

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
