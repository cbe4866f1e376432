//! Module kinds of the host's GPT-2 and of the modules the architecture plugins put in (and of
//! the other plugins' modules they must recognise).

/// The host's GPT-2 attention.
pub const GPT2_ATTENTION: &str = "gpt2_attention";
/// The attention with rotary positions and/or QK-norm ([`crate::ExtAttention`]).
pub const EXT_ATTENTION: &str = "gpt2_attention_ext";
/// The host's GPT-2 feed-forward block.
pub const GPT2_MLP: &str = "gpt2_mlp";
/// relu_squared's feed-forward block.
pub const RELU_SQUARED_MLP: &str = "relu_squared_gpt2_mlp";
/// The host's GPT-2 block (`transformer.h.{i}`).
pub const GPT2_BLOCK: &str = "gpt2_block";
/// The host's embedding table.
pub const EMBEDDING: &str = "embedding";
/// rotary's zero, untrained position table in place of `transformer.wpe`.
pub const ROTARY_ZERO_POSITIONS: &str = "rotary_zero_positions";
/// The host's tied language-model head (`lm_head` multiplying by `transformer.wte.weight`).
pub const TIED_LM_HEAD: &str = "tied_lm_head";
/// The host's untied language-model head (and any other linear layer).
pub const LINEAR: &str = "linear";
/// logit_softcap's wrapper around `lm_head`.
pub const SOFTCAP_LM_HEAD: &str = "logit_softcap_lm_head";
/// ALiBi's attention (plugins/alibi).
pub const ALIBI_ATTENTION: &str = "alibi_gpt2_attention";
/// ALiBi's zero position table (plugins/alibi).
pub const ALIBI_ZERO_POSITIONS: &str = "alibi_zero_positions";
/// Gated linear units' feed-forward block (plugins/gated_linear_units).
pub const GLU_MLP: &str = "glu_gpt2_mlp";

/// The host's Llama-family block (`model.layers.{i}`): `self_attn` (`llama_attention`, its
/// projections `q_proj`, `k_proj`, `v_proj`, `o_proj` linear children) and `mlp` (`llama_mlp`:
/// `gate_proj`, `up_proj`, `down_proj`).
pub const LLAMA_BLOCK: &str = "llama_block";
/// The host's Llama-family attention.
pub const LLAMA_ATTENTION: &str = "llama_attention";
/// The root of a Llama-family decoder.
pub const LLAMA_ROOT: &str = "llama_for_causal_lm";
/// qk_norm's wrapper around a llama attention's `q_proj` or `k_proj`.
pub const QK_NORM_PROJECTION: &str = "qk_norm_projection";

/// Path of GPT-2's position embedding.
pub const WPE_PATH: &str = "transformer.wpe";
/// Path of GPT-2's language-model head.
pub const LM_HEAD_PATH: &str = "lm_head";

/// The `init` priority of the surgery plugins: below the default 0, so that they run after
/// ALiBi's and gated linear units' surgery whatever the `trainer.toml` order, and so see (and
/// refuse) those plugins' modules.
pub const SURGERY_PRIORITY: i32 = -10;
/// zero_init_projections' `init` priority: after every surgery above (it zeroes the output
/// projections of the modules they put in, GLU's fresh `wo` included), before channels_last
/// (−100).
pub const ZERO_INIT_PRIORITY: i32 = -20;
