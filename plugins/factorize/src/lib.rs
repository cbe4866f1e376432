#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod conv;
mod linear;
mod modules;
mod solve;
mod surgery;

use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings};

pub use conv::FactorizedConv2d;
pub use linear::FactorizedLinear;
pub use modules::{latent_size, max_rank, Factorized};
pub use solve::{
    factorize_conv2d, factorize_matrix, ConvGeometry, LowRankSolution, DEFAULT_N_ITERS,
};
pub use surgery::{
    apply_factorization, linear_features, plan, Decision, FactorizeSettings, Outcome,
};
/// A 2-d convolution's hyperparameters (plugin-api's kit): what [`FactorizedConv2d`] keeps.
pub use tessera_plugin_api::kit::ConvSpec;

/// Module kind of the host's 2-d convolution.
pub const CONV2D: &str = "conv2d";
/// Module kind of the host's linear layer.
pub const LINEAR: &str = "linear";
/// Module kind of a factorized conv.
pub const FACTORIZED_CONV2D: &str = "factorized_conv2d";
/// Module kind of a factorized linear layer.
pub const FACTORIZED_LINEAR: &str = "factorized_linear";
/// Metric (Composer's key): factorized convs in the model after surgery.
pub const METRIC_NUM_CONV2D: &str = "factorize/num_conv2d_replacements";
/// Metric (Composer's key): factorized linear layers in the model after surgery.
pub const METRIC_NUM_LINEAR: &str = "factorize/num_linear_replacements";

/// The Factorize method: surgery at `init`.
#[derive(Debug)]
pub struct Factorize {
    settings: FactorizeSettings,
}

impl Factorize {
    /// The method's settings.
    pub fn settings(&self) -> &FactorizeSettings {
        &self.settings
    }
}

impl Method for Factorize {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let s = self.settings;
        let outcome = apply_factorization(ctx, &s)?;
        if s.factorize_convs {
            ctx.log_metric(METRIC_NUM_CONV2D, outcome.factorized_convs as f64);
        }
        if s.factorize_linears {
            ctx.log_metric(METRIC_NUM_LINEAR, outcome.factorized_linears as f64);
        }
        let candidates = outcome.decisions.len();
        if outcome.factorized_convs + outcome.factorized_linears == 0 {
            let why = if candidates == 0 {
                "the model has no conv2d or linear layers it may factorize".to_owned()
            } else {
                format!(
                    "none of its {candidates} candidate layers is wide enough (min_channels = {}, \
                     min_features = {}) with a latent size small enough to save work",
                    s.min_channels, s.min_features
                )
            };
            ctx.warn(&format!("factorize: nothing factorized: {why}"));
        }
        ctx.info(&format!(
            "factorize factorized {} conv2d and {} linear layers ({} factorized convs and {} \
             factorized linear layers in the model, of {candidates} candidates)",
            outcome.convs_replaced,
            outcome.linears_replaced,
            outcome.factorized_convs,
            outcome.factorized_linears
        ));
        Ok(())
    }
}

fn minimum(settings: &Settings, key: &str, default: i64) -> Result<i64, Error> {
    let v = settings.u64_or(key, default as u64)?;
    i64::try_from(v).map_err(|_| Error::config(format!("`{key}` is too large: {v}")))
}

fn latent(settings: &Settings, key: &str, default: f64) -> Result<f64, Error> {
    let v = settings.f64_or(key, default)?;
    if !(v.is_finite() && v > 0.0) {
        return Err(Error::config(format!(
            "`{key}` must be positive (a size >= 1, or a share of min(in, out) below 1), got {v}"
        )));
    }
    Ok(v)
}

impl Plugin for Factorize {
    const NAME: &'static str = "factorize";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "splits wide conv2d and linear layers into two low-rank layers (model surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "factorize_convs = true\nfactorize_linears = true\n\
        min_channels = 256\nlatent_channels = 0.25\nmin_features = 256\nlatent_features = 128";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let d = FactorizeSettings::default();
        Ok(Factorize {
            settings: FactorizeSettings {
                factorize_convs: settings.bool_or("factorize_convs", d.factorize_convs)?,
                factorize_linears: settings.bool_or("factorize_linears", d.factorize_linears)?,
                min_channels: minimum(settings, "min_channels", d.min_channels)?,
                latent_channels: latent(settings, "latent_channels", d.latent_channels)?,
                min_features: minimum(settings, "min_features", d.min_features)?,
                latent_features: latent(settings, "latent_features", d.latent_features)?,
            },
        })
    }
}

export_plugin!(Factorize);
