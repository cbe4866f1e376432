//! The epoch order of a sharded dataset: the shards shuffled, then the samples shuffled within
//! blocks of consecutive shards of that order, so a reader holds only a block's shards at a time.
//!
//! The order is one global permutation, a pure function of (seed, epoch, shard sizes, block
//! size): every rank computes it alike and the loader splits it round-robin, so it does not
//! depend on the number of ranks or workers, and resuming at batch `k` starts at position
//! `k × batch` of it without reading anything.
//!
//! A run over several nodes reads it per node instead ([`node_order`]), as MosaicML Streaming's
//! partition over canonical nodes does: the epoch's shard order is cut into one contiguous run
//! of whole shards per node, so each node reads (and downloads) only its own shards.

use rand::seq::SliceRandom;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A ChaCha key from the seed, the epoch, a purpose tag and a block number.
fn key(seed: u64, epoch: u64, purpose: [u8; 8], block: u64) -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    key[16..24].copy_from_slice(&purpose);
    key[24..].copy_from_slice(&block.to_le_bytes());
    key
}

/// The order in which epoch `epoch` reads `n` shards: a permutation of `0..n`; its runs of
/// `block` shards are the blocks of [`epoch_order`].
pub fn shard_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut shards: Vec<usize> = (0..n).collect();
    shards.shuffle(&mut ChaCha8Rng::from_seed(key(
        seed,
        epoch,
        *b"shards!!",
        0,
    )));
    shards
}

/// The first global index of each shard of `sizes`.
fn starts(sizes: &[usize]) -> Vec<usize> {
    let mut starts = Vec::with_capacity(sizes.len());
    let mut total = 0usize;
    for &s in sizes {
        starts.push(total);
        total += s;
    }
    starts
}

/// Appends the samples of `shards` to `order`, each run of `block` shards of them as one block
/// whose samples are permuted together by the generator `block_key(b)` gives block `b`
/// (`None`: kept in order).
fn push_blocks(
    order: &mut Vec<u32>,
    shards: &[usize],
    sizes: &[usize],
    block: usize,
    block_key: Option<&dyn Fn(u64) -> [u8; 32]>,
) {
    let starts = starts(sizes);
    for (b, group) in shards.chunks(block.max(1)).enumerate() {
        let from = order.len();
        for &s in group {
            order.extend((starts[s]..starts[s] + sizes[s]).map(|i| i as u32));
        }
        if let Some(block_key) = block_key {
            order[from..].shuffle(&mut ChaCha8Rng::from_seed(block_key(b as u64)));
        }
    }
}

/// The order of epoch `epoch` over shards of `sizes` samples (sample indices count through the
/// shards in their stored order): the shards permuted, then each run of `block` shards of that
/// permutation (the last one shorter) has its samples permuted together.
pub fn epoch_order(sizes: &[usize], block: usize, seed: u64, epoch: u64) -> Vec<u32> {
    let shards = shard_order(sizes.len(), seed, epoch);
    let mut order = Vec::with_capacity(sizes.iter().sum());
    let block_key = |b: u64| key(seed, epoch, *b"inblock!", b);
    push_blocks(&mut order, &shards, sizes, block, Some(&block_key));
    order
}

/// How an epoch is split over the nodes of a run: `nodes` nodes, the shards of `sizes` samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSplit {
    /// Nodes in the run (at least 2 to mean anything).
    pub nodes: usize,
}

impl NodeSplit {
    /// Why shards of `sizes` cannot be split over the nodes (fewer shards than nodes, or an
    /// empty shard, which would leave a node nothing to repeat); `None` when they can.
    pub fn refusal(&self, sizes: &[usize]) -> Option<String> {
        if sizes.len() < self.nodes {
            return Some(format!(
                "{} shards cannot be split over {} nodes",
                sizes.len(),
                self.nodes
            ));
        }
        sizes
            .iter()
            .position(|&s| s == 0)
            .map(|s| format!("shard {s} holds no samples"))
    }

    /// The shards of `order` (an epoch's shard order) node `node` reads: the `node`-th of
    /// `nodes` contiguous runs of it, of ⌊n/nodes⌋ or ⌈n/nodes⌉ shards.
    pub fn node_shards<'a>(&self, order: &'a [usize], node: usize) -> &'a [usize] {
        let n = order.len();
        let nodes = self.nodes.max(1);
        &order[node * n / nodes..(node + 1) * n / nodes]
    }

    /// The samples every node's share of an epoch is padded to: the ⌈n/nodes⌉ largest shards'
    /// samples, the most any node's run of shards can hold, so it is the same in every epoch.
    pub fn span(&self, sizes: &[usize]) -> usize {
        let mut sorted = sizes.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        sorted
            .iter()
            .take(sizes.len().div_ceil(self.nodes.max(1)))
            .sum()
    }
}

