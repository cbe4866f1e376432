#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use gpt_surgery::kinds::{
    ALIBI_ATTENTION, ALIBI_ZERO_POSITIONS, EMBEDDING, EXT_ATTENTION, GPT2_ATTENTION,
    SURGERY_PRIORITY, WPE_PATH,
};
use gpt_surgery::{rebuild_attention, Rotary, ZeroPositions};
use tessera_plugin_api::kit::{walk, SurgeryModel};
use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings};

pub use gpt_surgery::{apply_rotary, ExtAttention};

/// The default frequency base (Su et al., GPT-NeoX, LLaMA, modded-nanogpt).
pub const DEFAULT_BASE: f64 = 10_000.0;

/// The method's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RotarySettings {
    /// The frequency base θ.
    pub base: f64,
    /// The share of each head's features that is rotated, in `(0, 1]`.
    pub fraction: f64,
    /// Rows of the zero position table (the longest sequence the model then takes); `None`:
    /// the rows of the model's `transformer.wpe` (`n_positions`).
    pub max_sequence_length: Option<i64>,
}

impl Default for RotarySettings {
    fn default() -> RotarySettings {
        RotarySettings {
            base: DEFAULT_BASE,
            fraction: 1.0,
            max_sequence_length: None,
        }
    }
}

/// What one application did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Paths of the attention blocks given rotary positions.
    pub attention: Vec<String>,
    /// Rotated features per head (of the last block changed).
    pub dims: Option<(i64, i64)>,
    /// Rows of the zero position table put at `transformer.wpe`, when it was replaced.
    pub positions: Option<i64>,
}

/// The surgery: refuses a model with ALiBi's modules; every `gpt2_attention` or
/// `gpt2_attention_ext` without rotary becomes a `gpt2_attention_ext` with it (the same
/// tensors, its other features kept); the `embedding` at `transformer.wpe` becomes a zero,
/// untrained table. Modules that already have rotary positions are left alone, so a second
/// application changes nothing.
pub fn apply_rotary_embeddings(
    model: &mut impl SurgeryModel,
    settings: &RotarySettings,
) -> Result<Outcome, Error> {
    let modules = model.modules()?;
    if let Some(m) = modules.iter().find(|m| {
        let kind = m.kind.as_str();
        kind == ALIBI_ATTENTION || kind == ALIBI_ZERO_POSITIONS
    }) {
        return Err(Error::config(format!(
            "rotary cannot be combined with alibi: both replace the GPT-2's position handling \
             (the model has ALiBi's {} at `{}`); use one of the two",
            m.kind, m.path
        )));
    }
    let mut outcome = Outcome::default();
    let (base, fraction) = (settings.base, settings.fraction);
    let mut rotated = None;
    outcome.attention = rebuild_attention(model, |spec| {
        if spec.rotary.is_some() {
            return Ok(false);
        }
        let dims = Rotary::dims_for(spec.head_dim(), fraction)?;
        rotated = Some((dims, spec.head_dim()));
        spec.rotary = Some(Rotary { base, dims });
        Ok(true)
    })?;
    outcome.dims = rotated;
    if let Some(m) = walk::find(&modules, WPE_PATH).filter(|m| m.kind.as_str() == EMBEDDING) {
        let weight = model.tensor_of(m, "weight")?;
        let &[rows, n_embd] = weight.size().as_slice() else {
            return Err(format!("`{WPE_PATH}.weight` is not a (positions, n_embd) table").into());
        };
        let rows = settings.max_sequence_length.unwrap_or(rows);
        let module = ZeroPositions::new(rows, n_embd, (weight.kind(), weight.device()))?;
        model.replace(WPE_PATH, module)?;
        outcome.positions = Some(rows);
    }
    Ok(outcome)
}

/// The rotary method: surgery at `init`.
#[derive(Debug, Clone)]
pub struct RotaryMethod {
    settings: RotarySettings,
}

impl RotaryMethod {
    /// The method's settings.
    pub fn settings(&self) -> RotarySettings {
        self.settings
    }
}

impl Method for RotaryMethod {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let outcome = apply_rotary_embeddings(ctx, &self.settings)?;
        if outcome.attention.is_empty() && outcome.positions.is_none() {
            let rotated = ctx
                .modules()?
                .iter()
                .filter(|m| m.kind.as_str() == EXT_ATTENTION && m.attr("rotary") == Some(1.0))
                .count();
            if rotated == 0 {
                ctx.warn(&format!(
                    "rotary: the model has no {GPT2_ATTENTION} block and no {WPE_PATH} \
                     embedding: rotary had no effect"
                ));
            }
            return Ok(());
        }
        let dims = outcome
            .dims
            .map(|(d, h)| format!(", {d} of {h} features per head"))
            .unwrap_or_default();
        let positions = outcome
            .positions
            .map(|rows| format!("; {WPE_PATH} zeroed and frozen ({rows} positions)"))
            .unwrap_or_default();
        ctx.info(&format!(
            "rotary: {} attention blocks rotate q and k (base {}{dims}){positions}",
            outcome.attention.len(),
            self.settings.base
        ));
        Ok(())
    }
}

impl Plugin for RotaryMethod {
    const NAME: &'static str = "rotary";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "rotary position embeddings on q and k instead of learned \
        positions (GPT-2 surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "base = 10000.0\nfraction = 1.0\n\
        # max_sequence_length = 1024  (default: the model's n_positions)";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            event: Event::INIT,
            priority: SURGERY_PRIORITY,
        }]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let base = settings.f64_or("base", DEFAULT_BASE)?;
        if !(base.is_finite() && base > 0.0) {
            return Err(Error::config(format!(
                "`base` must be a positive number, got {base}"
            )));
        }
        let fraction = settings.f64("fraction")?;
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(Error::config(format!(
                "`fraction` must be in (0, 1], got {fraction}"
            )));
        }
        let max_sequence_length = settings
            .get_or::<Option<u64>>("max_sequence_length", None)?
            .map(|m| {
                i64::try_from(m).ok().filter(|&m| m >= 1).ok_or_else(|| {
                    Error::config(format!(
                        "`max_sequence_length` must be a positive integer, got {m}"
                    ))
                })
            })
            .transpose()?;
        Ok(RotaryMethod {
            settings: RotarySettings {
                base,
                fraction,
                max_sequence_length,
            },
        })
    }
}

export_plugin!(RotaryMethod);
