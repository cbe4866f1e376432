//! What the `low_precision_layernorm` and `low_precision_groupnorm` plugins share (a library,
//! not a plugin): Composer's `LPLayerNorm` / `LPGroupNorm` forwards, the probe of the autocast
//! in force, and the surgery at `init` that wraps a norm kind in place.
#![warn(missing_docs)]

use tessera_plugin_api::kit::{walk, SurgeryModel};
use tessera_plugin_api::tch::{self, Device, Kind, TchError, Tensor};
use tessera_plugin_api::{Context, Error, Inner, ModuleInfo, Wrapper};

/// The low-precision dtype of a run's precision (`train.precision`): bfloat16 for
/// `"amp_bf16"`, `None` for `"fp32"` (and any precision without autocast), where the methods
/// change nothing.
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

/// Composer's low-precision forward around `norm`: with `dtype` (the autocast dtype), `x`,
/// `weight` and `bias` are cast to it and `norm` runs with autocast off, so the result stays in
/// `dtype` (CUDA autocast lists the norms among its fp32 operations; CPU autocast leaves them
/// alone); without, `norm` of what arrives.
fn low_precision(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    dtype: Option<Kind>,
    norm: impl FnOnce(&Tensor, Option<&Tensor>, Option<&Tensor>) -> Result<Tensor, TchError>,
) -> Result<Tensor, TchError> {
    let Some(dtype) = dtype else {
        return norm(x, weight, bias);
    };
    let cast = |t: &Tensor| t.f_to_kind(dtype);
    let (x, weight, bias) = (
        cast(x)?,
        weight.map(cast).transpose()?,
        bias.map(cast).transpose()?,
    );
    let run = || norm(&x, weight.as_ref(), bias.as_ref());
    match x.device() {
        Device::Cuda(_) => tch::autocast(false, run),
        _ => run(),
    }
}

/// Composer's `LPLayerNorm.forward` with an explicit autocast `dtype` (`None`: autocast off).
pub fn low_precision_layer_norm(
    x: &Tensor,
    normalized_shape: &[i64],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    dtype: Option<Kind>,
) -> Result<Tensor, TchError> {
    low_precision(x, weight, bias, dtype, |x, w, b| {
        Tensor::f_layer_norm(x, normalized_shape, w, b, eps, true)
    })
}

/// Composer's `LPGroupNorm.forward` with an explicit autocast `dtype` (`None`: autocast off).
pub fn low_precision_group_norm(
    x: &Tensor,
    num_groups: i64,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    dtype: Option<Kind>,
) -> Result<Tensor, TchError> {
    low_precision(x, weight, bias, dtype, |x, w, b| {
        Tensor::f_group_norm(x, num_groups, w, b, eps, true)
    })
}

/// The norm a method converts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// The host's `layer_norm` (one normalized trailing dimension).
    Layer,
    /// The host's `group_norm`.
    Group,
}

impl NormKind {
    /// The plugin's name (`low_precision_layernorm`), which prefixes its messages and metric.
    pub fn plugin(self) -> &'static str {
        match self {
            NormKind::Layer => "low_precision_layernorm",
            NormKind::Group => "low_precision_groupnorm",
        }
    }

    /// The host's module kind the method converts.
    pub fn host_kind(self) -> &'static str {
        match self {
            NormKind::Layer => "layer_norm",
            NormKind::Group => "group_norm",
        }
    }

    /// The kind of a converted module.
    pub fn kind(self) -> &'static str {
        match self {
            NormKind::Layer => "low_precision_layer_norm",
            NormKind::Group => "low_precision_group_norm",
        }
    }

    /// The integer attribute the forward needs: `normalized_shape` or `num_groups`.
    fn size_attr(self) -> &'static str {
        match self {
            NormKind::Layer => "normalized_shape",
            NormKind::Group => "num_groups",
        }
    }
}

/// A norm's tensors (shallow clones, shared with the model) and settings.
pub struct NormTensors {
    /// Scale, or `None` without affine.
    pub weight: Option<Tensor>,
    /// Shift, or `None`.
    pub bias: Option<Tensor>,
    /// `normalized_shape` (layer norm) or `num_groups` (group norm).
    pub size: i64,
    /// Added to the variance.
    pub eps: f64,
}

/// The wrapper installed around one norm: the norm in the autocast dtype whenever autocast is
/// on, training and evaluation alike (as Composer's `LP*Norm`).
struct LowPrecisionNorm {
    kind: NormKind,
    norm: NormTensors,
}

impl Wrapper for LowPrecisionNorm {
    fn kind(&self) -> &str {
        self.kind.kind()
    }

