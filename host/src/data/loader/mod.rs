//! The batch loader: seeded per-epoch shuffling, per-sample transforms on worker threads, and a
//! bounded prefetch queue.
//!
//! Everything random is a pure function of the loader's seed: the order of epoch `e` comes from a
//! ChaCha generator keyed by (seed, e), and the transform draws of the sample at position `p` of
//! epoch `e` from a generator keyed by (seed, e) on stream `p`. So the batches do not depend on the
//! number of workers, and [`Loader::epoch`] can start at any batch without replaying the ones
//! before it.
//!
//! Image batches stay `u8` while the transforms only move pixels (crop, flip): the device scales
//! them to [0, 1] and runs a final `normalize` ([`HostInput::Pixels`]), so a quarter of the bytes
//! cross to it. A transform that computes new values (a method's) makes the batches `f32` from
//! that transform on.

use std::sync::Arc;

mod assemble;
mod batch;
mod order;
mod workers;

pub use crate::data::source::{TokenRows, TokenSource, TokenTargets};
pub use batch::{HostBatch, HostInput, Pixels};
pub use workers::EpochIter;

use crate::data::subset::{self, SubsetChoice};
use crate::data::transforms::Transform;
use crate::data::{DataError, SampleSource};
use assemble::{make_batch, make_token_batch, Stages, TransformKey};
use order::{key, NodeShare, Shard};
use workers::Producer;

/// How a [`Loader`] batches, orders and parallelises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderOptions {
    /// Samples per batch (at least 1).
    pub batch_size: usize,
    /// Shuffle the samples each epoch (seeded); otherwise keep the dataset order.
    pub shuffle: bool,
    /// Drop the last, smaller batch of an epoch.
    pub drop_last: bool,
    /// Seed of the shuffling and of the random transforms.
    pub seed: u64,
    /// Worker threads; 0 makes the batches in the calling thread.
    pub workers: usize,
    /// Finished batches each worker may queue ahead (at least 1).
    pub prefetch: usize,
}

impl LoaderOptions {
    /// Options with the given batch size: shuffled, keeping the last batch, seed 0, no workers,
    /// prefetch 2.
    pub fn new(batch_size: usize) -> LoaderOptions {
        LoaderOptions {
            batch_size,
            shuffle: true,
            drop_last: false,
            seed: 0,
            workers: 0,
            prefetch: 2,
        }
    }
}

/// Serves the batches of a dataset, one epoch at a time.
#[derive(Debug, Clone)]
pub struct Loader {
    source: Source,
    options: LoaderOptions,
    sample_shape: (usize, usize, usize),
    shard: Shard,
}

/// What a [`Loader`] reads.
#[derive(Debug, Clone)]
enum Source {
    /// Images, transformed per sample.
    Images {
        dataset: Arc<dyn SampleSource>,
        transforms: Arc<Vec<Transform>>,
        stages: Stages,
    },
    /// Token sequences, served as they are.
    Tokens(Arc<dyn TokenSource>),
}

impl Source {
    fn len(&self) -> usize {
        match self {
            Source::Images { dataset, .. } => dataset.len(),
            Source::Tokens(tokens) => tokens.len(),
        }
    }
}

impl Loader {
    /// Builds a loader after checking the options and that the transforms fit the image shape.
    pub fn new(
        dataset: Arc<dyn SampleSource>,
        transforms: Arc<Vec<Transform>>,
        options: LoaderOptions,
    ) -> Result<Loader, DataError> {
        check_options(&options, dataset.len())?;
        let mut shape = dataset.shape();
        for (i, transform) in transforms.iter().enumerate() {
            shape = transform
                .output_shape(shape)
                .map_err(|e| DataError::Invalid(format!("transform {i}: {e}")))?;
        }
        let stages = Stages::of(&transforms);
        Ok(Loader {
            source: Source::Images {
                dataset,
                transforms,
                stages,
            },
            options,
            sample_shape: shape,
            shard: Shard::WHOLE,
        })
    }

