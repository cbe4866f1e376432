//! GPT-2's causal self-attention (Hugging Face's `GPT2Attention`).

use tch::{nn::Init, TchError, Tensor};

use super::functional::{conv1d, dropout, proj_init, INIT_STD};
use crate::model::layers::{Attr, KvCache, Layer};
use crate::model::zoo::transformer::{btc, merge_heads, normal};
use crate::model::{tree::join, Gpt2Config, ParamStore};

/// GPT-2's causal self-attention (Hugging Face's `GPT2Attention`), kind `gpt2_attention`.
#[derive(Debug)]
pub struct Gpt2Attention {
    c_attn_weight: Tensor,
    c_attn_bias: Tensor,
    c_proj_weight: Tensor,
    c_proj_bias: Tensor,
    n_head: i64,
    n_embd: i64,
    n_positions: i64,
    attn_pdrop: f64,
    resid_pdrop: f64,
}

impl Gpt2Attention {
    /// The attention of a model with `config`'s sizes whose tensors join `store` under `path`
    /// (`c_attn.weight` (C, 3C), `c_attn.bias`, `c_proj.weight` (C, C), `c_proj.bias`), weights
    /// normal(0, 0.02), `c_proj.weight` normal(0, 0.02/sqrt(2 n_layer)), biases zero.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        config: &Gpt2Config,
        dropout: f64,
    ) -> Result<Gpt2Attention, TchError> {
        let c = config.n_embd as i64;
        let at = |name| join(path, name);
        Ok(Gpt2Attention {
            c_attn_weight: store.parameter(at("c_attn.weight"), &[c, 3 * c], normal(INIT_STD))?,
            c_attn_bias: store.parameter(at("c_attn.bias"), &[3 * c], Init::Const(0.0))?,
            c_proj_weight: store.parameter(at("c_proj.weight"), &[c, c], proj_init(config))?,
            c_proj_bias: store.parameter(at("c_proj.bias"), &[c], Init::Const(0.0))?,
            n_head: config.n_head as i64,
            n_embd: c,
            n_positions: config.n_positions as i64,
            attn_pdrop: dropout,
            resid_pdrop: dropout,
        })
    }
}

impl Layer for Gpt2Attention {
    fn kind(&self) -> &str {
        "gpt2_attention"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("n_head", Attr::Int(self.n_head)),
            ("n_embd", Attr::Int(self.n_embd)),
            ("n_positions", Attr::Int(self.n_positions)),
            ("attn_pdrop", Attr::Float(self.attn_pdrop)),
            ("resid_pdrop", Attr::Float(self.resid_pdrop)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![
            ("c_attn.weight", &self.c_attn_weight),
            ("c_attn.bias", &self.c_attn_bias),
            ("c_proj.weight", &self.c_proj_weight),
            ("c_proj.bias", &self.c_proj_bias),
        ]
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let [q, k, v] = self.qkv(xs)?;
        let p = if train { self.attn_pdrop } else { 0.0 };
        let y = Tensor::f_scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            p,
            true,
            None,
            false,
        )?;
        let y = conv1d(&merge_heads(&y)?, &self.c_proj_weight, &self.c_proj_bias)?;
        dropout(y, self.resid_pdrop, train)
    }

    fn forward_cached(&self, xs: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let [q, k, v] = self.qkv(xs)?;
        let (k, v) = cache.append(&k, &v)?;
        let mask = cache.mask().map(Tensor::shallow_clone);
        let causal = mask.is_none() && q.size()[2] > 1;
        let y = Tensor::f_scaled_dot_product_attention(&q, &k, &v, mask, 0.0, causal, None, false)?;
        conv1d(&merge_heads(&y)?, &self.c_proj_weight, &self.c_proj_bias)
    }
}

impl Gpt2Attention {
    /// The queries, keys and values of `xs` `(B, T, C)` in heads `(B, n_head, T, C / n_head)`.
    fn qkv(&self, xs: &Tensor) -> Result<[Tensor; 3], TchError> {
        let (b, t, c) = btc(xs, self.n_embd, "gpt2 attention")?;
        let (h, d) = (self.n_head, self.n_embd / self.n_head);
        let qkv = conv1d(xs, &self.c_attn_weight, &self.c_attn_bias)?;
        let heads = |part: &Tensor| -> Result<Tensor, TchError> {
            part.f_reshape([b, t, h, d])?.f_transpose(1, 2)
        };
        let parts = qkv.f_split(c, 2)?;
        let [q, k, v] = parts.as_slice() else {
            return Err(TchError::Shape(format!(
                "gpt2 attention: c_attn gave {} parts, not 3",
                parts.len()
            )));
        };
        Ok([heads(q)?, heads(k)?, heads(v)?])
    }
}
