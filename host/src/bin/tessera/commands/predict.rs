//! `tessera predict`: every test sample's prediction as JSON Lines.

use std::path::PathBuf;

use tessera::trainer::{self, Trainer};

use crate::Exit;

#[derive(clap::Args)]
pub struct Args {
    /// A checkpoint (`.ckpt`) or a trainer.toml.
    path: PathBuf,
    /// The predictions file to write (atomically).
    #[arg(long)]
    to: PathBuf,
    /// Override a setting (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let Args {
        path,
        to,
        overrides,
    } = args;
    let cfg = trainer::standalone_config(&path, &overrides)?;
    let mut trainer = Trainer::standalone(cfg, Vec::new())?;
    let s = trainer.predict(&to)?;
    eprintln!(
        "wrote {} predictions to {} (accuracy {:.4})",
        s.samples,
        s.path.display(),
        s.accuracy
    );
    Ok(Exit::SUCCESS)
}
