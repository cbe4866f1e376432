//! Checkpoints: one file per save, holding everything a run needs to continue bit-for-bit.
//!
//! A checkpoint is a [safetensors](https://github.com/huggingface/safetensors) file (readable by
//! any safetensors reader) named `ep{E}-ba{B}.ckpt`:
//! - tensors `model/<name>` (weights and buffers, PyTorch names), `optim/<param>.<buffer>`
//!   (optimizer state), `method/<method>/<name>` (each method's tensors) and
//!   `method/<method>/__bytes__` (its serialized counters), `trainer/running_loss`;
//! - metadata `tessera.checkpoint`: a JSON [`Meta`] (format version, clock, optimizer
//!   position, RNG state, methods and their settings, the resolved config, ...), and
//!   `tessera.sha256`: a checksum over the metadata and every tensor's name, dtype, shape and
//!   bytes, verified on load.
//!
//! Files are written atomically (temporary file in the same folder, fsync, rename, fsync of the
//! folder): a crash leaves the previous checkpoints untouched and at worst a stray temporary
//! file, which readers ignore. `latest.ckpt` is a symbolic link to the newest checkpoint,
//! replaced atomically too.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, View};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor};

use crate::report::EvalRecord;
use crate::time::Timestamp;

/// Version of the checkpoint layout this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// File extension of checkpoints.
pub const EXTENSION: &str = "ckpt";
/// Name of the link to the newest checkpoint.
pub const LATEST: &str = "latest.ckpt";
const META_KEY: &str = "tessera.checkpoint";
const CHECKSUM_KEY: &str = "tessera.sha256";
/// Test hook: milliseconds to sleep after the temporary file is written and before it is
/// renamed, so a test can kill the process in the middle of a write.
pub const PAUSE_ENV: &str = "TESSERA_TEST_PAUSE_IN_CHECKPOINT_WRITE_MS";

/// A checkpoint that cannot be read or does not fit.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The checkpoint file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is truncated, corrupt or not a Tessera checkpoint.
    #[error("{path}: corrupt or partial checkpoint: {reason}")]
    Corrupt {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor cannot be converted.
    #[error("{0}")]
    Tensor(String),
}

impl CheckpointError {
    fn corrupt(path: &Path, reason: impl Into<String>) -> Self {
        CheckpointError::Corrupt {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }
}

/// The optimizer's position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerMeta {
    /// `sgd` or `adamw`.
    pub algorithm: String,
    /// Learning rate of the next step.
    pub lr: f64,
    /// Learning rate at construction.
    pub initial_lr: f64,
    /// Steps taken.
    pub steps: u64,
    /// Names of the parameters it trains, in order.
    pub members: Vec<String>,
}

/// The state of the methods' random stream (ChaCha8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RngMeta {
    /// The 32-byte key, in hex.
    pub seed: String,
    /// The stream number.
    pub stream: u64,
    /// The word position, as a decimal string (it is a 128-bit number).
    pub word_pos: String,
}

/// The trainer's own counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerMeta {
    /// Seconds spent training so far.
    pub train_seconds: f64,
    /// Evaluations so far.
    pub evals: Vec<EvalRecord>,
    /// Batch of the last evaluation.
    pub last_eval_batch: Option<u64>,
    /// Batches summed in `trainer/running_loss` since the last metrics line.
    pub running_batches: u64,
    /// Length of `metrics.jsonl` when the checkpoint was written (a resumed run cuts the file
    /// there, so the file ends up as if the run had never stopped).
    pub metrics_bytes: u64,
    /// Methods disabled after a failure (`on_error = "disable"`).
    pub disabled: Vec<String>,
    /// Training steps skipped because the loss was not finite.
    #[serde(default)]
    pub skipped_steps: u64,
}

/// One method's entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MethodMeta {
    /// The method's name.
    pub name: String,
    /// Plugin version (empty for built-in methods).
    pub version: String,
    /// Settings it ran with.
    pub settings: serde_json::Value,
    /// The method's own state layout version.
    pub format_version: u32,
    /// Whether it saved any state.
    pub has_state: bool,
    /// The names of its state tensors, in the order the method gave them (the file stores
    /// tensors sorted by name).
    #[serde(default)]
    pub tensors: Vec<String>,
}

