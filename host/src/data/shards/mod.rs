//! Sharded streaming datasets: MosaicML Streaming's MDS folders and WebDataset tar shards,
//! read as a [`SampleSource`] of images and class labels, ordered shard-block by shard-block
//! ([`order`]), and written by `tessera data pack` ([`pack`]).
//!
//! A dataset root holds one split per folder (`train/`, `val/`, or the names set in
//! `[data.shards]`): for MDS an `index.json` with its shard files, for WebDataset `*.tar` files
//! (or a brace pattern such as `train-{000000..000009}.tar`). Images are decoded as image
//! folders' are (shorter side resized, centre crop, 1 or 3 channels).

pub mod cache;
mod image_data;
pub mod mds;
mod open;
pub mod order;
pub mod pack;
pub mod s3;
mod source;
pub mod wds;

pub use image_data::ImageData;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::decode::DecodePlan;
use super::source::SampleSource;
use super::{DataError, FolderConfig};

/// The shard format of a sharded dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ShardFormat {
    /// MosaicML Streaming MDS (`index.json` + `shard.NNNNN.mds[.zstd]`).
    #[serde(rename = "mds")]
    Mds,
    /// WebDataset tar shards.
    #[serde(rename = "wds")]
    Wds,
}

impl ShardFormat {
    /// The default image column (MDS) or extensions (WebDataset, `;`-separated alternatives).
    pub fn default_image(self) -> &'static str {
        match self {
            ShardFormat::Mds => "x",
            ShardFormat::Wds => "jpg;jpeg;png",
        }
    }

    /// The default label column (MDS) or extension (WebDataset).
    pub fn default_label(self) -> &'static str {
        match self {
            ShardFormat::Mds => "y",
            ShardFormat::Wds => "cls",
        }
    }
}

/// `[data.shards]`: how the samples of a sharded dataset become images and labels.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardsConfig {
    /// The image keys, as `[data.folder]` has them (`size`, `channels`, `on_bad_file`,
    /// `eval_size`, `eval_resize`, `random_resized_crop`, `color_jitter`).
    #[serde(flatten)]
    pub images: FolderConfig,
    /// Number of classes (required): labels must lie in `0..classes`.
    pub classes: usize,
    /// The image column (MDS, default `x`) or extensions (WebDataset, default `jpg;jpeg;png`).
    pub image: String,
    /// The label column (MDS, default `y`) or extension (WebDataset, default `cls`).
    pub label: String,
    /// The training split under `data_dir` (default `train`): a folder, or for WebDataset a
    /// brace pattern of tar files.
    pub train: String,
    /// The evaluation split (default `val`).
    pub val: String,
    /// Shards whose samples are shuffled together (default 4, >= 1).
    pub shuffle_block: usize,
    /// Remote datasets: the folder their shards are cached in (default: a folder named after
    /// the URL under `<data cache>/shards/`).
    pub cache_dir: Option<PathBuf>,
    /// Remote datasets: the most bytes the cached shards take (default 10GB).
    pub cache_limit: u64,
    /// Remote datasets: shards fetched ahead of the block being read (default: two blocks,
    /// `2 × shuffle_block`).
    pub prefetch_shards: Option<usize>,
}

impl ShardsConfig {
    /// The defaults of `format` with the required `size` and `classes`.
    pub fn new(format: ShardFormat, size: usize, classes: usize) -> ShardsConfig {
        ShardsConfig {
            images: FolderConfig::new(size),
            classes,
            image: format.default_image().into(),
            label: format.default_label().into(),
            train: "train".into(),
            val: "val".into(),
            shuffle_block: 4,
            cache_dir: None,
            cache_limit: 10_000_000_000,
            prefetch_shards: None,
        }
    }
}

/// What a [`Sharded`] dataset reads its samples from.
#[derive(Debug)]
enum Backend {
    Mds {
        store: Store,
        shards: Vec<mds::Shard>,
        /// Per shard: the indices of the image and label columns.
        columns: Vec<(usize, usize)>,
    },
    Wds {
        paths: Vec<PathBuf>,
        /// Per shard, per sample: the image field's extension and member, the label member.
        samples: Vec<Vec<(String, wds::Member, wds::Member)>>,
    },
}

/// Where the shard files of an MDS split are.
#[derive(Debug)]
enum Store {
    /// A local folder, read in place.
    Folder(PathBuf),
    /// A remote, read through the shard cache.
    Cached(cache::CachedShards),
}

impl Store {
    /// Shard `shard` (`info` from the index) opened, and its name for messages.
    fn open(&self, shard: usize, info: &mds::FileInfo) -> Result<(File, PathBuf), DataError> {
        match self {
            Store::Folder(dir) => {
                let path = dir.join(&info.basename);
                let file = File::open(&path).map_err(|e| DataError::io(&path, e))?;
                Ok((file, path))
            }
            Store::Cached(c) => Ok((c.open(shard)?, c.url(shard))),
        }
    }
}

