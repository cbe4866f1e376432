//! BERT (Devlin et al. 2019) as Hugging Face's `BertForMaskedLM` and
//! `BertForSequenceClassification` write it: the same module tree, parameter names, shapes,
//! initialisation and computation (post-LN encoder layers, exact GELU), so that weights map 1:1
//! to their `state_dict` and the logits agree.
//!
//! # The module tree (the contract with method plugins)
//!
//! `C` = `n_embd` (Hugging Face's `hidden_size`), `F` = `n_inner` (`intermediate_size`), `V` =
//! `vocab_size`, `P` = `n_positions` (`max_position_embeddings`), `L` = `n_layer`, `i` in
//! `0..L`:
//!
//! | path | kind | tensors (shape) |
//! | --- | --- | --- |
//! | `` (root) | `bert_for_masked_lm` or `bert_for_sequence_classification` | |
//! | `bert` | `bert_model` | |
//! | `bert.embeddings` | `bert_embeddings` | |
//! | `bert.embeddings.word_embeddings` | `embedding` | `weight` (V, C) |
//! | `bert.embeddings.position_embeddings` | `embedding` | `weight` (P, C) |
//! | `bert.embeddings.token_type_embeddings` | `embedding` | `weight` (`type_vocab_size`, C) |
//! | `bert.embeddings.LayerNorm` | `layer_norm` | `weight`, `bias` (C) |
//! | `bert.embeddings.dropout` | `dropout` | |
//! | `bert.encoder` | `bert_encoder` | |
//! | `bert.encoder.layer` | `sequential` | |
//! | `bert.encoder.layer.{i}` | `bert_layer` | |
//! | `….attention` | `bert_attention` | |
//! | `….attention.self` | `bert_self_attention` | children `query`, `key`, `value`: `linear` (C → C) |
//! | `….attention.output` | `bert_self_output` | children `dense` (`linear` C → C), `LayerNorm`, `dropout` |
//! | `….intermediate` | `bert_intermediate` | child `dense` (`linear` C → F) |
//! | `….output` | `bert_output` | children `dense` (`linear` F → C), `LayerNorm`, `dropout` |
//! | `bert.pooler` (classification) | `bert_pooler` | child `dense` (`linear` C → C) |
//! | `dropout` (classification) | `dropout` | |
//! | `classifier` (classification) | `linear` | `weight` (classes, C), `bias` |
//! | `cls` (masked LM) | `bert_only_mlm_head` | |
//! | `cls.predictions` | `bert_lm_prediction_head` | `bias` (V) |
//! | `cls.predictions.transform` | `bert_prediction_head_transform` | children `dense` (`linear` C → C), `LayerNorm` |
//! | `cls.predictions.decoder` | `tied_lm_head` | none of its own: `bert.embeddings.word_embeddings.weight` and `cls.predictions.bias` |
//!
//! What each module receives and returns (B sequences of T tokens):
//! - the root and `bert`: int64 token ids `(B, T)`; the masked-LM root returns logits
//!   `(B, T, V)`, the classifier `(B, classes)`, `bert` the last hidden states `(B, T, C)`.
//!   Token type ids are the batch's `token_type_ids` (sentence pairs: 0 on the first text, 1
//!   on the second, through [`super::mask::token_type_ids`]), else all 0 (one segment). The batch's `attention_mask` (`(B, T)`, 0 at
//!   padding), when it has one, reaches the attention through
//!   [`super::mask::attention_mask`]: padded keys get no weight, as Hugging Face's additive
//!   mask gives them.
//! - `bert.embeddings`: ids → `dropout(LayerNorm(word(ids) + token_type(types) + position(arange T)))`.
//!   While `position_embeddings` is an `embedding`, T may be at most its rows (P). The position
//!   ids `(1, T)` go to `position_embeddings`; a plugin that removes learned positions (ALiBi)
//!   replaces it, e.g. by a module returning zeros.
//! - `bert.encoder.layer.{i}`: `(B, T, C)` → `(B, T, C)`: `a = attention(x)`, then
//!   `output(cat[intermediate(a), a])`.
//! - `attention`: `output(cat[self(x), x])`.
//! - `attention.self`: `(B, T, C)` → the attention context `(B, T, C)` (the heads merged,
//!   before `attention.output.dense`): `softmax(q kᵀ / √(C/H) + mask) v` over `n_head` heads,
//!   dropout on the weights in training.
//! - `bert_self_output` and `bert_output` (Hugging Face's `BertSelfOutput(h, input)` and
//!   `BertOutput(h, input)`, whose forward takes two tensors): one tensor, the last dimension
//!   the concatenation `[h, residual]`, the residual the last C features;
//!   `LayerNorm(dropout(dense(h)) + residual)`. A plugin replacing them (GatedLinearUnits)
//!   splits its input the same way.
//! - `intermediate`: `gelu(dense(x))` (exact GELU, Hugging Face's `"gelu"`), `(B, T, F)`.
//! - `bert.pooler`: `tanh(dense(x[:, 0]))`, `(B, T, C)` → `(B, C)` (the first token, `[CLS]`).
//! - `cls.predictions`: `decoder(transform(x))`, `transform` = `LayerNorm(gelu(dense(x)))`,
//!   `decoder` = `x · word_embeddingsᵀ + bias`.
//!
//! # Tied weights
//!
//! `cls.predictions.decoder` multiplies by `bert.embeddings.word_embeddings.weight` itself and
//! adds `cls.predictions.bias`: the store holds each once; `tessera export` writes them a second
//! time as `cls.predictions.decoder.weight` and `cls.predictions.decoder.bias`, as Hugging
//! Face's `state_dict()` does, and weights come in under either name.

