//! Shards of a remote dataset (`s3://bucket/prefix`) fetched into a local cache folder: each
//! shard downloaded once, to a temporary then renamed into place, checked against the size (and
//! the sha256, when listed) that `index.json` gives, the folder kept under a size limit by
//! evicting the least recently used shards that the current, previous and next blocks of the
//! epoch do not need, and the shards the epoch reads next fetched ahead by a background thread.
//! The processes sharing a folder (a machine's ranks) fetch a shard one at a time (a lock file
//! per shard), so each is downloaded once per machine; over several nodes, each node's ranks
//! read only their node's shards (`order::node_order`).

mod prefetch;
mod split;

pub use prefetch::Prefetcher;
pub use split::CachedShards;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use sha2::{Digest, Sha256};

use crate::data::DataError;

/// Where shards are fetched from: a folder or an object store, read object by object.
pub trait Remote: Send + Sync + std::fmt::Debug {
    /// The address of object `key` (relative to the dataset's root), for messages.
    fn url(&self, key: &str) -> String;

    /// Writes the whole of object `key` to `out`; the bytes written.
    fn fetch(&self, key: &str, out: &mut dyn Write) -> Result<u64, DataError>;

    /// The whole of object `key`.
    fn get(&self, key: &str) -> Result<Vec<u8>, DataError> {
        let mut out = Vec::new();
        self.fetch(key, &mut out)?;
        Ok(out)
    }
}

/// A local folder read as a remote (tests, and a dataset on a slow network mount).
#[derive(Debug, Clone)]
pub struct FolderRemote {
    root: PathBuf,
}

impl FolderRemote {
    /// The objects are the files under `root`.
    pub fn new(root: impl Into<PathBuf>) -> FolderRemote {
        FolderRemote { root: root.into() }
    }
}

impl Remote for FolderRemote {
    fn url(&self, key: &str) -> String {
        self.root.join(key).display().to_string()
    }

    fn fetch(&self, key: &str, out: &mut dyn Write) -> Result<u64, DataError> {
        let path = self.root.join(key);
        let mut file = File::open(&path).map_err(|e| DataError::io(&path, e))?;
        std::io::copy(&mut file, out).map_err(|e| DataError::io(&path, e))
    }
}

/// A shard the cache is asked for: its key under the remote root, its size, its sha256 when
/// known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The object's key, relative to the remote root (`train/shard.00000.mds`).
    pub key: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its sha256 (hex), when `index.json` lists one.
    pub sha256: Option<String>,
}

/// How many times a download whose size or hash is wrong is tried before giving up.
const ATTEMPTS: usize = 3;

#[derive(Debug)]
struct Entry {
    bytes: u64,
    last_use: u64,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    used: u64,
    clock: u64,
    fetching: HashSet<String>,
    /// Per reader: the keys that must not be evicted (the blocks it reads and reads next).
    pinned: HashMap<u64, HashSet<String>>,
    fetches: u64,
    warned_over_limit: bool,
}

/// A folder of shards fetched from one remote, at most `limit` bytes (see the module docs).
#[derive(Debug)]
pub struct ShardCache {
    remote: Arc<dyn Remote>,
    dir: PathBuf,
    limit: u64,
    state: Mutex<State>,
    ready: Condvar,
    next_client: AtomicU64,
}

