//! `[model]`: the architecture and its sizes, or a TorchScript file made in PyTorch.

use std::path::{Path, PathBuf};

mod llama;
mod sizes;

use crate::config::data::DataConfig;
use crate::config::error::{ConfigError, ErrorKind};
use crate::config::reader::{quote_list, Bounds, Tbl};
use crate::config::required_table;
use crate::config::section::{section, Section};
use crate::model::{InitWeights, ModelConfig, ModelName, Norm, TorchscriptFile};
use llama::llama;
use sizes::{bert, gpt2, vit};

section!(ModelConfig {
    name,
    torchscript,
    sha256,
    hidden: uint_list(1),
    width: uint(1),
    num_classes: uint(1),
    dropout: float(Bounds::UNIT_OPEN),
    norm: choice("normalization", &Norm::CHOICES),
    n_layer,
    n_head,
    n_embd,
    n_positions,
    vocab_size,
    tie_embeddings,
    layer_norm_epsilon,
    num_hidden_layers,
    hidden_size,
    intermediate_size,
    num_attention_heads,
    num_key_value_heads,
    head_dim,
    max_position_embeddings,
    rms_norm_eps,
    rope_theta,
    rope_scaling,
    attention_bias,
    o_bias,
    initializer_range,
    config,
    n_inner,
    type_vocab_size,
    head,
    widths: uint_list(1),
    embed_dim,
    depth,
    num_heads,
    patch_size,
    init_weights,
    init_ignore,
    init_strict,
});

/// The `[model]` keys only BERT has ([`BertConfig`], with gpt2's shared ones), read by
/// [`bert`].
const BERT_ONLY_KEYS: [&str; 3] = ["n_inner", "type_vocab_size", "head"];

/// The `[model]` keys only llama has ([`LlamaConfig`]: Hugging Face's `LlamaConfig` names, and
/// `config`, a `config.json` to read them from), read by [`llama`].
const LLAMA_KEYS: [&str; 14] = [
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "attention_bias",
    "o_bias",
    "initializer_range",
    "config",
];

/// gpt2's keys that llama names otherwise.
const GPT2_ONLY_KEYS: [&str; 5] = [
    "n_layer",
    "n_head",
    "n_embd",
    "n_positions",
    "layer_norm_epsilon",
];

/// The `[model]` keys of a ViT's sizes ([`VitConfig`]), read by [`vit`].
const VIT_KEYS: [&str; 4] = ["embed_dim", "depth", "num_heads", "patch_size"];

/// The `[model]` keys of gpt2's sizes ([`Gpt2Config`]), read by [`gpt2`].
const GPT2_KEYS: [&str; 7] = [
    "n_layer",
    "n_head",
    "n_embd",
    "n_positions",
    "vocab_size",
    "tie_embeddings",
    "layer_norm_epsilon",
];

pub(super) fn read(top: &Tbl<'_>, data: &DataConfig) -> Result<ModelConfig, ConfigError> {
    let m = required_table(
        top,
        "model",
        ModelConfig::KEYS,
        "`name` (a zoo model) or `torchscript` (a model file)",
    )?;
    let classes = data.num_classes();
    let model = match (m.entry("name"), m.entry("torchscript")) {
        (Some(_), Some(_)) => {
            return Err(m.err_key(
                "torchscript",
                ErrorKind::InvalidValue,
                "give either `name` (a zoo model) or `torchscript` (a model file made in \
                 PyTorch), not both",
            ))
        }
        (None, Some(_)) => torchscript_model(&m, classes)?,
        (_, None) => zoo_model(&m, data, classes)?,
    };
    let model = model.read_keys(&m)?;
    with_model_tables(&m, model, data, classes)
}

/// A `[model]` of a TorchScript file: the zoo's size keys are refused.
fn torchscript_model(m: &Tbl<'_>, classes: usize) -> Result<ModelConfig, ConfigError> {
    for key in ["hidden", "width", "dropout", "norm", "widths"]
        .into_iter()
        .chain(GPT2_KEYS)
        .chain(LLAMA_KEYS)
        .chain(BERT_ONLY_KEYS)
        .chain(VIT_KEYS)
    {
        m.reject(
            key,
            &format!(
                "`{key}` applies to the zoo's models; a TorchScript model's sizes are \
                 fixed by its file"
            ),
        )?;
    }
    Ok(ModelConfig::torchscript(torchscript_file(m)?, classes))
}

