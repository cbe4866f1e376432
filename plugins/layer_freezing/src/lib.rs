#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod freeze;

use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings};

pub use freeze::{freeze_depth, freeze_layers, freeze_schedule, layers, Freezing, Layer};

/// Metric: leading layers frozen (Composer's `layer_freezing/layers_frozen`).
pub const METRIC_LAYERS_FROZEN: &str = "layer_freezing/layers_frozen";
/// Metric: the schedule's fraction (Composer's `layer_freezing/percentage_frozen`).
pub const METRIC_PERCENTAGE_FROZEN: &str = "layer_freezing/percentage_frozen";

/// The LayerFreezing method.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerFreezing {
    /// The elapsed fraction of the run before freezing begins.
    pub freeze_start: f64,
    /// The fraction of the layers (less the last) frozen by the end of the run.
    pub freeze_level: f64,
}

impl LayerFreezing {
    fn epoch_end(&self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let elapsed = ctx.time().elapsed_fraction;
        let done = freeze_layers(ctx, elapsed, self.freeze_start, self.freeze_level)?;
        if !done.newly_frozen.is_empty() {
            ctx.info(&format!(
                "layer_freezing: {} of {} layers frozen at {:.3} of the run ({} parameters frozen now)",
                done.depth,
                done.layers,
                elapsed,
                done.newly_frozen.len()
            ));
        }
        ctx.log_metric(METRIC_LAYERS_FROZEN, done.depth as f64);
        ctx.log_metric(METRIC_PERCENTAGE_FROZEN, done.percentage);
        Ok(())
    }
}

impl Method for LayerFreezing {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        if event == Event::EPOCH_END {
            self.epoch_end(ctx)?;
        }
        Ok(())
    }
}

/// A fraction setting in `[0, 1]`.
fn fraction(settings: &Settings, key: &str, default: f64) -> Result<f64, Error> {
    let value = settings.f64_or(key, default)?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(Error::config(format!(
            "setting `{key}` must be a fraction in [0, 1], got {value}"
        )))
    }
}

impl Plugin for LayerFreezing {
    const NAME: &'static str = "layer_freezing";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "freezes the model's leading layers progressively at epoch ends (FreezeOut)";
    const DEFAULT_SETTINGS: &'static str = "freeze_start = 0.5\nfreeze_level = 1.0";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::EPOCH_END)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        Ok(LayerFreezing {
            freeze_start: fraction(settings, "freeze_start", 0.5)?,
            freeze_level: fraction(settings, "freeze_level", 1.0)?,
        })
    }
}

export_plugin!(LayerFreezing);