/// Everything in a checkpoint besides tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Layout version ([`FORMAT_VERSION`]).
    pub format: u32,
    /// Tessera version that wrote it.
    pub tessera_version: String,
    /// libtorch version that wrote it.
    pub libtorch_version: String,
    /// Seconds since the Unix epoch at writing.
    pub created_unix: u64,
    /// The run's name.
    pub run_name: String,
    /// The training clock.
    pub timestamp: Timestamp,
    /// Batches per epoch of the run that wrote it (the data position is `timestamp.epoch`,
    /// `timestamp.batch_in_epoch`).
    pub batches_per_epoch: u64,
    /// The optimizer's position.
    pub optimizer: OptimizerMeta,
    /// The methods' random stream.
    pub rng: RngMeta,
    /// Trainer counters.
    pub trainer: TrainerMeta,
    /// Methods in the order they were configured.
    pub methods: Vec<MethodMeta>,
    /// The resolved configuration.
    pub config: serde_json::Value,
}

/// A checkpoint in memory: metadata and named CPU tensors.
pub struct Checkpoint {
    /// Metadata.
    pub meta: Meta,
    /// Tensors by full name (`model/...`, `optim/...`, `method/...`, `trainer/...`).
    pub tensors: Vec<(String, Tensor)>,
}

/// A tensor as little-endian bytes on the CPU, ready for safetensors (also used by
/// `tessera export`).
pub(crate) struct Blob {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Blob {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn dtype_of(kind: Kind) -> Result<Dtype, CheckpointError> {
    Ok(match kind {
        Kind::Bool => Dtype::BOOL,
        Kind::Uint8 => Dtype::U8,
        Kind::Int8 => Dtype::I8,
        Kind::Int16 => Dtype::I16,
        Kind::Int => Dtype::I32,
        Kind::Int64 => Dtype::I64,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Half => Dtype::F16,
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        other => {
            return Err(CheckpointError::Tensor(format!(
                "tensors of kind {other:?} cannot be saved"
            )))
        }
    })
}

fn kind_of(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::BOOL => Kind::Bool,
        Dtype::U8 => Kind::Uint8,
        Dtype::I8 => Kind::Int8,
        Dtype::I16 => Kind::Int16,
        Dtype::I32 => Kind::Int,
        Dtype::I64 => Kind::Int64,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F16 => Kind::Half,
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        _ => return None,
    })
}

/// Copies `t` (any device, any layout) into a [`Blob`]; fails for kinds safetensors lacks.
pub(crate) fn blob_of(name: &str, t: &Tensor) -> Result<Blob, CheckpointError> {
    let err = |e: tch::TchError| CheckpointError::Tensor(format!("saving `{name}`: {e}"));
    let dtype = dtype_of(t.kind())?;
    let cpu = t
        .f_detach()
        .and_then(|t| t.f_to_device(Device::Cpu))
        .and_then(|t| t.f_contiguous())
        .map_err(err)?;
    let numel = cpu.numel();
    let mut bytes = vec![0u8; numel * cpu.kind().elt_size_in_bytes()];
    cpu.f_copy_data_u8(&mut bytes, numel).map_err(err)?;
    Ok(Blob {
        dtype,
        shape: cpu.size().iter().map(|&d| d as usize).collect(),
        bytes,
    })
}