use serde::Serialize;
use tch::{nn::Init, Kind, TchError, Tensor};

use super::gpt2::{btc, check_sizes, embedding_rows};
use super::mask::{attention_mask, token_type_ids};
use super::{Attr, Dropout, Embedding, ExportTree, Exported, Layer, LayerNorm, Linear, Sequential};
use crate::model::{tree::join, ParamStore};

/// Hugging Face's `initializer_range`: the standard deviation of every weight's normal init.
const INIT_STD: f64 = 0.02;

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
fn normal() -> Init {
    super::gpt2::normal(INIT_STD)
}

/// A linear layer with Hugging Face's BERT init (normal(0, 0.02) weight, zero bias).
fn linear(
    store: &mut ParamStore,
    path: &str,
    in_features: i64,
    out_features: i64,
) -> Result<Linear, TchError> {
    Linear::with_init(store, path, in_features, out_features, normal())
}

/// The embeddings (Hugging Face's `BertEmbeddings`, path `bert.embeddings`), kind
/// `bert_embeddings`.
#[derive(Debug)]
pub struct BertEmbeddings {
    word_embeddings: Box<dyn Layer>,
    position_embeddings: Box<dyn Layer>,
    token_type_embeddings: Box<dyn Layer>,
    layer_norm: Box<dyn Layer>,
    dropout: Box<dyn Layer>,
}

impl Layer for BertEmbeddings {
    fn kind(&self) -> &str {
        "bert_embeddings"
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("word_embeddings", self.word_embeddings.as_ref()),
            ("position_embeddings", self.position_embeddings.as_ref()),
            ("token_type_embeddings", self.token_type_embeddings.as_ref()),
            ("LayerNorm", self.layer_norm.as_ref()),
            ("dropout", self.dropout.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "word_embeddings" => Some(&mut self.word_embeddings),
            "position_embeddings" => Some(&mut self.position_embeddings),
            "token_type_embeddings" => Some(&mut self.token_type_embeddings),
            "LayerNorm" => Some(&mut self.layer_norm),
            "dropout" => Some(&mut self.dropout),
            _ => None,
        }
    }

    fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let t = match (ids.kind(), ids.size().as_slice()) {
            (Kind::Int64, &[_, t]) => t,
            (kind, size) => {
                return Err(TchError::Shape(format!(
                    "bert: expected int64 token ids (batch, tokens), got {kind:?} {size:?}"
                )))
            }
        };
        if let Some(rows) = embedding_rows(self.position_embeddings.as_ref()) {
            if t > rows {
                return Err(TchError::Shape(format!(
                    "bert: the input has {t} tokens per sequence, more than the model's \
                     {rows} positions (`[model] n_positions`, the rows of \
                     `bert.embeddings.position_embeddings`)"
                )));
            }
        }
        let positions = Tensor::f_arange(t, (Kind::Int64, ids.device()))?.f_unsqueeze(0)?;
        // The batch's token type ids (sentence pairs), else all 0 (one segment).
        let token_types = match token_type_ids() {
            Some(types) if types.size() == ids.size() => types,
            Some(types) => {
                return Err(TchError::Shape(format!(
                    "bert: the batch's token_type_ids have shape {:?}, but the input ids {:?}",
                    types.size(),
                    ids.size()
                )))
            }
            None => ids.f_zeros_like()?,
        };
        let x = self
            .word_embeddings
            .forward(ids, train)?
            .f_add(&self.token_type_embeddings.forward(&token_types, train)?)?
            .f_add(&self.position_embeddings.forward(&positions, train)?)?;
        let x = self.layer_norm.forward(&x, train)?;
        self.dropout.forward(&x, train)
    }
}

/// The padding mask of the running forward as `scaled_dot_product_attention` takes it:
/// `(B, 1, 1, T)` booleans, true where a key may be attended; `None` without padding. A mask
/// whose shape is not the input's `(B, T)` is an error.
pub fn sdpa_key_mask(b: i64, t: i64, what: &str) -> Result<Option<Tensor>, TchError> {
    let Some(mask) = attention_mask() else {
        return Ok(None);
    };
    if mask.size() != [b, t] {
        return Err(TchError::Shape(format!(
            "{what}: the batch's attention_mask has shape {:?}, but the input has {b} sequences \
             of {t} tokens",
            mask.size()
        )));
    }
    Ok(Some(mask.f_ne(0)?.f_view([b, 1, 1, t])?))
}

/// Self-attention (Hugging Face's `BertSelfAttention`), kind `bert_self_attention`: the
/// attention context before the output projection.
#[derive(Debug)]
pub struct BertSelfAttention {
    query: Box<dyn Layer>,
    key: Box<dyn Layer>,
    value: Box<dyn Layer>,
    n_head: i64,
    n_embd: i64,
    dropout: f64,
}

