#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use tessera_plugin_api::tch::{self, Device, Kind, TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Inner, Method, ModuleInfo, Plugin, Settings,
    Wrapper,
};

/// Module kind of the host's group norm.
pub const GROUP_NORM: &str = "group_norm";
/// Module kind of a group norm computed in the autocast dtype.
pub const KIND: &str = "low_precision_group_norm";
/// Metric: group norms computed in low precision after surgery.
pub const METRIC_NUM_LAYERS: &str = "low_precision_groupnorm/num_layers";

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

/// Composer's `LPGroupNorm.forward` (`composer.algorithms.low_precision_groupnorm`): with
/// `dtype` (the autocast dtype), `x`, `weight` and `bias` are cast to it and the group norm runs
/// with autocast off, so the result stays in `dtype`; without, the plain `group_norm` of what
/// arrives.
pub fn low_precision_group_norm(
    x: &Tensor,
    num_groups: i64,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    dtype: Option<Kind>,
) -> Result<Tensor, TchError> {
    let Some(dtype) = dtype else {
        return Tensor::f_group_norm(x, num_groups, weight, bias, eps, true);
    };
    let cast = |t: &Tensor| t.f_to_kind(dtype);
    let (x, weight, bias) = (
        cast(x)?,
        weight.map(cast).transpose()?,
        bias.map(cast).transpose()?,
    );
    let run = || Tensor::f_group_norm(&x, num_groups, weight.as_ref(), bias.as_ref(), eps, true);
    // CUDA autocast lists `group_norm` among the fp32 operations: switch it off around the
    // call. CPU autocast leaves norms alone, so the bf16 kernel runs as it is.
    match x.device() {
        Device::Cuda(_) => tch::autocast(false, run),
        _ => run(),
    }
}

/// A group norm's tensors and settings, shared with the model (shallow clones).
pub struct GroupNormSpec {
    /// Per-channel scale, or `None` without affine.
    pub weight: Option<Tensor>,
    /// Per-channel shift, or `None`.
    pub bias: Option<Tensor>,
    /// Groups the channels are split into.
    pub num_groups: i64,
    /// Added to the variance.
    pub eps: f64,
}

/// The wrapper installed around one group norm: the norm in the autocast dtype whenever autocast
/// is on, training and evaluation alike (as Composer's `LPGroupNorm`).
struct LowPrecisionGroupNorm {
    norm: GroupNormSpec,
}

impl Wrapper for LowPrecisionGroupNorm {
    fn kind(&self) -> &str {
        KIND
    }

    fn forward(
        &self,
        input: &Tensor,
        _train: bool,
        _inner: &mut Inner<'_>,
    ) -> Result<Tensor, Error> {
        Ok(low_precision_group_norm(
            input,
            self.norm.num_groups,
            self.norm.weight.as_ref(),
            self.norm.bias.as_ref(),
            self.norm.eps,
            active_autocast_dtype(input.device())?,
        )?)
    }

    /// The same group norm in fp32 evaluation: the plain module, its tensors unchanged.
    fn export(&self, inner: Vec<(String, Tensor)>) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        Ok(Some(inner))
    }
}

/// The group norms the method converts: every `group_norm` of the tree (a converted one shows
/// the kind [`KIND`], so applying twice changes nothing).
pub fn targets(modules: &[ModuleInfo]) -> Vec<String> {
    modules
        .iter()
        .filter(|m| m.kind.as_str() == GROUP_NORM)
        .map(|m| m.path.as_str().to_owned())
        .collect()
}

/// Composer's `apply_low_precision_groupnorm(model, precision)`, the precision checked by the
/// caller: every group norm of the model's tree runs as [`low_precision_group_norm`] (wrapped in
/// place, its tensors keeping their names). Returns the paths converted.
pub fn apply_low_precision_groupnorm(ctx: &mut Context<'_>) -> Result<Vec<String>, Error> {
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
        let norm = GroupNormSpec {
            weight: tensor("weight")?,
            bias: tensor("bias")?,
            num_groups: info.int_attr("num_groups", None)?,
            eps: info.attr("eps").unwrap_or(1e-5),
        };
        ctx.wrap_module(path, LowPrecisionGroupNorm { norm }, None, Vec::new())?;
    }
    Ok(paths)
}

/// The LowPrecisionGroupNorm method: surgery at `init` when the run's precision has autocast.
#[derive(Debug, Default)]
pub struct LowPrecisionGroupNormMethod;

impl Method for LowPrecisionGroupNormMethod {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let precision = ctx.precision()?;
        let Some(dtype) = autocast_dtype(&precision) else {
            ctx.warn(&format!(
                "low_precision_groupnorm only applies with a mixed precision (train.precision = \
                 \"amp_bf16\"); with \"{precision}\" it does nothing"
            ));
            ctx.log_metric(METRIC_NUM_LAYERS, 0.0);
            return Ok(());
        };
        let paths = apply_low_precision_groupnorm(ctx)?;
        if paths.is_empty() {
            ctx.warn("low_precision_groupnorm: the model has no group_norm layers; nothing to do");
        }
        ctx.info(&format!(
            "low_precision_groupnorm: {} group norms computed in {dtype:?}",
            paths.len()
        ));
        ctx.log_metric(METRIC_NUM_LAYERS, paths.len() as f64);
        Ok(())
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
