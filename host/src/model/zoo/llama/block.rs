//! One decoder layer (`LlamaDecoderLayer`): attention and MLP, each after an RMSNorm, with
//! residuals.

use tch::{TchError, Tensor};

use super::attention::LlamaAttention;
use super::config::LlamaConfig;
use super::mlp::LlamaMlp;
use crate::model::layers::{Attr, KvCache, Layer, RmsNorm};
use crate::model::{tree::join, ParamStore};

/// A decoder block (`LlamaDecoderLayer`), kind `llama_block`.
#[derive(Debug)]
pub struct LlamaBlock {
    input_layernorm: Box<dyn Layer>,
    self_attn: Box<dyn Layer>,
    post_attention_layernorm: Box<dyn Layer>,
    mlp: Box<dyn Layer>,
    hidden: i64,
}

impl LlamaBlock {
    /// Block `path` (`model.layers.{i}`).
    pub fn new(store: &mut ParamStore, path: &str, config: &LlamaConfig) -> Result<Self, TchError> {
        let c = config.hidden_size as i64;
        let eps = config.rms_norm_eps;
        let at = |name| join(path, name);
        Ok(LlamaBlock {
            input_layernorm: Box::new(RmsNorm::new(store, &at("input_layernorm"), c, eps)?),
            self_attn: Box::new(LlamaAttention::new(store, &at("self_attn"), config)?),
            post_attention_layernorm: Box::new(RmsNorm::new(
                store,
                &at("post_attention_layernorm"),
                c,
                eps,
            )?),
            mlp: Box::new(LlamaMlp::new(store, &at("mlp"), config)?),
            hidden: c,
        })
    }
}

impl Layer for LlamaBlock {
    fn kind(&self) -> &str {
        "llama_block"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![("hidden_size", Attr::Int(self.hidden))]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("input_layernorm", self.input_layernorm.as_ref()),
            ("self_attn", self.self_attn.as_ref()),
            (
                "post_attention_layernorm",
                self.post_attention_layernorm.as_ref(),
            ),
            ("mlp", self.mlp.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "input_layernorm" => Some(&mut self.input_layernorm),
            "self_attn" => Some(&mut self.self_attn),
            "post_attention_layernorm" => Some(&mut self.post_attention_layernorm),
            "mlp" => Some(&mut self.mlp),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let a = self
            .self_attn
            .forward(&self.input_layernorm.forward(xs, train)?, train)?;
        let xs = xs.f_add(&a)?;
        let m = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&xs, train)?, train)?;
        xs.f_add(&m)
    }

    fn forward_cached(&self, xs: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let normed = self.input_layernorm.forward_cached(xs, cache)?;
        let xs = xs.f_add(&self.self_attn.forward_cached(&normed, cache)?)?;
        let normed = self.post_attention_layernorm.forward_cached(&xs, cache)?;
        xs.f_add(&self.mlp.forward_cached(&normed, cache)?)
    }
}
