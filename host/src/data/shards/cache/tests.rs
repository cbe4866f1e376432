//! Unit tests of the shard cache against folder remotes (no network).
use std::sync::atomic::AtomicUsize;

use super::*;

/// A temporary folder removed when dropped.
struct Temp(PathBuf);

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp(label: &str) -> Temp {
    let dir = std::env::temp_dir().join(format!("tessera-cache-{}-{label}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("remote/train")).unwrap();
    Temp(dir)
}

/// Writes object `train/<name>` of `bytes` bytes (content derived from the name) and returns
/// its [`Want`] with its sha256.
fn object(dir: &Path, name: &str, bytes: usize) -> Want {
    let data: Vec<u8> = (0..bytes)
        .map(|i| (i as u8).wrapping_mul(31) ^ name.as_bytes()[0])
        .collect();
    std::fs::write(dir.join("remote/train").join(name), &data).unwrap();
    let sha = crate::files::sha256_hex(&data);
    Want {
        key: format!("train/{name}"),
        bytes: bytes as u64,
        sha256: Some(sha),
    }
}

/// A folder remote that counts fetches, can spoil the first `spoil` of them (truncated or one
/// byte flipped) and can wait on a gate before answering.
#[derive(Debug)]
struct Counting {
    inner: FolderRemote,
    fetches: AtomicUsize,
    spoil: AtomicUsize,
    truncate: bool,
    gate: Option<Arc<(Mutex<bool>, Condvar)>>,
}

impl Counting {
    fn new(dir: &Path) -> Counting {
        Counting {
            inner: FolderRemote::new(dir.join("remote")),
            fetches: AtomicUsize::new(0),
            spoil: AtomicUsize::new(0),
            truncate: false,
            gate: None,
        }
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

impl Remote for Counting {
    fn url(&self, key: &str) -> String {
        format!("test://bucket/{key}")
    }

    fn fetch(&self, key: &str, out: &mut dyn Write) -> Result<u64, DataError> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            let (lock, cond) = &**gate;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cond.wait(open).unwrap();
            }
        }
        let mut data = Vec::new();
        self.inner.fetch(key, &mut data)?;
        let spoil = self
            .spoil
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if spoil {
            if self.truncate {
                data.truncate(data.len() / 2);
            } else {
                data[0] ^= 0xff;
            }
        }
        out.write_all(&data).unwrap();
        Ok(data.len() as u64)
    }
}

fn read(file: File) -> Vec<u8> {
    let mut file = file;
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut data).unwrap();
    data
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(crate::files::TMP_PREFIX))
        .collect()
}

