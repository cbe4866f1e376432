#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use low_precision_norms::NormKind;
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Method, ModuleInfo, Plugin, Settings,
};

pub use low_precision_norms::{active_autocast_dtype, autocast_dtype, low_precision_layer_norm};

/// Module kind of the host's layer norm.
pub const LAYER_NORM: &str = "layer_norm";
/// Module kind of a layer norm computed in the autocast dtype.
pub const KIND: &str = "low_precision_layer_norm";
/// Metric: layer norms computed in low precision after surgery.
pub const METRIC_NUM_LAYERS: &str = "low_precision_layernorm/num_layers";

/// The layer norms the method converts: every `layer_norm` of the tree.
pub fn targets(modules: &[ModuleInfo]) -> Vec<String> {
    low_precision_norms::targets(modules, NormKind::Layer)
}

/// Composer's `apply_low_precision_layernorm(model, precision)`, the precision checked by the
/// caller: every `layer_norm` is wrapped in place, its tensors keeping their names, and runs as
/// [`low_precision_layer_norm`] in the autocast dtype whenever autocast is on. Returns the paths converted.
pub fn apply_low_precision_layernorm(ctx: &mut Context<'_>) -> Result<Vec<String>, Error> {
    low_precision_norms::apply(ctx, NormKind::Layer)
}

/// The LowPrecisionLayerNorm method: surgery at `init` when the run's precision has autocast.
#[derive(Debug, Default)]
pub struct LowPrecisionLayerNormMethod;

impl Method for LowPrecisionLayerNormMethod {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        low_precision_norms::on_init(ctx, NormKind::Layer)
    }
}

impl Plugin for LowPrecisionLayerNormMethod {
    const NAME: &'static str = "low_precision_layernorm";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "computes layer norms in the autocast dtype (bf16) instead of fp32 (surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            // Last at init, as Composer's engine sorts it, so it also converts layer norms
            // that other methods' surgery added.
            event: Event::INIT,
            priority: -100,
        }]
    }

    fn create(_settings: &Settings) -> Result<Self, Error> {
        Ok(LowPrecisionLayerNormMethod)
    }
}

export_plugin!(LowPrecisionLayerNormMethod);
