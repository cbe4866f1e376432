#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod layers;
mod surgery;

use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings};

pub use layers::{
    blur_2d, blur_channels, blur_conv2d, blur_max_pool2d, default_filter, split_stride, BlurConv2d,
    BlurLayer, BlurMaxPool2d,
};
pub use surgery::{
    apply_blurpool, conv_is_replaced, decide, is_blur_kind, plan, Options, Outcome, Replacement,
};
/// The hyperparameters of the conv a [`BlurConv2d`] replaces (plugin-api's kit).
pub use tessera_plugin_api::kit::ConvSpec;

/// Module kind of a conv2d wrapped with a blur filter.
pub const BLUR_CONV2D: &str = "blur_conv2d";
/// Module kind of an anti-aliased max-pool.
pub const BLUR_MAX_POOL2D: &str = "blur_max_pool2d";
/// Metric: `blur_max_pool2d` modules in the model after surgery.
pub const METRIC_BLURPOOL_LAYERS: &str = "blurpool/num_blurpool_layers";
/// Metric: `blur_conv2d` modules in the model after surgery.
pub const METRIC_BLURCONV_LAYERS: &str = "blurpool/num_blurconv_layers";

/// The BlurPool method: surgery at `init`.
#[derive(Debug)]
pub struct BlurPool {
    options: Options,
}

impl BlurPool {
    /// The method's settings.
    pub fn options(&self) -> &Options {
        &self.options
    }
}

impl Method for BlurPool {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let o = self.options;
        if !o.replace_convs && !o.replace_maxpools {
            ctx.warn(
                "blurpool: replace_convs and replace_maxpools are both false; \
                 the model is left unchanged",
            );
        }
        let outcome = apply_blurpool(ctx, &o)?;
        ctx.log_metric(METRIC_BLURPOOL_LAYERS, outcome.num_blurpool_layers as f64);
        ctx.log_metric(METRIC_BLURCONV_LAYERS, outcome.num_blurconv_layers as f64);
        let total = outcome.num_blurpool_layers + outcome.num_blurconv_layers;
        if outcome.replaced() == 0 {
            if total == 0 {
                ctx.warn(
                    "blurpool did not change any layers: no strided conv2d (with in_channels \
                     >= min_channels) or max_pool2d layers were found",
                );
            } else {
                ctx.warn(&format!(
                    "blurpool did not change any layers: the model already has {} \
                     blur_max_pool2d and {} blur_conv2d layers",
                    outcome.num_blurpool_layers, outcome.num_blurconv_layers
                ));
            }
        }
        ctx.info(&format!(
            "blurpool replaced {} conv2d and {} max_pool2d layers (blur_first = {}); the model \
             now has {} blur_max_pool2d and {} blur_conv2d layers",
            outcome.replaced_convs,
            outcome.replaced_maxpools,
            o.blur_first,
            outcome.num_blurpool_layers,
            outcome.num_blurconv_layers
        ));
        Ok(())
    }
}

impl Plugin for BlurPool {
    const NAME: &'static str = "blurpool";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "anti-aliasing: blurs before strided convs and max-pools (model surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "replace_convs = true\nreplace_maxpools = true\n\
         blur_first = true\nmin_channels = 16";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let defaults = Options::default();
        let min_channels = settings.u64_or("min_channels", defaults.min_channels as u64)?;
        let min_channels = i64::try_from(min_channels)
            .map_err(|_| Error::config(format!("`min_channels` is too large: {min_channels}")))?;
        Ok(BlurPool {
            options: Options {
                replace_convs: settings.bool_or("replace_convs", defaults.replace_convs)?,
                replace_maxpools: settings
                    .bool_or("replace_maxpools", defaults.replace_maxpools)?,
                blur_first: settings.bool_or("blur_first", defaults.blur_first)?,
                min_channels,
            },
        })
    }
}

export_plugin!(BlurPool);
