#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use tessera_plugin_api::tch::{self, Device, Kind, TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Inner, Method, ModuleInfo, Plugin, Settings,
    Wrapper,
};

/// Module kind of the host's layer norm.
pub const LAYER_NORM: &str = "layer_norm";
/// Module kind of a layer norm computed in the autocast dtype.
pub const KIND: &str = "low_precision_layer_norm";
/// Metric: layer norms computed in low precision after surgery.
pub const METRIC_NUM_LAYERS: &str = "low_precision_layernorm/num_layers";

/// The low-precision dtype of a run's precision (`train.precision`): bfloat16 for
/// `"amp_bf16"`, `None` for `"fp32"` (and any precision without autocast), where the method
/// changes nothing.
pub fn autocast_dtype(precision: &str) -> Option<Kind> {
    match precision {
        "amp_bf16" => Some(Kind::BFloat16),
        "amp_fp16" => Some(Kind::Half),
        _ => None,
    }
}

/// The dtype autocast currently runs matrix products in on `device` (bf16 under the host's
/// `amp_bf16`), `None` when autocast is off there: the device-aware form of Composer's
/// `torch.is_autocast_enabled()` and autocast dtype. Probed with a 1×1 `mm` (on every
/// autocast's lower-precision list), since libtorch's C API reports CUDA autocast only.
pub fn active_autocast_dtype(device: Device) -> Result<Option<Kind>, TchError> {
    let one = Tensor::f_ones([1, 1], (Kind::Float, device))?;
    let kind = one.f_mm(&one)?.kind();
    Ok((kind != Kind::Float).then_some(kind))
}

/// Composer's `LPLayerNorm.forward` (`composer.algorithms.low_precision_layernorm`): with
/// `dtype` (the autocast dtype), `x`, `weight` and `bias` are cast to it and the layer norm runs
/// with autocast off, so the result stays in `dtype` (autocast would run a norm in fp32);
/// without, the plain `layer_norm` of what arrives.
pub fn low_precision_layer_norm(
    x: &Tensor,
    normalized_shape: &[i64],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    dtype: Option<Kind>,
) -> Result<Tensor, TchError> {
    let Some(dtype) = dtype else {
        return Tensor::f_layer_norm(x, normalized_shape, weight, bias, eps, true);
    };
    let cast = |t: &Tensor| t.f_to_kind(dtype);
    let (x, weight, bias) = (
        cast(x)?,
        weight.map(cast).transpose()?,
        bias.map(cast).transpose()?,
    );
    let run = || {
        Tensor::f_layer_norm(
            &x,
            normalized_shape,
            weight.as_ref(),
            bias.as_ref(),
            eps,
            true,
        )
    };
    // CUDA autocast lists `layer_norm` among the fp32 operations: switch it off around the
    // call. CPU autocast leaves norms alone, so the bf16 kernel runs as it is.
    match x.device() {
        Device::Cuda(_) => tch::autocast(false, run),
        _ => run(),
    }
}

/// A layer norm's tensors and settings, shared with the model (shallow clones).
pub struct LayerNormSpec {
    /// Scale, or `None` without an elementwise affine.
    pub weight: Option<Tensor>,
    /// Shift, or `None`.
    pub bias: Option<Tensor>,
    /// The normalized trailing dimension's size.
    pub normalized_shape: i64,
    /// Added to the variance.
    pub eps: f64,
}

/// The wrapper installed around one layer norm: the norm in the autocast dtype whenever autocast
/// is on, training and evaluation alike (as Composer's `LPLayerNorm`).
struct LowPrecisionLayerNorm {
    norm: LayerNormSpec,
}

impl Wrapper for LowPrecisionLayerNorm {
    fn kind(&self) -> &str {
        KIND
    }

    fn forward(
        &self,
        input: &Tensor,
        _train: bool,
        _inner: &mut Inner<'_>,
    ) -> Result<Tensor, Error> {
        Ok(low_precision_layer_norm(
            input,
            &[self.norm.normalized_shape],
            self.norm.weight.as_ref(),
            self.norm.bias.as_ref(),
            self.norm.eps,
            active_autocast_dtype(input.device())?,
        )?)
    }

    /// The same layer norm in fp32 evaluation: the plain module, its tensors unchanged.
    fn export(&self, inner: Vec<(String, Tensor)>) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        Ok(Some(inner))
    }
}

/// The layer norms the method converts: every `layer_norm` of the tree (a converted one shows
/// the kind [`KIND`], so applying twice changes nothing).
pub fn targets(modules: &[ModuleInfo]) -> Vec<String> {
    modules
        .iter()
        .filter(|m| m.kind.as_str() == LAYER_NORM)
        .map(|m| m.path.as_str().to_owned())
        .collect()
}

/// Composer's `apply_low_precision_layernorm(model, precision)`, the precision checked by the caller:
/// every layer norm of the model's tree runs as [`low_precision_layer_norm`] (wrapped
/// in place, its tensors keeping their names). Returns the paths converted.
pub fn apply_low_precision_layernorm(ctx: &mut Context<'_>) -> Result<Vec<String>, Error> {
    let modules = ctx.modules()?;
    let paths = targets(&modules);
    for path in &paths {
        let info = modules
            .iter()
            .find(|m| m.path.as_str() == path)
            .ok_or("the module tree changed during surgery")?;
        let tensor = |name: &str| -> Result<Option<Tensor>, Error> {
            let full = format!("{path}.{name}");
            if info.params.iter().any(|p| p.as_str() == full) {
                ctx.parameter(&full)
            } else {
                Ok(None)
            }
        };
        let norm = LayerNormSpec {
            weight: tensor("weight")?,
            bias: tensor("bias")?,
            normalized_shape: info.int_attr("normalized_shape", None)?,
            eps: info.attr("eps").unwrap_or(1e-5),
        };
        ctx.wrap_module(path, LowPrecisionLayerNorm { norm }, None, Vec::new())?;
    }
    Ok(paths)
}

/// The LowPrecisionLayerNorm method: surgery at `init` when the run's precision has autocast.
#[derive(Debug, Default)]
pub struct LowPrecisionLayerNormMethod;

impl Method for LowPrecisionLayerNormMethod {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let precision = ctx.precision()?;
        let Some(dtype) = autocast_dtype(&precision) else {
            ctx.warn(&format!(
                "low_precision_layernorm only applies with a mixed precision (train.precision = \
                 \"amp_bf16\"); with \"{precision}\" it does nothing"
            ));
            ctx.log_metric(METRIC_NUM_LAYERS, 0.0);
            return Ok(());
        };
        let paths = apply_low_precision_layernorm(ctx)?;
        if paths.is_empty() {
            ctx.warn("low_precision_layernorm: the model has no layer_norm layers; nothing to do");
        }
        ctx.info(&format!(
            "low_precision_layernorm: {} layer norms computed in {dtype:?}",
            paths.len()
        ));
        ctx.log_metric(METRIC_NUM_LAYERS, paths.len() as f64);
        Ok(())
    }
}

impl Plugin for LowPrecisionLayerNormMethod {
    const NAME: &'static str = "low_precision_layernorm";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "computes layer norms in the autocast dtype (bf16) instead of fp32 (surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "";

    fn hooks() -> Vec<Hook> {
        // Last at init, as Composer's engine sorts it, so it also converts layer norms that
        // other methods' surgery added.
        vec![Hook {
            event: Event::INIT,
            priority: -100,
        }]
    }

    fn create(_settings: &Settings) -> Result<Self, Error> {
        Ok(LowPrecisionLayerNormMethod)
    }
}

export_plugin!(LowPrecisionLayerNormMethod);
