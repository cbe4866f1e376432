//! ALiBi's surgery over any [`SurgeryModel`] ([`apply_alibi`]).

use tessera_plugin_api::kit::{walk, SurgeryModel};
use tessera_plugin_api::{Error, ErrorKind, ModuleInfo};

use crate::functional::{
    alibi_head_slopes, bidirectional_alibi_bias, causal_alibi_bias, BertAttentionWeights,
    Gpt2AttentionWeights,
};
use crate::modules::{AlibiAttention, AlibiBertAttention, AlibiModule, ZeroPositions};

/// Module kind of the host's GPT-2 attention block.
pub const GPT2_ATTENTION: &str = "gpt2_attention";
/// Module kind of the host's embedding table.
pub const EMBEDDING: &str = "embedding";
/// Path of GPT-2's position embedding.
pub const WPE_PATH: &str = "transformer.wpe";
/// Module kind of the host's BERT self-attention.
pub const BERT_SELF_ATTENTION: &str = "bert_self_attention";
/// Path of BERT's position embedding.
pub const BERT_POSITIONS_PATH: &str = "bert.embeddings.position_embeddings";

/// What one application did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Paths of the attention blocks given ALiBi.
    pub attention: Vec<String>,
    /// Whether the position embedding (`transformer.wpe`, `bert.embeddings.position_embeddings`)
    /// was zeroed and frozen.
    pub positions: bool,
}

fn prob_attr(module: &ModuleInfo, key: &str) -> Result<f64, Error> {
    let p = module.attr(key).unwrap_or(0.0);
    if !(0.0..1.0).contains(&p) {
        return Err(Error::new(
            ErrorKind::HOST,
            format!(
                "{} `{}`: `{key}` = {p} is not in [0, 1)",
                module.kind, module.path
            ),
        ));
    }
    Ok(p)
}

/// Composer's `apply_alibi(model, max_sequence_length)` on the host's GPT-2 and BERT: every
/// `gpt2_attention` becomes an [`AlibiAttention`] over the same tensors with the causal bias of
/// its `n_head` slopes for `max_sequence_length` positions, every `bert_self_attention` an
/// [`AlibiBertAttention`] with the bidirectional bias, and the `embedding` at
/// `transformer.wpe` or `bert.embeddings.position_embeddings` becomes [`ZeroPositions`] (a
/// zero, frozen `(max_sequence_length, n_embd)` table). Modules already changed are not
/// candidates, so a second application changes nothing.
pub fn apply_alibi(
    model: &mut impl SurgeryModel,
    max_sequence_length: i64,
) -> Result<Outcome, Error> {
    if max_sequence_length < 1 {
        return Err(Error::config(format!(
            "`max_sequence_length` must be at least 1, got {max_sequence_length}"
        )));
    }
    let modules = model.modules()?;
    let mut outcome = Outcome::default();
    for m in walk::of_kind(&modules, GPT2_ATTENTION) {
        let n_head = m.int_attr("n_head", None)?;
        let weights = Gpt2AttentionWeights {
            c_attn_weight: model.tensor_of(m, "c_attn.weight")?,
            c_attn_bias: model.tensor_of(m, "c_attn.bias")?,
            c_proj_weight: model.tensor_of(m, "c_proj.weight")?,
            c_proj_bias: model.tensor_of(m, "c_proj.bias")?,
        };
        let heads = usize::try_from(n_head)
            .map_err(|_| format!("{} `{}`: n_head = {n_head}", m.kind, m.path))?;
        let w = &weights.c_attn_weight;
        let alibi = causal_alibi_bias(
            &alibi_head_slopes(heads)?,
            max_sequence_length,
            (w.kind(), w.device()),
        )?;
        let module = AlibiAttention::new(
            weights,
            alibi,
            n_head,
            prob_attr(m, "attn_pdrop")?,
            prob_attr(m, "resid_pdrop")?,
        )
        .map_err(|e| format!("{} `{}`: {}", m.kind, m.path, e.message()))?;
        model.replace(&m.path, AlibiModule::Attention(module))?;
        outcome.attention.push(m.path.to_string());
    }
    for m in walk::of_kind(&modules, BERT_SELF_ATTENTION) {
        let n_head = m.int_attr("n_head", None)?;
        let weights = BertAttentionWeights {
            query_weight: model.tensor_of(m, "query.weight")?,
            query_bias: model.tensor_of(m, "query.bias")?,
            key_weight: model.tensor_of(m, "key.weight")?,
            key_bias: model.tensor_of(m, "key.bias")?,
            value_weight: model.tensor_of(m, "value.weight")?,
            value_bias: model.tensor_of(m, "value.bias")?,
        };
        let heads = usize::try_from(n_head)
            .map_err(|_| format!("{} `{}`: n_head = {n_head}", m.kind, m.path))?;
        let w = &weights.query_weight;
        let alibi = bidirectional_alibi_bias(
            &alibi_head_slopes(heads)?,
            max_sequence_length,
            (w.kind(), w.device()),
        )?;
        let module = AlibiBertAttention::new(
            weights,
            alibi,
            n_head,
            prob_attr(m, "attention_probs_dropout_prob")?,
        )
        .map_err(|e| format!("{} `{}`: {}", m.kind, m.path, e.message()))?;
        model.replace(&m.path, AlibiModule::BertAttention(module))?;
        outcome.attention.push(m.path.to_string());
    }
    if let Some(m) = walk::of_kind(&modules, EMBEDDING)
        .find(|m| [WPE_PATH, BERT_POSITIONS_PATH].contains(&m.path.as_str()))
    {
        let weight = model.tensor_of(m, "weight")?;
        let n_embd = *weight.size().get(1).ok_or_else(|| {
            format!(
                "`{}.weight` is not a (positions, n_embd) table",
                m.path.as_str()
            )
        })?;
        let module = ZeroPositions::with_kind(
            crate::modules::ZERO_POSITIONS,
            "ALiBi",
            max_sequence_length,
            n_embd,
            (weight.kind(), weight.device()),
        )?;
        model.replace(&m.path, AlibiModule::Positions(module))?;
        outcome.positions = true;
    }
    Ok(outcome)
}
