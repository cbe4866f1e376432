//! The running average itself, as PyTorch's `AveragedModel.update_parameters` with its default
//! `swa_avg` and `use_buffers=False`: pure functions on named tensors.

use tessera_plugin_api::kit::copy_into;
use tessera_plugin_api::tch::{self, Tensor};
use tessera_plugin_api::Error;

/// One tensor of the model as the average sees it.
pub struct ModelTensor {
    /// The model's name for it (`layer1.0.conv1.weight`).
    pub name: String,
    /// The tensor, sharing storage with the model.
    pub tensor: Tensor,
    /// A buffer (BatchNorm statistics): copied, not averaged.
    pub buffer: bool,
}

/// `average ← average + (θ − average) / (n + 1)` in place for one parameter (PyTorch's
/// `swa_avg`, computed in the tensor's own precision), or `average ← θ` when `n = 0`.
pub fn swa_update(average: &Tensor, model: &Tensor, n_averaged: u64) -> Result<(), Error> {
    let _no_grad = tch::no_grad_guard();
    let model = model.f_detach()?;
    if n_averaged == 0 {
        average.shallow_clone().f_copy_(&model)?;
        return Ok(());
    }
    let step = model
        .f_sub(average)?
        .f_div_scalar((n_averaged + 1) as f64)?;
    let mixed = average.f_add(&step)?;
    average.shallow_clone().f_copy_(&mixed)?;
    Ok(())
}

/// `AveragedModel.update_parameters` over named tensors: with `n_averaged` models averaged so
/// far, every parameter of `average` moves to the running mean with the model's, and every
/// buffer is copied from the model (`use_buffers=False`: BatchNorm statistics are the live
/// model's at the last update, not averaged). `average` shares storage with the caller's and
/// is updated in place; its names and shapes must be the model's, in the same order.
pub fn update_average(
    average: &[(String, Tensor)],
    model: &[ModelTensor],
    n_averaged: u64,
) -> Result<(), Error> {
    check_matches(average, model)?;
    for ((_, a), m) in average.iter().zip(model) {
        if m.buffer {
            copy_into(a, &m.tensor)?;
        } else {
            swa_update(a, &m.tensor, n_averaged)?;
        }
    }
    Ok(())
}

/// Errs unless `average` holds the model's tensors (names and shapes, in order).
pub fn check_matches(average: &[(String, Tensor)], model: &[ModelTensor]) -> Result<(), Error> {
    let ours: Vec<(&str, Vec<i64>)> = average
        .iter()
        .map(|(n, t)| (n.as_str(), t.size()))
        .collect();
    let theirs: Vec<(&str, Vec<i64>)> = model
        .iter()
        .map(|m| (m.name.as_str(), m.tensor.size()))
        .collect();
    if ours != theirs {
        let missing: Vec<&str> = ours
            .iter()
            .filter(|o| !theirs.contains(o))
            .map(|(n, _)| *n)
            .collect();
        let extra: Vec<&str> = theirs
            .iter()
            .filter(|t| !ours.contains(t))
            .map(|(n, _)| *n)
            .collect();
        return Err(format!(
            "the averaged weights do not match the model (not in the model or another shape: \
             {missing:?}; only in the model: {extra:?})"
        )
        .into());
    }
    Ok(())
}
