//! `[model]` sizes of the zoo's other transformers: GPT-2's, BERT's (GPT-2's keys and its own)
//! and a ViT's.

use crate::config::data::DataConfig;
use crate::config::error::{ConfigError, ErrorKind};
use crate::config::reader::{Bounds, Tbl};
use crate::model::{BertConfig, BertHead, Gpt2Config, VitConfig};

/// A ViT's sizes: each key given, else the name's (timm's); `embed_dim` must be a multiple of
/// `num_heads`. Whether the images fit `patch_size` is checked when the model is built (the
/// images' size comes from the data and its transforms).
pub(super) fn vit(m: &Tbl<'_>, mut c: VitConfig) -> Result<VitConfig, ConfigError> {
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
pub(super) fn gpt2(m: &Tbl<'_>, classes: usize) -> Result<Gpt2Config, ConfigError> {
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

/// bert's sizes: each key given, else BERT-base's ([`BertConfig::default`]); `n_embd` must be a
/// multiple of `n_head`; a masked LM's `vocab_size` at least the data's `classes` (its
/// vocabulary). The head follows the data unless given: a classifier of labelled text, else a
/// masked LM; the other one is refused.
pub(super) fn bert(
    m: &Tbl<'_>,
    classes: usize,
    data: &DataConfig,
) -> Result<BertConfig, ConfigError> {
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