    /// A loader of token sequences (language models): batches of B×T input ids and their B×T
    /// next-token targets, shuffled by sequence as images are by sample.
    pub fn tokens(
        tokens: Arc<dyn TokenSource>,
        options: LoaderOptions,
    ) -> Result<Loader, DataError> {
        check_options(&options, tokens.len())?;
        if tokens.seq_len() == 0 {
            return Err(DataError::Invalid(
                "loader: token sequences must hold at least 1 token".into(),
            ));
        }
        let sample_shape = (1, 1, tokens.seq_len());
        Ok(Loader {
            source: Source::Tokens(tokens),
            options,
            sample_shape,
            shard: Shard::WHOLE,
        })
    }

    /// Whether the loader serves token sequences.
    pub fn is_tokens(&self) -> bool {
        matches!(self.source, Source::Tokens(_))
    }

    /// Whether the loader serves a language model's batches: token sequences with one target
    /// per token (not text classification).
    pub fn is_language(&self) -> bool {
        matches!(&self.source, Source::Tokens(t) if t.targets() == TokenTargets::PerToken)
    }

    /// Whether image batches stay `u8` to the device ([`Pixels::Bytes`]): every host transform
    /// only moves pixels. `false` for token sequences.
    pub fn serves_bytes(&self) -> bool {
        match &self.source {
            Source::Images { stages, .. } => stages.bytes_to_device(),
            Source::Tokens(_) => false,
        }
    }

    /// Samples (images or sequences) this loader serves in one epoch, before batching: its
    /// shard's share in a data-parallel run.
    pub fn len(&self) -> usize {
        self.shard.len(self.source.len())
    }

    /// Serves only rank `rank`'s share of every epoch of a data-parallel run of `world` ranks,
    /// as PyTorch's `DistributedSampler` does: the epoch's order (the same on every rank) is
    /// split round-robin, rank r taking positions r, r + world, ... With `pad`, the order is
    /// first extended with its own first samples to a multiple of `world`, so every rank gets
    /// the same number of samples and batches (training); without, ranks differ by at most one
    /// sample and no sample is served twice (evaluation).
    ///
    /// Batch b of the ranks together is batch b of one loader with `world` times the batch
    /// size (before padding): a run on W ranks of batch B sees the batches of one process with
    /// batch W×B. Per-sample random transforms are keyed by the global position, so they are
    /// the same too.
    pub fn shard(mut self, rank: usize, world: usize, pad: bool) -> Loader {
        let world = world.max(1);
        self.shard = Shard {
            rank: rank.min(world - 1),
            world,
            pad,
            nodes: None,
        };
        self
    }

    /// In a run over several nodes of `ranks_per_node` ranks each (after
    /// [`shard`](Loader::shard) with `pad`): when the source splits its epochs by node (a
    /// sharded dataset: each node reads whole shards of its own, so the nodes download the
    /// dataset once between them), this rank serves its node's share, split round-robin over
    /// the node's ranks and padded with the share's first samples to a multiple of them.
    /// Otherwise (one node, ranks not a multiple of `ranks_per_node`, evaluation, another
    /// source) the loader is unchanged.
    ///
    /// The order then depends on the number of nodes too: batch b of the ranks together holds
    /// batch b of each node's share, so a run resumes exactly mid-epoch on the same nodes.
    pub fn across_nodes(mut self, ranks_per_node: usize) -> Loader {
        let world = self.shard.world;
        let per_node = ranks_per_node.max(1);
        if !self.shard.pad || world <= per_node || !world.is_multiple_of(per_node) {
            return self;
        }
        let nodes = world / per_node;
        if let Source::Images { dataset, .. } = &self.source {
            if let Some(span) = dataset.node_span(nodes) {
                self.shard.nodes = Some(NodeShare { nodes, span });
            }
        }
        self
    }

