//! A sharded dataset as the loader reads it: samples, their labels, an epoch's order by blocks
//! of shards and each node's span.

use std::borrow::Cow;

use crate::data::source::{RawSample, SampleData, SampleSource};
use crate::data::{DataError, OnBadFile};

use super::{order, Backend, Sharded, Store};

impl SampleSource for Sharded {
    fn len(&self) -> usize {
        self.sizes.iter().sum()
    }

    fn shape(&self) -> (usize, usize, usize) {
        (self.plan.channels, self.plan.size, self.plan.size)
    }

    fn read(&self, index: usize) -> Result<Option<RawSample<'_>>, DataError> {
        let (image, label) = self.read_raw(index)?;
        let (shard, local) = self.locate(index)?;
        let name = format!("{} shard {shard} sample {local}", self.name);
        let bytes = image
            .into_encoded()
            .map_err(|e| DataError::Invalid(format!("{name}: {e}")))?;
        Ok(Some((
            SampleData::Encoded {
                bytes: Cow::Owned(bytes),
                name: Cow::Owned(name),
                plan: &self.plan,
            },
            label,
        )))
    }

    fn undecodable(&self, _index: usize, error: DataError) -> Result<(), DataError> {
        if self.config.images.on_bad_file == OnBadFile::Skip {
            tracing::warn!("skipped {error}");
            return Ok(());
        }
        Err(error)
    }

    fn epoch_order(&self, seed: u64, epoch: u64) -> Option<Vec<u32>> {
        if let Backend::Mds {
            store: Store::Cached(c),
            ..
        } = &self.backend
        {
            let n = self.sizes.len();
            c.set_epoch(
                order::shard_order(n, seed, epoch),
                order::shard_order(n, seed, epoch + 1),
            );
        }
        Some(order::epoch_order(
            &self.sizes,
            self.config.shuffle_block,
            seed,
            epoch,
        ))
    }

    fn node_span(&self, nodes: usize) -> Option<usize> {
        let split = order::NodeSplit { nodes };
        if let Some(why) = split.refusal(&self.sizes) {
            tracing::warn!(
                "{}: {why}, so every node reads the whole dataset (round-robin over all ranks)",
                self.name
            );
            return None;
        }
        Some(split.span(&self.sizes))
    }

    fn node_order(
        &self,
        seed: u64,
        epoch: u64,
        shuffle: bool,
        nodes: usize,
        node: usize,
    ) -> Option<Vec<u32>> {
        let split = order::NodeSplit { nodes };
        if let Backend::Mds {
            store: Store::Cached(c),
            ..
        } = &self.backend
        {
            // This node fetches (and keeps) only its own shards, this epoch's then the next's.
            let n = self.sizes.len();
            let shards = |epoch| {
                let all = if shuffle {
                    order::shard_order(n, seed, epoch)
                } else {
                    (0..n).collect()
                };
                split.node_shards(&all, node).to_vec()
            };
            c.set_epoch(shards(epoch), shards(epoch + 1));
        }
        Some(order::node_order(
            &self.sizes,
            self.config.shuffle_block,
            seed,
            epoch,
            shuffle,
            split,
            node,
        ))
    }
}
