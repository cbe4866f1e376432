//! Where a [`Loader`](super::Loader) reads samples from: a dataset in memory or an image folder
//! decoded on demand.

use std::borrow::Cow;

use super::decode::DecodePlan;
use super::folder::ImageFolder;
use super::{DataError, ImageDataset};

/// One sample's data as read from a source.
#[derive(Debug, Clone)]
pub enum SampleData<'a> {
    /// C×H×W `u8` pixels of the source's [`shape`](SampleSource::shape), ready for the
    /// transforms (borrowed from memory or decoded by the source).
    Pixels(Cow<'a, [u8]>),
    /// An encoded image (JPEG or PNG bytes) that the loader decodes with
    /// [`decode_image`](super::decode::decode_image), the sample's random generator and `plan`
    /// (whose `channels`×`size`×`size` must be the source's shape), so a random crop is drawn
    /// from the image's size before decoding. A failure to decode goes to
    /// [`SampleSource::undecodable`].
    Encoded {
        /// The file's bytes.
        bytes: Cow<'a, [u8]>,
        /// What errors call the image (its path, or shard and key).
        name: Cow<'a, str>,
        /// How to decode it.
        plan: &'a DecodePlan,
    },
}

/// One sample as read from a source: its data and its label.
pub type RawSample<'a> = (SampleData<'a>, i64);

/// Indexed samples of one shape with class labels, readable from any thread.
///
/// [`read`](SampleSource::read) must be a pure function of the index (the loader's batches do
/// not depend on which worker reads a sample), and may be slow: the loader calls it on its
/// worker threads.
pub trait SampleSource: Send + Sync + std::fmt::Debug {
    /// Number of samples.
    fn len(&self) -> usize;

    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The (C, H, W) of every sample.
    fn shape(&self) -> (usize, usize, usize);

    /// Sample `index`; `Ok(None)` when it is to be left out (an undecodable file skipped by
    /// setting).
    fn read(&self, index: usize) -> Result<Option<RawSample<'_>>, DataError>;

    /// The label of sample `index` when the source knows it without reading the sample (a
    /// dataset in memory, a folder's class); `None` otherwise or past the end. Evaluation
    /// subsets are stratified by class when every label is known.
    fn label(&self, _index: usize) -> Option<i64> {
        None
    }

    /// The shuffled order of epoch `epoch` when the source has its own (a sharded dataset
    /// shuffles shards, then samples within blocks of shards, so that it reads a few shards at a
    /// time); `None` for the loader's uniform permutation. It must be a permutation of
    /// `0..len()` and a pure function of `(seed, epoch)`: every rank computes it alike and the
    /// loader splits it round-robin, and resuming at a batch starts at its position.
    fn epoch_order(&self, _seed: u64, _epoch: u64) -> Option<Vec<u32>> {
        None
    }

    /// In a run over `nodes` nodes: the samples each node's share of an epoch holds when the
    /// source splits its epochs by node ([`SampleSource::node_order`]; a sharded dataset gives
    /// each node whole shards of its own), the same in every epoch; `None` when it does not
    /// (the loader then splits the global order round-robin over all ranks).
    fn node_span(&self, _nodes: usize) -> Option<usize> {
        None
    }

    /// Node `node`'s share of epoch `epoch` of a run over `nodes` nodes, `node_span(nodes)`
    /// samples (shuffled when `shuffle`), a pure function of `(seed, epoch, nodes, node)`; the
    /// loader splits it round-robin over the node's ranks. Only called when `node_span` is some.
    fn node_order(
        &self,
        _seed: u64,
        _epoch: u64,
        _shuffle: bool,
        _nodes: usize,
        _node: usize,
    ) -> Option<Vec<u32>> {
        None
    }

    /// Called by the loader when sample `index`, read as [`SampleData::Encoded`], cannot be
    /// decoded (`error` names the image): `Ok(())` leaves the sample out of its batch (a source
    /// set to skip bad files records and warns), an error stops the run. The default stops.
    fn undecodable(&self, index: usize, error: DataError) -> Result<(), DataError> {
        let _ = index;
        Err(error)
    }
}

