//! `tessera data pack`: writes an image folder, a registry dataset or text files as MDS or
//! WebDataset shards, one split per folder (`train/`, `val/`), readable by Tessera
//! (`dataset = "mds"` / `"wds"`) and by MosaicML Streaming's `StreamingDataset` and
//! `webdataset`.
//!
//! Columns (MDS) and fields (WebDataset): images as `x` (MDS: `jpeg` or `png` holding the image
//! files' bytes as they are, or for a registry dataset `png` or `ndarray:uint8:H,W[,C]`) and
//! `jpg`/`png` (WebDataset), class labels as `y` (`int`) and `cls` (decimal text), text as `text`
//! (`str`) and `txt`.

use std::fs;
use std::path::{Path, PathBuf};

use super::{mds, wds, ShardFormat};
use crate::data::staging::StagedFolder;
use crate::data::{DataError, ImageDataset, Split};

/// What to pack.
#[derive(Debug)]
pub enum PackSource<'a> {
    /// An image folder (`train/CLASS/*`, `val/CLASS/*`): files stored as they are.
    Folder(&'a Path),
    /// A registry dataset in memory.
    Registry(&'a Split),
    /// Text documents per split: (train, val).
    Text(Vec<String>, Vec<String>),
}

/// How a registry dataset's pixels are stored in MDS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelEncoding {
    /// PNG files (`png`).
    Png,
    /// Raw `uint8` arrays (`ndarray:uint8:H,W` or `H,W,C`).
    NdArray,
}

/// How to pack.
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// MDS or WebDataset.
    pub format: ShardFormat,
    /// MDS only: `zstd` or `zstd:LEVEL`.
    pub compression: Option<String>,
    /// Bytes per shard at most (a sample larger than that gets a shard of its own).
    pub shard_size: u64,
    /// Registry datasets, MDS only: how pixels are stored.
    pub pixels: PixelEncoding,
}

/// What [`pack`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackSummary {
    /// The finished folder.
    pub path: PathBuf,
    /// Samples written per split (train, val).
    pub samples: [usize; 2],
    /// Shards written per split.
    pub shards: [usize; 2],
}

/// One sample to write: an image file or raw pixels with a label, or a text.
enum Item {
    File {
        bytes: Vec<u8>,
        jpeg: bool,
        label: i64,
    },
    Pixels {
        png: Vec<u8>,
        raw: Vec<u8>,
        label: i64,
    },
    Text(String),
}

/// Writes `source` as shards at `dst` (which must not exist, or be empty): under a temporary
/// name beside it, renamed when complete.
pub fn pack(
    source: &PackSource<'_>,
    dst: &Path,
    options: &PackOptions,
) -> Result<PackSummary, DataError> {
    if options.compression.is_some() && options.format == ShardFormat::Wds {
        return Err(DataError::Invalid(
            "--compression applies to MDS; WebDataset shards are plain tar files".into(),
        ));
    }
    if options.shard_size == 0 {
        return Err(DataError::Invalid(
            "the shard size must be at least 1 byte".into(),
        ));
    }
    let staging = StagedFolder::new(dst, "pack")?;
    let mut samples = [0usize; 2];
    let mut shards = [0usize; 2];
    for (i, part) in ["train", "val"].into_iter().enumerate() {
        let dir = staging.path().join(part);
        fs::create_dir_all(&dir).map_err(|e| DataError::io(&dir, e))?;
        let items = items(source, i == 0)?;
        samples[i] = items.len();
        shards[i] = write_split(&dir, items, source, options)?;
    }
    staging.finish()?;
    Ok(PackSummary {
        path: dst.to_path_buf(),
        samples,
        shards,
    })
}

/// The samples of one split, as an iterator that reads files as it goes.
fn items<'a>(
    source: &'a PackSource<'_>,
    train: bool,
) -> Result<Box<dyn ExactSizeIterator<Item = Result<Item, DataError>> + 'a>, DataError> {
    Ok(match source {
        PackSource::Folder(root) => {
            let config = crate::data::FolderConfig::new(1);
            let (t, v) = crate::data::ImageFolder::open_split(root, &config)?;
            let part = if train { t } else { v };
            let files: Vec<(PathBuf, i64)> = part
                .files()
                .iter()
                .cloned()
                .zip(part.labels().iter().copied())
                .collect();
            Box::new(files.into_iter().map(|(path, label)| {
                let bytes = fs::read(&path).map_err(|e| DataError::io(&path, e))?;
                let jpeg = matches!(image::guess_format(&bytes), Ok(image::ImageFormat::Jpeg));
                Ok(Item::File { bytes, jpeg, label })
            }))
        }
        PackSource::Registry(split) => {
            let d: &ImageDataset = if train { &split.train } else { &split.test };
            Box::new((0..d.len()).map(move |i| {
                let pixels = d
                    .sample(i)
                    .ok_or_else(|| DataError::Invalid(format!("sample {i} is missing")))?;
                let raw = interleaved(pixels, d.channels);
                let png = encode_png(&raw, d.channels, d.width, d.height)?;
                Ok(Item::Pixels {
                    png,
                    raw,
                    label: d.labels[i],
                })
            }))
        }
        PackSource::Text(t, v) => {
            let docs = if train { t } else { v };
            Box::new(docs.iter().map(|d| Ok(Item::Text(d.clone()))))
        }
    })
}

