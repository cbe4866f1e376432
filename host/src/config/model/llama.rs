//! `[model]` of a Llama-family model: Hugging Face's LlamaConfig keys (or its config.json),
//! `[model.rope_scaling]`, and the checks of its sizes.

use super::absolute;
use crate::config::error::{ConfigError, ErrorKind};
use crate::config::reader::{Bounds, Tbl};
use crate::model::{LlamaConfig, RopeScaling};

/// llama's sizes: those of the `config` file (a Hugging Face `config.json`) if given, else
/// SmolLM-135M's ([`LlamaConfig::default`]), each key given overriding them; checked against
/// each other and the data's vocabulary (`classes`), errors naming the key.
pub(super) fn llama(m: &Tbl<'_>, classes: usize) -> Result<LlamaConfig, ConfigError> {
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
    read_llama_keys(m, &mut c)?;
    if let Some(scaling) = rope_scaling(m)? {
        c.rope_scaling = Some(scaling);
    }
    check_llama_sizes(m, &c, classes)?;
    Ok(c)
}

/// The llama sizes given as `[model]` keys, over `c`'s.
fn read_llama_keys(m: &Tbl<'_>, c: &mut LlamaConfig) -> Result<(), ConfigError> {
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
    Ok(())
}

/// `[model.rope_scaling]`, Llama 3's: all four numbers, `high_freq_factor` above
/// `low_freq_factor`.
fn rope_scaling(m: &Tbl<'_>) -> Result<Option<RopeScaling>, ConfigError> {
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
        return Ok(Some(RopeScaling {
            factor: v[0],
            low_freq_factor: v[1],
            high_freq_factor: v[2],
            original_max_position_embeddings: v[3],
        }));
    }
    Ok(None)
}

/// Checks llama's sizes against each other and the data's vocabulary (`classes`), errors
/// naming the key.
fn check_llama_sizes(m: &Tbl<'_>, c: &LlamaConfig, classes: usize) -> Result<(), ConfigError> {
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
    Ok(())
}
