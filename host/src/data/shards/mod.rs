//! Sharded streaming datasets: MosaicML Streaming's MDS folders and WebDataset tar shards,
//! read as a [`SampleSource`] of images and class labels, ordered shard-block by shard-block
//! ([`order`]), and written by `tessera data pack` ([`pack`]).
//!
//! A dataset root holds one split per folder (`train/`, `val/`, or the names set in
//! `[data.shards]`): for MDS an `index.json` with its shard files, for WebDataset `*.tar` files
//! (or a brace pattern such as `train-{000000..000009}.tar`). Images are decoded as image
//! folders' are (shorter side resized, centre crop, 1 or 3 channels).

pub mod cache;
pub mod mds;
pub mod order;
pub mod pack;
pub mod s3;
pub mod wds;

use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::decode::DecodePlan;
use super::source::{RawSample, SampleData, SampleSource};
use super::{DataError, FolderConfig, OnBadFile};

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
    /// Opens the split `split` (a folder, or a WebDataset brace pattern) under `root`.
    pub fn open(
        root: &Path,
        split: &str,
        format: ShardFormat,
        config: &ShardsConfig,
    ) -> Result<Sharded, DataError> {
        let spec = root.join(split);
        let backend = match format {
            ShardFormat::Mds => open_mds(&spec, config)?,
            ShardFormat::Wds => open_wds(&spec, config)?,
        };
        Sharded::from_backend(spec.display().to_string(), backend, config)
    }

    /// Opens the MDS split `split` of a remote dataset, read through `cache`: its
    /// `index.json` is fetched now, its shards when read (and ahead of that).
    pub fn open_remote(
        cache: &Arc<cache::ShardCache>,
        split: &str,
        format: ShardFormat,
        config: &ShardsConfig,
    ) -> Result<Sharded, DataError> {
        let split = split.trim_matches('/');
        let remote = cache.remote();
        if format == ShardFormat::Wds {
            return Err(DataError::Invalid(format!(
                "{}: WebDataset shards are read from local folders only (their sample counts need a scan of every tar); use MDS shards (`tessera data pack --format mds`) for a remote dataset",
                remote.url(split)
            )));
        }
        let index_key = format!("{split}/{}", mds::INDEX);
        let text = remote.get(&index_key)?;
        let index_url = PathBuf::from(remote.url(&index_key));
        let index = mds::Index::parse(&text, &index_url)?;
        let columns = mds_columns(&index, &index_url, config)?;
        let wants = index
            .shards
            .iter()
            .map(|s| {
                let stored = s.stored();
                cache::Want {
                    key: format!("{split}/{}", stored.basename),
                    bytes: stored.bytes,
                    sha256: stored.hashes.get("sha256").cloned(),
                }
            })
            .collect();
        let block = config.shuffle_block.max(1);
        let store = Store::Cached(cache::CachedShards::new(
            Arc::clone(cache),
            wants,
            block,
            config.prefetch_shards.unwrap_or(2 * block),
        ));
        let backend = Backend::Mds {
            store,
            shards: index.shards,
            columns,
        };
        Sharded::from_backend(remote.url(split), backend, config)
    }

    fn from_backend(
        name: String,
        backend: Backend,
        config: &ShardsConfig,
    ) -> Result<Sharded, DataError> {
        let sizes: Vec<usize> = match &backend {
            Backend::Mds { shards, .. } => shards.iter().map(|s| s.samples).collect(),
            Backend::Wds { samples, .. } => samples.iter().map(Vec::len).collect(),
        };
        let mut starts = Vec::with_capacity(sizes.len());
        let mut total = 0usize;
        for &s in &sizes {
            starts.push(total);
            total += s;
        }
        if total == 0 {
            return Err(DataError::format(Path::new(&name), "holds no samples"));
        }
        Ok(Sharded {
            name,
            backend,
            sizes,
            starts,
            config: config.clone(),
            plan: config.images.eval_plan(),
            resident: Mutex::new(Vec::new()),
        })
    }

    /// The training and evaluation splits of `root`: training images decoded by the training
    /// plan (`random_resized_crop`, `color_jitter`), evaluation ones by the evaluation plan.
    pub fn open_split(
        root: &Path,
        format: ShardFormat,
        config: &ShardsConfig,
    ) -> Result<(Sharded, Sharded), DataError> {
        if let Some(url) = root.to_str().filter(|s| is_remote(s)) {
            return Sharded::open_s3(url, format, config);
        }
        let mut train = Sharded::open(root, &config.train, format, config)?;
        train.plan = config.images.train_plan();
        let val = Sharded::open(root, &config.val, format, config)?;
        Ok((train, val))
    }

    /// The training and evaluation splits of the S3 dataset `url` (`s3://bucket/prefix`),
    /// read through one shard cache (`cache_dir`, or a folder named after the URL under
    /// `<data cache>/shards/`).
    fn open_s3(
        url: &str,
        format: ShardFormat,
        config: &ShardsConfig,
    ) -> Result<(Sharded, Sharded), DataError> {
        if format == ShardFormat::Wds {
            return Err(DataError::Invalid(format!(
                "{url}: WebDataset shards are read from local folders only (their sample counts need a scan of every tar); use MDS shards (`tessera data pack --format mds`) for a remote dataset"
            )));
        }
        let remote: Arc<dyn cache::Remote> = Arc::new(s3::S3Remote::new(url)?);
        let dir = config
            .cache_dir
            .clone()
            .unwrap_or_else(|| default_remote_cache(&super::default_cache_root(), url));
        let cache = cache::ShardCache::new(remote, &dir, config.cache_limit)?;
        tracing::info!(
            "shards of {url} are cached in {} (at most {} bytes, [data.shards] cache_limit)",
            dir.display(),
            config.cache_limit
        );
        let mut train = Sharded::open_remote(&cache, &config.train, format, config)?;
        train.plan = config.images.train_plan();
        let val = Sharded::open_remote(&cache, &config.val, format, config)?;
        Ok((train, val))
    }

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

