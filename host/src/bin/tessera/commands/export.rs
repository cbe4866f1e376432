//! `tessera export`: a checkpoint's model as a plain safetensors file for PyTorch.

use std::path::PathBuf;

use tessera::trainer;

use crate::Exit;

/// What `--to` receives.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// One safetensors file (PyTorch's names).
    Safetensors,
    /// A Hugging Face folder: `model.safetensors`, `config.json` and, for text, the tokenizer the
    /// run encoded it with (its own trained BPE or your file) as `tokenizer.json` (gpt2, llama,
    /// bert).
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

pub fn run(args: Args) -> anyhow::Result<Exit> {
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
    Ok(Exit::SUCCESS)
}

/// `--format peft`: the run's LoRA adapters as a PEFT adapter folder.
fn export_peft(checkpoint: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<Exit> {
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
    Ok(Exit::SUCCESS)
}

/// `--format hf`: the model as `DIR/model.safetensors`, its Hugging Face `config.json` and the
/// run's `tokenizer.json` (when it trained with one). The config is checked before anything is
/// written.
fn export_hf(checkpoint: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<Exit> {
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
    let tokenizer = copy_tokenizer(&ckpt, dir)?;
    if !s.kept.is_empty() {
        let kinds: std::collections::BTreeSet<&str> =
            s.kept.iter().map(|(_, k)| k.as_str()).collect();
        eprintln!(
            "warning: {} plugin module(s) ({}) stay in the exported network: transformers' {} \
             does not have them, so from_pretrained will report their tensors as unexpected and \
             compute the plain model",
            s.kept.len(),
            kinds.into_iter().collect::<Vec<_>>().join(", "),
            config["architectures"][0].as_str().unwrap_or("model")
        );
    }
    println!(
        "exported {} tensors ({} parameters) to {} as a Hugging Face folder ({}config.json, model.safetensors{}): {}.from_pretrained loads it",
        s.tensors,
        s.parameters,
        dir.display(),
        config["architectures"][0]
            .as_str()
            .map(|a| format!("{a}: "))
            .unwrap_or_default(),
        if tokenizer { ", tokenizer.json" } else { "" },
        match config["architectures"][0].as_str() {
            Some("BertForMaskedLM") => "AutoModelForMaskedLM",
            Some("BertForSequenceClassification") => "AutoModelForSequenceClassification",
            _ => "AutoModelForCausalLM",
        }
    );
    Ok(Exit::SUCCESS)
}

/// Copies the tokenizer the run encoded its text with (its own trained BPE or the user's file,
/// as the checkpoint recorded it) to `DIR/tokenizer.json` when it is still there unchanged;
/// warns, copying nothing, when it is gone or changed. Returns whether it was copied.
fn copy_tokenizer(
    ckpt: &tessera::checkpoint::Checkpoint,
    dir: &std::path::Path,
) -> anyhow::Result<bool> {
    use anyhow::Context;
    let recorded = ckpt.meta.trainer.tokenizer.clone().or_else(|| {
        // Checkpoints before the tokenizer was recorded: the configured file, unverified.
        let path = ckpt.meta.config.pointer("/data/text/tokenizer")?.as_str()?;
        Some(tessera::checkpoint::TokenizerFile {
            path: PathBuf::from(path),
            sha256: String::new(),
        })
    });
    let Some(t) = recorded else {
        return Ok(false);
    };
    let bytes = match std::fs::read(&t.path) {
        Ok(bytes) => bytes,
        Err(e) => {
            eprintln!(
                "warning: the run's tokenizer {} cannot be read ({e}); the folder has no \
                 tokenizer.json (copy it there yourself)",
                t.path.display()
            );
            return Ok(false);
        }
    };
    if !t.sha256.is_empty() && tessera::files::sha256_hex(&bytes) != t.sha256 {
        eprintln!(
            "warning: the run's tokenizer {} changed since the run read it (sha256 {} then); \
             the folder has no tokenizer.json",
            t.path.display(),
            t.sha256
        );
        return Ok(false);
    }
    let to = dir.join("tokenizer.json");
    tessera::files::write_atomic(&to, &bytes)
        .with_context(|| format!("writing {}", to.display()))?;
    Ok(true)
}
