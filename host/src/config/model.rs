//! `[model]`: the architecture and its sizes, or a TorchScript file made in PyTorch.

use std::path::{Path, PathBuf};

use super::data::DataConfig;
use super::error::{ConfigError, ErrorKind};
use super::reader::{quote_list, Bounds, Tbl};
use super::required_table;
use super::section::{section, Section};
use crate::model::{
    BertConfig, BertHead, Gpt2Config, InitWeights, LlamaConfig, ModelConfig, ModelName, Norm,
    RopeScaling, TorchscriptFile, VitConfig,
};

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
    let names: Vec<&str> = ModelName::CHOICES.iter().map(|(n, _)| *n).collect();
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
        (None, Some(_)) => {
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
            ModelConfig::torchscript(torchscript_file(&m)?, classes)
        }
        (_, None) => {
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
            ModelConfig::new(name, classes)
        }
    };
    let mut model = model.read_keys(&m)?;
    model.init = init_weights(&m)?;
    if model.name == ModelName::Gpt2 {
        model.gpt2 = Some(gpt2(&m, classes)?);
    }
    if model.name == ModelName::Bert {
        model.bert = Some(bert(&m, classes, data)?);
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
        model.llama = Some(llama(&m, classes)?);
    }
    if let Some(sizes) = model.name.vit_sizes() {
        model.vit = Some(vit(&m, sizes)?);
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

/// A ViT's sizes: each key given, else the name's (timm's); `embed_dim` must be a multiple of
/// `num_heads`. Whether the images fit `patch_size` is checked when the model is built (the
/// images' size comes from the data and its transforms).
fn vit(m: &Tbl<'_>, mut c: VitConfig) -> Result<VitConfig, ConfigError> {
    for (key, field) in [
        ("embed_dim", &mut c.embed_dim),
        ("depth", &mut c.depth),
        ("num_heads", &mut c.num_heads),
        ("patch_size", &mut c.patch_size),
    ] {
        if let Some(v) = m.uint(key, 1)? {
            *field = v;
        }
    }
    if !c.embed_dim.is_multiple_of(c.num_heads) {
        let key = if m.entry("embed_dim").is_some() {
            "embed_dim"
        } else {
            "num_heads"
        };
        return Err(m.err(
            key,
            ErrorKind::InvalidValue,
            format!(
                "`embed_dim` ({}) must be a multiple of `num_heads` ({}): each head gets \
                 embed_dim / num_heads features",
                c.embed_dim, c.num_heads
            ),
        ));
    }
    Ok(c)
}

/// gpt2's sizes: each key given, else GPT-2 small's ([`Gpt2Config::default`]); `n_embd` must be
/// a multiple of `n_head` and `vocab_size` at least the data's `classes` (its vocabulary).
fn gpt2(m: &Tbl<'_>, classes: usize) -> Result<Gpt2Config, ConfigError> {
    let mut c = Gpt2Config::default();
    for (key, field) in [
        ("n_layer", &mut c.n_layer),
        ("n_head", &mut c.n_head),
        ("n_embd", &mut c.n_embd),
        ("n_positions", &mut c.n_positions),
    ] {
        if let Some(v) = m.uint(key, 1)? {
            *field = v;
        }
    }
    c.vocab_size = m.uint("vocab_size", 1)?;
    if let Some(v) = m.bool("tie_embeddings")? {
        c.tie_embeddings = v;
    }
    if let Some(v) = m.float("layer_norm_epsilon", Bounds::POSITIVE)? {
        c.layer_norm_epsilon = v;
    }
    if !c.n_embd.is_multiple_of(c.n_head) {
        let key = if m.entry("n_embd").is_some() {
            "n_embd"
        } else {
            "n_head"
        };
        return Err(m.err(
            key,
            ErrorKind::InvalidValue,
            format!(
                "`n_embd` ({}) must be a multiple of `n_head` ({}): each head gets n_embd / \
                 n_head features",
                c.n_embd, c.n_head
            ),
        ));
    }
    if let Some(v) = c.vocab_size.filter(|v| *v < classes) {
        return Err(m.err(
            "vocab_size",
            ErrorKind::InvalidValue,
            format!("must be >= {classes} (the tokens of the data's vocabulary), got {v}"),
        ));
    }
    Ok(c)
}

/// llama's sizes: those of the `config` file (a Hugging Face `config.json`) if given, else
/// SmolLM-135M's ([`LlamaConfig::default`]), each key given overriding them; checked against
/// each other and the data's vocabulary (`classes`), errors naming the key.
fn llama(m: &Tbl<'_>, classes: usize) -> Result<LlamaConfig, ConfigError> {
    let mut c = match m.path("config")? {
        Some(given) => {
            let path = absolute(&given);
            let invalid = |msg: String| m.err("config", ErrorKind::InvalidValue, msg);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| invalid(format!("{} is not JSON: {e}", path.display())))?;
            LlamaConfig::from_hf_config(&json)
                .map_err(|e| invalid(format!("{}: {e}", path.display())))?
        }
        None => LlamaConfig::default(),
    };
    for (key, field) in [
        ("num_hidden_layers", &mut c.num_hidden_layers),
        ("hidden_size", &mut c.hidden_size),
        ("intermediate_size", &mut c.intermediate_size),
        ("num_attention_heads", &mut c.num_attention_heads),
        ("max_position_embeddings", &mut c.max_position_embeddings),
    ] {
        if let Some(v) = m.uint(key, 1)? {
            *field = v;
        }
    }
    for (key, field) in [
        ("num_key_value_heads", &mut c.num_key_value_heads),
        ("head_dim", &mut c.head_dim),
        ("vocab_size", &mut c.vocab_size),
    ] {
        if let Some(v) = m.uint(key, 1)? {
            *field = Some(v);
        }
    }
    for (key, field) in [
        ("tie_embeddings", &mut c.tie_embeddings),
        ("attention_bias", &mut c.attention_bias),
    ] {
        if let Some(v) = m.bool(key)? {
            *field = v;
        }
    }
    if let Some(v) = m.bool("o_bias")? {
        c.o_bias = Some(v);
    }
    // Query heads given without key/value heads: one key/value head each (Hugging Face's
    // default), not the default model's grouping.
    if m.entry("num_attention_heads").is_some()
        && m.entry("num_key_value_heads").is_none()
        && m.entry("config").is_none()
    {
        c.num_key_value_heads = None;
    }
    for (key, field) in [
        ("rms_norm_eps", &mut c.rms_norm_eps),
        ("rope_theta", &mut c.rope_theta),
        ("initializer_range", &mut c.initializer_range),
    ] {
        if let Some(v) = m.float(key, Bounds::POSITIVE)? {
            *field = v;
        }
    }
    const SCALING: [&str; 4] = [
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ];
    if let Some(t) = m.sub("rope_scaling", Some(&SCALING))? {
        let mut v = [0.0; 4];
        for (key, slot) in SCALING.iter().zip(&mut v) {
            *slot = t
                .float(key, Bounds::POSITIVE)?
                .ok_or_else(|| t.missing(key, "a number > 0 (Llama 3's rope_scaling)"))?;
        }
        if v[2] <= v[1] {
            return Err(t.err(
                "high_freq_factor",
                ErrorKind::InvalidValue,
                format!("must be > low_freq_factor ({}), got {}", v[1], v[2]),
            ));
        }
        c.rope_scaling = Some(RopeScaling {
            factor: v[0],
            low_freq_factor: v[1],
            high_freq_factor: v[2],
            original_max_position_embeddings: v[3],
        });
    }
    let (heads, kv) = (c.num_attention_heads, c.kv_heads());
    if !heads.is_multiple_of(kv) {
        return Err(m.err(
            if m.entry("num_key_value_heads").is_some() {
                "num_key_value_heads"
            } else {
                "num_attention_heads"
            },
            ErrorKind::InvalidValue,
            format!(
                "`num_key_value_heads` ({kv}) must divide `num_attention_heads` ({heads}): \
                 each key/value head serves a group of query heads"
            ),
        ));
    }
    if c.head_dim.is_none() && !c.hidden_size.is_multiple_of(heads) {
        return Err(m.err(
            "hidden_size",
            ErrorKind::InvalidValue,
            format!(
                "`hidden_size` ({}) must be a multiple of `num_attention_heads` ({heads}), or \
                 give `head_dim`",
                c.hidden_size
            ),
        ));
    }
    if !c.head_width().is_multiple_of(2) {
        return Err(m.err(
            if m.entry("head_dim").is_some() {
                "head_dim"
            } else {
                "hidden_size"
            },
            ErrorKind::InvalidValue,
            format!(
                "a head's width ({}) must be even: the rotary positions turn pairs of features",
                c.head_width()
            ),
        ));
    }
    if let Some(v) = c.vocab_size.filter(|v| *v < classes) {
        return Err(m.err(
            if m.entry("vocab_size").is_some() {
                "vocab_size"
            } else {
                "config"
            },
            ErrorKind::InvalidValue,
            format!(
                "`vocab_size` must be >= {classes} (the tokens of the data's vocabulary), got {v}"
            ),
        ));
    }
    Ok(c)
}