    /// Whether the loader has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A fixed, seeded sample of `count` of this loader's samples (its whole source, before
    /// any [`shard`](Loader::shard)), stratified by class when the source knows every label
    /// (see [`super::subset`]): the loader serving it, with the same transforms and options, and
    /// the choice made.
    pub fn subset(&self, count: usize, seed: u64) -> Result<(Loader, SubsetChoice), DataError> {
        let (source, choice) = match &self.source {
            Source::Images {
                dataset,
                transforms,
                stages,
            } => {
                let labels = subset::labels_of(&**dataset);
                let choice = subset::choose(dataset.len(), count, seed, labels.as_deref())?;
                let indices = Arc::new(choice.indices.clone());
                let dataset: Arc<dyn SampleSource> =
                    Arc::new(subset::Subset::new(Arc::clone(dataset), indices)?);
                let source = Source::Images {
                    dataset,
                    transforms: Arc::clone(transforms),
                    stages: stages.clone(),
                };
                (source, choice)
            }
            Source::Tokens(tokens) => {
                let labels: Option<Vec<i64>> = (0..tokens.len()).map(|i| tokens.label(i)).collect();
                let choice = subset::choose(tokens.len(), count, seed, labels.as_deref())?;
                let indices = Arc::new(choice.indices.clone());
                let tokens: Arc<dyn TokenSource> =
                    Arc::new(subset::TokenSubset::new(Arc::clone(tokens), indices)?);
                (Source::Tokens(tokens), choice)
            }
        };
        let loader = Loader {
            source,
            options: self.options.clone(),
            sample_shape: self.sample_shape,
            shard: self.shard,
        };
        Ok((loader, choice))
    }
}

/// Checks the loader options against a source of `len` samples.
fn check_options(options: &LoaderOptions, len: usize) -> Result<(), DataError> {
    if options.batch_size == 0 {
        return Err(DataError::Invalid(
            "loader: `batch_size` must be at least 1".into(),
        ));
    }
    if options.prefetch == 0 {
        return Err(DataError::Invalid(
            "loader: `prefetch` must be at least 1".into(),
        ));
    }
    if u32::try_from(len).is_err() {
        return Err(DataError::Invalid(format!(
            "loader: {len} samples are more than the 2^32 - 1 supported"
        )));
    }
    Ok(())
}

impl Loader {
    /// The options this loader was built with.
    pub fn options(&self) -> &LoaderOptions {
        &self.options
    }

    /// The (C, H, W) of one sample after the transforms.
    pub fn sample_shape(&self) -> (usize, usize, usize) {
        self.sample_shape
    }

    /// Batches in one epoch, counting a final smaller batch unless `drop_last` is set.
    pub fn batches_per_epoch(&self) -> u64 {
        let (n, b) = (self.len() as u64, self.options.batch_size as u64);
        if self.options.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    /// The batches `start_batch..` of epoch `epoch`, in order.
    ///
    /// They equal the same batches of a pass that starts at 0. A `start_batch` at or past the end
    /// yields nothing. Dropping the iterator stops the workers.
    pub fn epoch(&self, epoch: u64, start_batch: u64) -> EpochIter {
        let end = self.batches_per_epoch();
        let start = start_batch.min(end);
        let order = Arc::new(self.order(epoch));
        let batch_size = self.options.batch_size;
        let (rank, world) = (self.shard.rank as u64, self.shard.world as u64);
        let producer: Producer = match &self.source {
            Source::Images {
                dataset,
                transforms,
                stages,
            } => {
                let dataset = Arc::clone(dataset);
                let transforms = Arc::clone(transforms);
                let stages = stages.clone();
                let shape = self.sample_shape;
                let transform_key = TransformKey {
                    key: key(self.options.seed, epoch, *b"transfrm"),
                    rank,
                    world,
                    epoch,
                };
                Arc::new(move |batch| {
                    make_batch(
                        &*dataset,
                        &transforms,
                        &stages,
                        &order,
                        batch_size,
                        shape,
                        transform_key,
                        batch,
                    )
                })
            }
            Source::Tokens(tokens) => {
                let tokens = Arc::clone(tokens);
                Arc::new(move |batch| make_token_batch(&*tokens, &order, batch_size, epoch, batch))
            }
        };
        EpochIter::new(
            producer,
            start,
            end,
            self.options.workers,
            self.options.prefetch,
        )
    }

    /// The number of nodes each epoch's order is split over when this loader reads per node
    /// ([`Loader::across_nodes`] found a sharded dataset to split); `None`: one order for all
    /// ranks.
    pub fn node_split(&self) -> Option<usize> {
        self.shard.nodes.map(|share| share.nodes)
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod token_tests;
#[cfg(test)]
mod transform_tests;
