//! Llama-family decoders (Llama 2/3, Mistral, Qwen2, SmolLM) as Hugging Face's
//! `LlamaForCausalLM` writes them: the same module tree, parameter names, shapes,
//! initialisation and computation (RMSNorm, a SwiGLU MLP, rotary positions with `rope_theta`
//! and the Llama-3 `rope_scaling`, grouped-query attention through SDPA), so that a
//! `save_pretrained` folder's tensors map 1:1 and the logits agree.
//!
//! # The module tree (the contract with method plugins)
//!
//! `C` = `hidden_size`, `I` = `intermediate_size`, `H` = `num_attention_heads`, `K` =
//! `num_key_value_heads`, `D` = `head_dim`, `V` = `vocab_size`, `L` = `num_hidden_layers`:
//!
//! | path | kind | tensors (shape) |
//! | --- | --- | --- |
//! | `` (root) | `llama_for_causal_lm` | |
//! | `model` | `llama_model` | |
//! | `model.embed_tokens` | `embedding` | `weight` (V, C) |
//! | `model.layers` | `sequential` | |
//! | `model.layers.{i}` | `llama_block` | |
//! | `model.layers.{i}.input_layernorm` | `rms_norm` | `weight` (C) |
//! | `model.layers.{i}.self_attn` | `llama_attention` | |
//! | `model.layers.{i}.self_attn.{q,k,v,o}_proj` | `linear` | `q`: `weight` (H·D, C); `k`, `v`: (K·D, C); `o`: (C, H·D); biases with `attention_bias` (q, k, v only with `o_bias = false`, Qwen2's) |
//! | `model.layers.{i}.post_attention_layernorm` | `rms_norm` | `weight` (C) |
//! | `model.layers.{i}.mlp` | `llama_mlp` | |
//! | `model.layers.{i}.mlp.{gate,up}_proj` | `linear` | `weight` (I, C) |
//! | `model.layers.{i}.mlp.down_proj` | `linear` | `weight` (C, I) |
//! | `model.norm` | `rms_norm` | `weight` (C) |
//! | `lm_head` | `tied_lm_head` (tied) or `linear` | untied: `weight` (V, C) |
//!
//! - a block computes `x = x + self_attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x))`;
//! - `self_attn`: `q`, `k`, `v` projected, split into heads, rotated (`rotate_half`, cos and sin
//!   of `position · inv_freq` in float32, as Hugging Face's `LlamaRotaryEmbedding`), `k` and `v`
//!   repeated `H / K` times, libtorch's `scaled_dot_product_attention` with `is_causal` and
//!   scale `1/sqrt(D)`, heads merged, `o_proj`;
//! - `mlp`: `down_proj(silu(gate_proj(x)) · up_proj(x))`;
//! - `rms_norm`: `weight · (x / sqrt(mean(x²) + eps))`, the normalisation in float32 and cast
//!   back to the input's dtype before the weight, as `LlamaRMSNorm`.

mod attention;
mod block;
mod config;
mod decoder;
mod mlp;
mod rotary;

pub use attention::LlamaAttention;
pub use block::LlamaBlock;
pub use config::{LlamaConfig, RopeScaling};
pub use decoder::LlamaModel;
pub use mlp::LlamaMlp;

use tch::{TchError, Tensor};

use crate::model::layers::{Attr, Embedding, KvCache, Layer, LmHead, RmsNorm, Sequential};
use crate::model::zoo::transformer::{check_sizes, normal};
use crate::model::ParamStore;

/// A Llama-family decoder with its language-model head (`LlamaForCausalLM`), the root, kind
/// `llama_for_causal_lm`: token ids `(B, T)` to logits `(B, T, vocab_size)`.
#[derive(Debug)]
pub struct LlamaForCausalLm {
    model: Box<dyn Layer>,
    lm_head: Box<dyn Layer>,
    config: LlamaConfig,
    vocab_size: i64,
}

