#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod functional;
mod modules;
mod surgery;

use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Settings,
};

pub use functional::{
    alibi_attention, alibi_attention_mask, alibi_attention_with, alibi_batch_shape,
    alibi_head_slopes, alibi_sdpa_attention, bert_alibi_attention, bidirectional_alibi_bias,
    causal_alibi_bias, reshape_for_alibi, AttentionOptions, BertAttentionWeights,
    Gpt2AttentionWeights, MASKED_BIAS,
};
pub use modules::{
    AlibiAttention, AlibiBertAttention, AlibiModule, ZeroPositions, ALIBI_ATTENTION,
    ALIBI_BERT_ATTENTION, ZERO_POSITIONS,
};
pub use surgery::{
    apply_alibi, Outcome, BERT_POSITIONS_PATH, BERT_SELF_ATTENTION, EMBEDDING, GPT2_ATTENTION,
    WPE_PATH,
};

/// The ALiBi method: surgery at `init`, shorter training sequences at `after_dataloader`.
#[derive(Debug, Clone, PartialEq)]
pub struct Alibi {
    max_sequence_length: i64,
    train_sequence_length_scaling: f64,
}

impl Alibi {
    /// `max_sequence_length`: the longest sequence the model can take after the surgery.
    pub fn max_sequence_length(&self) -> i64 {
        self.max_sequence_length
    }

    /// `train_sequence_length_scaling`: training batches `(B, S)` become
    /// `(B / scaling, S · scaling)`.
    pub fn train_sequence_length_scaling(&self) -> f64 {
        self.train_sequence_length_scaling
    }

    fn reshape_batch(&self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let scale = self.train_sequence_length_scaling;
        if scale == 1.0 {
            return Ok(());
        }
        let mut keys = ctx.batch_keys()?;
        if keys.is_empty() {
            keys = vec![keys::INPUT.to_owned(), keys::TARGET.to_owned()];
        }
        let mut entries = Vec::with_capacity(keys.len());
        for key in &keys {
            let Some(t) = ctx.tensor(key) else { continue };
            if t.dim() < 2 {
                return Err(format!(
                    "alibi: batch tensor `{key}` has shape {:?}; ALiBi reshapes token batches \
                     (B, S) and needs every batch tensor to have a sequence dimension",
                    t.size()
                )
                .into());
            }
            let out = reshape_for_alibi(&t, scale)
                .map_err(|e| format!("{} (batch tensor `{key}`)", e.message()))?;
            entries.push((key.as_str(), out));
        }
        ctx.set_batch(entries)
    }
}

impl Method for Alibi {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        if event == Event::INIT {
            let outcome = apply_alibi(ctx, self.max_sequence_length)?;
            if outcome.attention.is_empty() && !outcome.positions {
                ctx.warn(
                    "alibi: the model has no gpt2_attention or bert_self_attention block and \
                     no position embedding: ALiBi had no effect",
                );
            } else {
                ctx.info(&format!(
                    "alibi: {} attention blocks use ALiBi (max_sequence_length {}){}",
                    outcome.attention.len(),
                    self.max_sequence_length,
                    if outcome.positions {
                        "; the position embedding zeroed and frozen"
                    } else {
                        ""
                    }
                ));
            }
            Ok(())
        } else {
            self.reshape_batch(ctx)
        }
    }
}

impl Plugin for Alibi {
    const NAME: &'static str = "alibi";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "attention with linear biases instead of position \
        embeddings (GPT-2 and BERT surgery at init), training on shorter sequences";
    const DEFAULT_SETTINGS: &'static str = "# max_sequence_length = 1024  (required)\n\
        train_sequence_length_scaling = 0.25";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT), Hook::at(Event::AFTER_DATALOADER)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let max = settings
            .get_or::<Option<u64>>("max_sequence_length", None)?
            .ok_or_else(|| {
                Error::config(
                    "`max_sequence_length` is required: the longest sequence the model will see \
                     after the surgery (for example 1024)",
                )
            })?;
        let max_sequence_length = i64::try_from(max).ok().filter(|&m| m >= 1).ok_or_else(|| {
            Error::config(format!(
                "`max_sequence_length` must be a positive integer, got {max}"
            ))
        })?;
        let scale = settings.f64("train_sequence_length_scaling")?;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::config(format!(
                "`train_sequence_length_scaling` must be a positive number, got {scale}"
            )));
        }
        Ok(Alibi {
            max_sequence_length,
            train_sequence_length_scaling: scale,
        })
    }
}

export_plugin!(Alibi);