/// The file name a key is stored under: `/` and `%` escaped, so the folder stays flat.
fn file_name(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

fn key_of(file_name: &str) -> String {
    file_name.replace("%2F", "/").replace("%25", "%")
}

impl ShardCache {
    /// The cache of `remote` in `dir` (created), holding at most `limit` bytes; shards already
    /// in `dir` from an earlier run are kept (least recently modified evicted first).
    pub fn new(
        remote: Arc<dyn Remote>,
        dir: &Path,
        limit: u64,
    ) -> Result<Arc<ShardCache>, DataError> {
        std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, e))?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| DataError::io(dir, e))? {
            let entry = entry.map_err(|e| DataError::io(dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with(crate::files::TMP_PREFIX) {
                // An interrupted download of an earlier run; not one under way in another
                // process sharing the folder (the other ranks of a data-parallel run).
                if !downloading_elsewhere(&name) {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            let meta = entry.metadata().map_err(|e| DataError::io(&path, e))?;
            if meta.is_file() {
                let modified = meta.modified().ok();
                found.push((modified, key_of(&name), meta.len()));
            }
        }
        found.sort();
        let mut state = State::default();
        for (_, key, bytes) in found {
            state.clock += 1;
            state.used += bytes;
            state.entries.insert(
                key,
                Entry {
                    bytes,
                    last_use: state.clock,
                },
            );
        }
        Ok(Arc::new(ShardCache {
            remote,
            dir: dir.to_path_buf(),
            limit,
            state: Mutex::new(state),
            ready: Condvar::new(),
            next_client: AtomicU64::new(0),
        }))
    }

    /// The remote the shards come from.
    pub fn remote(&self) -> &Arc<dyn Remote> {
        &self.remote
    }

    /// The cache folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bytes the cached shards take.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// How many downloads have been installed since the cache was opened.
    pub fn fetches(&self) -> u64 {
        self.lock().fetches
    }

    /// The keys cached now, sorted.
    pub fn cached(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.lock().entries.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// A new reader id for [`ShardCache::pin`].
    pub fn client(&self) -> u64 {
        self.next_client.fetch_add(1, Ordering::Relaxed)
    }

    /// Keeps `keys` from eviction on behalf of reader `client` (replacing its earlier pins).
    pub fn pin(&self, client: u64, keys: impl IntoIterator<Item = String>) {
        self.lock()
            .pinned
            .insert(client, keys.into_iter().collect());
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(file_name(key))
    }

    /// The shard `want` opened from the cache, fetched first when it is not there (waiting for
    /// another thread's fetch of it rather than fetching it twice). The open file stays
    /// readable when the shard is evicted afterwards.
    pub fn open(&self, want: &Want) -> Result<File, DataError> {
        let path = self.path(&want.key);
        loop {
            let mut st = self.lock();
            let clock = st.clock + 1;
            let present = st.entries.get(&want.key).map(|e| e.bytes);
            match present {
                Some(bytes) if bytes == want.bytes => match File::open(&path) {
                    Ok(file) => {
                        st.clock = clock;
                        if let Some(e) = st.entries.get_mut(&want.key) {
                            e.last_use = clock;
                        }
                        return Ok(file);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        // Removed behind the cache's back: fetch it again.
                        st.used -= bytes;
                        st.entries.remove(&want.key);
                    }
                    Err(e) => return Err(DataError::io(&path, e)),
                },
                Some(bytes) => {
                    // A stale copy (the remote's index changed): replace it.
                    st.used -= bytes;
                    st.entries.remove(&want.key);
                    let _ = std::fs::remove_file(&path);
                }
                None => {}
            }
            if st.fetching.contains(&want.key) {
                drop(self.ready.wait(st).unwrap_or_else(|p| p.into_inner()));
                continue;
            }
            st.fetching.insert(want.key.clone());
            drop(st);
            // The other processes of this machine (ranks sharing the folder) fetch it one at a
            // time: a process that waited finds it in place and takes it as it is.
            let shared = self.lock_shard(want);
            let fetched = if on_disk(&path, want.bytes) {
                Ok(None)
            } else {
                self.download(want).map(Some)
            };
            let mut st = self.lock();
            st.fetching.remove(&want.key);
            let installed =
                fetched.and_then(|temp| self.install(&mut st, want, temp.as_deref(), &path));
            drop(st);
            drop(shared);
            self.ready.notify_all();
            installed?;
        }
    }

    /// Downloads `want` to a temporary in the cache folder, checked; its path.
    fn download(&self, want: &Want) -> Result<PathBuf, DataError> {
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        let url = self.remote.url(&want.key);
        let mut last = None;
        for attempt in 1..=ATTEMPTS {
            let temp = self.dir.join(format!(
                "{}{}.{}.{}",
                crate::files::TMP_PREFIX,
                file_name(&want.key),
                std::process::id(),
                SERIAL.fetch_add(1, Ordering::Relaxed)
            ));
            let result = self.download_to(want, &url, &temp);
            match result {
                Ok(()) => return Ok(temp),
                Err(e) => {
                    let _ = std::fs::remove_file(&temp);
                    let retry = matches!(e, DataError::Checksum { .. } | DataError::Format { .. });
                    if !retry || attempt == ATTEMPTS {
                        return Err(e);
                    }
                    tracing::warn!(
                        "{e}; fetching it again (attempt {} of {ATTEMPTS})",
                        attempt + 1
                    );
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| DataError::Invalid(format!("{url}: not fetched"))))
    }

    fn download_to(&self, want: &Want, url: &str, temp: &Path) -> Result<(), DataError> {
        let file = File::create(temp).map_err(|e| DataError::io(temp, e))?;
        let mut out = Hashing {
            inner: std::io::BufWriter::with_capacity(1 << 20, file),
            hash: want.sha256.as_ref().map(|_| Sha256::new()),
        };
        let bytes = self.remote.fetch(&want.key, &mut out)?;
        let file = out
            .inner
            .into_inner()
            .map_err(|e| DataError::io(temp, e.into_error()))?;
        file.sync_all().map_err(|e| DataError::io(temp, e))?;
        if bytes != want.bytes {
            return Err(DataError::Format {
                path: PathBuf::from(url),
                reason: format!(
                    "fetched {bytes} bytes where index.json says {}: an incomplete download or a replaced shard",
                    want.bytes
                ),
            });
        }
        if let (Some(expected), Some(hash)) = (&want.sha256, out.hash) {
            let actual = crate::files::hex(&hash.finalize());
            if !actual.eq_ignore_ascii_case(expected) {
                return Err(DataError::Checksum {
                    path: PathBuf::from(url),
                    expected: expected.clone(),
                    actual,
                });
            }
        }
        Ok(())
    }

    /// An exclusive lock (`flock`) on shard `want` among the processes sharing the folder,
    /// held while the returned file is open; `None` (no lock) where the lock file cannot be
    /// made, which only costs a second download.
    fn lock_shard(&self, want: &Want) -> Option<File> {
        use std::os::fd::AsRawFd as _;
        let dir = self.dir.join(LOCKS);
        std::fs::create_dir_all(&dir).ok()?;
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(file_name(&want.key)))
            .ok()?;
        // SAFETY: flock on a descriptor this function owns; it is released when `file` closes.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0;
        locked.then_some(file)
    }

    /// Makes room for `want` and renames its download `temp` into place (`None`: another
    /// process of the machine put it there).
    fn install(
        &self,
        st: &mut State,
        want: &Want,
        temp: Option<&Path>,
        path: &Path,
    ) -> Result<(), DataError> {
        let pinned: HashSet<&String> = st.pinned.values().flatten().collect();
        let mut victims: Vec<(u64, String)> = st
            .entries
            .iter()
            .filter(|(k, _)| !pinned.contains(k) && **k != want.key)
            .map(|(k, e)| (e.last_use, k.clone()))
            .collect();
        victims.sort();
        let mut evict = Vec::new();
        let mut used = st.used;
        for (_, key) in victims {
            if used + want.bytes <= self.limit {
                break;
            }
            used -= st.entries.get(&key).map_or(0, |e| e.bytes);
            evict.push(key);
        }
        for key in evict {
            if let Some(e) = st.entries.remove(&key) {
                st.used -= e.bytes;
                tracing::debug!(
                    "evicted {key} ({} bytes) from the shard cache {}",
                    e.bytes,
                    self.dir.display()
                );
            }
            let _ = std::fs::remove_file(self.path(&key));
        }
        if st.used + want.bytes > self.limit && !st.warned_over_limit {
            st.warned_over_limit = true;
            tracing::warn!(
                "the shard cache {} holds {} bytes of shards the current and next blocks need, over its limit of {} bytes ([data.shards] cache_limit)",
                self.dir.display(),
                st.used + want.bytes,
                self.limit
            );
        }
        if let Some(temp) = temp {
            if let Err(e) = std::fs::rename(temp, path) {
                let _ = std::fs::remove_file(temp);
                return Err(DataError::io(path, e));
            }
            st.fetches += 1;
        }
        st.clock += 1;
        st.used += want.bytes;
        st.entries.insert(
            want.key.clone(),
            Entry {
                bytes: want.bytes,
                last_use: st.clock,
            },
        );
        Ok(())
    }
}

/// The folder (in the cache folder) of the lock files that keep two processes from fetching one
/// shard at once.
const LOCKS: &str = ".locks";

/// Whether `path` holds a shard of `bytes` bytes (installed, so checked, by another process).
fn on_disk(path: &Path, bytes: u64) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == bytes)
}

/// Whether the download temporary `name` (`<tmp prefix><file>.<pid>.<serial>`) belongs to
/// another process still running.
fn downloading_elsewhere(name: &str) -> bool {
    let mut parts = name.rsplitn(3, '.');
    let (_, pid) = (parts.next(), parts.next());
    let Some(pid) = pid.and_then(|p| p.parse::<i32>().ok()).filter(|&p| p > 0) else {
        return false;
    };
    if pid as u32 == std::process::id() {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists (and may be signalled).
    let status = unsafe { libc::kill(pid, 0) };
    status == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A writer that hashes what it writes.
struct Hashing<W: Write> {
    inner: W,
    hash: Option<Sha256>,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(h) = &mut self.hash {
            h.update(&buf[..n]);
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `10GB`, `500MB`, `64KiB`, `1000` (bytes): decimal units (KB, MB, GB, TB), binary ones with
/// `i` (KiB, MiB, GiB, TiB).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size such as 64MB"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    Ok((number * scale).round() as u64)
}

#[cfg(test)]
mod tests;
