//! GPT-2 (Radford et al. 2019) as Hugging Face's `GPT2LMHeadModel` writes it: the same module
//! tree, parameter names, shapes (`Conv1D` weights stored `(in, out)`), initialisation and
//! computation, so that weights map 1:1 to its `state_dict` and the logits agree.
//!
//! # The module tree (the contract with method plugins)
//!
//! Paths, kinds and attributes as the module tree lists them; `C` = `n_embd`, `V` =
//! `vocab_size`, `P` = `n_positions`, `L` = `n_layer`, `i` in `0..L`:
//!
//! | path | kind | attributes | tensors (shape) |
//! | --- | --- | --- | --- |
//! | `` (root) | `gpt2_lm_head_model` | `vocab_size`, `n_positions`, `n_embd`, `n_layer`, `n_head`, `tie_embeddings` | |
//! | `transformer` | `gpt2_model` | `vocab_size`, `n_positions`, `n_embd`, `n_layer`, `n_head` | |
//! | `transformer.wte` | `embedding` | `num_embeddings` = V, `embedding_dim` = C | `weight` (V, C) |
//! | `transformer.wpe` | `embedding` | `num_embeddings` = P, `embedding_dim` = C | `weight` (P, C) |
//! | `transformer.drop` | `dropout` | `p` | |
//! | `transformer.h` | `sequential` | | |
//! | `transformer.h.{i}` | `gpt2_block` | `n_embd`, `n_head` | |
//! | `transformer.h.{i}.ln_1` | `layer_norm` | `normalized_shape` = C, `eps`, `elementwise_affine` | `weight`, `bias` (C) |
//! | `transformer.h.{i}.attn` | `gpt2_attention` | `n_head`, `n_embd`, `n_positions`, `attn_pdrop`, `resid_pdrop` | `c_attn.weight` (C, 3C), `c_attn.bias` (3C), `c_proj.weight` (C, C), `c_proj.bias` (C) |
//! | `transformer.h.{i}.ln_2` | `layer_norm` | as `ln_1` | `weight`, `bias` (C) |
//! | `transformer.h.{i}.mlp` | `gpt2_mlp` | `n_embd`, `n_inner` = 4C, `resid_pdrop` | `c_fc.weight` (C, 4C), `c_fc.bias` (4C), `c_proj.weight` (4C, C), `c_proj.bias` (C) |
//! | `transformer.ln_f` | `layer_norm` | as `ln_1` | `weight`, `bias` (C) |
//! | `lm_head` | `tied_lm_head` (tied) or `linear` (untied) | `in_features` = C, `out_features` = V, `bias` = false | untied: `weight` (V, C); tied: none of its own |
//!
//! What each module receives and returns (B sequences of T tokens):
//! - the root and `transformer`: int64 token ids `(B, T)`; the root returns logits `(B, T, V)`,
//!   `transformer` the final hidden states `(B, T, C)`. While `transformer.wpe` is an
//!   `embedding`, T may be at most its `num_embeddings` (P); a longer input is an error.
//! - `transformer.wte`: the token ids `(B, T)` → `(B, T, C)`.
//! - `transformer.wpe`: the position ids `arange(T)` as int64 `(1, T)` → `(1, T, C)` (anything
//!   that broadcasts against `(B, T, C)`), added to the token embeddings. A plugin that removes
//!   learned positions (ALiBi) replaces this module, e.g. by one returning zeros; the rest of
//!   the model then accepts any T.
//! - `transformer.h.{i}`: `(B, T, C)` → `(B, T, C)`, computing
//!   `x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))` through its children, which surgery may
//!   replace (a `layer_norm` by LowPrecisionLayerNorm's, ...).
//! - `attn`: causal self-attention, `(B, T, C)` → `(B, T, C)`: `qkv = x @ c_attn.weight +
//!   c_attn.bias` split into q, k, v of `n_head` heads of `C / n_head`; libtorch's fused
//!   `scaled_dot_product_attention` with `is_causal` (scale `1/sqrt(C / n_head)`, dropout
//!   `attn_pdrop` on the weights in training only); heads merged; `@ c_proj.weight +
//!   c_proj.bias`; dropout `resid_pdrop` in training. No mask buffer: any T works.
//! - `mlp`: `dropout(gelu_tanh(x @ c_fc.weight + c_fc.bias) @ c_proj.weight + c_proj.bias)`
//!   (Hugging Face's `gelu_new`).
//! - `lm_head`: `(B, T, C)` → `(B, T, V)`, `x @ weightᵀ` without bias.
//!
//! # Tied embeddings
//!
//! With `tie_embeddings` (the default), `lm_head` multiplies by `transformer.wte.weight` itself
//! (the same tensor, so gradients of both uses add up in it). The store — and so the optimizer,
//! checkpoints and resume — holds that tensor once, as `transformer.wte.weight`; the tree lists no
//! tensor under `lm_head`. `tessera export` writes it a second time as `lm_head.weight`, because
//! Hugging Face's `state_dict()` holds both names ([`Layer::export`] of the tied head).