/// A `[model]` of the zoo: the name (a model for the data's kind: images or text), the keys
/// that apply to another model refused.
fn zoo_model(m: &Tbl<'_>, data: &DataConfig, classes: usize) -> Result<ModelConfig, ConfigError> {
    let names: Vec<&str> = ModelName::CHOICES.iter().map(|(n, _)| *n).collect();
    m.reject("sha256", "`sha256` pins a `torchscript` model file")?;
    if m.string("name")?.as_deref() == Some(ModelName::Torchscript.as_str()) {
        return Err(m.err(
            "name",
            ErrorKind::InvalidValue,
            "a TorchScript model is named by its file: write `torchscript = \
             \"model.pt\"` instead of `name`",
        ));
    }
    let name = m
        .choice("name", "model", &ModelName::CHOICES)?
        .ok_or_else(|| {
            m.missing(
                "name",
                &format!(
                    "{} (or `torchscript = \"model.pt\"`, a model made in PyTorch)",
                    quote_list(&names)
                ),
            )
        })?;
    let text_model = matches!(name, ModelName::Gpt2 | ModelName::Bert | ModelName::Llama);
    if data.is_text() != text_model {
        let why = if data.is_text() {
            format!(
                "model {:?} takes images, but dataset {:?} is text: use name = \"gpt2\", \
                 \"llama\" or \"bert\" (or a TorchScript model that takes token ids)",
                name.as_str(),
                data.dataset.as_str()
            )
        } else {
            format!(
                "model {:?} is a language model, but dataset {:?} is images: use a \
                 text dataset (sotu, shakespeare, text, synthetic-text)",
                name.as_str(),
                data.dataset.as_str()
            )
        };
        return Err(m.err("name", ErrorKind::InvalidValue, why));
    }
    reject_other_models_keys(m, name, text_model)?;
    Ok(ModelConfig::new(name, classes))
}

/// Refuses the `[model]` keys that apply to another model than `name`, naming the models they
/// apply to.
fn reject_other_models_keys(
    m: &Tbl<'_>,
    name: ModelName,
    text_model: bool,
) -> Result<(), ConfigError> {
    if name != ModelName::Bert {
        for key in BERT_ONLY_KEYS {
            m.reject(
                key,
                &format!(
                    "`{key}` only applies to model \"bert\", not {:?}",
                    name.as_str()
                ),
            )?;
        }
    } else {
        m.reject(
            "tie_embeddings",
            "`tie_embeddings` does not apply to model \"bert\": its masked-LM decoder is \
             always the word embedding (as Hugging Face's BertForMaskedLM)",
        )?;
    }
    if !text_model {
        for key in GPT2_KEYS {
            m.reject(
                key,
                &format!(
                    "`{key}` only applies to models \"gpt2\" and \"bert\", not {:?}",
                    name.as_str()
                ),
            )?;
        }
    }
    if name != ModelName::Llama {
        for key in LLAMA_KEYS {
            m.reject(
                key,
                &format!(
                    "`{key}` only applies to model \"llama\", not {:?}",
                    name.as_str()
                ),
            )?;
        }
    } else {
        for key in GPT2_ONLY_KEYS {
            m.reject(
                key,
                "llama's sizes have Hugging Face's LlamaConfig names: \
                 `num_hidden_layers`, `num_attention_heads`, `hidden_size`, \
                 `max_position_embeddings`, `rms_norm_eps` (or `config`, a config.json)",
            )?;
        }
    }
    if name.vit_sizes().is_none() {
        for key in VIT_KEYS {
            m.reject(
                key,
                &format!(
                    "`{key}` only applies to the ViTs (\"vit_tiny\", \"vit_small\", \"vit_base\"), not {:?}",
                    name.as_str()
                ),
            )?;
        }
    } else {
        m.reject(
            "width",
            "`width` does not apply to a ViT: its sizes are `embed_dim`, `depth`, \
             `num_heads` and `patch_size`",
        )?;
    }
    if name != ModelName::Airbench {
        m.reject(
            "widths",
            &format!(
                "`widths` only applies to model \"airbench\", not {:?}",
                name.as_str()
            ),
        )?;
    } else {
        m.reject(
            "width",
            "`width` does not apply to model \"airbench\": give its three conv-group \
             widths as `widths = [64, 256, 256]`",
        )?;
    }
    if name == ModelName::Mlp {
        m.reject(
            "width",
            "`width` applies to models \"cnn\" and the resnets, not \"mlp\" (use `hidden`)",
        )?;
    } else if text_model {
        for key in ["hidden", "width", "norm"] {
            m.reject(
                key,
                &format!(
                    "`{key}` does not apply to model {:?} (a language model: its sizes \
                     are its own keys, docs/models.md)",
                    name.as_str()
                ),
            )?;
        }
    } else {
        m.reject(
            "dropout",
            &format!(
                "`dropout` only applies to model \"mlp\", not {:?}",
                name.as_str()
            ),
        )?;
        m.reject(
            "hidden",
            &format!(
                "`hidden` only applies to model \"mlp\", not {:?}",
                name.as_str()
            ),
        )?;
    }
    Ok(())
}

