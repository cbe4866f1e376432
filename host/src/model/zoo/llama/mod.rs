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

use serde::{Deserialize, Serialize};
use tch::{Kind, TchError, Tensor};

use super::gpt2::{check_sizes, merge_heads, normal, LmHead};
use super::{Attr, Embedding, KvCache, Layer, Linear, Sequential};
use crate::model::{hf_json, tree::join, ParamStore};

/// The sizes and choices of a Llama-family decoder, named as Hugging Face's `LlamaConfig`
/// (`[model]` keys, or `config.json`). The defaults are SmolLM-135M's shapes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// Blocks (`num_hidden_layers`).
    pub num_hidden_layers: usize,
    /// Width of the residual stream (`hidden_size`).
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections (`intermediate_size`).
    pub intermediate_size: usize,
    /// Query heads (`num_attention_heads`).
    pub num_attention_heads: usize,
    /// Key and value heads (`num_key_value_heads`, grouped-query attention); divides the query
    /// heads. `None`: as many as the query heads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// Width of a head (`head_dim`); `None`: `hidden_size / num_attention_heads`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Rows of the token embedding and logits per token; `None`: the data's vocabulary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    /// The longest sequence (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    /// The epsilon of every RMSNorm (`rms_norm_eps`).
    pub rms_norm_eps: f64,
    /// The rotary base (`rope_theta`).
    pub rope_theta: f64,
    /// Llama 3's frequency-dependent scaling of the rotary frequencies (`rope_scaling` with
    /// `rope_type = "llama3"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// Whether `lm_head` shares the token embedding's weight (`tie_word_embeddings`).
    pub tie_embeddings: bool,
    /// Biases on the q, k and v projections (`attention_bias`; Qwen2 has them).
    pub attention_bias: bool,
    /// A bias on the output projection too (Llama's `attention_bias` puts one on all four;
    /// Qwen2 on q, k and v only). `None`: as `attention_bias`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub o_bias: Option<bool>,
    /// The standard deviation of every weight's normal init (`initializer_range`).
    pub initializer_range: f64,
}

impl Default for LlamaConfig {
    fn default() -> Self {
        LlamaConfig {
            num_hidden_layers: 30,
            hidden_size: 576,
            intermediate_size: 1536,
            num_attention_heads: 9,
            num_key_value_heads: Some(3),
            head_dim: None,
            vocab_size: None,
            max_position_embeddings: 2048,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: None,
            tie_embeddings: true,
            attention_bias: false,
            o_bias: None,
            initializer_range: 0.02,
        }
    }
}

/// Llama 3's `rope_scaling` (`rope_type = "llama3"`): frequencies whose wavelength is longer
/// than `original_max_position_embeddings / low_freq_factor` are divided by `factor`, those
/// shorter than `... / high_freq_factor` kept, those between interpolated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// `factor`.
    pub factor: f64,
    /// `low_freq_factor`.
    pub low_freq_factor: f64,
    /// `high_freq_factor`.
    pub high_freq_factor: f64,
    /// `original_max_position_embeddings`.
    pub original_max_position_embeddings: f64,
}