#[test]
fn least_recently_used_shards_are_evicted_to_stay_under_the_limit() {
    let t = temp("lru");
    let w: Vec<Want> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| object(&t.0, n, 100))
        .collect();
    let remote = Arc::new(Counting::new(&t.0));
    let cache = ShardCache::new(remote.clone(), &t.0.join("cache"), 250).unwrap();
    cache.open(&w[0]).unwrap();
    cache.open(&w[1]).unwrap();
    // `a` used again: `b` is now the least recently used.
    cache.open(&w[0]).unwrap();
    cache.open(&w[2]).unwrap();
    assert_eq!(cache.cached(), ["train/a", "train/c"]);
    assert_eq!(cache.used(), 200);
    // Cached shards are not fetched again.
    let before = remote.fetches();
    cache.open(&w[0]).unwrap();
    cache.open(&w[2]).unwrap();
    assert_eq!(remote.fetches(), before);
    // A pinned shard is kept even when least recently used.
    let client = cache.client();
    cache.pin(client, ["train/a".to_string()]);
    cache.open(&w[3]).unwrap();
    assert_eq!(cache.cached(), ["train/a", "train/d"]);
    assert!(cache.used() <= 250);
    // The folder holds exactly what the cache counts (and the processes' lock files).
    let mut files: Vec<String> = std::fs::read_dir(t.0.join("cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != LOCKS)
        .collect();
    files.sort();
    assert_eq!(files, ["train%2Fa", "train%2Fd"]);
    // A new cache on the same folder knows them (oldest first) and removes stale temporaries
    // (of a process that is gone), not those of a download under way in another process (pid
    // 1 is always running).
    std::fs::write(
        t.0.join("cache").join(".tmp-train%2Fb.999999999.0"),
        b"partial",
    )
    .unwrap();
    std::fs::write(t.0.join("cache").join(".tmp-train%2Fc.1.0"), b"partial").unwrap();
    let again = ShardCache::new(remote.clone(), &t.0.join("cache"), 250).unwrap();
    assert_eq!(again.cached(), ["train/a", "train/d"]);
    assert_eq!(again.used(), 200);
    assert_eq!(leftovers(&t.0.join("cache")), [".tmp-train%2Fc.1.0"]);
    std::fs::remove_file(t.0.join("cache").join(".tmp-train%2Fc.1.0")).unwrap();
    let before = remote.fetches();
    assert_eq!(
        read(again.open(&w[3]).unwrap()),
        std::fs::read(t.0.join("remote/train/d")).unwrap()
    );
    assert_eq!(remote.fetches(), before);
}

#[test]
fn a_short_or_corrupt_download_is_refused_and_fetched_again() {
    for truncate in [true, false] {
        let t = temp(&format!("spoil-{truncate}"));
        let w = object(&t.0, "a", 1000);
        let remote = Arc::new(Counting {
            truncate,
            ..Counting::new(&t.0)
        });
        remote.spoil.store(1, Ordering::SeqCst);
        let cache = ShardCache::new(remote.clone(), &t.0.join("cache"), 10_000).unwrap();
        let data = read(cache.open(&w).unwrap());
        assert_eq!(data, std::fs::read(t.0.join("remote/train/a")).unwrap());
        assert_eq!(remote.fetches(), 2, "truncate {truncate}");
        assert_eq!(cache.fetches(), 1);
        assert!(leftovers(&t.0.join("cache")).is_empty());
        // Spoiled every time: an error naming the object, nothing installed.
        let w2 = object(&t.0, "b", 1000);
        remote.spoil.store(usize::MAX, Ordering::SeqCst);
        let err = cache.open(&w2).unwrap_err().to_string();
        assert!(err.contains("test://bucket/train/b"), "{err}");
        let reason = if truncate {
            "fetched 500 bytes where index.json says 1000"
        } else {
            "checksum mismatch"
        };
        assert!(err.contains(reason), "{err}");
        assert_eq!(cache.cached(), ["train/a"]);
        assert!(leftovers(&t.0.join("cache")).is_empty());
    }
}

#[test]
fn a_missing_object_is_an_error_naming_it() {
    let t = temp("missing");
    let remote = Arc::new(Counting::new(&t.0));
    let cache = ShardCache::new(remote, &t.0.join("cache"), 10_000).unwrap();
    let err = cache
        .open(&Want {
            key: "train/nope.mds".into(),
            bytes: 5,
            sha256: None,
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope.mds"), "{err}");
    assert!(cache.cached().is_empty());
    assert!(leftovers(&t.0.join("cache")).is_empty());
}

#[test]
fn a_cached_copy_of_another_size_is_replaced() {
    let t = temp("stale");
    let w = object(&t.0, "a", 100);
    let remote = Arc::new(Counting::new(&t.0));
    let cache = ShardCache::new(remote.clone(), &t.0.join("cache"), 10_000).unwrap();
    cache.open(&w).unwrap();
    // The remote's shard is rewritten with another size.
    let w2 = object(&t.0, "a", 150);
    assert_eq!(read(cache.open(&w2).unwrap()).len(), 150);
    assert_eq!(remote.fetches(), 2);
    assert_eq!(cache.used(), 150);
}

#[test]
fn concurrent_readers_of_one_shard_fetch_it_once() {
    let t = temp("concurrent");
    let w = object(&t.0, "a", 5000);
    let gate: Arc<(Mutex<bool>, Condvar)> = Arc::default();
    let remote = Arc::new(Counting {
        gate: Some(Arc::clone(&gate)),
        ..Counting::new(&t.0)
    });
    let cache = ShardCache::new(remote.clone(), &t.0.join("cache"), 100_000).unwrap();
    let readers: Vec<_> = (0..6)
        .map(|_| {
            let cache = Arc::clone(&cache);
            let w = w.clone();
            std::thread::spawn(move || read(cache.open(&w).unwrap()))
        })
        .collect();
    // Let the first fetch begin, then let it finish: the other readers wait for it.
    while remote.fetches() == 0 {
        std::thread::yield_now();
    }
    {
        let (lock, cond) = &*gate;
        *lock.lock().unwrap() = true;
        cond.notify_all();
    }
    let want = std::fs::read(t.0.join("remote/train/a")).unwrap();
    for r in readers {
        assert_eq!(r.join().unwrap(), want);
    }
    assert_eq!(remote.fetches(), 1);
    assert_eq!(cache.fetches(), 1);
}

#[test]
fn the_prefetcher_fetches_the_next_blocks_in_epoch_order() {
    let t = temp("prefetch");
    let wants: Vec<Want> = (0..6)
        .map(|i| object(&t.0, &format!("s{i}"), 100))
        .collect();
    let remote = Arc::new(Counting::new(&t.0));
    let cache = ShardCache::new(remote.clone(), &t.0.join("cache"), 400).unwrap();
    // Blocks of 2 shards, 2 shards ahead; epoch order 5 4 | 3 2 | 1 0.
    let shards = CachedShards::new(Arc::clone(&cache), wants, 2, 2);
    shards.set_epoch(vec![5, 4, 3, 2, 1, 0], vec![0, 1, 2, 3, 4, 5]);
    read(shards.open(5).unwrap());
    // The prefetcher brings in shards 4, 3 and 2 without anyone reading them.
    let expect = ["train/s2", "train/s3", "train/s4", "train/s5"];
    let (lock, _) = &*shards.prefetcher.queue;
    loop {
        let idle = lock.lock().unwrap().wanted.is_empty();
        if idle && cache.cached() == expect {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Reading block 2 (shards 1, 0) may evict block 0's shards but not block 1's (previous).
    read(shards.open(1).unwrap());
    read(shards.open(0).unwrap());
    let cached = cache.cached();
    for key in ["train/s0", "train/s1", "train/s2", "train/s3"] {
        assert!(cached.contains(&key.to_string()), "{cached:?}");
    }
    assert!(cache.used() <= 400);
    // Every shard was fetched once.
    assert_eq!(remote.fetches(), 6);
}

#[test]
fn sizes_parse_in_decimal_and_binary_units() {
    assert_eq!(parse_size("10GB"), Ok(10_000_000_000));
    assert_eq!(parse_size("1.5 MB"), Ok(1_500_000));
    assert_eq!(parse_size("64KiB"), Ok(65_536));
    assert_eq!(parse_size("1000"), Ok(1000));
    assert!(parse_size("ten").unwrap_err().contains("ten"));
    assert!(parse_size("5 parsecs").unwrap_err().contains("parsecs"));
}
