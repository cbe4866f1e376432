#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod layer;
mod surgery;

use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings};

pub use layer::{standardize_weight, StandardizedConv2d, EPSILON};
pub use surgery::{apply_weight_standardization, plan, Outcome, Plan};

/// Module kind of the host's 2-d convolution.
pub const CONV2D: &str = "conv2d";
/// Module kind of a conv whose weight is standardized at every forward.
pub const WS_CONV2D: &str = "weight_standardized_conv2d";
/// Metric: standardized convs in the model after surgery.
pub const METRIC_NUM_LAYERS: &str = "weight_standardization/num_layers";

/// The WeightStandardization method: surgery at `init`.
#[derive(Debug)]
pub struct WeightStandardization {
    n_last_layers_ignore: usize,
}

impl WeightStandardization {
    /// Convs at the end of the model left alone.
    pub fn n_last_layers_ignore(&self) -> usize {
        self.n_last_layers_ignore
    }
}

impl Method for WeightStandardization {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let outcome = apply_weight_standardization(ctx, self.n_last_layers_ignore)?;
        ctx.log_metric(METRIC_NUM_LAYERS, outcome.standardized as f64);
        if outcome.convs == 0 {
            ctx.warn("weight_standardization: the model has no conv2d layers; nothing to do");
        } else if outcome.standardized == 0 {
            ctx.warn(&format!(
                "weight_standardization: n_last_layers_ignore = {} leaves all {} convs alone",
                self.n_last_layers_ignore, outcome.convs
            ));
        }
        ctx.info(&format!(
            "weight_standardization standardized {} conv2d layers ({} of the model's {} convs \
             are standardized, the last {} ignored)",
            outcome.replaced,
            outcome.standardized,
            outcome.convs,
            outcome.convs - outcome.standardized
        ));
        Ok(())
    }
}

impl Plugin for WeightStandardization {
    const NAME: &'static str = "weight_standardization";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "standardizes conv weights per output channel at every forward (model surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "n_last_layers_ignore = 0";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let n = settings.u64("n_last_layers_ignore")?;
        let n_last_layers_ignore = usize::try_from(n)
            .map_err(|_| Error::config(format!("`n_last_layers_ignore` is too large: {n}")))?;
        Ok(WeightStandardization {
            n_last_layers_ignore,
        })
    }
}

export_plugin!(WeightStandardization);
