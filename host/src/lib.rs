//! Tessera: a fast deep-learning trainer on libtorch whose speed-up methods are binary plugins.
//!
//! One folder per concern: `config` (trainer.toml), `time` (Time, Timestamp, durations),
//! `checkpoint` (saving and resuming runs), `data` (datasets, loaders, transforms, fetching), `model` (module tree and zoo), `optim`
//! (optimizers, schedules), `engine` (events and dispatch), `plugin` (loading plugins, the
//! host side of the ABI), `precision` (autocast), `device` (where to train), `trainer` (the loops), `report` (progress, metrics, run records), `tracking` (an MLflow server),
//! `cost` (machine prices, instance presets), `explore` (`tessera explore`: the Pareto frontier
//! of time and cost against quality, its plots and report), `sweep` (`tessera sweep`), `recipes` (`tessera recipe search`), `scaffold` (`tessera new-plugin`), `export` (`tessera export`: weights for PyTorch), `generate` (`tessera generate`: text from a language model), `memory` (the C allocator's settings for
//! training), `launch` (`tessera launch`: starting and supervising the ranks of a data-parallel
//! run).

pub mod checkpoint;
pub mod config;
pub mod cost;
pub mod data;
pub mod device;
pub mod dist;
pub mod engine;
pub mod explore;
pub mod export;
pub mod files;
pub mod generate;
pub mod hf_config;
pub mod launch;
pub mod memory;
pub mod model;
pub mod optim;
pub mod peft;
pub mod plugin;
pub mod precision;
pub mod recipes;
pub mod report;
pub mod scaffold;
pub mod sweep;
pub mod sync;
pub mod tensor_file;
pub mod time;
pub mod tracking;
pub mod trainer;

/// An error and its causes on one line, `what: cause: cause`, as the command line prints them.
/// A cause whose text the line already holds is left out: many errors print their source in
/// their own message and also return it as their source ("shard.mds: No such file or directory
/// (os error 2)" would otherwise end with the OS error twice).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// Helpers shared by unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::{Path, PathBuf};

    /// `(folder, file)` for every file in `folders` (paths relative to the repository root),
    /// folder by folder, files sorted by name.
    pub fn files_in(folders: &[&str]) -> Vec<(PathBuf, PathBuf)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut out = Vec::new();
        for folder in folders {
            let folder = root.join(folder);
            let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
                .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
                .map(|entry| entry.expect("a folder entry").path())
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            out.extend(files.into_iter().map(|f| (folder.clone(), f)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::with_causes;

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct Named {
        path: String,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_line_is_not_repeated() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::new(Named {
            path: "shard.0.mds".into(),
            source: io(),
        })
        .context("reading the training shards");
        assert_eq!(
            with_causes(e.as_ref()),
            format!("reading the training shards: shard.0.mds: {}", io())
        );
        // Causes that add something are kept.
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(with_causes(e.as_ref()), "outer: inner");
    }
}

#[cfg(test)]
#[path = "architecture_tests.rs"]
mod architecture_tests;