fn hash_tensor(h: &mut Sha256, name: &str, dtype: Dtype, shape: &[usize], bytes: &[u8]) {
    h.update((name.len() as u64).to_le_bytes());
    h.update(name.as_bytes());
    h.update(format!("{dtype:?}").as_bytes());
    h.update((shape.len() as u64).to_le_bytes());
    for d in shape {
        h.update((*d as u64).to_le_bytes());
    }
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Checkpoint {
    /// The tensors whose names start with `prefix`, with the prefix removed.
    pub fn with_prefix<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a Tensor)> {
        self.tensors
            .iter()
            .filter_map(move |(n, t)| n.strip_prefix(prefix).map(|rest| (rest, t)))
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// The checkpoint as safetensors bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        let meta = serde_json::to_string(&self.meta)
            .map_err(|e| CheckpointError::Tensor(format!("serializing the metadata: {e}")))?;
        let mut blobs: Vec<(String, Blob)> = Vec::with_capacity(self.tensors.len());
        for (name, t) in &self.tensors {
            if blobs.iter().any(|(n, _)| n == name) {
                return Err(CheckpointError::Tensor(format!(
                    "two tensors are named `{name}`"
                )));
            }
            blobs.push((name.clone(), blob_of(name, t)?));
        }
        blobs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut h = Sha256::new();
        h.update(meta.as_bytes());
        for (name, b) in &blobs {
            hash_tensor(&mut h, name, b.dtype, &b.shape, &b.bytes);
        }
        let info = HashMap::from([
            (META_KEY.to_owned(), meta),
            (CHECKSUM_KEY.to_owned(), hex(&h.finalize())),
        ]);
        safetensors::tensor::serialize(blobs.iter().map(|(n, b)| (n.as_str(), b)), &Some(info))
            .map_err(|e| CheckpointError::Tensor(format!("serializing: {e}")))
    }

    /// Parses and verifies checkpoint bytes read from `path` (used in messages).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Checkpoint, CheckpointError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| {
            CheckpointError::corrupt(path, format!("not a valid safetensors file ({e})"))
        })?;
        let (_, header) = SafeTensors::read_metadata(bytes)
            .map_err(|e| CheckpointError::corrupt(path, format!("bad header ({e})")))?;
        let info = header.metadata().as_ref().ok_or_else(|| {
            CheckpointError::corrupt(path, "no Tessera metadata (is it a plain weights file?)")
        })?;
        let meta_text = info.get(META_KEY).ok_or_else(|| {
            CheckpointError::corrupt(path, "no Tessera metadata (is it a plain weights file?)")
        })?;
        let expected = info
            .get(CHECKSUM_KEY)
            .ok_or_else(|| CheckpointError::corrupt(path, "no checksum"))?;
        let mut views = st.tensors();
        views.sort_by(|a, b| a.0.cmp(&b.0));
        let mut h = Sha256::new();
        h.update(meta_text.as_bytes());
        for (name, v) in &views {
            hash_tensor(&mut h, name, v.dtype(), v.shape(), v.data());
        }
        let actual = hex(&h.finalize());
        if &actual != expected {
            return Err(CheckpointError::corrupt(
                path,
                format!("checksum mismatch (stored {expected}, computed {actual})"),
            ));
        }
        let meta: Meta = serde_json::from_str(meta_text)
            .map_err(|e| CheckpointError::corrupt(path, format!("bad metadata: {e}")))?;
        if meta.format != FORMAT_VERSION {
            return Err(CheckpointError::corrupt(
                path,
                format!(
                    "checkpoint format {} (written by Tessera {}); this Tessera reads format {FORMAT_VERSION}",
                    meta.format, meta.tessera_version
                ),
            ));
        }
        let mut tensors = Vec::with_capacity(views.len());
        for (name, v) in views {
            let kind = kind_of(v.dtype()).ok_or_else(|| {
                CheckpointError::corrupt(
                    path,
                    format!("`{name}` has unsupported dtype {:?}", v.dtype()),
                )
            })?;
            let shape: Vec<i64> = v.shape().iter().map(|&d| d as i64).collect();
            let t = Tensor::f_from_data_size(v.data(), &shape, kind)
                .map_err(|e| CheckpointError::corrupt(path, format!("`{name}`: {e}")))?;
            tensors.push((name, t));
        }
        Ok(Checkpoint { meta, tensors })
    }

    /// Reads and verifies the checkpoint at `path`.
    pub fn read(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
            path: path.to_owned(),
            source,
        })?;
        Checkpoint::from_bytes(&bytes, path)
    }

    /// Writes the checkpoint to `path` atomically; returns the number of bytes written.
    pub fn write(&self, path: &Path) -> Result<u64, CheckpointError> {
        let bytes = self.to_bytes()?;
        write_atomic_with_pause(path, &bytes).map_err(|source| CheckpointError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(bytes.len() as u64)
    }
}

/// Temporary files of interrupted writes start with this.
const TMP_PREFIX: &str = ".tmp-";