/// One split of a sharded dataset, read as a [`SampleSource`].
#[derive(Debug)]
pub struct Sharded {
    name: String,
    backend: Backend,
    /// Samples per shard, and the first global index of each shard.
    sizes: Vec<usize>,
    starts: Vec<usize>,
    config: ShardsConfig,
    /// How its images become samples.
    plan: DecodePlan,
    /// Decompressed shards (zstd MDS) recently read, most recent last.
    resident: Mutex<Vec<(usize, Arc<Vec<u8>>)>>,
}

impl Sharded {
    /// Samples per shard, in stored order.
    pub fn shard_sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The shard holding sample `index` and the sample's place in it.
    fn locate(&self, index: usize) -> Result<(usize, usize), DataError> {
        let shard = self
            .starts
            .partition_point(|&s| s <= index)
            .saturating_sub(1);
        let local = index.checked_sub(self.starts[shard]).unwrap_or(usize::MAX);
        if local >= self.sizes.get(shard).copied().unwrap_or(0) {
            return Err(DataError::Invalid(format!(
                "sample {index} is outside the {} samples of {}",
                self.len(),
                self.name
            )));
        }
        Ok((shard, local))
    }

    /// The decompressed bytes of zstd MDS shard `shard`, from memory when recently read.
    fn resident_shard(
        &self,
        shard: usize,
        store: &Store,
        info: &mds::FileInfo,
        compression: Option<&str>,
    ) -> Result<Arc<Vec<u8>>, DataError> {
        {
            let mut r = self.resident.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = r.iter().position(|(s, _)| *s == shard) {
                let entry = r.remove(at);
                let data = Arc::clone(&entry.1);
                r.push(entry);
                return Ok(data);
            }
        }
        let (mut file, path) = store.open(shard, info)?;
        let mut stored = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut stored).map_err(|e| DataError::io(&path, e))?;
        let data = Arc::new(mds::decompress(compression, stored, &path)?);
        let mut r = self.resident.lock().unwrap_or_else(|p| p.into_inner());
        // A block's shards are read together; keep two blocks' worth.
        let capacity = 2 * self.config.shuffle_block.max(1);
        while r.len() >= capacity {
            r.remove(0);
        }
        r.push((shard, Arc::clone(&data)));
        Ok(data)
    }

    /// The raw image and the label of sample `index`.
    fn read_raw(&self, index: usize) -> Result<(ImageData, i64), DataError> {
        let (shard, local) = self.locate(index)?;
        match &self.backend {
            Backend::Mds {
                store,
                shards,
                columns,
            } => {
                let s = &shards[shard];
                let (sample, path) = self.mds_sample(s, shard, local, store)?;
                let at = |e: String| DataError::format(&path, format!("sample {local}: {e}"));
                let values = mds::split_columns(&s.columns, &sample).map_err(at)?;
                let (ic, lc) = columns[shard];
                let image = ImageData::from_mds(&s.columns[ic].encoding, values[ic]).map_err(at)?;
                let label = mds::decode_value(&s.columns[lc].encoding, values[lc]).map_err(at)?;
                let label = label_of(&label)
                    .map_err(|e| at(format!("column `{}`: {e}", s.columns[lc].name)))?;
                Ok((image, self.check_label(label).map_err(at)?))
            }
            Backend::Wds { paths, samples } => {
                let path = &paths[shard];
                let (extension, image, label) = &samples[shard][local];
                let file = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
                let image_bytes = wds::read_member(&file, *image, path)?;
                let label_bytes = wds::read_member(&file, *label, path)?;
                let at = |e: String| DataError::format(path, format!("sample {local}: {e}"));
                let text = std::str::from_utf8(&label_bytes)
                    .map_err(|_| at(format!("the `{}` label is not text", self.config.label)))?;
                let label = text.trim().parse::<i64>().map_err(|_| {
                    at(format!(
                        "the `{}` label `{}` is not an integer",
                        self.config.label,
                        text.trim()
                    ))
                })?;
                let _ = extension;
                Ok((
                    ImageData::Encoded(image_bytes),
                    self.check_label(label).map_err(at)?,
                ))
            }
        }
    }

    fn check_label(&self, label: i64) -> Result<i64, String> {
        if label < 0 || label as u64 >= self.config.classes as u64 {
            return Err(format!(
                "label {label} is outside 0..{} ([data.shards] classes)",
                self.config.classes
            ));
        }
        Ok(label)
    }

    /// Every column of MDS sample `index`, decoded (images as their stored bytes); an error for
    /// WebDataset shards.
    pub fn mds_values(&self, index: usize) -> Result<Vec<(String, mds::Value)>, DataError> {
        let (shard, local) = self.locate(index)?;
        let Backend::Mds { store, shards, .. } = &self.backend else {
            return Err(DataError::Invalid(format!(
                "{} is not an MDS dataset",
                self.name
            )));
        };
        let s = &shards[shard];
        let (sample, path) = self.mds_sample(s, shard, local, store)?;
        let at = |e: String| DataError::format(&path, format!("sample {local}: {e}"));
        let values = mds::split_columns(&s.columns, &sample).map_err(at)?;
        s.columns
            .iter()
            .zip(values)
            .map(|(c, v)| {
                mds::decode_value(&c.encoding, v)
                    .map(|v| (c.name.clone(), v))
                    .map_err(|e| at(format!("column `{}`: {e}", c.name)))
            })
            .collect()
    }

    /// The bytes of sample `local` of MDS shard `shard` (in `store`), and the shard's name.
    fn mds_sample(
        &self,
        s: &mds::Shard,
        shard: usize,
        local: usize,
        store: &Store,
    ) -> Result<(Vec<u8>, PathBuf), DataError> {
        if s.zip.is_some() {
            let data = self.resident_shard(shard, store, s.stored(), s.compression.as_deref())?;
            let path = match store {
                Store::Folder(dir) => dir.join(&s.stored().basename),
                Store::Cached(c) => c.url(shard),
            };
            Ok((mds::sample_bytes(&data, local, &path)?.to_vec(), path))
        } else {
            let (file, path) = store.open(shard, s.stored())?;
            Ok((read_mds_sample(&file, &path, local)?, path))
        }
    }

    /// The label of sample `index` (reads the sample).
    pub fn label(&self, index: usize) -> Result<i64, DataError> {
        Ok(self.read_raw(index)?.1)
    }
}