impl LlamaConfig {
    /// The config of a Hugging Face `config.json` (`LlamaForCausalLM`, `MistralForCausalLM`
    /// without a sliding window, `Qwen2ForCausalLM`), as transformers 4 (`rope_theta`,
    /// `rope_scaling`) or 5 (`rope_parameters`) writes it. What this model does not compute (another
    /// activation, an MLP bias, a sliding window, another rotary type) is an error naming the key.
    pub fn from_hf_config(json: &serde_json::Value) -> Result<LlamaConfig, String> {
        let get = |key: &str| hf_json::field(json, key);
        let count = |key: &str| hf_json::count(json, key);
        let number = hf_json::number;
        let flag = |key: &str| hf_json::flag(json, key);
        let model_type = get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or("llama");
        if !matches!(model_type, "llama" | "mistral" | "qwen2") {
            return Err(format!(
                "`model_type` {model_type:?} is not a Llama-family decoder this model computes \
                 (llama, mistral, qwen2)"
            ));
        }
        if let Some(act) = get("hidden_act").and_then(|v| v.as_str()) {
            if act != "silu" {
                return Err(format!(
                    "`hidden_act` {act:?}: only \"silu\" (SwiGLU) is computed"
                ));
            }
        }
        if flag("mlp_bias")? == Some(true) {
            return Err("`mlp_bias` = true is not computed (Llama's MLP has no biases)".into());
        }
        if flag("use_sliding_window")? == Some(true)
            || (model_type == "mistral" && get("sliding_window").is_some())
        {
            return Err("a sliding attention window (`sliding_window`) is not computed".into());
        }
        let defaults = LlamaConfig::default();
        let required = |key: &str| -> Result<usize, String> {
            count(key)?.ok_or_else(|| format!("`{key}` is missing"))
        };
        // transformers 5 keeps the rotary settings in `rope_parameters`, 4 in `rope_theta` and
        // `rope_scaling`.
        let rope = get("rope_parameters").or(get("rope_scaling"));
        let theta = match rope.and_then(|r| r.get("rope_theta")).or(get("rope_theta")) {
            Some(v) => number(v, "rope_theta")?,
            None => defaults.rope_theta,
        };
        let rope_type = rope
            .and_then(|r| r.get("rope_type").or(r.get("type")))
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        let rope_scaling = match rope_type {
            "default" => None,
            "llama3" => {
                let r = rope.unwrap_or(&serde_json::Value::Null);
                let field = |key: &str| -> Result<f64, String> {
                    let v = r
                        .get(key)
                        .ok_or_else(|| format!("`rope_scaling.{key}` is missing"))?;
                    number(v, &format!("rope_scaling.{key}"))
                };
                Some(RopeScaling {
                    factor: field("factor")?,
                    low_freq_factor: field("low_freq_factor")?,
                    high_freq_factor: field("high_freq_factor")?,
                    original_max_position_embeddings: field("original_max_position_embeddings")?,
                })
            }
            other => {
                return Err(format!(
                    "rotary type {other:?} (`rope_type`) is not computed (\"default\", \"llama3\")"
                ))
            }
        };
        let qwen2 = model_type == "qwen2";
        Ok(LlamaConfig {
            num_hidden_layers: required("num_hidden_layers")?,
            hidden_size: required("hidden_size")?,
            intermediate_size: required("intermediate_size")?,
            num_attention_heads: required("num_attention_heads")?,
            num_key_value_heads: count("num_key_value_heads")?,
            head_dim: count("head_dim")?,
            vocab_size: count("vocab_size")?,
            max_position_embeddings: count("max_position_embeddings")?
                .unwrap_or(defaults.max_position_embeddings),
            rms_norm_eps: match get("rms_norm_eps") {
                Some(v) => number(v, "rms_norm_eps")?,
                None => defaults.rms_norm_eps,
            },
            rope_theta: theta,
            rope_scaling,
            // transformers' default for `tie_word_embeddings` is true.
            tie_embeddings: flag("tie_word_embeddings")?.unwrap_or(true),
            attention_bias: if qwen2 {
                true
            } else {
                flag("attention_bias")?.unwrap_or(false)
            },
            o_bias: qwen2.then_some(false),
            initializer_range: match get("initializer_range") {
                Some(v) => number(v, "initializer_range")?,
                None => defaults.initializer_range,
            },
        })
    }

    /// Key and value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of a head.
    pub fn head_width(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }
}

/// The rotary frequencies of heads of width `dim`: `1 / theta^(2i / dim)`, float32, then Llama
/// 3's scaling (Hugging Face's `_compute_default_rope_parameters` and
/// `_compute_llama3_parameters`, in the same float32 operations).
fn inv_freq(dim: i64, theta: f64, scaling: Option<RopeScaling>) -> Result<Tensor, TchError> {
    let opts = (Kind::Float, tch::Device::Cpu);
    let exponents = Tensor::f_arange_start_step(0, dim, 2, (Kind::Int64, tch::Device::Cpu))?
        .f_to_kind(Kind::Float)?
        .f_div_scalar(dim as f64)?;
    let base = Tensor::f_full([], theta, opts)?;
    let inv = base.f_pow(&exponents)?.f_reciprocal()?;
    let Some(s) = scaling else {
        return Ok(inv);
    };
    let old = s.original_max_position_embeddings;
    let low_wavelen = old / s.low_freq_factor;
    let high_wavelen = old / s.high_freq_factor;
    let wavelen = inv
        .f_reciprocal()?
        .f_mul_scalar(2.0 * std::f64::consts::PI)?;
    let long = wavelen.f_gt(low_wavelen)?;
    let scaled = inv.f_div_scalar(s.factor)?.f_where_self(&long, &inv)?;
    let smooth = wavelen
        .f_reciprocal()?
        .f_mul_scalar(old)?
        .f_sub_scalar(s.low_freq_factor)?
        .f_div_scalar(s.high_freq_factor - s.low_freq_factor)?;
    let smoothed = smooth
        .f_neg()?
        .f_add_scalar(1.0)?
        .f_mul(&scaled)?
        .f_div_scalar(s.factor)?
        .f_add(&smooth.f_mul(&scaled)?)?;
    let medium = wavelen
        .f_lt(high_wavelen)?
        .f_logical_not()?
        .f_logical_and(&long.f_logical_not()?)?;
    smoothed.f_where_self(&medium, &scaled)
}

/// `(cos, sin)` of `(1, 1, T, D)` for positions `0..t` on `like`'s device, in its kind.
fn rotary(inv_freq: &Tensor, t: i64, like: &Tensor) -> Result<(Tensor, Tensor), TchError> {
    let positions = Tensor::f_arange(t, (Kind::Float, like.device()))?.f_unsqueeze(0)?;
    rotary_at(inv_freq, &positions, like)
}

