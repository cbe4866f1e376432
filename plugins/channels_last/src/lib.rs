#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use tessera_plugin_api::tch::{self, TchError, Tensor};
use tessera_plugin_api::{export_plugin, Context, Error, ErrorKind, Event, Hook, Method, Plugin};
use tessera_plugin_api::{ParamInfo, Settings};

/// Metric: the model's 4-d tensors (parameters and buffers) in channels-last layout after the
/// method ran.
pub const METRIC_NUM_TENSORS: &str = "channels_last/num_tensors";

/// The `init` priority: below every other method's default 0, so that tensors created by
/// surgery at `init` (BlurPool, ...) are converted too, whatever the `trainer.toml` order.
pub const PRIORITY: i32 = -100;

/// PyTorch's channels-last (NHWC) strides for a 4-d `(N, C, H, W)` size, as
/// `c10::get_channels_last_strides_2d` computes them (a size-0 dimension counts as 1); `None`
/// for any other number of dimensions.
pub fn channels_last_strides(size: &[i64]) -> Option<Vec<i64>> {
    let &[_, c, _, w] = size else {
        return None;
    };
    let c_stride = 1;
    let w_stride = c.max(1);
    let h_stride = w_stride * w.max(1);
    let n_stride = h_stride * size[2].max(1);
    Some(vec![n_stride, c_stride, h_stride, w_stride])
}

/// Whether `t` is a 4-d tensor with exactly the channels-last strides.
pub fn is_channels_last(t: &Tensor) -> bool {
    channels_last_strides(&t.size()).is_some_and(|s| s == t.stride())
}

/// A copy of the 4-d tensor `t` with the same values in channels-last layout (PyTorch's
/// `t.contiguous(memory_format=torch.channels_last)`), not tracked by autograd. Fails for a
/// tensor that is not 4-d.
pub fn to_channels_last(t: &Tensor) -> Result<Tensor, TchError> {
    let size = t.size();
    let stride = channels_last_strides(&size).ok_or_else(|| {
        TchError::Shape(format!(
            "channels-last needs a 4-d (N, C, H, W) tensor, got shape {size:?}"
        ))
    })?;
    tch::no_grad(|| {
        let out = Tensor::f_empty_strided(&size, &stride, (t.kind(), t.device()))?;
        out.shallow_clone().f_copy_(t)?;
        Ok(out)
    })
}

/// Composer's `apply_channels_last` for one tensor, in place: a 4-d tensor not yet in
/// channels-last layout gets its data replaced by [`to_channels_last`] (`param.data = ...`, as
/// `Module.to(memory_format=...)` does), so every holder of the tensor — the model's layer, the
/// host's parameter store, autograd — sees the new layout, and a parameter keeps requiring a
/// gradient. Returns whether it changed; other tensors are left alone.
pub fn convert_in_place(t: &mut Tensor) -> Result<bool, TchError> {
    if t.dim() != 4 || is_channels_last(t) {
        return Ok(false);
    }
    let data = to_channels_last(t)?;
    t.f_set_data(&data)?;
    Ok(true)
}

/// What one application did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Tensors converted by this application.
    pub converted: usize,
    /// 4-d tensors of the model in channels-last layout afterwards.
    pub channels_last: usize,
}

/// Composer's `apply_channels_last(model)` on the host's model: every 4-d parameter and buffer
/// is converted with [`convert_in_place`]. Applying it again changes nothing.
pub fn apply_channels_last(ctx: &mut Context<'_>) -> Result<Outcome, Error> {
    let mut outcome = Outcome::default();
    for ParamInfo { name, shape, .. } in ctx.parameters()? {
        if shape.len() != 4 {
            continue;
        }
        let mut t = ctx.parameter(name.as_str())?.ok_or_else(|| {
            Error::new(
                ErrorKind::HOST,
                format!("the model lists tensor `{name}` but does not give it"),
            )
        })?;
        if convert_in_place(&mut t)
            .map_err(|e| Error::new(ErrorKind::TORCH, format!("converting `{name}`: {e}")))?
        {
            outcome.converted += 1;
        }
        outcome.channels_last += usize::from(is_channels_last(&t));
    }
    Ok(outcome)
}

/// The ChannelsLast method: the model's 4-d tensors to NHWC layout at `init`.
#[derive(Debug, Default)]
pub struct ChannelsLast;

impl Method for ChannelsLast {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let outcome = apply_channels_last(ctx)?;
        ctx.log_metric(METRIC_NUM_TENSORS, outcome.channels_last as f64);
        if outcome.channels_last == 0 {
            ctx.warn("channels_last: the model has no 4-d tensors; nothing to convert");
        } else {
            ctx.info(&format!(
                "channels_last: {} 4-d tensors converted to channels-last (NHWC) layout, {} in \
                 that layout now",
                outcome.converted, outcome.channels_last
            ));
        }
        Ok(())
    }
}

impl Plugin for ChannelsLast {
    const NAME: &'static str = "channels_last";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "stores conv weights in channels-last (NHWC) memory layout (values unchanged, at init)";
    const DEFAULT_SETTINGS: &'static str = "";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            event: Event::INIT,
            priority: PRIORITY,
        }]
    }

    fn create(_settings: &Settings) -> Result<Self, Error> {
        Ok(ChannelsLast)
    }
}

export_plugin!(ChannelsLast);
