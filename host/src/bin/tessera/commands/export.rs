//! `tessera export`: a checkpoint's model as a plain safetensors file for PyTorch.

use std::path::PathBuf;
use std::process::ExitCode;

use tessera::trainer;

/// What `--to` receives.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// One safetensors file (PyTorch's names).
    Safetensors,
    /// A Hugging Face folder: `model.safetensors`, `config.json` and, for text a tokenizer
    /// file trained with, `tokenizer.json` (gpt2 and llama).
    Hf,
    /// A PEFT adapter folder: `adapter_model.safetensors` and `adapter_config.json`, the
    /// low-rank adapters the `lora` plugin trained (`PeftModel.from_pretrained` loads them onto
    /// the base model).
    Peft,
}

#[derive(clap::Args)]
pub struct Args {
    /// The checkpoint file (`.ckpt`).
    checkpoint: PathBuf,
    /// The safetensors file to write (`--format hf`: the folder).
    #[arg(long)]
    to: PathBuf,
    /// `safetensors` (a file), `hf` (a folder `from_pretrained` loads; LoRA adapters merged
    /// in) or `peft` (the LoRA adapters alone, a folder PEFT loads).
    #[arg(long, value_enum, default_value = "safetensors")]
    format: Format,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Args {
        checkpoint,
        to,
        format,
    } = args;
    match format {
        Format::Hf => return export_hf(&checkpoint, &to),
        Format::Peft => return export_peft(&checkpoint, &to),
        Format::Safetensors => {}
    }
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

/// `--format peft`: the run's LoRA adapters as a PEFT adapter folder.
fn export_peft(checkpoint: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let a = trainer::export_peft(checkpoint, dir)?;
    let parameters: i64 = a.tensors.iter().map(|(_, t)| t.numel() as i64).sum();
    println!(
        "exported the LoRA adapters of {} layers ({} parameters, rank {}, target_modules {}) to {} (adapter_model.safetensors, adapter_config.json): PeftModel.from_pretrained(base_model, \"{}\") loads them",
        a.layers.len(),
        parameters,
        a.config["r"],
        a.config["target_modules"],
        dir.display(),
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `--format hf`: the model as `DIR/model.safetensors`, its Hugging Face `config.json` and the
/// run's `tokenizer.json` (when it trained with one). The config is checked before anything is
/// written.
fn export_hf(checkpoint: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let ckpt = tessera::checkpoint::Checkpoint::read(checkpoint)?;
    let model_json = ckpt.meta.config.get("model").cloned().unwrap_or_default();
    let config = tessera::hf_config::hf_config(&model_json)
        .map_err(|e| anyhow::anyhow!("{}: {e}", checkpoint.display()))?;
    if dir.is_file() {
        anyhow::bail!("{} is a file: `--format hf` writes a folder", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let s = trainer::export_checkpoint(checkpoint, &dir.join("model.safetensors"))?;
    let text = serde_json::to_string_pretty(&config)? + "\n";
    let config_path = dir.join("config.json");
    tessera::files::write_atomic(&config_path, text.as_bytes())
        .with_context(|| format!("writing {}", config_path.display()))?;
    let tokenizer = ckpt
        .meta
        .config
        .pointer("/data/text/tokenizer")
        .and_then(|v| v.as_str())
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    if let Some(t) = &tokenizer {
        let bytes = std::fs::read(t).with_context(|| format!("reading {}", t.display()))?;
        tessera::files::write_atomic(&dir.join("tokenizer.json"), &bytes)
            .with_context(|| format!("writing {}", dir.join("tokenizer.json").display()))?;
    }
    println!(
        "exported {} tensors ({} parameters) to {} as a Hugging Face folder ({}config.json, model.safetensors{}): AutoModelForCausalLM.from_pretrained loads it",
        s.tensors,
        s.parameters,
        dir.display(),
        config["architectures"][0]
            .as_str()
            .map(|a| format!("{a}: "))
            .unwrap_or_default(),
        if tokenizer.is_some() { ", tokenizer.json" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}
