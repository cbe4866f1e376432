//! BERT's sizes (`BertConfig`), its two heads, and Hugging Face's init of its weights.

use serde::Serialize;
use tch::{nn::Init, TchError};

use crate::model::layers::{Attr, Linear};
use crate::model::ParamStore;

/// Hugging Face's `initializer_range`: the standard deviation of every weight's normal init.
pub(super) const INIT_STD: f64 = 0.02;

/// What BERT is trained for: which head sits on the encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BertHead {
    /// `BertForMaskedLM`: logits over the vocabulary at every position.
    MaskedLm,
    /// `BertForSequenceClassification`: the pooled `[CLS]` state to class logits.
    Classification,
}

impl BertHead {
    /// Every head with the name used in `trainer.toml` (`[model] head`).
    pub const CHOICES: [(&'static str, BertHead); 2] = [
        ("masked_lm", BertHead::MaskedLm),
        ("classification", BertHead::Classification),
    ];

    /// The name used in `trainer.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            BertHead::MaskedLm => "masked_lm",
            BertHead::Classification => "classification",
        }
    }
}

/// BERT's sizes (`[model]` keys, named as gpt2's; Hugging Face's names in brackets). The
/// defaults are BERT-base's: 12 layers, 12 heads, 768 features, 3072 inner features, 512
/// positions, 2 token types, layer-norm epsilon 1e-12.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BertConfig {
    /// Encoder layers (`n_layer`; `num_hidden_layers`).
    pub n_layer: usize,
    /// Attention heads (`n_head`; `num_attention_heads`); divides `n_embd`.
    pub n_head: usize,
    /// Width (`n_embd`; `hidden_size`).
    pub n_embd: usize,
    /// Inner width of the feed-forward (`n_inner`; `intermediate_size`).
    pub n_inner: usize,
    /// The most tokens a sequence may have (`n_positions`; `max_position_embeddings`).
    pub n_positions: usize,
    /// Rows of the word embedding (`vocab_size`); `None`: the data's vocabulary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    /// Rows of the token-type embedding (`type_vocab_size`).
    pub type_vocab_size: usize,
    /// The epsilon of every layer norm (`layer_norm_epsilon`; `layer_norm_eps`).
    pub layer_norm_epsilon: f64,
    /// The head (`head`).
    pub head: BertHead,
}

impl Default for BertConfig {
    fn default() -> Self {
        BertConfig {
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            n_inner: 3072,
            n_positions: 512,
            vocab_size: None,
            type_vocab_size: 2,
            layer_norm_epsilon: 1e-12,
            head: BertHead::MaskedLm,
        }
    }
}

/// normal(0, 0.02), Hugging Face's init of every BERT weight.
pub(super) fn normal() -> Init {
    crate::model::zoo::transformer::normal(INIT_STD)
}

/// A linear layer with Hugging Face's BERT init (normal(0, 0.02) weight, zero bias).
pub(super) fn linear(
    store: &mut ParamStore,
    path: &str,
    in_features: i64,
    out_features: i64,
) -> Result<Linear, TchError> {
    Linear::with_init(store, path, in_features, out_features, normal())
}

pub(super) fn config_attrs(c: &BertConfig, vocab_size: i64) -> Vec<(&'static str, Attr)> {
    vec![
        ("vocab_size", Attr::Int(vocab_size)),
        ("n_positions", Attr::Int(c.n_positions as i64)),
        ("n_embd", Attr::Int(c.n_embd as i64)),
        ("n_inner", Attr::Int(c.n_inner as i64)),
        ("n_layer", Attr::Int(c.n_layer as i64)),
        ("n_head", Attr::Int(c.n_head as i64)),
        ("type_vocab_size", Attr::Int(c.type_vocab_size as i64)),
        ("layer_norm_epsilon", Attr::Float(c.layer_norm_epsilon)),
    ]
}
