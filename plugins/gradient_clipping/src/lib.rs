#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod clip;

use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings};

pub use clip::{
    agc_coefficient, apply_agc, apply_gradient_clipping, clip_grad_norm, clip_grad_value,
    total_norm, unitwise_norm, ClippingType, NORM_EPSILON,
};

/// The method's priority at `after_train_batch`: the default, above SAM's (−1000), so that the
/// gradient SAM perturbs with, and the one the optimizer steps with, are the clipped ones — as in
/// Composer, where `AFTER_TRAIN_BATCH` fires inside the closure `SAMOptimizer` calls.
pub const PRIORITY: i32 = 0;

/// The GradientClipping method.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradientClipping {
    /// How the gradients are clipped.
    pub clipping_type: ClippingType,
    /// The norm (`norm`), the largest absolute value (`value`) or the largest gradient-to-weight
    /// norm ratio (`adaptive`) let through.
    pub clipping_threshold: f64,
}

impl GradientClipping {
    /// The trainable parameters of the model (frozen ones and buffers left out), shared with the
    /// host so that their gradients are clipped in place.
    fn trainable_parameters(ctx: &Context<'_>) -> Result<Vec<Tensor>, Error> {
        let mut params = Vec::new();
        for info in ctx.parameters()? {
            if info.buffer || !info.trainable {
                continue;
            }
            if let Some(p) = ctx.parameter(info.name.as_str())? {
                params.push(p);
            }
        }
        Ok(params)
    }
}

impl Method for GradientClipping {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        if event != Event::AFTER_TRAIN_BATCH {
            return Ok(());
        }
        let params = GradientClipping::trainable_parameters(ctx)?;
        apply_gradient_clipping(&params, self.clipping_type, self.clipping_threshold)?;
        Ok(())
    }
}

/// A required setting (Composer's `GradientClipping` has no defaults).
fn required<T>(value: Option<T>, key: &str, example: &str) -> Result<T, Error> {
    value.ok_or_else(|| {
        Error::config(format!(
            "gradient_clipping needs `{key}` (for example `{key} = {example}`)"
        ))
    })
}

impl Plugin for GradientClipping {
    const NAME: &'static str = "gradient_clipping";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "clips gradients after backward, before the optimizer step (by global norm, value or AGC)";
    const DEFAULT_SETTINGS: &'static str = "# both required, no defaults (as in Composer):\n\
        # clipping_type = \"norm\"  (\"norm\", \"value\" or \"adaptive\")\n\
        # clipping_threshold = 1.0";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            event: Event::AFTER_TRAIN_BATCH,
            priority: PRIORITY,
        }]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let name: Option<String> = settings.get_or("clipping_type", None)?;
        let name = required(name, "clipping_type", "\"norm\"")?;
        let clipping_type = name
            .parse::<ClippingType>()
            .map_err(|e| Error::config(format!("setting `clipping_type` {e}")))?;
        let threshold: Option<f64> = settings.get_or("clipping_threshold", None)?;
        let clipping_threshold = required(threshold, "clipping_threshold", "1.0")?;
        if !(clipping_threshold.is_finite() && clipping_threshold > 0.0) {
            return Err(Error::config(format!(
                "setting `clipping_threshold` must be a finite number > 0, got {clipping_threshold}"
            )));
        }
        Ok(GradientClipping {
            clipping_type,
            clipping_threshold,
        })
    }
}

export_plugin!(GradientClipping);