/// `(cos, sin)` of `(B, 1, T, D)` for the positions `(B, T)` (each row its own, as generation's
/// left-padded rows have), on `like`'s device, in its kind.
fn rotary_at(
    inv_freq: &Tensor,
    positions: &Tensor,
    like: &Tensor,
) -> Result<(Tensor, Tensor), TchError> {
    let device = like.device();
    let freqs = positions
        .f_to_kind(Kind::Float)?
        .f_unsqueeze(-1)?
        .f_mul(&inv_freq.f_to_device(device)?)?;
    let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
    let shape =
        |x: Tensor| -> Result<Tensor, TchError> { x.f_to_kind(like.kind())?.f_unsqueeze(1) };
    Ok((shape(emb.f_cos()?)?, shape(emb.f_sin()?)?))
}

/// `cat(-x₂, x₁)` over the last dimension's halves.
fn rotate_half(x: &Tensor) -> Result<Tensor, TchError> {
    let half = x.size().last().copied().unwrap_or(0) / 2;
    let x1 = x.f_narrow(-1, 0, half)?;
    let x2 = x.f_narrow(-1, half, half)?;
    Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)
}

/// A normal(0, std) weight and optional zero bias, as Hugging Face initialises a Llama linear.
fn projection(
    store: &mut ParamStore,
    path: &str,
    (in_features, out_features): (i64, i64),
    bias: bool,
    std: f64,
) -> Result<Linear, TchError> {
    Linear::with_init_and_bias(store, path, in_features, out_features, normal(std), bias)
}

/// RMSNorm (`LlamaRMSNorm`), kind `rms_norm`.
#[derive(Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
    size: i64,
}

impl RmsNorm {
    /// A norm of width `size` whose weight (ones) joins `store` as `{path}.weight`.
    pub fn new(store: &mut ParamStore, path: &str, size: i64, eps: f64) -> Result<Self, TchError> {
        let weight = store.parameter(join(path, "weight"), &[size], tch::nn::Init::Const(1.0))?;
        Ok(RmsNorm { weight, eps, size })
    }
}

impl Layer for RmsNorm {
    fn kind(&self) -> &str {
        "rms_norm"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("normalized_shape", Attr::Int(self.size)),
            ("eps", Attr::Float(self.eps)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![("weight", &self.weight)]
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        let kind = xs.kind();
        let x = xs.f_to_kind(Kind::Float)?;
        let variance = x
            .f_pow_tensor_scalar(2)?
            .f_mean_dim(-1, true, Kind::Float)?;
        let normed = x.f_mul(&variance.f_add_scalar(self.eps)?.f_rsqrt()?)?;
        self.weight.f_mul(&normed.f_to_kind(kind)?)
    }
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

/// `x · cos + rotate_half(x) · sin`: rotary positions applied to queries or keys.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, TchError> {
    x.f_mul(cos)?.f_add(&rotate_half(x)?.f_mul(sin)?)
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

/// The SwiGLU feed-forward block (`LlamaMLP`), kind `llama_mlp`:
/// `down_proj(silu(gate_proj(x)) · up_proj(x))`.
#[derive(Debug)]
pub struct LlamaMlp {
    gate_proj: Box<dyn Layer>,
    up_proj: Box<dyn Layer>,
    down_proj: Box<dyn Layer>,
    hidden: i64,
    intermediate: i64,
}

impl LlamaMlp {
    /// The MLP of block `path`.
    pub fn new(store: &mut ParamStore, path: &str, config: &LlamaConfig) -> Result<Self, TchError> {
        let (c, i) = (config.hidden_size as i64, config.intermediate_size as i64);
        let std = config.initializer_range;
        let at = |name| join(path, name);
        Ok(LlamaMlp {
            gate_proj: Box::new(projection(store, &at("gate_proj"), (c, i), false, std)?),
            up_proj: Box::new(projection(store, &at("up_proj"), (c, i), false, std)?),
            down_proj: Box::new(projection(store, &at("down_proj"), (i, c), false, std)?),
            hidden: c,
            intermediate: i,
        })
    }
}

impl Layer for LlamaMlp {
    fn kind(&self) -> &str {
        "llama_mlp"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("hidden_size", Attr::Int(self.hidden)),
            ("intermediate_size", Attr::Int(self.intermediate)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("gate_proj", self.gate_proj.as_ref()),
            ("up_proj", self.up_proj.as_ref()),
            ("down_proj", self.down_proj.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "gate_proj" => Some(&mut self.gate_proj),
            "up_proj" => Some(&mut self.up_proj),
            "down_proj" => Some(&mut self.down_proj),
            _ => None,
        }
    }

    fn is_position_wise(&self) -> bool {
        self.children().iter().all(|(_, c)| c.is_position_wise())
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let gate = self.gate_proj.forward(xs, train)?.f_silu()?;
        let up = self.up_proj.forward(xs, train)?;
        self.down_proj.forward(&gate.f_mul(&up)?, train)
    }
}

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

/// The decoder without its head (`LlamaModel`, path `model`), kind `llama_model`: token ids
/// `(B, T)` to the final hidden states `(B, T, C)`.
#[derive(Debug)]
pub struct LlamaModel {
    embed_tokens: Box<dyn Layer>,
    layers: Box<dyn Layer>,
    norm: Box<dyn Layer>,
    max_positions: i64,
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
