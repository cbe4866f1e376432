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

use std::any::Any;
use std::borrow::Cow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::decode::decode_image;
use super::source::SampleData;
pub use super::source::{TokenRows, TokenSource, TokenTargets};
use super::subset::{self, SubsetChoice};
use super::transforms::{Normalize, Sample, Transform};
use super::{DataError, SampleSource};

/// One batch in host memory, ready to become tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBatch {
    /// The images or token sequences.
    pub input: HostInput,
    /// B class indices (images, labelled text), or B×T target ids (token sequences).
    pub target: Vec<i64>,
    /// The batch's index within its epoch.
    pub index: u64,
}

/// The input half of a [`HostBatch`].
#[derive(Debug, Clone, PartialEq)]
pub enum HostInput {
    /// B×C×H×W pixels after the host's transforms, with their shape `[B, C, H, W]`; B is smaller
    /// than the batch size only for the last batch when `drop_last` is off, or when the source
    /// left samples out (skipped bad files). What the model sees is [`HostBatch::input_f32`]:
    /// the device computes it from `data` and `normalize`.
    Pixels {
        /// The pixels, sample after sample.
        data: Pixels,
        /// `[B, C, H, W]`.
        shape: [usize; 4],
        /// The normalization still to run (on the device), after the scaling of `u8` pixels.
        normalize: Option<Arc<Normalize>>,
    },
    /// B×T token ids with their shape `[B, T]`.
    Tokens {
        /// The ids, sequence after sequence.
        ids: Vec<i64>,
        /// `[B, T]`.
        shape: [usize; 2],
        /// What the batch's targets are: B×T token ids or B class indices.
        targets: TokenTargets,
        /// B×T: 1 on a token, 0 on padding; only for padded sequences (labelled text).
        attention_mask: Option<Vec<i64>>,
        /// B×T: 0 on a pair's first text, 1 on its second; only for sentence pairs.
        token_type_ids: Option<Vec<i64>>,
    },
}

/// The pixels of an image batch, sample after sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Pixels {
    /// `u8` pixels, as decoded and moved by crops and flips: the device scales them to [0, 1]
    /// (÷255).
    Bytes(Vec<u8>),
    /// `f32` values in [0, 1]: a transform that computes new values (a method's) ran.
    Floats(Vec<f32>),
}

impl Pixels {
    /// Values in the batch.
    pub fn len(&self) -> usize {
        match self {
            Pixels::Bytes(v) => v.len(),
            Pixels::Floats(v) => v.len(),
        }
    }

    /// Whether the batch holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The size of the buffer in bytes: what crosses to the device.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            Pixels::Bytes(v) => v.len(),
            Pixels::Floats(v) => std::mem::size_of_val(v.as_slice()),
        }
    }
}

impl HostBatch {
    /// Samples (images or sequences) in the batch.
    pub fn len(&self) -> usize {
        match &self.input {
            HostInput::Pixels { shape, .. } => shape[0],
            HostInput::Tokens { shape, .. } => shape[0],
        }
    }

    /// Whether the batch holds no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The input's shape: `[B, C, H, W]` or `[B, T]`.
    pub fn input_shape(&self) -> Vec<usize> {
        match &self.input {
            HostInput::Pixels { shape, .. } => shape.to_vec(),
            HostInput::Tokens { shape, .. } => shape.to_vec(),
        }
    }

    /// The pixels of an image batch (`None` for token sequences).
    pub fn pixels(&self) -> Option<&Pixels> {
        match &self.input {
            HostInput::Pixels { data, .. } => Some(data),
            HostInput::Tokens { .. } => None,
        }
    }

    /// The input of an image batch as the model sees it, computed on the host: `u8` pixels
    /// scaled to [0, 1] (÷255), then normalized, `(x - mean) * (1 / std)` per channel, in `f32`.
    /// The device computes the same from [`HostInput::Pixels`]; this is its reference, and what
    /// the loader served before it left those steps to the device. `None` for token sequences.
    pub fn input_f32(&self) -> Option<Vec<f32>> {
        let HostInput::Pixels {
            data,
            shape,
            normalize,
        } = &self.input
        else {
            return None;
        };
        let mut values = match data {
            Pixels::Bytes(bytes) => bytes.iter().map(|&p| f32::from(p) / 255.0).collect(),
            Pixels::Floats(values) => values.clone(),
        };
        if let Some(n) = normalize {
            n.normalize_planes(&mut values, shape[1], shape[2] * shape[3]);
        }
        Some(values)
    }