fn write_atomic_with_pause(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "checkpoint".to_owned());
    let tmp = dir.join(format!("{TMP_PREFIX}{name}.{}", std::process::id()));
    let result = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        if let Some(ms) = std::env::var(PAUSE_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = File::open(dir) {
            d.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The file name of the checkpoint taken at `t`.
pub fn file_name(t: &Timestamp) -> String {
    format!("ep{}-ba{}.{EXTENSION}", t.epoch, t.batch)
}

/// `(epoch, batch)` of a checkpoint file name written by [`file_name`].
pub fn parse_file_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(&format!(".{EXTENSION}"))?;
    let (ep, ba) = stem.split_once('-')?;
    let ep = ep.strip_prefix("ep")?.parse().ok()?;
    let ba = ba.strip_prefix("ba")?.parse().ok()?;
    Some((ep, ba))
}

/// The checkpoints in `folder`, newest (highest batch, then epoch) first. Temporary files and
/// the `latest` link are not listed.
pub fn list(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut found: Vec<((u64, u64), PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (ep, ba) = parse_file_name(&name)?;
            Some(((ba, ep), e.path()))
        })
        .collect();
    found.sort_by_key(|(key, _)| std::cmp::Reverse(*key));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The newest checkpoint in `folder` that reads and verifies; corrupt or partial ones are
/// skipped with a warning. `None` when there is none.
pub fn latest_good(folder: &Path) -> Option<(PathBuf, Checkpoint)> {
    for path in list(folder) {
        match Checkpoint::read(&path) {
            Ok(c) => return Some((path, c)),
            Err(e) => tracing::warn!("skipping checkpoint: {e}"),
        }
    }
    None
}

/// Points `folder/latest.ckpt` at `target` (a file in `folder`), atomically.
pub fn update_latest(folder: &Path, target: &Path) -> std::io::Result<()> {
    let name = target
        .file_name()
        .ok_or_else(|| std::io::Error::other("checkpoint path has no file name"))?;
    let link = folder.join(LATEST);
    let tmp = folder.join(format!("{TMP_PREFIX}{LATEST}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    #[cfg(unix)]
    std::os::unix::fs::symlink(name, &tmp)?;
    #[cfg(not(unix))]
    std::fs::copy(target, &tmp)?;
    std::fs::rename(&tmp, &link)?;
    if let Ok(d) = File::open(folder) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Deletes all but the newest `keep` checkpoints in `folder` (0 keeps all), never `current`.
/// Returns the deleted files.
pub fn prune(folder: &Path, keep: usize, current: &Path) -> Vec<PathBuf> {
    if keep == 0 {
        return Vec::new();
    }
    let mut deleted = Vec::new();
    for path in list(folder).into_iter().skip(keep) {
        if path == current {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => deleted.push(path),
            Err(e) => tracing::warn!("cannot delete old checkpoint {}: {e}", path.display()),
        }
    }
    deleted
}

/// Removes temporary files left by writes that were interrupted (by another process id).
pub fn remove_stale_temporaries(folder: &Path) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    let own = format!(".{}", std::process::id());
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(TMP_PREFIX) && !name.ends_with(&own) {
            tracing::info!(
                "removing {} (left by an interrupted checkpoint write)",
                e.path().display()
            );
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The methods' random stream as metadata.
pub fn rng_meta(rng: &rand_chacha::ChaCha8Rng) -> RngMeta {
    RngMeta {
        seed: hex(&rng.get_seed()),
        stream: rng.get_stream(),
        word_pos: rng.get_word_pos().to_string(),
    }
}

/// The random stream saved by [`rng_meta`].
pub fn rng_from_meta(m: &RngMeta) -> Result<rand_chacha::ChaCha8Rng, String> {
    use rand_chacha::rand_core::SeedableRng;
    if m.seed.len() != 64 {
        return Err(format!("bad RNG seed {:?}", m.seed));
    }
    let mut seed = [0u8; 32];
    for (i, b) in seed.iter_mut().enumerate() {
        *b = u8::from_str_radix(&m.seed[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("bad RNG seed {:?}", m.seed))?;
    }
    let word_pos: u128 = m
        .word_pos
        .parse()
        .map_err(|_| format!("bad RNG position {:?}", m.word_pos))?;
    let mut rng = rand_chacha::ChaCha8Rng::from_seed(seed);
    rng.set_stream(m.stream);
    rng.set_word_pos(word_pos);
    Ok(rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;
    use rand_chacha::rand_core::SeedableRng;

    fn sample() -> Checkpoint {
        Checkpoint {
            meta: Meta {
                format: FORMAT_VERSION,
                tessera_version: "test".into(),
                libtorch_version: "x".into(),
                created_unix: 1,
                run_name: "r".into(),
                timestamp: Timestamp {
                    batch: 7,
                    epoch: 1,
                    ..Default::default()
                },
                batches_per_epoch: 5,
                optimizer: OptimizerMeta {
                    algorithm: "sgd".into(),
                    lr: 0.1,
                    initial_lr: 0.2,
                    steps: 7,
                    members: vec!["w".into()],
                },
                rng: rng_meta(&rand_chacha::ChaCha8Rng::seed_from_u64(3)),
                trainer: TrainerMeta {
                    train_seconds: 1.5,
                    evals: vec![],
                    last_eval_batch: None,
                    running_batches: 2,
                    metrics_bytes: 10,
                    disabled: vec![],
                    skipped_steps: 0,
                },
                methods: vec![],
                config: serde_json::json!({"seed": 1}),
            },
            tensors: vec![
                (
                    "model/w".into(),
                    Tensor::from_slice(&[1.5f32, -2.0, 3.25]).view([3, 1]),
                ),
                ("model/n".into(), Tensor::from_slice(&[4i64])),
                ("method/x/__bytes__".into(), Tensor::from_slice::<u8>(&[])),
            ],
        }
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tessera-ckpt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn round_trip_is_exact() {
        let c = sample();
        let bytes = c.to_bytes().unwrap();
        let back = Checkpoint::from_bytes(&bytes, Path::new("x.ckpt")).unwrap();
        assert_eq!(back.meta, c.meta);
        assert_eq!(back.tensors.len(), 3);
        for (name, t) in &c.tensors {
            let b = back.tensor(name).unwrap();
            assert_eq!(b.kind(), t.kind());
            assert_eq!(b.size(), t.size());
            assert!(b.equal(t), "{name}");
        }
    }

    #[test]
    fn every_flipped_byte_or_truncation_is_detected() {
        let bytes = sample().to_bytes().unwrap();
        for i in (0..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            let r = Checkpoint::from_bytes(&bad, Path::new("x.ckpt"));
            assert!(r.is_err(), "flip at {i} of {} not detected", bytes.len());
        }
        for len in [0, 8, bytes.len() / 2, bytes.len() - 1] {
            let e = Checkpoint::from_bytes(&bytes[..len], Path::new("x.ckpt"))
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("x.ckpt") && e.contains("corrupt"), "{e}");
        }
    }

    #[test]
    fn rng_state_round_trips_mid_stream() {
        let mut a = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for _ in 0..13 {
            a.next_u32();
        }
        let mut b = rng_from_meta(&rng_meta(&a)).unwrap();
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn listing_latest_and_pruning() {
        let dir = temp_dir("list");
        let c = sample();
        for (ep, ba) in [(0, 2), (0, 4), (1, 6)] {
            let t = Timestamp {
                epoch: ep,
                batch: ba,
                ..Default::default()
            };
            let p = dir.join(file_name(&t));
            c.write(&p).unwrap();
            update_latest(&dir, &p).unwrap();
        }
        std::fs::write(dir.join(".tmp-ep9-ba99.ckpt.1"), b"partial").unwrap();
        let names: Vec<String> = list(&dir)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["ep1-ba6.ckpt", "ep0-ba4.ckpt", "ep0-ba2.ckpt"]);
        assert_eq!(
            std::fs::read_link(dir.join(LATEST)).unwrap(),
            Path::new("ep1-ba6.ckpt")
        );
        // A truncated newest file is skipped in favour of the previous one.
        let newest = dir.join("ep1-ba6.ckpt");
        let bytes = std::fs::read(&newest).unwrap();
        std::fs::write(&newest, &bytes[..bytes.len() / 3]).unwrap();
        let (path, _) = latest_good(&dir).unwrap();
        assert_eq!(path, dir.join("ep0-ba4.ckpt"));
        let deleted = prune(&dir, 1, &newest);
        assert_eq!(deleted.len(), 2);
        remove_stale_temporaries(&dir);
        assert!(!dir.join(".tmp-ep9-ba99.ckpt.1").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Hostile inputs and the fuzzer's seeds: every file reads or fails naming itself; the
    /// seeds (real checkpoints) read.
    #[test]
    fn fuzz_regressions_and_seed_corpus() {
        let mut checked = 0;
        for (folder, path) in crate::test_support::files_in(&[
            "tests/fuzz_regressions/checkpoint",
            "fuzz/corpus/checkpoint",
        ]) {
            let bytes = std::fs::read(&path).unwrap();
            let seed = folder.ends_with("fuzz/corpus/checkpoint")
                && path.extension().is_some_and(|e| e == "ckpt");
            match Checkpoint::from_bytes(&bytes, &path) {
                Ok(_) => assert!(
                    !folder.ends_with("tests/fuzz_regressions/checkpoint"),
                    "{path:?} was read"
                ),
                Err(e) => {
                    assert!(!seed, "seed {path:?}: {e}");
                    let name = path.display().to_string();
                    assert!(e.to_string().contains(&name), "{e}");
                }
            }
            checked += 1;
        }
        assert!(checked >= 6, "only {checked} files checked");
    }

    #[test]
    fn names_parse() {
        assert_eq!(parse_file_name("ep3-ba120.ckpt"), Some((3, 120)));
        assert_eq!(parse_file_name("latest.ckpt"), None);
        assert_eq!(parse_file_name("ep3-ba120.ckpt.partial"), None);
    }
}
