//! The shards of one split read through the cache (`CachedShards`): which are wanted next, and
//! their files.

use std::sync::{Arc, Mutex};

use super::Prefetcher;
use super::{ShardCache, Want};
use crate::data::DataError;
use std::fs::File;
use std::path::PathBuf;

/// The shards of one split read through a [`ShardCache`]: on each shard read, the shards of
/// the previous, current and next blocks of the epoch's shard order are pinned and the next
/// `prefetch` shards after the current block are fetched ahead.
#[derive(Debug)]
pub struct CachedShards {
    cache: Arc<ShardCache>,
    client: u64,
    wants: Vec<Want>,
    block: usize,
    prefetch: usize,
    plan: Mutex<Plan>,
    pub(super) prefetcher: Prefetcher,
}

#[derive(Debug)]
struct Plan {
    /// The shard order of the epoch being read, then of the next one (on one node of several,
    /// the node's own shards only).
    order: Vec<usize>,
    /// Each shard's place in the first half of `order`, `None` for one it does not list.
    position: Vec<Option<usize>>,
    /// The block last announced to the prefetcher.
    announced: Option<usize>,
}

impl Plan {
    fn new(shards: usize, this: Vec<usize>, next: Vec<usize>) -> Plan {
        let mut position = vec![None; shards];
        for (p, &s) in this.iter().enumerate() {
            if let Some(at) = position.get_mut(s) {
                *at = Some(p);
            }
        }
        let mut order = this;
        order.extend(next);
        Plan {
            order,
            position,
            announced: None,
        }
    }
}

impl CachedShards {
    /// The shards `wants` (in stored order) of a split read through `cache`, in blocks of
    /// `block` shards, `prefetch` shards fetched ahead. Until [`CachedShards::set_epoch`] the
    /// order is the stored one (evaluation).
    pub fn new(
        cache: Arc<ShardCache>,
        wants: Vec<Want>,
        block: usize,
        prefetch: usize,
    ) -> CachedShards {
        let n = wants.len();
        let prefetcher = Prefetcher::start(Arc::clone(&cache));
        CachedShards {
            client: cache.client(),
            cache,
            wants,
            block: block.max(1),
            prefetch,
            plan: Mutex::new(Plan::new(n, (0..n).collect(), (0..n).collect())),
            prefetcher,
        }
    }

    /// The shard order of the epoch being read and of the next one: every shard, or on one
    /// node of several the node's own (a shard not listed is fetched when read, not ahead).
    pub fn set_epoch(&self, this: Vec<usize>, next: Vec<usize>) {
        *self.plan.lock().unwrap_or_else(|p| p.into_inner()) =
            Plan::new(self.wants.len(), this, next);
    }

    /// The cache the shards go through.
    pub fn cache(&self) -> &Arc<ShardCache> {
        &self.cache
    }

    /// The address of shard `shard`, for messages.
    pub fn url(&self, shard: usize) -> PathBuf {
        PathBuf::from(self.cache.remote().url(&self.wants[shard].key))
    }

    /// Shard `shard` opened, fetched first when not cached.
    pub fn open(&self, shard: usize) -> Result<File, DataError> {
        {
            let mut plan = self.plan.lock().unwrap_or_else(|p| p.into_inner());
            let p = plan.position.get(shard).copied().flatten();
            if let Some((p, b)) = p
                .map(|p| (p, p / self.block))
                .filter(|&(_, b)| plan.announced != Some(b))
            {
                plan.announced = Some(b);
                let from = b.saturating_sub(1) * self.block;
                let current = b * self.block;
                let end = (current + 2 * self.block).min(plan.order.len());
                let ahead = ((current + self.block).min(plan.order.len()) + self.prefetch)
                    .min(plan.order.len());
                let keep = plan.order[from..end.max(ahead)]
                    .iter()
                    .map(|&s| self.wants[s].key.clone());
                self.cache.pin(self.client, keep);
                self.prefetcher.set(
                    plan.order[p..ahead]
                        .iter()
                        .map(|&s| self.wants[s].clone())
                        .collect(),
                );
            }
        }
        self.cache.open(&self.wants[shard])
    }
}
