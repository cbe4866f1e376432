#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use gpt_surgery::kinds::{ALIBI_ATTENTION, EXT_ATTENTION, GPT2_ATTENTION, SURGERY_PRIORITY};
use gpt_surgery::{rebuild_attention, Model};
use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings};

pub use gpt_surgery::{qk_rms_norm, ExtAttention};

/// The surgery: refuses a model with ALiBi's attention; every `gpt2_attention` or
/// `gpt2_attention_ext` without QK-norm becomes a `gpt2_attention_ext` with it (the same
/// tensors, its other features kept). Returns the replaced paths; modules that already
/// normalise q and k are left alone, so a second application changes nothing.
pub fn apply_qk_norm(model: &mut impl Model) -> Result<Vec<String>, Error> {
    if let Some(m) = model
        .modules()?
        .into_iter()
        .find(|m| m.kind.as_str() == ALIBI_ATTENTION)
    {
        return Err(Error::config(format!(
            "qk_norm cannot change ALiBi's attention ({ALIBI_ATTENTION} at `{}`): it normalises \
             q and k of the {GPT2_ATTENTION} blocks only (with rotary positions instead of \
             ALiBi's, list rotary and qk_norm)",
            m.path
        )));
    }
    rebuild_attention(model, |spec| {
        if spec.qk_norm {
            return Ok(false);
        }
        spec.qk_norm = true;
        Ok(true)
    })
}

/// The QK-norm method: surgery at `init`.
#[derive(Debug, Clone, Copy, Default)]
pub struct QkNorm;

impl Method for QkNorm {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let done = apply_qk_norm(ctx)?;
        if done.is_empty() {
            let normalised = ctx
                .modules()?
                .iter()
                .filter(|m| m.kind.as_str() == EXT_ATTENTION && m.attr("qk_norm") == Some(1.0))
                .count();
            if normalised == 0 {
                ctx.warn(&format!(
                    "qk_norm: the model has no {GPT2_ATTENTION} block: QK-norm had no effect"
                ));
            }
            return Ok(());
        }
        ctx.info(&format!(
            "qk_norm: {} attention blocks RMS-normalise q and k per head",
            done.len()
        ));
        Ok(())
    }
}

impl Plugin for QkNorm {
    const NAME: &'static str = "qk_norm";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "RMS-normalises queries and keys per head before the attention (GPT-2 surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            event: Event::INIT,
            priority: SURGERY_PRIORITY,
        }]
    }

    fn create(_settings: &Settings) -> Result<Self, Error> {
        Ok(QkNorm)
    }
}

export_plugin!(QkNorm);
