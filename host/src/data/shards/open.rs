//! Opening a sharded dataset: local MDS or WebDataset folders, remote MDS shards through the
//! cache, the training and validation splits.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::data::DataError;

use super::default_remote_cache;
use super::is_remote;
use super::{cache, mds, s3, wds, Backend, ShardFormat, Sharded, ShardsConfig, Store};

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
            .unwrap_or_else(|| default_remote_cache(&crate::data::default_cache_root(), url));
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
}