/// `model` with the tables of its name read (gpt2, bert, llama, a ViT), `init_weights`, and
/// the checks that need the whole `[model]`: sentence pairs only for bert, airbench's three
/// widths, the normalization the model can be built with, enough classes for the data.
fn with_model_tables(
    m: &Tbl<'_>,
    mut model: ModelConfig,
    data: &DataConfig,
    classes: usize,
) -> Result<ModelConfig, ConfigError> {
    model.init = init_weights(m)?;
    if model.name == ModelName::Gpt2 {
        model.gpt2 = Some(gpt2(m, classes)?);
    }
    if model.name == ModelName::Bert {
        model.bert = Some(bert(m, classes, data)?);
    }
    let paired = data.text.as_ref().and_then(|t| t.pair_field.as_deref());
    if let (Some(field), false) = (paired, model.name == ModelName::Bert) {
        return Err(m.err(
            "name",
            ErrorKind::InvalidValue,
            format!(
                "data.text.pair_field = {field:?} reads sentence pairs, which only bert tells \
                 apart (its token type ids); model {:?} would see one text",
                model.name.as_str()
            ),
        ));
    }
    if model.name == ModelName::Llama {
        model.llama = Some(llama(m, classes)?);
    }
    if let Some(sizes) = model.name.vit_sizes() {
        model.vit = Some(vit(m, sizes)?);
    }
    if model.name == ModelName::Airbench && model.widths.len() != 3 {
        return Err(m.err(
            "widths",
            ErrorKind::InvalidValue,
            format!(
                "airbench has three conv groups: give three widths (e.g. [64, 256, 256]), got {}",
                model.widths.len()
            ),
        ));
    }
    if let Some(norm) = model.norm {
        let allowed = Norm::choices(model.name);
        if !allowed.contains(&norm) {
            let names: Vec<&str> = allowed.iter().map(|n| n.as_str()).collect();
            return Err(m.err(
                "norm",
                ErrorKind::InvalidValue,
                format!(
                    "model {:?} can be built with {}, not {:?}",
                    model.name.as_str(),
                    quote_list(&names),
                    norm.as_str()
                ),
            ));
        }
    }
    // Labelled text's classes are known once its labels are read, and a trained BPE's
    // vocabulary once it is trained (at most `vocab_size`: a small corpus gives fewer): the
    // run records them, and a recorded config holds them.
    let known_later = data.dataset.is_text() && data.dataset != crate::data::Dataset::SyntheticText;
    if model.num_classes < classes && !known_later {
        return Err(m.err(
            "num_classes",
            ErrorKind::InvalidValue,
            format!(
                "must be >= {classes} (the classes of {}), got {}",
                data.dataset, model.num_classes
            ),
        ));
    }
    Ok(model)
}

/// `init_weights` (resolved against the file's folder, made absolute), `init_ignore` (glob
/// patterns) and `init_strict` (default true). The file is read when the run starts (a
/// resumed run, or a recorded config read elsewhere, need not have it).
fn init_weights(m: &Tbl<'_>) -> Result<Option<InitWeights>, ConfigError> {
    let Some(path) = m.path("init_weights")? else {
        for key in ["init_ignore", "init_strict"] {
            m.reject(
                key,
                &format!(
                    "`{key}` applies to `init_weights` (pretrained weights), which is not given"
                ),
            )?;
        }
        return Ok(None);
    };
    if path.as_os_str().is_empty() || m.string("init_weights")?.is_some_and(|s| s.is_empty()) {
        return Err(m.err(
            "init_weights",
            ErrorKind::InvalidValue,
            "give a safetensors file of PyTorch state_dict weights, or a Hugging Face \
             save_pretrained folder",
        ));
    }
    let ignore = m.string_list("init_ignore")?.unwrap_or_default();
    if let Err(e) = crate::model::check_init_patterns(&ignore) {
        return Err(m.err("init_ignore", ErrorKind::InvalidValue, e));
    }
    Ok(Some(InitWeights {
        path: absolute(&path),
        ignore,
        strict: m.bool("init_strict")?.unwrap_or(true),
    }))
}

/// `torchscript` (resolved against the file's folder, made absolute) and its sha256, which
/// must equal `sha256` when that is given.
fn torchscript_file(m: &Tbl<'_>) -> Result<TorchscriptFile, ConfigError> {
    let given = m.path("torchscript")?.unwrap_or_default();
    let path = absolute(&given);
    let invalid = |msg: String| m.err("torchscript", ErrorKind::InvalidValue, msg);
    if !path.is_file() {
        return Err(invalid(format!(
            "the TorchScript model {} does not exist{}",
            path.display(),
            if path.exists() { " as a file" } else { "" }
        )));
    }
    let sha256 = crate::files::sha256_file(&path)
        .map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
    if let Some(pinned) = m.string("sha256")? {
        if !pinned.eq_ignore_ascii_case(&sha256) {
            return Err(m.err(
                "sha256",
                ErrorKind::InvalidValue,
                format!(
                    "{} has sha256 {sha256}, but the config pins {pinned}: the model file \
                     changed since (restore it; in a trainer.toml, drop `sha256` to accept the \
                     new one)",
                    path.display()
                ),
            ));
        }
    }
    Ok(TorchscriptFile { path, sha256 })
}

/// `path` made absolute against the working folder (links are kept), so a recorded config
/// still finds the file from another folder.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}
