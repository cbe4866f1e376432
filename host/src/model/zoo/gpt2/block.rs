//! One GPT-2 block (Hugging Face's `GPT2Block`): attention and MLP, each after a layer norm, with
//! residuals.

use tch::{TchError, Tensor};

use super::attention::Gpt2Attention;
use super::mlp::Gpt2Mlp;
use crate::model::layers::{Attr, KvCache, Layer, LayerNorm};
use crate::model::{tree::join, Gpt2Config, ParamStore};

/// A transformer block (Hugging Face's `GPT2Block`), kind `gpt2_block`:
/// `x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))`, its four children replaceable by path.
#[derive(Debug)]
pub struct Gpt2Block {
    ln_1: Box<dyn Layer>,
    attn: Box<dyn Layer>,
    ln_2: Box<dyn Layer>,
    mlp: Box<dyn Layer>,
    n_embd: i64,
    n_head: i64,
}

impl Gpt2Block {
    /// Block `path` (`transformer.h.{i}`) of a model with `config`'s sizes.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        config: &Gpt2Config,
        dropout: f64,
    ) -> Result<Gpt2Block, TchError> {
        let c = config.n_embd as i64;
        let eps = config.layer_norm_epsilon;
        let at = |name| join(path, name);
        let ln_1 = LayerNorm::with_eps(store, &at("ln_1"), c, eps)?;
        let attn = Gpt2Attention::new(store, &at("attn"), config, dropout)?;
        let ln_2 = LayerNorm::with_eps(store, &at("ln_2"), c, eps)?;
        let mlp = Gpt2Mlp::new(store, &at("mlp"), config, dropout)?;
        Ok(Gpt2Block {
            ln_1: Box::new(ln_1),
            attn: Box::new(attn),
            ln_2: Box::new(ln_2),
            mlp: Box::new(mlp),
            n_embd: c,
            n_head: config.n_head as i64,
        })
    }
}

impl Layer for Gpt2Block {
    fn kind(&self) -> &str {
        "gpt2_block"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("n_embd", Attr::Int(self.n_embd)),
            ("n_head", Attr::Int(self.n_head)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("ln_1", self.ln_1.as_ref()),
            ("attn", self.attn.as_ref()),
            ("ln_2", self.ln_2.as_ref()),
            ("mlp", self.mlp.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "ln_1" => Some(&mut self.ln_1),
            "attn" => Some(&mut self.attn),
            "ln_2" => Some(&mut self.ln_2),
            "mlp" => Some(&mut self.mlp),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let a = self.attn.forward(&self.ln_1.forward(xs, train)?, train)?;
        let xs = xs.f_add(&a)?;
        let m = self.mlp.forward(&self.ln_2.forward(&xs, train)?, train)?;
        xs.f_add(&m)
    }

    fn forward_cached(&self, xs: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let normed = self.ln_1.forward_cached(xs, cache)?;
        let xs = xs.f_add(&self.attn.forward_cached(&normed, cache)?)?;
        let normed = self.ln_2.forward_cached(&xs, cache)?;
        xs.f_add(&self.mlp.forward_cached(&normed, cache)?)
    }
}