/// Reads sample `local` of an uncompressed MDS shard file: its two offsets, then its bytes.
fn read_mds_sample(file: &File, path: &Path, local: usize) -> Result<Vec<u8>, DataError> {
    use std::os::unix::fs::FileExt as _;
    let mut pair = [0u8; 8];
    file.read_exact_at(&mut pair, 4 * (1 + local as u64))
        .map_err(|e| DataError::io(path, e))?;
    let begin = u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]);
    let end = u32::from_le_bytes([pair[4], pair[5], pair[6], pair[7]]);
    if end < begin {
        return Err(DataError::format(
            path,
            format!("sample {local}: offsets {begin}..{end} run backwards"),
        ));
    }
    let mut data = vec![0u8; (end - begin) as usize];
    file.read_exact_at(&mut data, u64::from(begin))
        .map_err(|e| DataError::io(path, e))?;
    Ok(data)
}

fn label_of(v: &mds::Value) -> Result<i64, String> {
    match v {
        mds::Value::Int(i) => Ok(*i),
        mds::Value::Float(f) if f.fract() == 0.0 && f.abs() < 9e15 => Ok(*f as i64),
        mds::Value::Str(s) => s
            .trim()
            .parse()
            .map_err(|_| format!("`{}` is not an integer label", s.trim())),
        mds::Value::Array { .. } => match v.as_f64s().as_slice() {
            [f] if f.fract() == 0.0 => Ok(*f as i64),
            _ => Err("an array label must hold one integer".into()),
        },
        _ => Err("not an integer label".into()),
    }
}

/// The name of the temporary a shard `path` is written to before it is renamed into place.
pub(crate) fn partial_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(
        "{}{name}.{}",
        crate::files::TMP_PREFIX,
        std::process::id()
    ))
}

/// Writes `data` to `path` atomically (a DataError naming the file on failure).
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<(), DataError> {
    crate::files::write_atomic(path, data).map_err(|e| DataError::io(path, e))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

/// The default shard cache of the remote `url` under the data cache `root`:
/// `root/shards/<the URL, its characters other than letters, digits, `.`, `-` and `_` as `_`>-<8
/// hex digits of its sha256>` (so that `s3://a/b_c` and `s3://a/b/c` differ).
pub fn default_remote_cache(root: &Path, url: &str) -> PathBuf {
    use sha2::Digest as _;
    let readable: String = url
        .trim_start_matches("s3://")
        .trim_end_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    let hash = sha2::Sha256::digest(url.trim_end_matches('/').as_bytes());
    let hex: String = hash[..4].iter().map(|b| format!("{b:02x}")).collect();
    root.join("shards").join(format!("{readable}-{hex}"))
}

/// Whether `data_dir` names a remote (`s3://bucket/prefix`) rather than a local folder.
pub fn is_remote(data_dir: &str) -> bool {
    data_dir.starts_with("s3://")
}
