//! Checkpoints: one file per save, holding everything a run needs to continue bit-for-bit.
//!
//! A checkpoint is a [safetensors](https://github.com/huggingface/safetensors) file (readable by
//! any safetensors reader) named `ep{E}-ba{B}.ckpt`:
//! - tensors `model/<name>` (weights and buffers, PyTorch names), `optim/<param>.<buffer>`
//!   (optimizer state), `method/<method>/<name>` (each method's tensors) and
//!   `method/<method>/__bytes__` (its serialized counters), `trainer/running_loss`,
//!   `trainer/torch_cpu_rng`, `trainer/torch_cuda_rng/<i>` (CUDA device i's generator, for each
//!   device of the machine that wrote it; none without CUDA) and, for a data-parallel run,
//!   `rank/<r>/torch_cpu_rng` and `rank/<r>/torch_cuda_rng/<i>` (ranks 1..);
//! - metadata `tessera.checkpoint`: a JSON [`Meta`] (format version, clock, optimizer
//!   position, RNG state, methods and their settings, the resolved config, ...), and
//!   `tessera.sha256`: a checksum over the metadata and every tensor's name, dtype, shape and
//!   bytes, verified on load.
//!
//! Files are written atomically (temporary file in the same folder, fsync, rename, fsync of the
//! folder): a crash leaves the previous checkpoints untouched and at worst a stray temporary
//! file, which readers ignore. `latest.ckpt` is a symbolic link to the newest checkpoint,
//! replaced atomically too.

use std::path::{Path, PathBuf};

use tch::Tensor;

mod folder;
mod format;
mod parts;
mod retention;
pub mod sharded;
#[cfg(test)]
mod tests;
pub mod torch_rng;

pub use folder::{
    file_name, latest_good, list, parse_file_name, remove_stale_temporaries, update_latest,
    update_link,
};
pub(crate) use format::{blob_of, Blob};
pub use parts::{
    rng_from_meta, rng_meta, Meta, MethodMeta, Parts, RankPart, RngMeta, SavedClock, TokenizerFile,
    TrainerMeta,
};
pub(crate) use parts::{MODEL as MODEL_PREFIX, OPTIMIZER as OPTIMIZER_PREFIX};
pub use retention::{best_of, prune};

/// Version of the checkpoint layout this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// File extension of checkpoints.
pub const EXTENSION: &str = "ckpt";
/// Name of the link to the newest checkpoint.
pub const LATEST: &str = "latest.ckpt";
/// Name of the link to the checkpoint with the best evaluation (`checkpoint.keep_best`).
pub const BEST: &str = "best.ckpt";

/// A checkpoint that cannot be read or does not fit.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The checkpoint file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is truncated, corrupt or not a Tessera checkpoint.
    #[error("{path}: corrupt or partial checkpoint: {reason}")]
    Corrupt {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor cannot be converted.
    #[error("{0}")]
    Tensor(String),
    /// A part of the checkpoint is missing or inconsistent (a method's tensor, the RNG state).
    #[error("{0}")]
    Part(String),
}

impl CheckpointError {
    fn corrupt(path: &Path, reason: impl Into<String>) -> Self {
        CheckpointError::Corrupt {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }
}

/// A checkpoint in memory: metadata and named CPU tensors. Built from a run's [`Parts`] and
/// taken apart into them again; only this module knows how parts are named in the file.
pub struct Checkpoint {
    /// Metadata.
    pub meta: Meta,
    /// Tensors by full name (`model/...`, `optim/...`, `method/...`, `trainer/...`).
    pub tensors: Vec<(String, Tensor)>,
}
