#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use gpt_surgery::kinds::{
    LINEAR, LLAMA_ROOT, LM_HEAD_PATH, SOFTCAP_LM_HEAD, SURGERY_PRIORITY, TIED_LM_HEAD,
};
use tessera_plugin_api::kit::{walk, SurgeryModel};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Inner, Method, Plugin, Settings, Wrapper,
};

/// The default cap (modded-nanogpt's 30; Gemma 2's final-logit cap is 30 too).
pub const DEFAULT_CAP: f64 = 30.0;

/// `cap · tanh(logits / cap)`, computed in float32 for float16/bfloat16 logits (as
/// modded-nanogpt casts the logits with `.float()` before its cap) and in the logits' own
/// dtype otherwise; the result has that dtype.
pub fn softcap(logits: &Tensor, cap: f64) -> Result<Tensor, Error> {
    let x = match logits.kind() {
        Kind::Half | Kind::BFloat16 => logits.f_to_kind(Kind::Float)?,
        _ => logits.shallow_clone(),
    };
    Ok(x.f_div_scalar(cap)?.f_tanh()?.f_mul_scalar(cap)?)
}

/// The wrapper around `lm_head` (kind [`SOFTCAP_LM_HEAD`]): runs the head, then [`softcap`].
/// Transparent: the head keeps its tensors and names (none of its own when tied to
/// `transformer.wte.weight`, `weight` when untied).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftcapHead {
    cap: f64,
    tied: bool,
}

impl SoftcapHead {
    /// The wrapper for a head that is `tied` (or not) with cap `cap`.
    pub fn new(cap: f64, tied: bool) -> SoftcapHead {
        SoftcapHead { cap, tied }
    }

    /// The cap.
    pub fn cap(&self) -> f64 {
        self.cap
    }
}

impl Wrapper for SoftcapHead {
    fn kind(&self) -> &str {
        SOFTCAP_LM_HEAD
    }

    /// `cap`, and `tied` (1 when the head multiplies by `transformer.wte.weight`), besides the
    /// head's own (`in_features`, `out_features`, `bias`).
    fn attrs(&self) -> Vec<(String, f64)> {
        vec![
            ("cap".to_owned(), self.cap),
            ("tied".to_owned(), f64::from(u8::from(self.tied))),
        ]
    }

    fn forward(&self, input: &Tensor, train: bool, inner: &mut Inner<'_>) -> Result<Tensor, Error> {
        softcap(&inner.forward(input, train)?, self.cap)
    }
    // `export`: the default (kept, listed in `tessera.modules` with `cap` and `tied`): the cap
    // changes the logits, so the head does not fold back into a plain `lm_head`. Untied, the
    // export holds `lm_head.weight`; tied, the node holds no tensor of its own and the export
    // has no second copy of `transformer.wte.weight` under `lm_head.weight` (the PyTorch twin
    // in scripts/pytorch_models.py multiplies by the token embedding, as the host does).
}

/// What the surgery found at `lm_head`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The head was wrapped; `tied` says whether it multiplies by the token embedding.
    Wrapped {
        /// Tied to `transformer.wte.weight`.
        tied: bool,
    },
    /// It already was capped (a second application changes nothing).
    AlreadyCapped,
    /// The model has no GPT-2 language-model head.
    NoHead,
}

/// The surgery: wraps the GPT-2's `lm_head` (`tied_lm_head` or `linear`) in a
/// [`SoftcapHead`] with `cap`.
pub fn apply_logit_softcap(model: &mut impl SurgeryModel, cap: f64) -> Result<Outcome, Error> {
    let modules = model.modules()?;
    // GPT-2's head, or a Llama-family decoder's (the same two kinds, tied or untied).
    let is_gpt2 = walk::find(&modules, "")
        .is_some_and(|m| matches!(m.kind.as_str(), "gpt2_lm_head_model" | LLAMA_ROOT));
    let Some(head) = walk::find(&modules, LM_HEAD_PATH).filter(|_| is_gpt2) else {
        return Ok(Outcome::NoHead);
    };
    let tied = match head.kind.as_str() {
        TIED_LM_HEAD => true,
        LINEAR => false,
        SOFTCAP_LM_HEAD => return Ok(Outcome::AlreadyCapped),
        other => {
            return Err(format!(
                "logit_softcap: `{LM_HEAD_PATH}` is a {other}, not GPT-2's {TIED_LM_HEAD} or \
                 {LINEAR} head"
            )
            .into())
        }
    };
    model.wrap_module(LM_HEAD_PATH, SoftcapHead::new(cap, tied), None, vec![])?;
    Ok(Outcome::Wrapped { tied })
}

/// The logit soft-capping method: surgery at `init`.
#[derive(Debug, Clone, Copy)]
pub struct LogitSoftcap {
    cap: f64,
}

impl LogitSoftcap {
    /// The cap.
    pub fn cap(&self) -> f64 {
        self.cap
    }
}

impl Method for LogitSoftcap {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        match apply_logit_softcap(ctx, self.cap)? {
            Outcome::Wrapped { tied } => ctx.info(&format!(
                "logit_softcap: the logits of the {} lm_head are capped at {} \
                 (cap * tanh(logits / cap))",
                if tied { "tied" } else { "untied" },
                self.cap
            )),
            Outcome::AlreadyCapped => {}
            Outcome::NoHead => ctx.warn(
                "logit_softcap: the model is not a GPT-2 or llama with an lm_head: soft-capping \
                 had no effect",
            ),
        }
        Ok(())
    }
}

impl Plugin for LogitSoftcap {
    const NAME: &'static str = "logit_softcap";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "soft-caps the language-model logits, cap * tanh(logits / cap) (GPT-2 surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "cap = 30.0";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            event: Event::INIT,
            priority: SURGERY_PRIORITY,
        }]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let cap = settings.f64_or("cap", DEFAULT_CAP)?;
        if !(cap.is_finite() && cap > 0.0) {
            return Err(Error::config(format!(
                "`cap` must be a positive number, got {cap}"
            )));
        }
        Ok(LogitSoftcap { cap })
    }
}

export_plugin!(LogitSoftcap);
