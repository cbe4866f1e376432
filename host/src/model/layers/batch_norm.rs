//! Batch normalization over channels (PyTorch `BatchNorm2d`).

use tch::{nn::Init, TchError, Tensor};

use super::{Attr, Layer};
use crate::model::{tree::join, ParamStore};

/// Normalizes each channel by the batch's statistics in training and by the running ones in
/// evaluation, then scales and shifts it.
#[derive(Debug)]
pub struct BatchNorm2d {
    /// Scale.
    weight: Tensor,
    /// Shift.
    bias: Tensor,
    /// Running mean (buffer).
    running_mean: Tensor,
    /// Running variance (buffer).
    running_var: Tensor,
    /// Training-mode forwards so far: an int64 scalar buffer, as in PyTorch.
    num_batches_tracked: Tensor,
    num_features: i64,
    /// Running-stat momentum.
    momentum: f64,
    /// Epsilon.
    eps: f64,
}

impl BatchNorm2d {
    /// A batch norm over `num_features` channels whose tensors join `store` under `path` in
    /// PyTorch's order, with PyTorch's defaults (scale 1, shift 0, momentum 0.1, eps 1e-5).
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        num_features: i64,
    ) -> Result<BatchNorm2d, TchError> {
        let channels = [num_features];
        // Fields are evaluated in the order written: the store keeps PyTorch's order.
        Ok(BatchNorm2d {
            weight: store.parameter(join(path, "weight"), &channels, Init::Const(1.0))?,
            bias: store.parameter(join(path, "bias"), &channels, Init::Const(0.0))?,
            running_mean: store.buffer(join(path, "running_mean"), &channels, 0.0)?,
            running_var: store.buffer(join(path, "running_var"), &channels, 1.0)?,
            num_batches_tracked: store.buffer_int64(join(path, "num_batches_tracked"), 0)?,
            num_features,
            momentum: 0.1,
            eps: 1e-5,
        })
    }
}

impl Layer for BatchNorm2d {
    fn kind(&self) -> &str {
        "batch_norm2d"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("num_features", Attr::Int(self.num_features)),
            ("eps", Attr::Float(self.eps)),
            ("momentum", Attr::Float(self.momentum)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![
            ("weight", &self.weight),
            ("bias", &self.bias),
            ("running_mean", &self.running_mean),
            ("running_var", &self.running_var),
            ("num_batches_tracked", &self.num_batches_tracked),
        ]
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let out = Tensor::f_batch_norm(
            xs,
            Some(&self.weight),
            Some(&self.bias),
            Some(&self.running_mean),
            Some(&self.running_var),
            train,
            self.momentum,
            self.eps,
            true,
        )?;
        if train {
            // As PyTorch's BatchNorm: count the training-mode forwards (in place, so the store
            // and checkpoints see it).
            let _ = tch::no_grad(|| self.num_batches_tracked.shallow_clone().f_add_scalar_(1))?;
        }
        Ok(out)
    }
}
