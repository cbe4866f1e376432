//! `tessera export`: a checkpoint's model as a plain safetensors file for PyTorch.

use std::path::PathBuf;
use std::process::ExitCode;

use tessera::trainer;

#[derive(clap::Args)]
pub struct Args {
    /// The checkpoint file (`.ckpt`).
    checkpoint: PathBuf,
    /// The safetensors file to write.
    #[arg(long)]
    to: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Args { checkpoint, to } = args;
    let s = trainer::export_checkpoint(&checkpoint, &to)?;
    println!(
        "exported {} tensors ({} parameters) to {}",
        s.tensors,
        s.parameters,
        s.path.display()
    );
    if !s.methods.is_empty() {
        println!(
            "the run trained with {}; train-time-only changes are folded into plain modules",
            s.methods.join(", ")
        );
        if s.kept.is_empty() {
            println!("the exported network is the plain model");
        } else {
            let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
            for (_, kind) in &s.kept {
                *kinds.entry(kind.as_str()).or_default() += 1;
            }
            let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
            println!(
                "{} plugin module(s) stay in the exported network: {} (paths in the file's `tessera.modules` metadata; scripts/pytorch_models.py builds their PyTorch twins)",
                s.kept.len(),
                kinds.join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
