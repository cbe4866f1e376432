#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use low_precision_norms::NormKind;
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Method, ModuleInfo, Plugin, Settings,
};

pub use low_precision_norms::{active_autocast_dtype, autocast_dtype, low_precision_group_norm};

/// Module kind of the host's group norm.
pub const GROUP_NORM: &str = "group_norm";
/// Module kind of a group norm computed in the autocast dtype.
pub const KIND: &str = "low_precision_group_norm";
/// Metric: group norms computed in low precision after surgery.
pub const METRIC_NUM_LAYERS: &str = "low_precision_groupnorm/num_layers";

/// The group norms the method converts: every `group_norm` of the tree.
pub fn targets(modules: &[ModuleInfo]) -> Vec<String> {
    low_precision_norms::targets(modules, NormKind::Group)
}

/// Composer's `apply_low_precision_groupnorm(model, precision)`, the precision checked by the
/// caller: every `group_norm` is wrapped in place, its tensors keeping their names, and runs as
/// [`low_precision_group_norm`] in the autocast dtype whenever autocast is on. Returns the paths converted.
pub fn apply_low_precision_groupnorm(ctx: &mut Context<'_>) -> Result<Vec<String>, Error> {
    low_precision_norms::apply(ctx, NormKind::Group)
}

/// The LowPrecisionGroupNorm method: surgery at `init` when the run's precision has autocast.
#[derive(Debug, Default)]
pub struct LowPrecisionGroupNormMethod;

impl Method for LowPrecisionGroupNormMethod {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        low_precision_norms::on_init(ctx, NormKind::Group)
    }
}

impl Plugin for LowPrecisionGroupNormMethod {
    const NAME: &'static str = "low_precision_groupnorm";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "computes group norms in the autocast dtype (bf16) instead of fp32 (surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(_settings: &Settings) -> Result<Self, Error> {
        Ok(LowPrecisionGroupNormMethod)
    }
}

export_plugin!(LowPrecisionGroupNormMethod);