    /// Bytes of the input buffer: what crosses to the device.
    pub fn input_size_in_bytes(&self) -> usize {
        match &self.input {
            HostInput::Pixels { data, .. } => data.size_in_bytes(),
            HostInput::Tokens { ids, .. } => std::mem::size_of_val(ids.as_slice()),
        }
    }

    /// Tokens in the batch's input (B×T; 0 for images).
    pub fn tokens(&self) -> u64 {
        match &self.input {
            HostInput::Pixels { .. } => 0,
            HostInput::Tokens { ids, .. } => ids.len() as u64,
        }
    }
}

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

/// Which share of every epoch a loader serves in a data-parallel run (see [`Loader::shard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shard {
    rank: usize,
    world: usize,
    /// Pad the epoch to a multiple of `world` with its first samples, so that every rank gets
    /// as many (training); otherwise ranks get one sample fewer or more (evaluation).
    pad: bool,
    /// In a run over several nodes whose source splits epochs by node (see
    /// [`Loader::across_nodes`]): how.
    nodes: Option<NodeShare>,
}

/// How a rank's node reads its own part of every epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NodeShare {
    /// Nodes in the run; ranks `k·R..(k+1)·R` (R = world / nodes) are node `k`'s.
    nodes: usize,
    /// Samples of each node's share of an epoch (the source's `node_span`).
    span: usize,
}

impl Shard {
    const WHOLE: Shard = Shard {
        rank: 0,
        world: 1,
        pad: false,
        nodes: None,
    };

    /// Samples this shard gets of an epoch of `n`.
    fn len(&self, n: usize) -> usize {
        if let Some(share) = self.nodes {
            share.span.div_ceil(self.world / share.nodes)
        } else if self.pad {
            n.div_ceil(self.world)
        } else {
            (n + self.world - 1 - self.rank) / self.world
        }
    }
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

/// Where a loader runs each of its image transforms: `transforms[..bytes]` (crops and flips) on
/// the `u8` pixels, `transforms[bytes..host]` on `f32` values (from the first transform that
/// computes new values), and a final `normalize` on the device.
#[derive(Debug, Clone)]
struct Stages {
    bytes: usize,
    host: usize,
    device_normalize: Option<Arc<Normalize>>,
}

impl Stages {
    fn of(transforms: &[Transform]) -> Stages {
        let (host, device_normalize) = match transforms.last() {
            Some(Transform::Normalize(n)) => (transforms.len() - 1, Some(Arc::new(n.clone()))),
            _ => (transforms.len(), None),
        };
        let bytes = transforms[..host]
            .iter()
            .position(|t| !t.works_on_bytes())
            .unwrap_or(host);
        Stages {
            bytes,
            host,
            device_normalize,
        }
    }

    /// Whether batches stay `u8` to the device.
    fn bytes_to_device(&self) -> bool {
        self.bytes == self.host
    }
}

type Producer = Arc<dyn Fn(u64) -> Result<HostBatch, DataError> + Send + Sync>;

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

    /// The sample order of an epoch: a permutation keyed by (seed, epoch), or the identity;
    /// in a data-parallel run, this rank's share of it (see [`Loader::shard`] and
    /// [`Loader::across_nodes`]).
    fn order(&self, epoch: u64) -> Vec<u32> {
        if let Some(order) = self
            .shard
            .nodes
            .and_then(|share| self.node_order(epoch, share))
        {
            return order;
        }
        // `new` checked that the length fits in u32.
        let n = self.source.len();
        let own = match &self.source {
            Source::Images { dataset, .. } if self.options.shuffle => dataset
                .epoch_order(self.options.seed, epoch)
                .filter(|o| o.len() == n),
            _ => None,
        };
        let order = match own {
            Some(order) => order,
            None => {
                let mut order: Vec<u32> = (0..n as u32).collect();
                if self.options.shuffle {
                    let mut rng =
                        ChaCha8Rng::from_seed(key(self.options.seed, epoch, *b"shuffle!"));
                    order.shuffle(&mut rng);
                }
                order
            }
        };
        let Shard {
            rank, world, pad, ..
        } = self.shard;
        if world == 1 {
            return order;
        }
        let total = if pad { n.div_ceil(world) * world } else { n };
        (rank..total)
            .step_by(world)
            .filter_map(|position| order.get(position % n.max(1)).copied())
            .collect()
    }