fn write_split(
    dir: &Path,
    items: Box<dyn ExactSizeIterator<Item = Result<Item, DataError>> + '_>,
    source: &PackSource<'_>,
    options: &PackOptions,
) -> Result<usize, DataError> {
    let limit = usize::try_from(options.shard_size).unwrap_or(usize::MAX);
    match options.format {
        ShardFormat::Mds => {
            let image = match source {
                // One encoding per column: `jpeg` when every file is a JPEG, else `png` when
                // every one is a PNG, else `bytes` (Tessera decodes all three).
                PackSource::Folder(root) => Some(folder_encoding(root)?),
                PackSource::Registry(split) => Some(match options.pixels {
                    PixelEncoding::Png => mds::Encoding::Png,
                    PixelEncoding::NdArray => {
                        let d = &split.train;
                        let mut shape = vec![d.height, d.width];
                        if d.channels != 1 {
                            shape.push(d.channels);
                        }
                        mds::Encoding::NdArray {
                            dtype: Some(mds::Dtype::U8),
                            shape: Some(shape),
                        }
                    }
                }),
                PackSource::Text(..) => None,
            };
            let columns = match &image {
                Some(e) => vec![
                    ("x".to_string(), e.clone()),
                    ("y".to_string(), mds::Encoding::Int),
                ],
                None => vec![("text".to_string(), mds::Encoding::Str)],
            };
            let mut writer = mds::Writer::new(dir, columns, options.compression.clone(), limit)?;
            for item in items {
                let values = match item? {
                    Item::File { bytes, label, .. } => vec![bytes, label.to_le_bytes().to_vec()],
                    Item::Pixels { png, raw, label } => {
                        let x = if options.pixels == PixelEncoding::Png {
                            png
                        } else {
                            raw
                        };
                        vec![x, label.to_le_bytes().to_vec()]
                    }
                    Item::Text(t) => vec![t.into_bytes()],
                };
                writer.write(&values)?;
            }
            writer.finish()
        }
        ShardFormat::Wds => {
            let mut writer = wds::Writer::new(dir, "shard", options.shard_size);
            let width = items
                .len()
                .saturating_sub(1)
                .max(1)
                .to_string()
                .len()
                .max(8);
            for (i, item) in items.enumerate() {
                let key = format!("{i:0width$}");
                match item? {
                    Item::File { bytes, jpeg, label } => {
                        let ext = if jpeg { "jpg" } else { "png" };
                        let cls = label.to_string();
                        writer.write(&key, &[(ext, &bytes), ("cls", cls.as_bytes())])?;
                    }
                    Item::Pixels { png, label, .. } => {
                        let cls = label.to_string();
                        writer.write(&key, &[("png", &png), ("cls", cls.as_bytes())])?;
                    }
                    Item::Text(t) => writer.write(&key, &[("txt", t.as_bytes())])?,
                }
            }
            writer.finish()
        }
    }
}

/// The MDS encoding of an image folder's files: `jpeg` if all are JPEGs, `png` if all are PNGs,
/// else `bytes`.
fn folder_encoding(root: &Path) -> Result<mds::Encoding, DataError> {
    let config = crate::data::FolderConfig::new(1);
    let (t, v) = crate::data::ImageFolder::open_split(root, &config)?;
    let (mut jpeg, mut png) = (0usize, 0usize);
    for path in t.files().iter().chain(v.files()) {
        let mut head = [0u8; 16];
        let n = {
            use std::io::Read as _;
            let mut f = fs::File::open(path).map_err(|e| DataError::io(path, e))?;
            f.read(&mut head).map_err(|e| DataError::io(path, e))?
        };
        match image::guess_format(&head[..n]) {
            Ok(image::ImageFormat::Jpeg) => jpeg += 1,
            Ok(image::ImageFormat::Png) => png += 1,
            _ => {}
        }
    }
    let total = t.len() + v.len();
    Ok(if jpeg == total {
        mds::Encoding::Jpeg
    } else if png == total {
        mds::Encoding::Png
    } else {
        mds::Encoding::Bytes
    })
}

/// C×H×W planes as H×W×C (the same bytes for one channel).
fn interleaved(pixels: &[u8], channels: usize) -> Vec<u8> {
    if channels == 1 {
        return pixels.to_vec();
    }
    let plane = pixels.len() / channels;
    (0..plane)
        .flat_map(|i| (0..channels).map(move |c| pixels[c * plane + i]))
        .collect()
}

fn encode_png(
    raw: &[u8],
    channels: usize,
    width: usize,
    height: usize,
) -> Result<Vec<u8>, DataError> {
    let color = match channels {
        1 => image::ExtendedColorType::L8,
        3 => image::ExtendedColorType::Rgb8,
        c => {
            return Err(DataError::Invalid(format!(
                "only 1- or 3-channel images can be written as PNG, not {c}"
            )))
        }
    };
    let mut out = Vec::new();
    image::ImageEncoder::write_image(
        image::codecs::png::PngEncoder::new(&mut out),
        raw,
        width as u32,
        height as u32,
        color,
    )
    .map_err(|e| DataError::Invalid(format!("encoding a PNG: {e}")))?;
    Ok(out)
}
