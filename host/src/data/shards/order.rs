//! The epoch order of a sharded dataset: the shards shuffled, then the samples shuffled within
//! blocks of consecutive shards of that order, so a reader holds only a block's shards at a time.
//!
//! The order is one global permutation, a pure function of (seed, epoch, shard sizes, block
//! size): every rank computes it alike and the loader splits it round-robin, so it does not
//! depend on the number of ranks or workers, and resuming at batch `k` starts at position
//! `k × batch` of it without reading anything.

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

/// The order of epoch `epoch` over shards of `sizes` samples (sample indices count through the
/// shards in their stored order): the shards permuted, then each run of `block` shards of that
/// permutation (the last one shorter) has its samples permuted together.
pub fn epoch_order(sizes: &[usize], block: usize, seed: u64, epoch: u64) -> Vec<u32> {
    let mut starts = Vec::with_capacity(sizes.len());
    let mut total = 0usize;
    for &s in sizes {
        starts.push(total);
        total += s;
    }
    let shards = shard_order(sizes.len(), seed, epoch);
    let mut order = Vec::with_capacity(total);
    for (b, group) in shards.chunks(block.max(1)).enumerate() {
        let from = order.len();
        for &s in group {
            order.extend((starts[s]..starts[s] + sizes[s]).map(|i| i as u32));
        }
        order[from..].shuffle(&mut ChaCha8Rng::from_seed(key(
            seed,
            epoch,
            *b"inblock!",
            b as u64,
        )));
    }
    order
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

    #[test]
    fn depends_on_seed_and_epoch_only() {
        let a = epoch_order(&sizes(), 2, 1, 0);
        assert_eq!(a, epoch_order(&sizes(), 2, 1, 0));
        assert_ne!(a, epoch_order(&sizes(), 2, 1, 1));
        assert_ne!(a, epoch_order(&sizes(), 2, 2, 0));
    }
}
