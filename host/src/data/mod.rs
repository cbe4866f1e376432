//! Datasets, the batch loader and per-sample transforms.
//!
//! Pure Rust: this module reads and fetches image datasets ([`idx`], [`mod@fetch`]) and text
//! corpora ([`text`]), holds images in memory ([`ImageDataset`]) or lists an image folder whose files are decoded on demand
//! ([`ImageFolder`]), both read through a [`SampleSource`], augments samples ([`Transform`]) and
//! serves batches on worker threads ([`Loader`]): `u8` pixels (or `f32` values when a method's
//! transform computes new ones) with the normalization still to run, or `i64` token ids. The
//! trainer turns [`HostBatch`]es into tensors on the device, where the pixels are scaled and
//! normalized.
//!
//! Layering: each module uses only those listed before it (and `DataError`, defined here).
//!
//! 1. [`idx`], `download` (the registry clients: `apt-get`, `pip`, `npm`), [`transforms`].
//! 2. `registry`: the one fetcher of registry datasets (pins, verification, atomic install, the
//!    cache root); it knows no dataset.
//! 3. [`spec`] (which dataset, shapes, settings), [`dataset`] (images in memory), [`folder`]
//!    (an image folder), [`source`] (both as a [`SampleSource`]).
//! 4. [`text`]: corpora (pinned for `registry`), the user's own text, tokenizers, the token
//!    cache, packing.
//! 5. [`mod@fetch`]: the image datasets' pins and the catalogue of every registry dataset
//!    ([`fn@fetch`], [`load`], [`known_datasets`]).
//! 6. [`loader`] (batches on worker threads) and [`tokens`] (token streams as a
//!    [`TokenSource`]).

pub mod dataset;
pub mod decode;
mod download;
pub mod fetch;
pub mod folder;
pub mod idx;
mod image_augment;
pub mod loader;
mod registry;
pub mod shards;
pub mod source;
pub mod spec;
mod staging;
pub mod subset;
pub mod text;
pub mod tokens;
pub mod transforms;

use std::path::PathBuf;

pub use dataset::{ImageDataset, Split};
pub use fetch::{fetch, fetch_again, known_datasets, load, registry_class_names, registry_shape};
pub use folder::{FolderConfig, ImageFolder, OnBadFile};
pub use idx::{read_images, read_labels, Images};
pub use loader::{
    EpochIter, HostBatch, HostInput, Loader, LoaderOptions, Pixels, TokenRows, TokenSource,
    TokenTargets,
};
pub use registry::{default_cache_root, Pin, VERIFIED_MARKER};
pub use shards::{ShardFormat, Sharded, ShardsConfig};
pub use source::{SampleData, SampleSource};
pub use spec::{Dataset, DatasetShape, SyntheticConfig, TextConfig};
pub use subset::SubsetChoice;
pub use text::{
    fetch_corpus, known_corpora, load_chat, load_labelled_text, load_own_text, load_text,
    ChatConfig, ChatData, ChatLayout, ChatSequences, ChatTemplate, Classes, CorpusConfig,
    LabelledSequences, LabelledText, LabelledTextConfig, LossOn, MaskedSequences, MlmConfig,
    MlmSplit, OwnTextConfig, PackedSequences, SpecialTokens, TextFacts, TextTokenizer, TokenCorpus,
    IGNORE_TARGET,
};
pub use tokens::synthetic_tokens;
pub use transforms::{
    HorizontalFlip, MethodTransform, Normalize, RandomCrop, Sample, SampleFn, Transform, Transforms,
};

/// Everything that can go wrong while reading, fetching or loading data.
///
/// Each variant names the file, dataset or setting involved, so the message alone tells the user
/// what to fix.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An operating-system error on a file or folder.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file's contents are not what its format requires (wrong magic, truncated, corrupt gzip...).
    #[error("{}: {reason}", path.display())]
    Format {
        /// The file that is malformed.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file's sha256 or size differs from the pinned value.
    #[error("{}: checksum mismatch: expected sha256 {expected}, got {actual}", path.display())]
    Checksum {
        /// The file (or the source it was made from) that failed verification.
        path: PathBuf,
        /// The pinned sha256.
        expected: String,
        /// The sha256 (or size) actually seen.
        actual: String,
    },
    /// Sizes, labels or settings that do not fit together.
    #[error("{0}")]
    Invalid(String),
    /// A dataset name that [`fn@fetch`] does not know.
    #[error("unknown dataset `{name}`; known datasets: {known}")]
    UnknownDataset {
        /// The requested name.
        name: String,
        /// The known names, comma separated.
        known: String,
    },
    /// A dataset that is not (completely) in the cache.
    #[error("dataset `{name}` is not usable at {}: {reason}; run `tessera data fetch {name}` (or set data.fetch = true) to fetch it", path.display())]
    NotCached {
        /// The dataset name.
        name: String,
        /// Where it was looked for.
        path: PathBuf,
        /// What is missing or wrong.
        reason: String,
    },
    /// An external program that a fetch needs is not installed.
    #[error("`{tool}` was not found on PATH; {hint}")]
    MissingTool {
        /// The program that is missing.
        tool: String,
        /// What to install.
        hint: String,
    },
    /// An external program ran but did not deliver what was expected.
    #[error("fetching `{dataset}`: {detail}")]
    Fetch {
        /// The dataset being fetched.
        dataset: String,
        /// What failed, with the tail of the program's output.
        detail: String,
    },
    /// A loader worker panicked or stopped while making a batch.
    #[error("data loader worker {worker} failed on batch {batch}: {message}")]
    Worker {
        /// The worker's number (0 for the calling thread).
        worker: usize,
        /// The batch index in the epoch it was making.
        batch: u64,
        /// The panic message or reason.
        message: String,
    },
}

impl DataError {
    /// An [`DataError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }

    /// A [`DataError::Format`] for `path`.
    pub(crate) fn format(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        DataError::Format {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
