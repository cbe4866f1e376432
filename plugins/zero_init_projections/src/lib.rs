#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use gpt_surgery::kinds::{GPT2_BLOCK, LLAMA_BLOCK, LM_HEAD_PATH, ZERO_INIT_PRIORITY};
use tessera_plugin_api::kit::{walk, SurgeryModel};
use tessera_plugin_api::tch::{self, Tensor};
use tessera_plugin_api::{
    export_plugin, Context, Error, ErrorKind, Event, Hook, Method, Plugin, Settings,
};

/// Metric: weight matrices zeroed at `init`.
pub const METRIC_ZEROED: &str = "zero_init_projections/num_zeroed";

/// Which output projections to zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroInitSettings {
    /// Every block's `attn.c_proj.weight`.
    pub attention: bool,
    /// Every block's `mlp.c_proj.weight` (`mlp.wo.weight` of a gated MLP).
    pub mlp: bool,
    /// `lm_head.weight` (an untied head only).
    pub lm_head: bool,
}

impl Default for ZeroInitSettings {
    fn default() -> ZeroInitSettings {
        ZeroInitSettings {
            attention: true,
            mlp: true,
            lm_head: false,
        }
    }
}

/// The output projection's weight of the module at `path` (kind `kind`): `c_proj.weight`, or
/// `wo.weight` (gated linear units' MLP); an error naming the module when it has neither.
fn projection(
    model: &impl SurgeryModel,
    path: &str,
    kind: &str,
) -> Result<(String, Tensor), Error> {
    for leaf in ["c_proj.weight", "wo.weight"] {
        let name = format!("{path}.{leaf}");
        if let Some(t) = model.parameter(&name)? {
            return Ok((name, t));
        }
    }
    Err(Error::new(
        ErrorKind::HOST,
        format!(
            "zero_init_projections: the {kind} at `{path}` has no output projection \
             (`c_proj.weight` or `wo.weight`)"
        ),
    ))
}

/// Zeroes the chosen output projections of every `gpt2_block` of the model (and of every
/// `llama_block`: `self_attn.o_proj.weight` and `mlp.down_proj.weight`), in place (the
/// tensors the optimizer then trains); returns their names in tree order. With `lm_head`, an
/// untied head's `lm_head.weight` too; a tied head (no tensor of its own: it multiplies by
/// `transformer.wte.weight`) is an error, since zeroing it would zero the token embeddings.
pub fn zero_init_projections(
    model: &mut impl SurgeryModel,
    settings: &ZeroInitSettings,
) -> Result<Vec<String>, Error> {
    let modules = model.modules()?;
    let mut targets = Vec::new();
    for block in walk::of_kind(&modules, GPT2_BLOCK) {
        for (child, wanted) in [("attn", settings.attention), ("mlp", settings.mlp)] {
            if !wanted {
                continue;
            }
            let path = format!("{}.{child}", block.path);
            let kind = walk::find(&modules, &path)
                .map(|m| m.kind.to_string())
                .ok_or_else(|| format!("zero_init_projections: no module at `{path}`"))?;
            targets.push(projection(model, &path, &kind)?);
        }
    }
    for block in walk::of_kind(&modules, LLAMA_BLOCK) {
        let block = block.path.as_str();
        for (leaf, wanted) in [
            ("self_attn.o_proj.weight", settings.attention),
            ("mlp.down_proj.weight", settings.mlp),
        ] {
            if !wanted {
                continue;
            }
            let name = format!("{block}.{leaf}");
            let weight = model.parameter(&name)?.ok_or_else(|| {
                format!("zero_init_projections: the llama block `{block}` has no `{name}`")
            })?;
            targets.push((name, weight));
        }
    }
    if settings.lm_head && walk::find(&modules, LM_HEAD_PATH).is_some() {
        let name = format!("{LM_HEAD_PATH}.weight");
        let weight = model.parameter(&name)?.ok_or_else(|| {
            Error::config(
                "`lm_head = true`, but the model's lm_head is tied to transformer.wte.weight \
                 (`[model] tie_embeddings`, the default): zeroing it would zero the token \
                 embeddings; set `[model] tie_embeddings = false` or `lm_head = false`",
            )
        })?;
        targets.push((name, weight));
    }
    tch::no_grad(|| -> Result<(), Error> {
        for (_, t) in &mut targets {
            let _ = t.f_zero_()?;
        }
        Ok(())
    })?;
    Ok(targets.into_iter().map(|(name, _)| name).collect())
}

/// The zero-init method: at `init`, after every surgery.
#[derive(Debug, Clone, Copy)]
pub struct ZeroInitProjections {
    settings: ZeroInitSettings,
}

impl ZeroInitProjections {
    /// The method's settings.
    pub fn settings(&self) -> ZeroInitSettings {
        self.settings
    }
}

impl Method for ZeroInitProjections {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let zeroed = zero_init_projections(ctx, &self.settings)?;
        ctx.log_metric(METRIC_ZEROED, zeroed.len() as f64);
        if zeroed.is_empty() {
            ctx.warn(
                "zero_init_projections: the model has no gpt2_block or llama_block (or every \
                 projection is switched off): nothing was zeroed",
            );
        } else {
            ctx.info(&format!(
                "zero_init_projections: {} output projections start at zero",
                zeroed.len()
            ));
        }
        Ok(())
    }
}

impl Plugin for ZeroInitProjections {
    const NAME: &'static str = "zero_init_projections";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "zero-initialises the GPT-2's attention and MLP output \
        projections (and optionally an untied lm_head) at init";
    const DEFAULT_SETTINGS: &'static str = "attention = true\nmlp = true\nlm_head = false";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            event: Event::INIT,
            priority: ZERO_INIT_PRIORITY,
        }]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        Ok(ZeroInitProjections {
            settings: ZeroInitSettings {
                attention: settings.bool("attention")?,
                mlp: settings.bool("mlp")?,
                lm_head: settings.bool("lm_head")?,
            },
        })
    }
}

export_plugin!(ZeroInitProjections);
