//! The decoder without its head (`LlamaModel`, path `model`).

use tch::{Kind, TchError, Tensor};

use crate::model::layers::{Attr, KvCache, Layer};

/// The decoder without its head (`LlamaModel`, path `model`), kind `llama_model`: token ids
/// `(B, T)` to the final hidden states `(B, T, C)`.
#[derive(Debug)]
pub struct LlamaModel {
    pub(super) embed_tokens: Box<dyn Layer>,
    pub(super) layers: Box<dyn Layer>,
    pub(super) norm: Box<dyn Layer>,
    pub(super) max_positions: i64,
}

impl Layer for LlamaModel {
    fn kind(&self) -> &str {
        "llama_model"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![("max_position_embeddings", Attr::Int(self.max_positions))]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("embed_tokens", self.embed_tokens.as_ref()),
            ("layers", self.layers.as_ref()),
            ("norm", self.norm.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "embed_tokens" => Some(&mut self.embed_tokens),
            "layers" => Some(&mut self.layers),
            "norm" => Some(&mut self.norm),
            _ => None,
        }
    }

    fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor, TchError> {
        match (ids.kind(), ids.size().as_slice()) {
            (Kind::Int64, &[_, t]) if t <= self.max_positions => {}
            (Kind::Int64, &[_, t]) => {
                return Err(TchError::Shape(format!(
                    "llama: the input has {t} tokens per sequence, more than the model's \
                     context of {} (`[model] max_position_embeddings`)",
                    self.max_positions
                )))
            }
            (kind, size) => {
                return Err(TchError::Shape(format!(
                    "llama: expected int64 token ids (batch, tokens), got {kind:?} {size:?}"
                )))
            }
        }
        let x = self.embed_tokens.forward(ids, train)?;
        let x = self.layers.forward(&x, train)?;
        self.norm.forward(&x, train)
    }

    fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let t = ids.size().last().copied().unwrap_or(0);
        if cache.past() + t > self.max_positions {
            return Err(TchError::Shape(format!(
                "llama: {} tokens per sequence, more than the model's context of {} \
                 (`max_position_embeddings`)",
                cache.past() + t,
                self.max_positions
            )));
        }
        let x = self.embed_tokens.forward_cached(ids, cache)?;
        let x = self.layers.forward_cached(&x, cache)?;
        self.norm.forward_cached(&x, cache)
    }
}