    /// This rank's part of its node's share of epoch `epoch` (see [`Loader::across_nodes`]):
    /// the share split round-robin over the node's ranks, padded with its first samples.
    fn node_order(&self, epoch: u64, share: NodeShare) -> Option<Vec<u32>> {
        let Source::Images { dataset, .. } = &self.source else {
            return None;
        };
        let per_node = self.shard.world / share.nodes;
        let (node, local) = (self.shard.rank / per_node, self.shard.rank % per_node);
        let order = dataset
            .node_order(
                self.options.seed,
                epoch,
                self.options.shuffle,
                share.nodes,
                node,
            )
            .filter(|o| o.len() == share.span && !o.is_empty())?;
        let total = share.span.div_ceil(per_node) * per_node;
        Some(
            (local..total)
                .step_by(per_node)
                .map(|position| order[position % order.len()])
                .collect(),
        )
    }
}

/// A 32-byte ChaCha key from the seed, the epoch and a purpose tag.
fn key(seed: u64, epoch: u64, purpose: [u8; 8]) -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    key[16..24].copy_from_slice(&purpose);
    key
}

/// The random stream of a sample's transforms: keyed by (seed, epoch), numbered by the sample's
/// position in the whole epoch's order, so it is the same for any number of ranks.
#[derive(Debug, Clone, Copy)]
struct TransformKey {
    key: [u8; 32],
    rank: u64,
    world: u64,
    /// The epoch, told to methods' transforms with the sample's index.
    epoch: u64,
}

impl TransformKey {
    /// The stream of the sample at `position` in this rank's share.
    fn rng(&self, position: usize) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::from_seed(self.key);
        rng.set_stream(position as u64 * self.world + self.rank);
        rng
    }
}