    fn forward(
        &self,
        input: &Tensor,
        _train: bool,
        _inner: &mut Inner<'_>,
    ) -> Result<Tensor, Error> {
        let dtype = active_autocast_dtype(input.device())?;
        let (w, b, n) = (
            self.norm.weight.as_ref(),
            self.norm.bias.as_ref(),
            &self.norm,
        );
        Ok(match self.kind {
            NormKind::Layer => low_precision_layer_norm(input, &[n.size], w, b, n.eps, dtype)?,
            NormKind::Group => low_precision_group_norm(input, n.size, w, b, n.eps, dtype)?,
        })
    }

    /// The same norm in fp32 evaluation: the plain module, its tensors unchanged.
    fn export(&self, inner: Vec<(String, Tensor)>) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        Ok(Some(inner))
    }
}

/// The norms of `kind` in the tree (a converted one shows [`NormKind::kind`], so applying twice
/// changes nothing).
pub fn targets(modules: &[ModuleInfo], kind: NormKind) -> Vec<String> {
    walk::of_kind(modules, kind.host_kind())
        .map(|m| m.path.to_string())
        .collect()
}

/// Composer's `apply_low_precision_layernorm` / `_groupnorm(model, precision)`, the precision
/// checked by the caller: every norm of `kind` is wrapped in place, its tensors keeping their
/// names. Returns the paths converted.
pub fn apply(model: &mut impl SurgeryModel, kind: NormKind) -> Result<Vec<String>, Error> {
    let modules = model.modules()?;
    let paths = targets(&modules, kind);
    for path in &paths {
        let info = walk::find(&modules, path).ok_or("the module tree changed during surgery")?;
        let norm = NormTensors {
            weight: model.optional_tensor_of(info, "weight")?,
            bias: model.optional_tensor_of(info, "bias")?,
            size: info.int_attr(kind.size_attr(), None)?,
            eps: info.attr("eps").unwrap_or(1e-5),
        };
        model.wrap_module(path, LowPrecisionNorm { kind, norm }, None, Vec::new())?;
    }
    Ok(paths)
}

/// The host's RMSNorm (a Llama-family decoder's).
pub const RMS_NORM: &str = "rms_norm";

/// low_precision_layernorm on a model whose norms are RMSNorms and none a layer norm (a llama):
/// refused, naming the reason, rather than a silent no-op. Hugging Face's `LlamaRMSNorm`
/// computes in float32 on purpose (it upcasts its input; the host's `rms_norm` does as it does)
/// and Composer's LowPrecisionLayerNorm converts `torch.nn.LayerNorm` only: there is no
/// Composer semantics to follow, and an RMSNorm in bfloat16 changes what a pretrained llama
/// computes.
pub fn refuse_rms_norms(modules: &[ModuleInfo]) -> Result<(), Error> {
    let layer = NormKind::Layer.host_kind();
    let has = |k: &str| walk::of_kind(modules, k).next().is_some();
    if has(RMS_NORM) && !has(layer) {
        let first = walk::of_kind(modules, RMS_NORM)
            .next()
            .map(|m| m.path.to_string())
            .unwrap_or_default();
        return Err(Error::config(format!(
            "low_precision_layernorm converts layer norms ({layer}), and this model's norms are \
             RMSNorms ({RMS_NORM}, e.g. `{first}`), which Llama-family models compute in \
             float32 on purpose (Hugging Face's LlamaRMSNorm upcasts its input); there is no \
             low-precision RMSNorm variant: leave the method out for this model"
        )));
    }
    Ok(())
}

/// A method's `init`: with a mixed precision, [`apply`] and log `<plugin>/num_layers`; with
/// `fp32`, a warning that the method does nothing (as Composer's) and the metric 0.
pub fn on_init(ctx: &mut Context<'_>, kind: NormKind) -> Result<(), Error> {
    let plugin = kind.plugin();
    let metric = format!("{plugin}/num_layers");
    if kind == NormKind::Layer {
        refuse_rms_norms(&ctx.modules()?)?;
    }
    let precision = ctx.precision()?;
    let Some(dtype) = autocast_dtype(&precision) else {
        ctx.warn(&format!(
            "{plugin} only applies with a mixed precision (train.precision = \"amp_bf16\" or \"amp_fp16\"); \
             with \"{precision}\" it does nothing"
        ));
        ctx.log_metric(&metric, 0.0);
        return Ok(());
    };
    let paths = apply(ctx, kind)?;
    if paths.is_empty() {
        ctx.warn(&format!(
            "{plugin}: the model has no {} layers; nothing to do",
            kind.host_kind()
        ));
    }
    ctx.info(&format!(
        "{plugin}: {} {} layers computed in {dtype:?} under autocast",
        paths.len(),
        kind.host_kind()
    ));
    ctx.log_metric(&metric, paths.len() as f64);
    Ok(())
}
