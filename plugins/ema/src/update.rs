//! The update itself, as Composer's `compute_ema`: pure functions on tensors.

use tessera_plugin_api::tch::{self, Tensor};
use tessera_plugin_api::Error;

/// One tensor's update, in place: `ema ← ema·s + θ·(1 − s)`, computed as Composer does
/// (`ema * s + (1 - s) * θ`) and written back with `copy_`, so an integer tensor (BatchNorm's
/// `num_batches_tracked`) receives the float result truncated toward zero.
pub fn ema_update(ema: &mut Tensor, model: &Tensor, smoothing: f64) -> Result<(), Error> {
    let _no_grad = tch::no_grad_guard();
    let model = model.f_detach()?;
    let mixed = ema
        .f_mul_scalar(smoothing)?
        .f_add(&model.f_mul_scalar(1.0 - smoothing)?)?;
    ema.f_copy_(&mixed)?;
    Ok(())
}

/// Composer's `compute_ema` on named tensors: every tensor of `ema` (which shares storage with
/// the caller's, and is updated in place) moves towards the model tensor of the same name.
/// A name of `ema` missing from `model`, or a shape mismatch, is an error.
pub fn compute_ema(
    ema: &[(String, Tensor)],
    model: &[(String, Tensor)],
    smoothing: f64,
) -> Result<(), Error> {
    for (name, e) in ema {
        let m = model
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| Error::from(format!("compute_ema: the model has no `{name}`")))?;
        if e.size() != m.size() {
            return Err(format!(
                "compute_ema: `{name}` has shape {:?} in the average but {:?} in the model",
                e.size(),
                m.size()
            )
            .into());
        }
        ema_update(&mut e.shallow_clone(), m, smoothing)?;
    }
    Ok(())
}
