//! Where the model comes from: a run's checkpoint (or trainer.toml), rebuilt as `tessera eval`
//! rebuilds it (its recorded config, its plugins and their surgery, its weights), with the run's
//! tokenizer; or a Hugging Face `save_pretrained` folder (config.json, model.safetensors or
//! shards, tokenizer.json) of a llama-family or gpt2 model.

use std::path::Path;

use serde_json::Value;

use crate::model::{
    load_init_weights, Attr, Gpt2Config, InputShape, LlamaConfig, Model, ModelConfig, ModelName,
};
use crate::trainer::{standalone_config, Trainer};

use super::text::TextCodec;
use super::GenerateError;

/// The root kinds of the causal language models generation runs.
const CAUSAL_LMS: [&str; 2] = ["llama_for_causal_lm", "gpt2_lm_head_model"];

/// A causal language model ready to generate, with what generation needs to know of it.
pub struct LanguageModel {
    holder: Holder,
    /// The tokenizer, when the source has one.
    pub codec: Option<TextCodec>,
    /// The ids that end a sequence.
    pub eos: Vec<i64>,
    /// The longest sequence the model takes (`None`: unbounded).
    pub context: Option<i64>,
    /// Rows of the logits.
    pub vocab_size: i64,
    /// What was loaded, for messages.
    pub description: String,
}

/// Who owns the model: the rebuilt run (whose plugins' code it may call) or nobody else.
enum Holder {
    Run(Box<Trainer>),
    Folder(Model),
}

impl std::fmt::Debug for LanguageModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LanguageModel")
            .field("description", &self.description)
            .field("eos", &self.eos)
            .field("context", &self.context)
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

impl LanguageModel {
    /// Loads `source`: a Hugging Face folder (it has a `config.json`), else a checkpoint or a
    /// trainer.toml, with `overrides` (`--set`) applied to the run's config. `device`:
    /// `train.device`'s syntax (`auto`, `cpu`, `cuda`, `cuda:N`); `None`: the run's own (a
    /// folder: `auto`).
    pub fn load(
        source: &Path,
        device: Option<&str>,
        overrides: &[String],
    ) -> Result<LanguageModel, GenerateError> {
        if source.join("config.json").is_file() {
            if !overrides.is_empty() {
                return Err(GenerateError::Invalid(format!(
                    "--set applies to a run's config; {} is a Hugging Face folder",
                    source.display()
                )));
            }
            return load_folder(source, device.unwrap_or("auto"));
        }
        if source.is_dir() {
            return Err(GenerateError::Invalid(format!(
                "{} is a folder without a config.json: give a checkpoint (.ckpt), a \
                 trainer.toml or a Hugging Face save_pretrained folder",
                source.display()
            )));
        }
        load_run(source, device, overrides)
    }

    /// The model.
    pub fn model(&self) -> &Model {
        match &self.holder {
            Holder::Run(trainer) => trainer.model(),
            Holder::Folder(model) => model,
        }
    }
}

/// A run rebuilt from its checkpoint (or trainer.toml) with its methods.
fn load_run(
    source: &Path,
    device: Option<&str>,
    overrides: &[String],
) -> Result<LanguageModel, GenerateError> {
    let mut overrides = overrides.to_vec();
    if let Some(d) = device {
        overrides.push(format!("train.device={d}"));
    }
    let config = standalone_config(source, &overrides)?;
    let trainer = Trainer::standalone(config, Vec::new())?;
    let codec = trainer.tokenizer_path().map(TextCodec::load).transpose()?;
    // The end-of-document token the run's token stream put after every document.
    let eos = match trainer.tokenizer_path() {
        Some(path) => vec![i64::from(crate::data::TextTokenizer::load(path)?.eos_id())],
        None => Vec::new(),
    };
    let model = trainer.model();
    let description = format!("{} ({})", source.display(), model.root.kind());
    let (context, vocab_size) = check_causal_lm(model, source)?;
    Ok(LanguageModel {
        holder: Holder::Run(Box::new(trainer)),
        codec,
        eos,
        context,
        vocab_size,
        description,
    })
}

