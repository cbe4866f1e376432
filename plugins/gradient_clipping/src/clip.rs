//! The clipping itself, as Composer's `apply_gradient_clipping`: pure functions on parameters
//! and their gradients, in place.

use std::fmt;
use std::str::FromStr;

use tessera_plugin_api::device::upload;
use tessera_plugin_api::tch::{self, TchError, Tensor};

/// PyTorch's `clip_grad_norm_` adds this to the total norm before dividing.
pub const NORM_EPSILON: f64 = 1e-6;

/// How gradients are clipped (Composer's `clipping_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClippingType {
    /// `torch.nn.utils.clip_grad_norm_`: every gradient scaled by
    /// `min(1, threshold / (‖g‖₂ + 1e-6))`, the norm global over all gradients.
    Norm,
    /// `torch.nn.utils.clip_grad_value_`: every element clamped to `[−threshold, threshold]`.
    Value,
    /// Adaptive gradient clipping (AGC, Brock et al. 2021): each unit's gradient scaled by
    /// `min(1, threshold · ‖W‖ / ‖g‖)`, a unit being an output row or channel.
    Adaptive,
}

impl ClippingType {
    /// The name used in settings: `norm`, `value` or `adaptive`.
    pub fn name(self) -> &'static str {
        match self {
            ClippingType::Norm => "norm",
            ClippingType::Value => "value",
            ClippingType::Adaptive => "adaptive",
        }
    }
}

impl fmt::Display for ClippingType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ClippingType {
    type Err = String;

    fn from_str(s: &str) -> Result<ClippingType, String> {
        match s {
            "norm" => Ok(ClippingType::Norm),
            "value" => Ok(ClippingType::Value),
            "adaptive" => Ok(ClippingType::Adaptive),
            other => Err(format!(
                "must be \"norm\", \"value\" or \"adaptive\", got {other:?}"
            )),
        }
    }
}

/// The gradients of `params` that exist (PyTorch skips a parameter whose `grad` is `None`).
fn defined_grads(params: &[Tensor]) -> Vec<Tensor> {
    params
        .iter()
        .map(Tensor::grad)
        .filter(Tensor::defined)
        .collect()
}

/// Clips the gradients of `params` in place (Composer's `apply_gradient_clipping` without FSDP);
/// a parameter without a gradient is skipped. Returns the global L2 norm of the gradients before
/// clipping for [`ClippingType::Norm`] (`None` otherwise, or without gradients).
pub fn apply_gradient_clipping(
    params: &[Tensor],
    clipping_type: ClippingType,
    clipping_threshold: f64,
) -> Result<Option<Tensor>, TchError> {
    match clipping_type {
        ClippingType::Norm => clip_grad_norm(&defined_grads(params), clipping_threshold),
        ClippingType::Value => {
            clip_grad_value(&defined_grads(params), clipping_threshold)?;
            Ok(None)
        }
        ClippingType::Adaptive => {
            apply_agc(params, clipping_threshold)?;
            Ok(None)
        }
    }
}

/// The global L2 norm of `grads` as `clip_grad_norm_` computes it: the 2-norm of the stacked
/// per-gradient 2-norms (libtorch's `norm`, which is `linalg_vector_norm` for p = 2), on the
/// first gradient's device. `None` for no gradients.
pub fn total_norm(grads: &[Tensor]) -> Result<Option<Tensor>, TchError> {
    let Some(first) = grads.first() else {
        return Ok(None);
    };
    let device = first.device();
    let norms = grads
        .iter()
        .map(|g| upload(&g.f_norm()?, device))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Tensor::f_stack(&norms, 0)?.f_norm()?))
}

/// `torch.nn.utils.clip_grad_norm_(max_norm)` on gradients, in place: each is multiplied by
/// `clamp(max_norm / (total + 1e-6), max = 1)`, computed as PyTorch does
/// (`reciprocal(total + 1e-6) · max_norm`, in the norm's dtype). Returns the total norm
/// (before clipping); `None` and nothing done for no gradients. As PyTorch with
/// `error_if_nonfinite = False`, a non-finite norm is not an error (the gradients become NaN).
pub fn clip_grad_norm(grads: &[Tensor], max_norm: f64) -> Result<Option<Tensor>, TchError> {
    let _no_grad = tch::no_grad_guard();
    let Some(total) = total_norm(grads)? else {
        return Ok(None);
    };
    let coefficient = total
        .f_add_scalar(NORM_EPSILON)?
        .f_reciprocal()?
        .f_mul_scalar(max_norm)?
        .f_clamp_max(1.0)?;
    for g in grads {
        let _ = g
            .shallow_clone()
            .f_mul_(&upload(&coefficient, g.device())?)?;
    }
    Ok(Some(total))
}

/// `torch.nn.utils.clip_grad_value_(clip_value)` on gradients, in place: every element clamped
/// to `[−clip_value, clip_value]`.
pub fn clip_grad_value(grads: &[Tensor], clip_value: f64) -> Result<(), TchError> {
    let _no_grad = tch::no_grad_guard();
    for g in grads {
        let _ = g.shallow_clone().f_clamp_(-clip_value, clip_value)?;
    }
    Ok(())
}

/// Composer's `_unitwise_norm`: the L2 norm over every dimension but the first, kept as
/// `(N, 1, ...)` so it broadcasts over the tensor; for a 0-D or 1-D tensor, the norm of the
/// whole tensor (a 0-D result).
pub fn unitwise_norm(tensor: &Tensor) -> Result<Tensor, TchError> {
    if tensor.dim() <= 1 {
        tensor.f_norm()
    } else {
        let dims: Vec<i64> = (1..tensor.dim() as i64).collect();
        tensor.f_norm_scalaropt_dim(2.0, dims.as_slice(), true)
    }
}

/// Composer's `_get_clipped_gradient_coeff`: per unit,
/// `clamp(nan_to_num(threshold · ‖W‖ / ‖g‖, nan = 1), max = 1)`. A unit whose gradient is zero
/// gets 1 (`x / 0` is infinite, or NaN for a zero weight too); a unit whose weight is zero but
/// gradient is not gets 0 — its gradient is zeroed.
pub fn agc_coefficient(
    weight: &Tensor,
    grad: &Tensor,
    clipping_threshold: f64,
) -> Result<Tensor, TchError> {
    let max_norm = unitwise_norm(weight)?.f_mul_scalar(clipping_threshold)?;
    max_norm
        .f_div(&unitwise_norm(grad)?)?
        .f_nan_to_num(1.0, None, None)?
        .f_clamp_max(1.0)
}

/// Adaptive gradient clipping (Composer's `_apply_agc`), in place: each parameter's gradient is
/// multiplied by its [`agc_coefficient`]; a parameter without a gradient is skipped.
pub fn apply_agc(params: &[Tensor], clipping_threshold: f64) -> Result<(), TchError> {
    let _no_grad = tch::no_grad_guard();
    for param in params {
        let grad = param.grad();
        if !grad.defined() {
            continue;
        }
        let coefficient = agc_coefficient(&param.f_detach()?, &grad, clipping_threshold)?;
        let _ = grad.shallow_clone().f_mul_(&coefficient)?;
    }
    Ok(())
}
