//! Why a sweep could not be planned or run.

use std::path::PathBuf;

use crate::config::ConfigError;

/// A sweep that cannot go on. Its message says what was being done; the cause is its source.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// A run's configuration does not load (the base, an override, a recipe).
    #[error("{run}")]
    Config {
        /// The run, with its axes and the sweep file.
        run: String,
        /// What is wrong with it.
        #[source]
        source: Box<ConfigError>,
    },
    /// A run's configuration could not be written as the trainer.toml it trains from.
    #[error("{run}: {message}")]
    Encode {
        /// The run, with its axes and the sweep file.
        run: String,
        /// The encoder's message.
        message: String,
    },
    /// A run was started with other settings than the sweep now gives.
    #[error(
        "the settings of run `{id}` changed since it started ({} differs from what the sweep \
         now gives); restore the sweep file, or delete {} to run it again",
        config.display(),
        dir.display()
    )]
    SettingsChanged {
        /// The run.
        id: String,
        /// Its trainer.toml.
        config: PathBuf,
        /// Its folder.
        dir: PathBuf,
    },
    /// A finished run's record could not be read.
    #[error(transparent)]
    Record(#[from] crate::report::RecordError),
    /// Another sweep holds the folder.
    #[error(
        "another `tessera sweep` is running on {} (it holds {}); wait for it or stop it",
        dir.display(),
        lock.display()
    )]
    Locked {
        /// The sweep folder.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
    },
    /// A file or folder could not be read or written.
    #[error("{action} {}", path.display())]
    Io {
        /// What was being done: `creating`, `opening`, `writing`, `reading`.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A run's process could not be started or waited for.
    #[error("{action} run `{id}`")]
    Process {
        /// `starting <program> for` or `waiting for`.
        action: String,
        /// The run.
        id: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// `Io` errors for `path`, as `map_err(io("writing", &path))`.
pub(crate) fn io(
    action: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> SweepError {
    let path = path.to_owned();
    move |source| SweepError::Io {
        action,
        path,
        source,
    }
}
