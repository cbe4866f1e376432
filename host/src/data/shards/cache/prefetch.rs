//! Fetching the shards a split will read next on a thread of its own (`Prefetcher`).

use std::sync::{Arc, Condvar, Mutex};

use super::{ShardCache, Want};
use std::thread::JoinHandle;

#[derive(Debug, Default)]
pub(super) struct Queue {
    pub(super) wanted: Vec<Want>,
    pub(super) stop: bool,
}

/// A background thread fetching the shards a reader needs next, in order.
#[derive(Debug)]
pub struct Prefetcher {
    pub(super) queue: Arc<(Mutex<Queue>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// Starts the thread that fills `cache`.
    pub fn start(cache: Arc<ShardCache>) -> Prefetcher {
        let queue: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let q = Arc::clone(&queue);
        let thread = std::thread::Builder::new()
            .name("shard-prefetch".into())
            .spawn(move || loop {
                let want = {
                    let (lock, cond) = &*q;
                    let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
                    while st.wanted.is_empty() && !st.stop {
                        st = cond.wait(st).unwrap_or_else(|p| p.into_inner());
                    }
                    if st.stop {
                        return;
                    }
                    st.wanted.remove(0)
                };
                if let Err(e) = cache.open(&want) {
                    // The reader meets the same error when it needs the shard.
                    tracing::debug!("prefetching a shard: {e}");
                }
            })
            .ok();
        if thread.is_none() {
            tracing::warn!(
                "could not start the shard prefetch thread; shards are fetched when read"
            );
        }
        Prefetcher { queue, thread }
    }

    /// Replaces the shards to fetch with `wanted`, fetched in order.
    pub fn set(&self, wanted: Vec<Want>) {
        let (lock, cond) = &*self.queue;
        lock.lock().unwrap_or_else(|p| p.into_inner()).wanted = wanted;
        cond.notify_all();
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        let (lock, cond) = &*self.queue;
        lock.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        cond.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
