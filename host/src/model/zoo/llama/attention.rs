//! Grouped-query attention with rotary positions (`LlamaAttention`).

use tch::{TchError, Tensor};

use super::config::LlamaConfig;
use super::rotary::{inv_freq, rotary, rotary_at, rotate};
use crate::model::layers::{Attr, KvCache, Layer, Linear};
use crate::model::zoo::transformer::{merge_heads, normal};
use crate::model::{tree::join, ParamStore};

/// A normal(0, std) weight and optional zero bias, as Hugging Face initialises a Llama linear.
pub(super) fn projection(
    store: &mut ParamStore,
    path: &str,
    (in_features, out_features): (i64, i64),
    bias: bool,
    std: f64,
) -> Result<Linear, TchError> {
    Linear::with_init_and_bias(store, path, in_features, out_features, normal(std), bias)
}

/// Grouped-query causal self-attention with rotary positions (`LlamaAttention`), kind
/// `llama_attention`; its projections are children (`q_proj`, `k_proj`, `v_proj`, `o_proj`)
/// that surgery may replace or wrap (LoRA).
#[derive(Debug)]
pub struct LlamaAttention {
    q_proj: Box<dyn Layer>,
    k_proj: Box<dyn Layer>,
    v_proj: Box<dyn Layer>,
    o_proj: Box<dyn Layer>,
    inv_freq: Tensor,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    hidden: i64,
}

impl LlamaAttention {
    /// The attention of block `path` of a model of `config`'s sizes.
    pub fn new(store: &mut ParamStore, path: &str, config: &LlamaConfig) -> Result<Self, TchError> {
        let c = config.hidden_size as i64;
        let (h, k, d) = (
            config.num_attention_heads as i64,
            config.kv_heads() as i64,
            config.head_width() as i64,
        );
        let std = config.initializer_range;
        let bias = config.attention_bias;
        let o_bias = config.o_bias.unwrap_or(bias);
        let at = |name| join(path, name);
        Ok(LlamaAttention {
            q_proj: Box::new(projection(store, &at("q_proj"), (c, h * d), bias, std)?),
            k_proj: Box::new(projection(store, &at("k_proj"), (c, k * d), bias, std)?),
            v_proj: Box::new(projection(store, &at("v_proj"), (c, k * d), bias, std)?),
            o_proj: Box::new(projection(store, &at("o_proj"), (h * d, c), o_bias, std)?),
            inv_freq: inv_freq(d, config.rope_theta, config.rope_scaling)?,
            heads: h,
            kv_heads: k,
            head_dim: d,
            hidden: c,
        })
    }
}

impl Layer for LlamaAttention {
    fn kind(&self) -> &str {
        "llama_attention"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("num_attention_heads", Attr::Int(self.heads)),
            ("num_key_value_heads", Attr::Int(self.kv_heads)),
            ("head_dim", Attr::Int(self.head_dim)),
            ("hidden_size", Attr::Int(self.hidden)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("q_proj", self.q_proj.as_ref()),
            ("k_proj", self.k_proj.as_ref()),
            ("v_proj", self.v_proj.as_ref()),
            ("o_proj", self.o_proj.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "q_proj" => Some(&mut self.q_proj),
            "k_proj" => Some(&mut self.k_proj),
            "v_proj" => Some(&mut self.v_proj),
            "o_proj" => Some(&mut self.o_proj),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let [q, k, v] = self.rotated_qkv(xs, None, |p| p.forward(xs, train))?;
        let t = q.size()[2];
        let y = self.attend(&q, k, v, None, t > 1)?;
        self.o_proj.forward(&y, train)
    }

    fn forward_cached(&self, xs: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let positions = cache.positions()?.shallow_clone();
        let [q, k, v] = self.rotated_qkv(xs, Some(&positions), |p| p.forward_cached(xs, cache))?;
        let (k, v) = cache.append(&k, &v)?;
        let mask = cache.mask().map(Tensor::shallow_clone);
        let causal = mask.is_none() && q.size()[2] > 1;
        let y = self.attend(&q, k, v, mask, causal)?;
        self.o_proj.forward_cached(&y, cache)
    }
}

impl LlamaAttention {
    /// The queries, keys and values of `xs` `(B, T, C)` in heads `(B, heads, T, D)`, queries
    /// and keys rotated to `positions` `(B, T)` (`None`: `0..T`); `project` runs a projection.
    fn rotated_qkv(
        &self,
        xs: &Tensor,
        positions: Option<&Tensor>,
        mut project: impl FnMut(&dyn Layer) -> Result<Tensor, TchError>,
    ) -> Result<[Tensor; 3], TchError> {
        let (b, t) = match xs.size().as_slice() {
            &[b, t, c] if c == self.hidden => (b, t),
            s => {
                return Err(TchError::Shape(format!(
                    "llama attention: expected an input (batch, tokens, {}), got {s:?}",
                    self.hidden
                )))
            }
        };
        let d = self.head_dim;
        let heads = |x: Tensor, n: i64| x.f_reshape([b, t, n, d])?.f_transpose(1, 2);
        let q = heads(project(self.q_proj.as_ref())?, self.heads)?;
        let k = heads(project(self.k_proj.as_ref())?, self.kv_heads)?;
        let v = heads(project(self.v_proj.as_ref())?, self.kv_heads)?;
        let (cos, sin) = match positions {
            None => rotary(&self.inv_freq, t, &q)?,
            Some(p) => rotary_at(&self.inv_freq, p, &q)?,
        };
        Ok([rotate(&q, &cos, &sin)?, rotate(&k, &cos, &sin)?, v])
    }

    /// Scaled dot-product attention of the queries `q` over the keys `k` and values `v` (their
    /// heads repeated to serve the query heads), `mask` or `causal` as libtorch's SDPA takes
    /// them; the heads merged `(B, T, H·D)`.
    fn attend(
        &self,
        q: &Tensor,
        k: Tensor,
        v: Tensor,
        mask: Option<Tensor>,
        causal: bool,
    ) -> Result<Tensor, TchError> {
        let y = Tensor::f_scaled_dot_product_attention(
            q,
            &self.repeat_kv(k)?,
            &self.repeat_kv(v)?,
            mask,
            0.0,
            causal,
            None,
            false,
        )?;
        merge_heads(&y)
    }

    /// Hugging Face's `repeat_kv`: each key/value head of `x` `(B, K, T, D)` serves
    /// `heads / kv_heads` query heads.
    fn repeat_kv(&self, x: Tensor) -> Result<Tensor, TchError> {
        let n = self.heads / self.kv_heads;
        if n == 1 {
            return Ok(x);
        }
        let (b, t) = (x.size()[0], x.size()[2]);
        x.f_unsqueeze(2)?
            .f_expand([b, self.kv_heads, n, t, self.head_dim], false)?
            .f_reshape([b, self.heads, t, self.head_dim])
    }
}
