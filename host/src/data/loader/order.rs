//! The order of an epoch: a permutation keyed by (seed, epoch), and each rank's (and node's) share
//! of it.

use super::Loader;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::Source;

/// Which share of every epoch a loader serves in a data-parallel run (see [`Loader::shard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shard {
    pub(super) rank: usize,
    pub(super) world: usize,
    /// Pad the epoch to a multiple of `world` with its first samples, so that every rank gets
    /// as many (training); otherwise ranks get one sample fewer or more (evaluation).
    pub(super) pad: bool,
    /// In a run over several nodes whose source splits epochs by node (see
    /// [`Loader::across_nodes`]): how.
    pub(super) nodes: Option<NodeShare>,
}

/// How a rank's node reads its own part of every epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NodeShare {
    /// Nodes in the run; ranks `k·R..(k+1)·R` (R = world / nodes) are node `k`'s.
    pub(super) nodes: usize,
    /// Samples of each node's share of an epoch (the source's `node_span`).
    pub(super) span: usize,
}

impl Shard {
    pub(super) const WHOLE: Shard = Shard {
        rank: 0,
        world: 1,
        pad: false,
        nodes: None,
    };

    /// Samples this shard gets of an epoch of `n`.
    pub(super) fn len(&self, n: usize) -> usize {
        if let Some(share) = self.nodes {
            share.span.div_ceil(self.world / share.nodes)
        } else if self.pad {
            n.div_ceil(self.world)
        } else {
            (n + self.world - 1 - self.rank) / self.world
        }
    }
}

/// A 32-byte ChaCha key from the seed, the epoch and a purpose tag.
pub(super) fn key(seed: u64, epoch: u64, purpose: [u8; 8]) -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    key[16..24].copy_from_slice(&purpose);
    key
}

impl Loader {
    /// The sample order of an epoch: a permutation keyed by (seed, epoch), or the identity;
    /// in a data-parallel run, this rank's share of it (see [`Loader::shard`] and
    /// [`Loader::across_nodes`]).
    pub(super) fn order(&self, epoch: u64) -> Vec<u32> {
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
    pub(super) fn node_order(&self, epoch: u64, share: NodeShare) -> Option<Vec<u32>> {
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