impl LlamaForCausalLm {
    /// A decoder of `config`'s sizes whose logits cover `vocab_size` tokens (the config's, else
    /// `num_classes`), its tensors in `store` under Hugging Face's names. Sizes that do not fit
    /// are errors naming the `[model]` key.
    pub fn new(
        store: &mut ParamStore,
        config: &LlamaConfig,
        num_classes: i64,
    ) -> Result<Self, TchError> {
        let vocab_size = validate(config, num_classes)?;
        let c = config.hidden_size as i64;
        let std = config.initializer_range;
        let embed = Embedding::new(store, "model.embed_tokens", vocab_size, c, normal(std))?;
        let mut layers = Sequential::new();
        for i in 0..config.num_hidden_layers {
            let path = format!("model.layers.{i}");
            layers = layers.add(i.to_string(), LlamaBlock::new(store, &path, config)?);
        }
        let norm = RmsNorm::new(store, "model.norm", c, config.rms_norm_eps)?;
        let lm_head = if config.tie_embeddings {
            LmHead::tied(embed.weight().shallow_clone(), c, vocab_size)
        } else {
            let weight =
                store.parameter("lm_head.weight".to_owned(), &[vocab_size, c], normal(std))?;
            LmHead::untied(weight, c, vocab_size)
        };
        let model = LlamaModel {
            embed_tokens: Box::new(embed),
            layers: Box::new(layers),
            norm: Box::new(norm),
            max_positions: config.max_position_embeddings as i64,
        };
        Ok(LlamaForCausalLm {
            model: Box::new(model),
            lm_head: Box::new(lm_head),
            config: config.clone(),
            vocab_size,
        })
    }
}

/// Checks `config`; returns the vocabulary size.
fn validate(config: &LlamaConfig, num_classes: i64) -> Result<i64, TchError> {
    let bad = |msg: String| Err(TchError::Shape(format!("llama: {msg}")));
    let heads = config.num_attention_heads;
    let kv = config.kv_heads();
    if kv == 0 || !heads.is_multiple_of(kv) {
        return bad(format!(
            "`[model] num_key_value_heads` ({kv}) must divide `num_attention_heads` ({heads})"
        ));
    }
    if config.head_dim.is_none() && heads > 0 && !config.hidden_size.is_multiple_of(heads) {
        return bad(format!(
            "`[model] hidden_size` ({}) must be a multiple of `num_attention_heads` ({heads}), \
             or set `head_dim`",
            config.hidden_size
        ));
    }
    if !config.head_width().is_multiple_of(2) || config.head_width() == 0 {
        return bad(format!(
            "the head width ({}) must be even for the rotary positions (`[model] head_dim`)",
            config.head_width()
        ));
    }
    if config.rope_theta.is_nan() || config.rope_theta <= 0.0 {
        return bad(format!(
            "`[model] rope_theta` must be > 0, got {}",
            config.rope_theta
        ));
    }
    if config.rms_norm_eps.is_nan() || config.rms_norm_eps <= 0.0 {
        return bad(format!(
            "`[model] rms_norm_eps` must be > 0, got {}",
            config.rms_norm_eps
        ));
    }
    if let Some(s) = config.rope_scaling {
        let fine =
            s.factor > 0.0 && s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor;
        if !fine {
            return bad(format!(
                "`[model] rope_scaling`: factor and low_freq_factor must be > 0 and \
                 high_freq_factor > low_freq_factor, got {s:?}"
            ));
        }
    }
    check_sizes(
        "llama",
        &[
            ("num_hidden_layers", config.num_hidden_layers),
            ("num_attention_heads", heads),
            ("hidden_size", config.hidden_size),
            ("intermediate_size", config.intermediate_size),
            ("max_position_embeddings", config.max_position_embeddings),
        ],
        (heads, heads),
        config.rms_norm_eps,
        (config.vocab_size, num_classes),
    )
}

impl Layer for LlamaForCausalLm {
    fn kind(&self) -> &str {
        "llama_for_causal_lm"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        let c = &self.config;
        vec![
            ("vocab_size", Attr::Int(self.vocab_size)),
            ("hidden_size", Attr::Int(c.hidden_size as i64)),
            ("num_hidden_layers", Attr::Int(c.num_hidden_layers as i64)),
            (
                "num_attention_heads",
                Attr::Int(c.num_attention_heads as i64),
            ),
            ("num_key_value_heads", Attr::Int(c.kv_heads() as i64)),
            ("tie_embeddings", Attr::Bool(c.tie_embeddings)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("model", self.model.as_ref()),
            ("lm_head", self.lm_head.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "model" => Some(&mut self.model),
            "lm_head" => Some(&mut self.lm_head),
            _ => None,
        }
    }

    fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let hidden = self.model.forward(ids, train)?;
        self.lm_head.forward(&hidden, train)
    }

    /// The logits of the last new token only `(B, 1, V)`: generation needs no other.
    fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let hidden = self.model.forward_cached(ids, cache)?;
        let t = hidden.size().get(1).copied().unwrap_or(1);
        self.lm_head
            .forward_cached(&hidden.f_narrow(1, t - 1, 1)?, cache)
    }
}
