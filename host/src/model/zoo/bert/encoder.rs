//! The encoder: its layers (`BertLayer` and its dense parts) and the body without a head
//! (`BertModel`).

use tch::{TchError, Tensor};

use super::attention::{BertAttention, BertSelfAttention};
use super::config::{config_attrs, linear, BertConfig};
use super::output::BertResidualOutput;
use crate::model::layers::{Attr, Layer};
use crate::model::{tree::join, ParamStore};

/// A linear layer then a fixed activation: Hugging Face's `BertIntermediate` (exact GELU, kind
/// `bert_intermediate`), `BertPooler` (tanh of the first token, kind `bert_pooler`) and
/// `BertPredictionHeadTransform` (GELU then a layer norm, kind
/// `bert_prediction_head_transform`).
#[derive(Debug)]
pub struct BertDense {
    pub(super) dense: Box<dyn Layer>,
    pub(super) layer_norm: Option<Box<dyn Layer>>,
    pub(super) kind: &'static str,
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
    pub(super) name: &'static str,
    pub(super) inner: Box<dyn Layer>,
    pub(super) kind: &'static str,
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
    pub(super) embeddings: Box<dyn Layer>,
    pub(super) encoder: Box<dyn Layer>,
    pub(super) pooler: Option<Box<dyn Layer>>,
    pub(super) config: BertConfig,
    pub(super) vocab_size: i64,
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
