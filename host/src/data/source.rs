//! Where a [`Loader`](super::Loader) reads samples from: a dataset in memory or an image folder
//! decoded on demand.

use std::borrow::Cow;

use super::folder::ImageFolder;
use super::{DataError, ImageDataset};

/// One sample as read from a source: its C×H×W `u8` pixels (borrowed from memory or decoded)
/// and its label.
pub type RawSample<'a> = (Cow<'a, [u8]>, i64);

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

    /// The shuffled order of epoch `epoch` when the source has its own (a sharded dataset
    /// shuffles shards, then samples within blocks of shards, so that it reads a few shards at a
    /// time); `None` for the loader's uniform permutation. It must be a permutation of
    /// `0..len()` and a pure function of `(seed, epoch)`: every rank computes it alike and the
    /// loader splits it round-robin, and resuming at a batch starts at its position.
    fn epoch_order(&self, _seed: u64, _epoch: u64) -> Option<Vec<u32>> {
        None
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
        Ok(Some((Cow::Borrowed(pixels), self.labels[index])))
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
        Ok(self
            .load(index)?
            .map(|pixels| (Cow::Owned(pixels), self.labels()[index])))
    }
}