impl SampleSource for ImageDataset {
    fn len(&self) -> usize {
        ImageDataset::len(self)
    }

    fn shape(&self) -> (usize, usize, usize) {
        (self.channels, self.height, self.width)
    }

    fn read(&self, index: usize) -> Result<Option<RawSample<'_>>, DataError> {
        let pixels = self.sample(index).ok_or_else(|| {
            DataError::Invalid(format!(
                "sample {index} is outside the dataset of {}",
                ImageDataset::len(self)
            ))
        })?;
        Ok(Some((
            SampleData::Pixels(Cow::Borrowed(pixels)),
            self.labels[index],
        )))
    }

    fn label(&self, index: usize) -> Option<i64> {
        self.labels.get(index).copied()
    }
}

impl SampleSource for ImageFolder {
    fn len(&self) -> usize {
        ImageFolder::len(self)
    }

    fn shape(&self) -> (usize, usize, usize) {
        ImageFolder::shape(self)
    }

    fn read(&self, index: usize) -> Result<Option<RawSample<'_>>, DataError> {
        Ok(self.read_encoded(index)?.map(|(bytes, name)| {
            (
                SampleData::Encoded {
                    bytes: Cow::Owned(bytes),
                    name: Cow::Owned(name),
                    plan: self.plan(),
                },
                self.labels()[index],
            )
        }))
    }

    fn undecodable(&self, index: usize, error: DataError) -> Result<(), DataError> {
        self.bad_file(index, error)
    }

    fn label(&self, index: usize) -> Option<i64> {
        self.labels().get(index).copied()
    }
}

/// What a token batch's targets are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenTargets {
    /// One id per token, `[B, T]`: next-token or masked-LM targets (a language model).
    PerToken,
    /// One class index per sequence, `[B]` (text classification).
    PerSequence,
}

/// Where a [`TokenSource`] appends the samples of a batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenRows {
    /// T input ids per sample.
    pub input: Vec<i64>,
    /// T target ids ([`TokenTargets::PerToken`]) or one class index per sample.
    pub target: Vec<i64>,
    /// T attention-mask values per sample (1 = token, 0 = padding) from a padded source;
    /// empty otherwise.
    pub attention_mask: Vec<i64>,
    /// T token type ids per sample (0 = first text, 1 = second) from a source of sentence
    /// pairs; empty otherwise.
    pub token_type_ids: Vec<i64>,
}

/// Fixed-length token sequences with their targets, readable from any thread: what a [`super::Loader`]
/// serves token batches from (a language model's, or a text classifier's).
pub trait TokenSource: Send + Sync + std::fmt::Debug {
    /// Number of sequences.
    fn len(&self) -> usize;

    /// Whether there are no sequences.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens per sequence (T).
    fn seq_len(&self) -> usize;

    /// What the targets are (default: one id per token).
    fn targets(&self) -> TokenTargets {
        TokenTargets::PerToken
    }

    /// Whether sequences are padded, and so come with an attention mask (default false).
    fn padded(&self) -> bool {
        false
    }

    /// Whether samples are sentence pairs, and so come with token type ids (default false).
    fn paired(&self) -> bool {
        false
    }

    /// The class of sequence `index` when each has one ([`TokenTargets::PerSequence`]);
    /// evaluation subsets are then stratified by class. `None` by default.
    fn label(&self, _index: usize) -> Option<i64> {
        None
    }

    /// Appends sequence `index` as served in `epoch` to `rows`: its T input ids, its targets
    /// (T ids, or one class index), from a padded source its T attention-mask values and from a
    /// paired one its T token type ids. A
    /// source whose samples are random (masked-LM) draws them from `(seed, epoch, index)` only.
    fn read(&self, index: usize, epoch: u64, rows: &mut TokenRows) -> Result<(), DataError>;
}