/// bert's sizes: each key given, else BERT-base's ([`BertConfig::default`]); `n_embd` must be a
/// multiple of `n_head`; a masked LM's `vocab_size` at least the data's `classes` (its
/// vocabulary). The head follows the data unless given: a classifier of labelled text, else a
/// masked LM; the other one is refused.
fn bert(m: &Tbl<'_>, classes: usize, data: &DataConfig) -> Result<BertConfig, ConfigError> {
    let mut c = BertConfig::default();
    let labelled = data.dataset.is_labelled_text();
    if labelled {
        c.head = BertHead::Classification;
    }
    for (key, field) in [
        ("n_layer", &mut c.n_layer),
        ("n_head", &mut c.n_head),
        ("n_embd", &mut c.n_embd),
        ("n_inner", &mut c.n_inner),
        ("n_positions", &mut c.n_positions),
        ("type_vocab_size", &mut c.type_vocab_size),
    ] {
        if let Some(v) = m.uint(key, 1)? {
            *field = v;
        }
    }
    c.vocab_size = m.uint("vocab_size", 1)?;
    if let Some(v) = m.float("layer_norm_epsilon", Bounds::POSITIVE)? {
        c.layer_norm_epsilon = v;
    }
    if let Some(head) = m.choice("head", "BERT head", &BertHead::CHOICES)? {
        c.head = head;
    }
    let paired = data.text.as_ref().and_then(|t| t.pair_field.as_deref());
    if let (Some(field), true) = (paired, c.type_vocab_size < 2) {
        return Err(m.err(
            "type_vocab_size",
            ErrorKind::InvalidValue,
            format!(
                "sentence pairs (data.text.pair_field = {field:?}) have token types 0 and 1, \
                 but the model has {} token type (type_vocab_size = 2 or more)",
                c.type_vocab_size
            ),
        ));
    }
    if !c.n_embd.is_multiple_of(c.n_head) {
        let key = if m.entry("n_embd").is_some() {
            "n_embd"
        } else {
            "n_head"
        };
        return Err(m.err(
            key,
            ErrorKind::InvalidValue,
            format!(
                "`n_embd` ({}) must be a multiple of `n_head` ({}): each head gets n_embd / \
                 n_head features",
                c.n_embd, c.n_head
            ),
        ));
    }
    match (c.head, labelled) {
        (BertHead::MaskedLm, false) => {
            if let Some(v) = c.vocab_size.filter(|v| *v < classes) {
                return Err(m.err(
                    "vocab_size",
                    ErrorKind::InvalidValue,
                    format!("must be >= {classes} (the tokens of the data's vocabulary), got {v}"),
                ));
            }
        }
        (BertHead::Classification, true) => {}
        (BertHead::MaskedLm, true) => {
            return Err(m.err(
                "head",
                ErrorKind::InvalidValue,
                format!(
                    "a masked LM predicts tokens, but dataset {:?} gives class labels: use \
                     head = \"classification\" (the default for it), or a text corpus with \
                     [data.mlm]",
                    data.dataset.as_str()
                ),
            ))
        }
        (BertHead::Classification, false) => {
            return Err(m.err(
                "head",
                ErrorKind::InvalidValue,
                format!(
                    "a classifier needs class labels, but dataset {:?} is a token stream: use \
                     dataset = \"labelled-text\", or head = \"masked_lm\" (the default for it) \
                     with [data.mlm]",
                    data.dataset.as_str()
                ),
            ))
        }
    }
    Ok(c)
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