/// A Hugging Face `save_pretrained` folder.
fn load_folder(dir: &Path, device: &str) -> Result<LanguageModel, GenerateError> {
    let config_path = dir.join("config.json");
    let json = read_json(&config_path)?.unwrap_or(Value::Null);
    let invalid = |e: String| GenerateError::Invalid(format!("{}: {e}", config_path.display()));
    let model_type = json
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let mut config = match model_type.as_str() {
        "llama" | "mistral" | "qwen2" => {
            let llama = LlamaConfig::from_hf_config(&json).map_err(invalid)?;
            ModelConfig {
                llama: Some(llama),
                ..ModelConfig::new(ModelName::Llama, 0)
            }
        }
        "gpt2" => {
            let gpt2 = Gpt2Config::from_hf_config(&json).map_err(invalid)?;
            ModelConfig {
                gpt2: Some(gpt2),
                ..ModelConfig::new(ModelName::Gpt2, 0)
            }
        }
        other => {
            return Err(invalid(format!(
                "`model_type` {other:?}: `tessera generate` runs llama-family (llama, mistral, \
                 qwen2) and gpt2 causal language models"
            )))
        }
    };
    let vocab = json
        .get("vocab_size")
        .and_then(Value::as_u64)
        .ok_or_else(|| invalid("`vocab_size` is missing".to_owned()))?;
    config.num_classes = vocab as usize;
    let device: crate::device::Device = device
        .parse()
        .map_err(|e| GenerateError::Invalid(format!("--device: {e}")))?;
    let device = device.resolve()?;
    let input = InputShape {
        channels: 1,
        height: 1,
        width: 1,
    };
    let model = Model::build(&config, input, vocab as i64, device)?;
    load_init_weights(&model, config.name, dir, &[], true)?;
    let tokenizer = dir.join("tokenizer.json");
    let codec = if tokenizer.is_file() {
        Some(TextCodec::load(&tokenizer)?)
    } else {
        None
    };
    // generation_config.json's end tokens, else config.json's, else the tokenizer's
    // end-of-document token.
    let generation = read_json(&dir.join("generation_config.json"))?;
    let mut eos = generation
        .as_ref()
        .map(eos_ids)
        .filter(|ids| !ids.is_empty())
        .unwrap_or_else(|| eos_ids(&json));
    if eos.is_empty() && tokenizer.is_file() {
        if let Ok(t) = crate::data::TextTokenizer::load(&tokenizer) {
            eos.push(i64::from(t.eos_id()));
        }
    }
    let (context, vocab_size) = check_causal_lm(&model, dir)?;
    Ok(LanguageModel {
        description: format!("{} ({model_type})", dir.display()),
        holder: Holder::Folder(model),
        codec,
        eos,
        context,
        vocab_size,
    })
}

/// The JSON file at `path`, `None` when there is none.
fn read_json(path: &Path) -> Result<Option<Value>, GenerateError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| GenerateError::Invalid(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| GenerateError::Invalid(format!("{} is not JSON: {e}", path.display())))
}

/// `eos_token_id` of a Hugging Face config: one id or a list.
fn eos_ids(json: &Value) -> Vec<i64> {
    match json.get("eos_token_id") {
        Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(Value::Array(ids)) => ids.iter().filter_map(Value::as_i64).collect(),
        _ => Vec::new(),
    }
}

/// Refuses a model that is not a causal language model; returns its context (the longest
/// sequence it takes, `None` when unbounded) and its vocabulary.
fn check_causal_lm(model: &Model, source: &Path) -> Result<(Option<i64>, i64), GenerateError> {
    let kind = model.root.kind();
    if !CAUSAL_LMS.contains(&kind) {
        return Err(GenerateError::Invalid(format!(
            "{}: the model (`{kind}`) is not a causal language model; `tessera generate` runs \
             gpt2 and llama models",
            source.display()
        )));
    }
    let layers = model.root.walk();
    let int = |path: &str, kind: &str, key: &str| {
        layers
            .iter()
            .find(|l| l.path == path && l.kind == kind)
            .and_then(|l| match l.attrs.get(key) {
                Some(Attr::Int(n)) => Some(*n),
                _ => None,
            })
    };
    let context = int("model", "llama_model", "max_position_embeddings")
        .or_else(|| int("transformer.wpe", "embedding", "num_embeddings"));
    let vocab = int("", kind, "vocab_size").ok_or_else(|| {
        GenerateError::Invalid(format!(
            "{}: the model has no `vocab_size`",
            source.display()
        ))
    })?;
    Ok((context, vocab))
}
