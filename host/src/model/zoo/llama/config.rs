//! A Llama-family model's sizes (`LlamaConfig`, `RopeScaling`) and their reading from a Hugging
//! Face `config.json`.

use serde::{Deserialize, Serialize};

use crate::model::hf_json;

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