/// Node `node`'s share of epoch `epoch` over shards of `sizes` samples, split by `split`: the
/// shards of its run of the epoch's shard order ([`shard_order`], or the stored order without
/// `shuffle`), in blocks of `block` shards whose samples are permuted together (with
/// `shuffle`), then repeated from its start up to [`NodeSplit::span`] samples, so that every
/// node has as many. A pure function of (seed, epoch, shard sizes, block size, node count).
pub fn node_order(
    sizes: &[usize],
    block: usize,
    seed: u64,
    epoch: u64,
    shuffle: bool,
    split: NodeSplit,
    node: usize,
) -> Vec<u32> {
    let order = if shuffle {
        shard_order(sizes.len(), seed, epoch)
    } else {
        (0..sizes.len()).collect()
    };
    let shards = split.node_shards(&order, node);
    let span = split.span(sizes);
    let mut samples = Vec::with_capacity(span);
    // Each node's blocks are keyed apart from the others' and from the one-node order's.
    let block_key = |b: u64| key(seed, epoch, *b"nodeblok", ((node as u64) << 32) | b);
    push_blocks(
        &mut samples,
        shards,
        sizes,
        block,
        shuffle.then_some(&block_key as &dyn Fn(u64) -> [u8; 32]),
    );
    let own = samples.len();
    if own > 0 {
        for i in own..span {
            samples.push(samples[i % own]);
        }
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes() -> Vec<usize> {
        vec![7, 3, 10, 1, 8, 8, 5]
    }

    #[test]
    fn is_a_permutation_for_every_block_size() {
        let total: usize = sizes().iter().sum();
        for block in [1, 2, 3, 7, 100] {
            let mut order = epoch_order(&sizes(), block, 5, 2);
            order.sort_unstable();
            assert_eq!(
                order,
                (0..total as u32).collect::<Vec<_>>(),
                "block {block}"
            );
        }
    }

    #[test]
    fn samples_stay_within_their_block_of_shards() {
        let s = sizes();
        let shard_of = |i: u32| {
            let mut acc = 0;
            s.iter()
                .position(|&n| {
                    acc += n;
                    (i as usize) < acc
                })
                .unwrap()
        };
        let order = epoch_order(&s, 2, 9, 0);
        // Reading the order front to back, each block of two shards is finished before the next
        // begins: at most 2 distinct shards per block-length window starting at a block edge.
        let mut shards_seen: Vec<usize> = Vec::new();
        let mut at = 0;
        while at < order.len() {
            let first = shard_of(order[at]);
            let mut group: Vec<usize> = vec![first];
            let mut end = at;
            while end < order.len() && group.len() <= 2 {
                let sh = shard_of(order[end]);
                if !group.contains(&sh) {
                    group.push(sh);
                }
                if group.len() > 2 {
                    break;
                }
                end += 1;
            }
            let block_len: usize = group[..group.len().min(2)].iter().map(|&g| s[g]).sum();
            assert_eq!(end - at, block_len, "block at position {at}");
            for g in &group[..group.len().min(2)] {
                assert!(!shards_seen.contains(g), "shard {g} in two blocks");
                shards_seen.push(*g);
            }
            at = end;
        }
        assert_eq!(shards_seen.len(), s.len());
    }

    /// The shard of sample `i` of shards of `sizes`.
    fn shard_of(sizes: &[usize], i: u32) -> usize {
        let starts = starts(sizes);
        starts.partition_point(|&s| s <= i as usize) - 1
    }

    #[test]
    fn nodes_read_disjoint_shards_and_every_sample_between_them() {
        let s = sizes();
        let total: usize = s.iter().sum();
        for nodes in [2usize, 3, 7] {
            let split = NodeSplit { nodes };
            assert_eq!(split.refusal(&s), None);
            for shuffle in [true, false] {
                let shares: Vec<Vec<u32>> = (0..nodes)
                    .map(|n| node_order(&s, 2, 4, 1, shuffle, split, n))
                    .collect();
                let mut seen = vec![0usize; total];
                let mut owner = vec![None; s.len()];
                for (n, share) in shares.iter().enumerate() {
                    assert_eq!(share.len(), split.span(&s), "{nodes} nodes");
                    let mut distinct = share.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    for &i in &distinct {
                        seen[i as usize] += 1;
                        let shard = shard_of(&s, i);
                        assert!(
                            owner[shard].is_none_or(|o| o == n),
                            "shard {shard} read by two nodes"
                        );
                        owner[shard] = Some(n);
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "{nodes} nodes: {seen:?}");
            }
        }
        // Fewer shards than nodes, or an empty shard, cannot be split.
        assert!(NodeSplit { nodes: 8 }.refusal(&s).is_some());
        assert!(NodeSplit { nodes: 2 }.refusal(&[3, 0, 2]).is_some());
    }

    #[test]
    fn equal_shards_split_evenly_without_repeats() {
        let s = vec![16; 8];
        let split = NodeSplit { nodes: 2 };
        assert_eq!(split.span(&s), 64);
        let a = node_order(&s, 2, 3, 0, true, split, 0);
        let b = node_order(&s, 2, 3, 0, true, split, 1);
        let mut all: Vec<u32> = a.iter().chain(&b).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..128).collect::<Vec<u32>>());
        // A pure function of seed and epoch; another epoch gives each node other shards.
        assert_eq!(a, node_order(&s, 2, 3, 0, true, split, 0));
        let shards = |o: &[u32]| {
            let mut v: Vec<usize> = o.iter().map(|&i| shard_of(&s, i)).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let next = node_order(&s, 2, 3, 1, true, split, 0);
        assert_ne!(shards(&a), shards(&next));
    }

    #[test]
    fn depends_on_seed_and_epoch_only() {
        let a = epoch_order(&sizes(), 2, 1, 0);
        assert_eq!(a, epoch_order(&sizes(), 2, 1, 0));
        assert_ne!(a, epoch_order(&sizes(), 2, 1, 1));
        assert_ne!(a, epoch_order(&sizes(), 2, 2, 0));
    }
}