/// An image as stored in a shard, before decoding.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageData {
    /// An image file (JPEG or PNG).
    Encoded(Vec<u8>),
    /// Raw 8-bit pixels: width, height, channels (1, 3 or 4), interleaved.
    Raw {
        /// Width.
        width: u32,
        /// Height.
        height: u32,
        /// Channels per pixel.
        channels: u8,
        /// `width × height × channels` bytes.
        data: Vec<u8>,
    },
}

impl ImageData {
    /// The image of an MDS column value.
    pub fn from_mds(encoding: &mds::Encoding, bytes: &[u8]) -> Result<ImageData, String> {
        use mds::Encoding as E;
        match encoding {
            E::Jpeg | E::Png | E::Bytes => Ok(ImageData::Encoded(bytes.to_vec())),
            E::Pil => {
                let (mode, width, height, raw) = mds::parse_pil(bytes)?;
                let channels = match mode.as_str() {
                    "L" => 1,
                    "RGB" => 3,
                    "RGBA" => 4,
                    other => {
                        return Err(format!(
                            "pil mode `{other}` is not supported (L, RGB, RGBA are)"
                        ))
                    }
                };
                Ok(ImageData::Raw {
                    width,
                    height,
                    channels,
                    data: raw.to_vec(),
                })
            }
            E::NdArray { .. } => match mds::decode_value(encoding, bytes)? {
                mds::Value::Array {
                    dtype: mds::Dtype::U8,
                    shape,
                    data,
                } => {
                    let (h, w, c) = match shape[..] {
                        [h, w] => (h, w, 1),
                        [h, w, c] if matches!(c, 1 | 3 | 4) => (h, w, c),
                        _ => {
                            return Err(format!(
                                "an ndarray image must be H×W or H×W×C (C = 1, 3, 4), got {shape:?}"
                            ))
                        }
                    };
                    Ok(ImageData::Raw {
                        width: u32::try_from(w).map_err(|_| "image too wide")?,
                        height: u32::try_from(h).map_err(|_| "image too tall")?,
                        channels: c as u8,
                        data,
                    })
                }
                mds::Value::Array { dtype, .. } => Err(format!(
                    "an ndarray image must be uint8, got {}",
                    dtype.name()
                )),
                _ => Err("not an ndarray".into()),
            },
            other => Err(format!(
                "encoding `{}` does not hold an image (jpeg, png, pil, ndarray:uint8 or bytes do)",
                other.name()
            )),
        }
    }

    /// The image as an encoded file the loader decodes: stored files as they are, raw pixels
    /// (`pil`, `ndarray`) as a quickly compressed PNG, so every image takes the same decode path
    /// (crops, jitter) as image folders' do.
    pub fn into_encoded(self) -> Result<Vec<u8>, String> {
        match self {
            ImageData::Encoded(bytes) => Ok(bytes),
            ImageData::Raw {
                width,
                height,
                channels,
                data,
            } => {
                let color = match channels {
                    1 => image::ExtendedColorType::L8,
                    3 => image::ExtendedColorType::Rgb8,
                    _ => image::ExtendedColorType::Rgba8,
                };
                let expected = width as usize * height as usize * usize::from(channels);
                if data.len() != expected {
                    return Err(format!(
                        "{width}x{height}x{channels} pixels are {expected} bytes, got {}",
                        data.len()
                    ));
                }
                let mut out = Vec::with_capacity(expected / 2 + 64);
                let encoder = image::codecs::png::PngEncoder::new_with_quality(
                    &mut out,
                    image::codecs::png::CompressionType::Fast,
                    image::codecs::png::FilterType::NoFilter,
                );
                image::ImageEncoder::write_image(encoder, &data, width, height, color)
                    .map_err(|e| format!("re-encoding raw pixels: {e}"))?;
                Ok(out)
            }
        }
    }
}