impl Layer for BertSelfAttention {
    fn kind(&self) -> &str {
        "bert_self_attention"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("n_head", Attr::Int(self.n_head)),
            ("n_embd", Attr::Int(self.n_embd)),
            ("attention_probs_dropout_prob", Attr::Float(self.dropout)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("query", self.query.as_ref()),
            ("key", self.key.as_ref()),
            ("value", self.value.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "query" => Some(&mut self.query),
            "key" => Some(&mut self.key),
            "value" => Some(&mut self.value),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let (b, t, c) = btc(xs, self.n_embd, "bert self-attention")?;
        let (h, d) = (self.n_head, self.n_embd / self.n_head);
        let heads = |layer: &dyn Layer| -> Result<Tensor, TchError> {
            layer
                .forward(xs, train)?
                .f_reshape([b, t, h, d])?
                .f_transpose(1, 2)
        };
        let mask = sdpa_key_mask(b, t, "bert self-attention")?;
        let p = if train { self.dropout } else { 0.0 };
        let y = Tensor::f_scaled_dot_product_attention(
            &heads(self.query.as_ref())?,
            &heads(self.key.as_ref())?,
            &heads(self.value.as_ref())?,
            mask,
            p,
            false,
            None,
            false,
        )?;
        y.f_transpose(1, 2)?.f_contiguous()?.f_reshape([b, t, c])
    }
}

/// `LayerNorm(dropout(dense(h)) + residual)` over an input `cat[h, residual]` (Hugging Face's
/// `BertSelfOutput` and `BertOutput`, whose forward takes `h` and the residual), kinds
/// `bert_self_output` and `bert_output`.
#[derive(Debug)]
pub struct BertResidualOutput {
    dense: Box<dyn Layer>,
    layer_norm: Box<dyn Layer>,
    dropout: Box<dyn Layer>,
    kind: &'static str,
    in_features: i64,
    n_embd: i64,
}

impl BertResidualOutput {
    fn new(
        store: &mut ParamStore,
        path: &str,
        kind: &'static str,
        in_features: i64,
        config: &BertConfig,
        dropout: f64,
    ) -> Result<BertResidualOutput, TchError> {
        let c = config.n_embd as i64;
        Ok(BertResidualOutput {
            dense: Box::new(linear(store, &join(path, "dense"), in_features, c)?),
            layer_norm: Box::new(LayerNorm::with_eps(
                store,
                &join(path, "LayerNorm"),
                c,
                config.layer_norm_epsilon,
            )?),
            dropout: Box::new(Dropout::new(dropout)),
            kind,
            in_features,
            n_embd: c,
        })
    }
}

impl Layer for BertResidualOutput {
    fn kind(&self) -> &str {
        self.kind
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("in_features", Attr::Int(self.in_features)),
            ("n_embd", Attr::Int(self.n_embd)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("dense", self.dense.as_ref()),
            ("LayerNorm", self.layer_norm.as_ref()),
            ("dropout", self.dropout.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "dense" => Some(&mut self.dense),
            "LayerNorm" => Some(&mut self.layer_norm),
            "dropout" => Some(&mut self.dropout),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let (h, residual) = split_residual(xs, self.n_embd, self.kind)?;
        let y = self
            .dropout
            .forward(&self.dense.forward(&h, train)?, train)?;
        self.layer_norm.forward(&y.f_add(&residual)?, train)
    }
}

/// `cat[h, residual]` (last dimension) split into `h` and the residual (its last `n_embd`
/// features).
pub fn split_residual(xs: &Tensor, n_embd: i64, what: &str) -> Result<(Tensor, Tensor), TchError> {
    let width = xs.size().last().copied().unwrap_or(0);
    if xs.dim() != 3 || width <= n_embd {
        return Err(TchError::Shape(format!(
            "{what}: expected an input (batch, tokens, features + {n_embd}) holding [h, \
             residual], got {:?}",
            xs.size()
        )));
    }
    Ok((
        xs.f_narrow(2, 0, width - n_embd)?,
        xs.f_narrow(2, width - n_embd, n_embd)?,
    ))
}

/// Self-attention and its output (Hugging Face's `BertAttention`), kind `bert_attention`:
/// `output(cat[self(x), x])`.
#[derive(Debug)]
pub struct BertAttention {
    self_attention: Box<dyn Layer>,
    output: Box<dyn Layer>,
}

impl Layer for BertAttention {
    fn kind(&self) -> &str {
        "bert_attention"
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("self", self.self_attention.as_ref()),
            ("output", self.output.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "self" => Some(&mut self.self_attention),
            "output" => Some(&mut self.output),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let context = self.self_attention.forward(xs, train)?;
        self.output
            .forward(&Tensor::f_cat(&[&context, xs], -1)?, train)
    }
}

/// A linear layer then a fixed activation: Hugging Face's `BertIntermediate` (exact GELU, kind
/// `bert_intermediate`), `BertPooler` (tanh of the first token, kind `bert_pooler`) and
/// `BertPredictionHeadTransform` (GELU then a layer norm, kind
/// `bert_prediction_head_transform`).
#[derive(Debug)]
pub struct BertDense {
    dense: Box<dyn Layer>,
    layer_norm: Option<Box<dyn Layer>>,
    kind: &'static str,
}

impl Layer for BertDense {
    fn kind(&self) -> &str {
        self.kind
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        let mut out = vec![("dense", self.dense.as_ref())];
        if let Some(ln) = &self.layer_norm {
            out.push(("LayerNorm", ln.as_ref()));
        }
        out
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "dense" => Some(&mut self.dense),
            "LayerNorm" => self.layer_norm.as_mut(),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        match self.kind {
            "bert_pooler" => {
                if xs.dim() != 3 {
                    return Err(TchError::Shape(format!(
                        "bert pooler: expected hidden states (batch, tokens, features), got {:?}",
                        xs.size()
                    )));
                }
                self.dense.forward(&xs.f_select(1, 0)?, train)?.f_tanh()
            }
            _ => {
                let y = self.dense.forward(xs, train)?.f_gelu("none")?;
                match &self.layer_norm {
                    Some(ln) => ln.forward(&y, train),
                    None => Ok(y),
                }
            }
        }
    }
}

/// An encoder layer (Hugging Face's `BertLayer`), kind `bert_layer`:
/// `a = attention(x); output(cat[intermediate(a), a])`.
#[derive(Debug)]
pub struct BertLayer {
    attention: Box<dyn Layer>,
    intermediate: Box<dyn Layer>,
    output: Box<dyn Layer>,
    n_embd: i64,
    n_head: i64,
}

impl BertLayer {
    /// Layer `path` (`bert.encoder.layer.{i}`) of a model with `config`'s sizes.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        config: &BertConfig,
        dropout: f64,
    ) -> Result<BertLayer, TchError> {
        let c = config.n_embd as i64;
        let f = config.n_inner as i64;
        let at = |name| join(path, name);
        let self_path = at("attention.self");
        let self_attention = BertSelfAttention {
            query: Box::new(linear(store, &join(&self_path, "query"), c, c)?),
            key: Box::new(linear(store, &join(&self_path, "key"), c, c)?),
            value: Box::new(linear(store, &join(&self_path, "value"), c, c)?),
            n_head: config.n_head as i64,
            n_embd: c,
            dropout,
        };
        let attention_output = BertResidualOutput::new(
            store,
            &at("attention.output"),
            "bert_self_output",
            c,
            config,
            dropout,
        )?;
        let intermediate = BertDense {
            dense: Box::new(linear(store, &at("intermediate.dense"), c, f)?),
            layer_norm: None,
            kind: "bert_intermediate",
        };
        let output =
            BertResidualOutput::new(store, &at("output"), "bert_output", f, config, dropout)?;
        Ok(BertLayer {
            attention: Box::new(BertAttention {
                self_attention: Box::new(self_attention),
                output: Box::new(attention_output),
            }),
            intermediate: Box::new(intermediate),
            output: Box::new(output),
            n_embd: c,
            n_head: config.n_head as i64,
        })
    }
}

impl Layer for BertLayer {
    fn kind(&self) -> &str {
        "bert_layer"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("n_embd", Attr::Int(self.n_embd)),
            ("n_head", Attr::Int(self.n_head)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("attention", self.attention.as_ref()),
            ("intermediate", self.intermediate.as_ref()),
            ("output", self.output.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "attention" => Some(&mut self.attention),
            "intermediate" => Some(&mut self.intermediate),
            "output" => Some(&mut self.output),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let a = self.attention.forward(xs, train)?;
        let inner = self.intermediate.forward(&a, train)?;
        self.output
            .forward(&Tensor::f_cat(&[&inner, &a], -1)?, train)
    }
}

/// A container running its children in order on one tensor: `bert_encoder` (child `layer`)
/// and `bert_only_mlm_head` (child `predictions`).
#[derive(Debug)]
pub struct BertWrapper {
    name: &'static str,
    inner: Box<dyn Layer>,
    kind: &'static str,
}

impl Layer for BertWrapper {
    fn kind(&self) -> &str {
        self.kind
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![(self.name, self.inner.as_ref())]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        (name == self.name).then_some(&mut self.inner)
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        self.inner.forward(xs, train)
    }
}

/// The encoder (Hugging Face's `BertModel`, path `bert`), kind `bert_model`: token ids to the
/// last hidden states. Its `pooler` (classification only) is run by the root.
#[derive(Debug)]
pub struct BertModel {
    embeddings: Box<dyn Layer>,
    encoder: Box<dyn Layer>,
    pooler: Option<Box<dyn Layer>>,
    config: BertConfig,
    vocab_size: i64,
}

impl Layer for BertModel {
    fn kind(&self) -> &str {
        "bert_model"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        config_attrs(&self.config, self.vocab_size)
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        let mut out = vec![
            ("embeddings", self.embeddings.as_ref()),
            ("encoder", self.encoder.as_ref()),
        ];
        if let Some(p) = &self.pooler {
            out.push(("pooler", p.as_ref()));
        }
        out
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "embeddings" => Some(&mut self.embeddings),
            "encoder" => Some(&mut self.encoder),
            "pooler" => self.pooler.as_mut(),
            _ => None,
        }
    }

    fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let x = self.embeddings.forward(ids, train)?;
        self.encoder.forward(&x, train)
    }
}

fn config_attrs(c: &BertConfig, vocab_size: i64) -> Vec<(&'static str, Attr)> {
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

/// The masked-LM decoder: `x · weightᵀ + bias` with the word embedding's weight and
/// `cls.predictions.bias` (kind `tied_lm_head`, no tensors of its own; exported as
/// `decoder.weight` and `decoder.bias`).
#[derive(Debug)]
pub struct TiedDecoder {
    weight: Tensor,
    bias: Tensor,
}

impl Layer for TiedDecoder {
    fn kind(&self) -> &str {
        "tied_lm_head"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        let s = self.weight.size();
        vec![
            ("in_features", Attr::Int(s.get(1).copied().unwrap_or(0))),
            ("out_features", Attr::Int(s.first().copied().unwrap_or(0))),
            ("bias", Attr::Bool(true)),
        ]
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_linear(&self.weight, Some(&self.bias))
    }

    fn export(&self) -> Result<Exported, TchError> {
        Ok(Exported::Folded(ExportTree {
            tensors: vec![
                ("weight".to_owned(), self.weight.shallow_clone()),
                ("bias".to_owned(), self.bias.shallow_clone()),
            ],
            kept: Vec::new(),
        }))
    }
}

/// Hugging Face's `BertLMPredictionHead` (path `cls.predictions`), kind
/// `bert_lm_prediction_head`: holds `bias`; `decoder(transform(x))`.
#[derive(Debug)]
pub struct BertLmPredictionHead {
    bias: Tensor,
    transform: Box<dyn Layer>,
    decoder: Box<dyn Layer>,
}

impl Layer for BertLmPredictionHead {
    fn kind(&self) -> &str {
        "bert_lm_prediction_head"
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![("bias", &self.bias)]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("transform", self.transform.as_ref()),
            ("decoder", self.decoder.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "transform" => Some(&mut self.transform),
            "decoder" => Some(&mut self.decoder),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let x = self.transform.forward(xs, train)?;
        self.decoder.forward(&x, train)
    }
}

/// BERT with a head (Hugging Face's `BertForMaskedLM` or `BertForSequenceClassification`),
/// the root: token ids `(B, T)` to logits. See the module documentation for the tree.
#[derive(Debug)]
pub struct Bert {
    bert: Box<dyn Layer>,
    /// Masked LM: `cls`; classification: `dropout` and `classifier`.
    head: Vec<(&'static str, Box<dyn Layer>)>,
    config: BertConfig,
    vocab_size: i64,
    num_classes: i64,
}

impl Bert {
    /// A BERT of `config`'s sizes and head, with `dropout` as its hidden and attention dropout,
    /// its tensors in `store` under Hugging Face's names. The vocabulary is `vocab_size` (the
    /// config's, else the data's `vocabulary`); a classifier has `num_classes` outputs. Sizes
    /// that do not fit are errors naming the `[model]` key.
    pub fn new(
        store: &mut ParamStore,
        config: &BertConfig,
        dropout: f64,
        vocabulary: i64,
        num_classes: i64,
    ) -> Result<Bert, TchError> {
        let vocab_size = validate(config, vocabulary)?;
        let c = config.n_embd as i64;
        let eps = config.layer_norm_epsilon;
        let word = Embedding::new(
            store,
            "bert.embeddings.word_embeddings",
            vocab_size,
            c,
            normal(),
        )?;
        let word_weight = word.weight().shallow_clone();
        let embeddings = BertEmbeddings {
            word_embeddings: Box::new(word),
            position_embeddings: Box::new(Embedding::new(
                store,
                "bert.embeddings.position_embeddings",
                config.n_positions as i64,
                c,
                normal(),
            )?),
            token_type_embeddings: Box::new(Embedding::new(
                store,
                "bert.embeddings.token_type_embeddings",
                config.type_vocab_size as i64,
                c,
                normal(),
            )?),
            layer_norm: Box::new(LayerNorm::with_eps(
                store,
                "bert.embeddings.LayerNorm",
                c,
                eps,
            )?),
            dropout: Box::new(Dropout::new(dropout)),
        };
        let mut layers = Sequential::new();
        for i in 0..config.n_layer {
            let path = format!("bert.encoder.layer.{i}");
            layers = layers.add(
                i.to_string(),
                BertLayer::new(store, &path, config, dropout)?,
            );
        }
        let encoder = BertWrapper {
            name: "layer",
            inner: Box::new(layers),
            kind: "bert_encoder",
        };
        let classification = config.head == BertHead::Classification;
        let pooler = if classification {
            Some(Box::new(BertDense {
                dense: Box::new(linear(store, "bert.pooler.dense", c, c)?),
                layer_norm: None,
                kind: "bert_pooler",
            }) as Box<dyn Layer>)
        } else {
            None
        };
        let bert = BertModel {
            embeddings: Box::new(embeddings),
            encoder: Box::new(encoder),
            pooler,
            config: config.clone(),
            vocab_size,
        };
        let head: Vec<(&'static str, Box<dyn Layer>)> = if classification {
            vec![
                ("dropout", Box::new(Dropout::new(dropout))),
                (
                    "classifier",
                    Box::new(linear(store, "classifier", c, num_classes)?),
                ),
            ]
        } else {
            let transform = BertDense {
                dense: Box::new(linear(store, "cls.predictions.transform.dense", c, c)?),
                layer_norm: Some(Box::new(LayerNorm::with_eps(
                    store,
                    "cls.predictions.transform.LayerNorm",
                    c,
                    eps,
                )?)),
                kind: "bert_prediction_head_transform",
            };
            let bias = store.parameter(
                "cls.predictions.bias".to_owned(),
                &[vocab_size],
                Init::Const(0.0),
            )?;
            let predictions = BertLmPredictionHead {
                bias: bias.shallow_clone(),
                transform: Box::new(transform),
                decoder: Box::new(TiedDecoder {
                    weight: word_weight,
                    bias,
                }),
            };
            vec![(
                "cls",
                Box::new(BertWrapper {
                    name: "predictions",
                    inner: Box::new(predictions),
                    kind: "bert_only_mlm_head",
                }),
            )]
        };
        Ok(Bert {
            bert: Box::new(bert),
            head,
            config: config.clone(),
            vocab_size,
            num_classes,
        })
    }

    fn head(&self, name: &str) -> Result<&dyn Layer, TchError> {
        self.head
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, l)| l.as_ref())
            .ok_or_else(|| TchError::Shape(format!("bert: no module `{name}`")))
    }
}

/// Checks `config` against itself and the data's `vocabulary`; returns the vocabulary size.
fn validate(config: &BertConfig, vocabulary: i64) -> Result<i64, TchError> {
    check_sizes(
        "bert",
        &[
            ("n_layer", config.n_layer),
            ("n_head", config.n_head),
            ("n_embd", config.n_embd),
            ("n_inner", config.n_inner),
            ("n_positions", config.n_positions),
            ("type_vocab_size", config.type_vocab_size),
        ],
        (config.n_embd, config.n_head),
        config.layer_norm_epsilon,
        (config.vocab_size, vocabulary),
    )
}

impl Layer for Bert {
    fn kind(&self) -> &str {
        match self.config.head {
            BertHead::MaskedLm => "bert_for_masked_lm",
            BertHead::Classification => "bert_for_sequence_classification",
        }
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        let mut attrs = config_attrs(&self.config, self.vocab_size);
        if self.config.head == BertHead::Classification {
            attrs.push(("num_labels", Attr::Int(self.num_classes)));
        }
        attrs
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        let mut out = vec![("bert", self.bert.as_ref())];
        out.extend(self.head.iter().map(|(n, l)| (*n, l.as_ref())));
        out
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        if name == "bert" {
            return Some(&mut self.bert);
        }
        self.head
            .iter_mut()
            .find(|(n, _)| *n == name)
            .map(|(_, l)| l)
    }

    fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let hidden = self.bert.forward(ids, train)?;
        match self.config.head {
            BertHead::MaskedLm => self.head("cls")?.forward(&hidden, train),
            BertHead::Classification => {
                let pooler = self
                    .bert
                    .children()
                    .into_iter()
                    .find(|(n, _)| *n == "pooler")
                    .map(|(_, l)| l)
                    .ok_or_else(|| TchError::Shape("bert: no module `bert.pooler`".into()))?;
                let pooled = pooler.forward(&hidden, train)?;
                let pooled = self.head("dropout")?.forward(&pooled, train)?;
                self.head("classifier")?.forward(&pooled, train)
            }
        }
    }
}