#[allow(clippy::too_many_arguments)]
fn make_batch(
    dataset: &dyn SampleSource,
    transforms: &[Transform],
    stages: &Stages,
    order: &[u32],
    batch_size: usize,
    shape: (usize, usize, usize),
    transform_key: TransformKey,
    batch: u64,
) -> Result<HostBatch, DataError> {
    let start = (batch as usize).saturating_mul(batch_size).min(order.len());
    let end = start.saturating_add(batch_size).min(order.len());
    let (channels, height, width) = shape;
    let per = channels * height * width;
    let capacity = (end - start) * per;
    let mut input = if stages.bytes_to_device() {
        Pixels::Bytes(Vec::with_capacity(capacity))
    } else {
        Pixels::Floats(Vec::with_capacity(capacity))
    };
    let mut target = Vec::with_capacity(end - start);
    let failed = |i: usize, index: usize, e: super::transforms::TransformError| {
        DataError::Invalid(format!("transform {i} on sample {index}: {e}"))
    };
    for (position, &index) in order.iter().enumerate().take(end).skip(start) {
        let index = index as usize;
        // A sample the source leaves out (a skipped bad file) makes the batch shorter.
        let Some((data, label)) = dataset.read(index)? else {
            continue;
        };
        let (c, h, w) = dataset.shape();
        let mut rng = transform_key.rng(position);
        // An encoded image is decoded here, its random crop drawn first from the sample's
        // generator.
        let pixels: Cow<'_, [u8]> = match data {
            SampleData::Pixels(pixels) => pixels,
            SampleData::Encoded { bytes, name, plan } => {
                if (plan.channels, plan.size, plan.size) != (c, h, w) {
                    return Err(DataError::Invalid(format!(
                        "loader: {name} is decoded to {}×{}×{} but the source's samples are \
                         {c}×{h}×{w}",
                        plan.channels, plan.size, plan.size
                    )));
                }
                match decode_image(&bytes, &name, plan, &mut rng) {
                    Ok(pixels) => Cow::Owned(pixels),
                    Err(e) => {
                        dataset.undecodable(index, e)?;
                        continue;
                    }
                }
            }
        };
        // Crops and flips on the u8 pixels (a copy only when there are some).
        let moved;
        let (bytes, bytes_shape): (&[u8], _) = if stages.bytes == 0 {
            (&pixels, (c, h, w))
        } else {
            let mut sample = Sample {
                data: pixels.into_owned(),
                channels: c,
                height: h,
                width: w,
            };
            for (i, transform) in transforms[..stages.bytes].iter().enumerate() {
                transform
                    .apply_to_bytes(&mut sample, &mut rng)
                    .map_err(|e| failed(i, index, e))?;
            }
            moved = sample;
            (&moved.data, moved.shape())
        };
        let out_shape = match &mut input {
            Pixels::Bytes(out) => {
                if bytes.len() == per {
                    out.extend_from_slice(bytes);
                }
                (bytes_shape, bytes.len())
            }
            Pixels::Floats(out) => {
                let (c, h, w) = bytes_shape;
                let mut sample = Sample::from_u8(bytes, c, h, w);
                for (i, transform) in transforms[stages.bytes..stages.host].iter().enumerate() {
                    let at = tessera_plugin_api::SamplePlace {
                        epoch: transform_key.epoch,
                        index: index as u64,
                    };
                    transform
                        .apply_at(&mut sample, &mut rng, at)
                        .map_err(|e| failed(stages.bytes + i, index, e))?;
                }
                if sample.data.len() == per {
                    out.extend_from_slice(&sample.data);
                }
                (sample.shape(), sample.data.len())
            }
        };
        if out_shape != (shape, per) {
            return Err(DataError::Invalid(format!(
                "loader: sample {index} came out as {:?}, expected {shape:?}",
                out_shape.0
            )));
        }
        target.push(label);
    }
    if target.is_empty() && end > start {
        return Err(DataError::Invalid(format!(
            "loader: every sample of batch {batch} was left out (see the warnings above)"
        )));
    }
    Ok(HostBatch {
        input: HostInput::Pixels {
            data: input,
            shape: [target.len(), channels, height, width],
            normalize: stages.device_normalize.clone(),
        },
        target,
        index: batch,
    })
}

fn make_token_batch(
    tokens: &dyn TokenSource,
    order: &[u32],
    batch_size: usize,
    epoch: u64,
    batch: u64,
) -> Result<HostBatch, DataError> {
    let start = (batch as usize).saturating_mul(batch_size).min(order.len());
    let end = start.saturating_add(batch_size).min(order.len());
    let (b, t) = (end - start, tokens.seq_len());
    let targets = tokens.targets();
    let per_target = match targets {
        TokenTargets::PerToken => t,
        TokenTargets::PerSequence => 1,
    };
    let mask_len = if tokens.padded() { b * t } else { 0 };
    let types_len = if tokens.paired() { b * t } else { 0 };
    let mut rows = TokenRows {
        input: Vec::with_capacity(b * t),
        target: Vec::with_capacity(b * per_target),
        attention_mask: Vec::with_capacity(mask_len),
        token_type_ids: Vec::with_capacity(types_len),
    };
    for &index in &order[start..end] {
        tokens.read(index as usize, epoch, &mut rows)?;
    }
    if rows.input.len() != b * t
        || rows.target.len() != b * per_target
        || rows.attention_mask.len() != mask_len
        || rows.token_type_ids.len() != types_len
    {
        return Err(DataError::Invalid(format!(
            "loader: batch {batch} of {b} sequences of {t} tokens came out as {} input, {} \
             target, {} attention-mask and {} token-type values",
            rows.input.len(),
            rows.target.len(),
            rows.attention_mask.len(),
            rows.token_type_ids.len()
        )));
    }
    Ok(HostBatch {
        input: HostInput::Tokens {
            ids: rows.input,
            shape: [b, t],
            targets,
            attention_mask: tokens.padded().then_some(rows.attention_mask),
            token_type_ids: tokens.paired().then_some(rows.token_type_ids),
        },
        target: rows.target,
        index: batch,
    })
}