mod attention;
mod block;
mod decoder;
mod functional;
mod mlp;

pub use attention::Gpt2Attention;
pub use block::Gpt2Block;
pub use decoder::Gpt2Model;
pub use mlp::Gpt2Mlp;

use tch::{TchError, Tensor};

use crate::model::layers::{
    Attr, Dropout, Embedding, KvCache, Layer, LayerNorm, LmHead, Sequential,
};
use crate::model::zoo::transformer::{check_sizes, normal};
use crate::model::{Gpt2Config, ParamStore};
use functional::INIT_STD;

/// GPT-2 with its language-model head (Hugging Face's `GPT2LMHeadModel`), the root, kind
/// `gpt2_lm_head_model`: token ids `(B, T)` to logits `(B, T, vocab_size)`. See the module
/// documentation for the tree.
#[derive(Debug)]
pub struct Gpt2LmHeadModel {
    transformer: Box<dyn Layer>,
    lm_head: Box<dyn Layer>,
    config: Gpt2Config,
    vocab_size: i64,
}

impl Gpt2LmHeadModel {
    /// A GPT-2 of `config`'s sizes whose logits cover `vocab_size` tokens (the config's
    /// `vocab_size`, else `num_classes`), with `dropout` as its embedding, attention and residual
    /// dropout, its tensors in `store` under Hugging Face's names. Sizes that do not fit (a zero
    /// count, `n_embd` not a multiple of `n_head`, a `vocab_size` below `num_classes`) are errors
    /// naming the `[model]` key.
    pub fn new(
        store: &mut ParamStore,
        config: &Gpt2Config,
        dropout: f64,
        num_classes: i64,
    ) -> Result<Gpt2LmHeadModel, TchError> {
        let vocab_size = validate(config, num_classes)?;
        let c = config.n_embd as i64;
        let wte = Embedding::new(store, "transformer.wte", vocab_size, c, normal(INIT_STD))?;
        let wpe = Embedding::new(
            store,
            "transformer.wpe",
            config.n_positions as i64,
            c,
            normal(INIT_STD),
        )?;
        let mut h = Sequential::new();
        for i in 0..config.n_layer {
            let path = format!("transformer.h.{i}");
            h = h.add(
                i.to_string(),
                Gpt2Block::new(store, &path, config, dropout)?,
            );
        }
        let eps = config.layer_norm_epsilon;
        let ln_f = LayerNorm::with_eps(store, "transformer.ln_f", c, eps)?;
        let weight = if config.tie_embeddings {
            wte.weight().shallow_clone()
        } else {
            store.parameter(
                "lm_head.weight".to_owned(),
                &[vocab_size, c],
                normal(INIT_STD),
            )?
        };
        let lm_head = if config.tie_embeddings {
            LmHead::tied(weight, c, vocab_size)
        } else {
            LmHead::untied(weight, c, vocab_size)
        };
        let transformer = Gpt2Model {
            wte: Box::new(wte),
            wpe: Box::new(wpe),
            drop: Box::new(Dropout::new(dropout)),
            h: Box::new(h),
            ln_f: Box::new(ln_f),
            config: config.clone(),
            vocab_size,
        };
        Ok(Gpt2LmHeadModel {
            transformer: Box::new(transformer),
            lm_head: Box::new(lm_head),
            config: config.clone(),
            vocab_size,
        })
    }
}

/// Checks `config` against itself and `num_classes`; returns the vocabulary size.
fn validate(config: &Gpt2Config, num_classes: i64) -> Result<i64, TchError> {
    check_sizes(
        "gpt2",
        &[
            ("n_layer", config.n_layer),
            ("n_head", config.n_head),
            ("n_embd", config.n_embd),
            ("n_positions", config.n_positions),
        ],
        (config.n_embd, config.n_head),
        config.layer_norm_epsilon,
        (config.vocab_size, num_classes),
    )
}

impl Layer for Gpt2LmHeadModel {
    fn kind(&self) -> &str {
        "gpt2_lm_head_model"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        let c = &self.config;
        vec![
            ("vocab_size", Attr::Int(self.vocab_size)),
            ("n_positions", Attr::Int(c.n_positions as i64)),
            ("n_embd", Attr::Int(c.n_embd as i64)),
            ("n_layer", Attr::Int(c.n_layer as i64)),
            ("n_head", Attr::Int(c.n_head as i64)),
            ("tie_embeddings", Attr::Bool(c.tie_embeddings)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("transformer", self.transformer.as_ref()),
            ("lm_head", self.lm_head.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "transformer" => Some(&mut self.transformer),
            "lm_head" => Some(&mut self.lm_head),
            _ => None,
        }
    }

    fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let hidden = self.transformer.forward(ids, train)?;
        self.lm_head.forward(&hidden, train)
    }

    /// The logits of the last new token only `(B, 1, V)`: generation needs no other.
    fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let hidden = self.transformer.forward_cached(ids, cache)?;
        let t = hidden.size().get(1).copied().unwrap_or(1);
        self.lm_head
            .forward_cached(&hidden.f_narrow(1, t - 1, 1)?, cache)
    }
}