/// Per shard of `index` (read from `index_path`): the indices of the image and label columns.
fn mds_columns(
    index: &mds::Index,
    index_path: &Path,
    config: &ShardsConfig,
) -> Result<Vec<(usize, usize)>, DataError> {
    let mut columns = Vec::with_capacity(index.shards.len());
    for (i, s) in index.shards.iter().enumerate() {
        let find = |name: &str, key: &str| {
            s.columns
                .iter()
                .position(|c| c.name == name)
                .ok_or_else(|| {
                    let names: Vec<&str> = s.columns.iter().map(|c| c.name.as_str()).collect();
                    DataError::format(
                        index_path,
                        format!(
                        "shard {i} has no column `{name}` ([data.shards] {key}); its columns: {}",
                        names.join(", ")
                    ),
                    )
                })
        };
        let (image, label) = (find(&config.image, "image")?, find(&config.label, "label")?);
        let wrong = |column: &mds::Column, key: &str, holds: &str| {
            DataError::format(
                index_path,
                format!(
                    "shard {i}: column `{}` ([data.shards] {key}) has encoding `{}`, which does \
                     not hold {holds}",
                    column.name,
                    column.encoding.name()
                ),
            )
        };
        use mds::Encoding as E;
        let c = &s.columns[image];
        if !matches!(
            c.encoding,
            E::Jpeg | E::Png | E::Bytes | E::Pil | E::NdArray { .. }
        ) {
            return Err(wrong(
                c,
                "image",
                "an image (jpeg, png, pil, ndarray:uint8 or bytes do)",
            ));
        }
        let c = &s.columns[label];
        // An ndarray label holds one value; one whose encoding fixes a larger shape cannot.
        let one_value = |shape: &Option<Vec<usize>>| {
            shape
                .as_ref()
                .is_none_or(|d| d.iter().product::<usize>() == 1)
        };
        if !matches!(&c.encoding, E::Int | E::Scalar(_) | E::StrNumber | E::Str)
            && !matches!(&c.encoding, E::NdArray { shape, .. } if one_value(shape))
        {
            return Err(wrong(
                c,
                "label",
                "an integer label (int, an integer scalar such as int64, str_int, str or a \
                 one-value ndarray do)",
            ));
        }
        columns.push((image, label));
    }
    Ok(columns)
}

fn open_mds(dir: &Path, config: &ShardsConfig) -> Result<Backend, DataError> {
    let index = mds::Index::read(dir)?;
    let columns = mds_columns(&index, &dir.join(mds::INDEX), config)?;
    for s in &index.shards {
        let stored = s.stored();
        let path = dir.join(&stored.basename);
        let meta = std::fs::metadata(&path).map_err(|e| DataError::io(&path, e))?;
        if meta.len() != stored.bytes {
            return Err(DataError::format(
                &path,
                format!(
                    "is {} bytes where index.json says {}: an incomplete or replaced shard",
                    meta.len(),
                    stored.bytes
                ),
            ));
        }
    }
    Ok(Backend::Mds {
        store: Store::Folder(dir.to_path_buf()),
        shards: index.shards,
        columns,
    })
}

fn open_wds(spec: &Path, config: &ShardsConfig) -> Result<Backend, DataError> {
    let paths = wds::shard_paths(spec)?;
    let images: Vec<String> = config
        .image
        .split(';')
        .map(|s| s.trim().to_string())
        .collect();
    let labels = vec![config.label.clone()];
    let mut samples = Vec::with_capacity(paths.len());
    for path in &paths {
        let scanned = wds::scan(path)?;
        let mut shard = Vec::with_capacity(scanned.len());
        for s in scanned {
            let missing = |what: &str, key: &str| {
                let have: Vec<&str> = s.fields.iter().map(|f| f.0.as_str()).collect();
                DataError::format(
                    path,
                    format!(
                        "sample `{}` has no {what} field `{key}` ([data.shards] {what}); its fields: {}",
                        s.key,
                        have.join(", ")
                    ),
                )
            };
            let (extension, image) = s
                .field(&images)
                .ok_or_else(|| missing("image", &config.image))?;
            let (_, label) = s
                .field(&labels)
                .ok_or_else(|| missing("label", &config.label))?;
            shard.push((extension.to_string(), image, label));
        }
        samples.push(shard);
    }
    Ok(Backend::Wds { paths, samples })
}

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