/// Runs the producer for one batch, turning a panic into an error.
fn produce(producer: &Producer, worker: usize, batch: u64) -> Result<HostBatch, DataError> {
    catch_unwind(AssertUnwindSafe(|| producer(batch))).unwrap_or_else(|payload| {
        Err(DataError::Worker {
            worker,
            batch,
            message: panic_message(payload.as_ref()),
        })
    })
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".into()
    }
}

/// The batches of one epoch, in order; see [`Loader::epoch`].
///
/// After an error it yields nothing more.
pub struct EpochIter {
    producer: Producer,
    next: u64,
    start: u64,
    end: u64,
    failed: bool,
    pending_error: Option<DataError>,
    workers: Vec<WorkerHandle>,
    stop: Arc<AtomicBool>,
}

struct WorkerHandle {
    receiver: Option<Receiver<Result<HostBatch, DataError>>>,
    thread: Option<JoinHandle<()>>,
}

impl EpochIter {
    fn new(producer: Producer, start: u64, end: u64, workers: usize, prefetch: usize) -> EpochIter {
        let mut iter = EpochIter {
            producer,
            next: start,
            start,
            end,
            failed: false,
            pending_error: None,
            workers: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        // No more threads than batches left.
        let threads = (workers as u64).min(end - start) as usize;
        for worker in 0..threads {
            let (sender, receiver) = sync_channel(prefetch);
            let producer = Arc::clone(&iter.producer);
            let stop = Arc::clone(&iter.stop);
            let first = start + worker as u64;
            let stride = threads as u64;
            let spawned = std::thread::Builder::new()
                .name(format!("tessera-loader-{worker}"))
                .spawn(move || {
                    let mut batch = first;
                    while batch < end && !stop.load(Ordering::Relaxed) {
                        let result = produce(&producer, worker + 1, batch);
                        let failed = result.is_err();
                        // A closed channel means the iterator is gone: stop quietly.
                        if sender.send(result).is_err() || failed {
                            return;
                        }
                        batch += stride;
                    }
                });
            match spawned {
                Ok(thread) => iter.workers.push(WorkerHandle {
                    receiver: Some(receiver),
                    thread: Some(thread),
                }),
                Err(e) => {
                    iter.pending_error = Some(DataError::Worker {
                        worker: worker + 1,
                        batch: first,
                        message: format!("could not start the thread: {e}"),
                    });
                    break;
                }
            }
        }
        iter
    }

    fn next_from_worker(&mut self, batch: u64) -> Result<HostBatch, DataError> {
        let slot = ((batch - self.start) % self.workers.len() as u64) as usize;
        let handle = &mut self.workers[slot];
        let received = handle.receiver.as_ref().map(|r| r.recv());
        match received {
            Some(Ok(result)) => result,
            _ => {
                // The worker ended without sending this batch: report why.
                let message = match handle.thread.take().map(JoinHandle::join) {
                    Some(Err(payload)) => panic_message(payload.as_ref()),
                    _ => "stopped without producing the batch".into(),
                };
                Err(DataError::Worker {
                    worker: slot + 1,
                    batch,
                    message,
                })
            }
        }
    }
}

impl Iterator for EpochIter {
    type Item = Result<HostBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(error) = self.pending_error.take() {
            self.failed = true;
            return Some(Err(error));
        }
        if self.failed || self.next >= self.end {
            return None;
        }
        let batch = self.next;
        self.next += 1;
        let result = if self.workers.is_empty() {
            produce(&self.producer, 0, batch)
        } else {
            self.next_from_worker(batch)
        };
        if result.is_err() {
            self.failed = true;
        }
        Some(result)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.failed {
            return (0, Some(0));
        }
        let left = usize::try_from(self.end - self.next).unwrap_or(usize::MAX);
        (
            0,
            Some(left.saturating_add(usize::from(self.pending_error.is_some()))),
        )
    }
}

impl Drop for EpochIter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Closing the queues wakes workers blocked on a full one; each finishes at most the batch
        // in hand, so joining is quick.
        for handle in &mut self.workers {
            handle.receiver.take();
        }
        for handle in &mut self.workers {
            if let Some(thread) = handle.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
#[path = "loader_tests.rs"]
mod tests;
