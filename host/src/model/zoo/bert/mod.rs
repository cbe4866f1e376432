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
//!   on the second, through [`crate::model::layers::mask::token_type_ids`]), else all 0 (one segment). The batch's `attention_mask` (`(B, T)`, 0 at
//!   padding), when it has one, reaches the attention through
//!   [`crate::model::layers::mask::attention_mask`]: padded keys get no weight, as Hugging Face's additive
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

mod attention;
mod config;
mod embeddings;
mod encoder;
mod head;
mod output;

pub use attention::{sdpa_key_mask, BertAttention, BertSelfAttention};
pub use config::{BertConfig, BertHead};
pub use embeddings::BertEmbeddings;
pub use encoder::{BertDense, BertLayer, BertModel, BertWrapper};
pub use head::{BertLmPredictionHead, TiedDecoder};
pub use output::{split_residual, BertResidualOutput};

use tch::{nn::Init, TchError, Tensor};

use crate::model::layers::{Attr, Dropout, Embedding, Layer, LayerNorm, Sequential};
use crate::model::zoo::transformer::check_sizes;
use crate::model::ParamStore;
use config::{config_attrs, linear, normal};

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
        let embeddings = embeddings(store, config, word, dropout)?;
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

/// The embeddings (`bert.embeddings`) around the word embedding `word`: positions, token
/// types, the layer norm and dropout.
fn embeddings(
    store: &mut ParamStore,
    config: &BertConfig,
    word: Embedding,
    dropout: f64,
) -> Result<BertEmbeddings, TchError> {
    let (c, eps) = (config.n_embd as i64, config.layer_norm_epsilon);
    Ok(BertEmbeddings {
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
    })
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
