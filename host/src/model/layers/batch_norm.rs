//! Batch normalization over channels (PyTorch `BatchNorm2d`).

use std::sync::{Arc, RwLock};

use tch::{nn::Init, Kind, TchError, Tensor};

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
        BatchNorm2d::with_settings(store, path, num_features, 0.1, 1e-5)
    }

    /// The same with running-statistics `momentum` (PyTorch's convention: the weight of the new
    /// batch's statistics) and `eps`, as airbench's `BatchNorm(momentum=0.6, eps=1e-12)`, which is
    /// PyTorch's `BatchNorm2d(eps=1e-12, momentum=0.4)`.
    pub fn with_settings(
        store: &mut ParamStore,
        path: &str,
        num_features: i64,
        momentum: f64,
        eps: f64,
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
            momentum,
            eps,
        })
    }
}

/// A differentiable sum over the ranks of a data-parallel run (see [`set_sync`]).
pub type RankSum = Arc<dyn Fn(&Tensor) -> Result<Tensor, TchError> + Send + Sync>;

/// The sum batch norms use for their training statistics when they are synchronised.
static SYNC: RwLock<Option<RankSum>> = RwLock::new(None);

/// Makes every [`BatchNorm2d`] of this process compute its training-mode statistics over the
/// global batch of a data-parallel run (PyTorch's `SyncBatchNorm`): `sum` adds a tensor over
/// the ranks, and its gradient is the sum of the ranks' gradients. `None` goes back to each
/// rank's own batch.
pub fn set_sync(sum: Option<RankSum>) {
    match SYNC.write() {
        Ok(mut s) => *s = sum,
        Err(poisoned) => *poisoned.into_inner() = sum,
    }
}

fn sync() -> Option<RankSum> {
    match SYNC.read() {
        Ok(s) => s.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

impl BatchNorm2d {
    /// Training-mode forward with statistics over every rank's batch, as
    /// `torch.nn.SyncBatchNorm`: the global mean from the ranks' per-channel sums and counts,
    /// then the global (biased) variance from the ranks' sums of squared deviations from it
    /// (two passes, as stable as one process's); the running statistics take the global mean
    /// and unbiased variance.
    fn forward_synced(&self, xs: &Tensor, sum: &RankSum) -> Result<Tensor, TchError> {
        let x = xs.f_to_kind(Kind::Float)?;
        let c = self.num_features;
        let dims: &[i64] = &[0, 2, 3];
        let shape = [1, c, 1, 1];
        let local_count = (x.numel() as i64 / c.max(1)) as f32;
        let first = Tensor::f_cat(
            &[
                x.f_sum_dim_intlist(dims, false, Kind::Float)?,
                Tensor::f_from_slice(&[local_count])?.f_to_device(x.device())?,
            ],
            0,
        )?;
        let first = sum(&first)?;
        let count = first.f_narrow(0, c, 1)?;
        let mean = first.f_narrow(0, 0, c)?.f_div(&count)?;
        let centered = x.f_sub(&mean.f_view(shape)?)?;
        let squares = centered
            .f_square()?
            .f_sum_dim_intlist(dims, false, Kind::Float)?;
        let var = sum(&squares)?.f_div(&count)?;
        let inv = var.f_add_scalar(self.eps)?.f_rsqrt()?;
        let out = centered
            .f_mul(&inv.f_view(shape)?)?
            .f_mul(&self.weight.f_view(shape)?)?
            .f_add(&self.bias.f_view(shape)?)?
            .f_to_kind(xs.kind())?;
        tch::no_grad(|| -> Result<(), TchError> {
            let n = count.f_double_value(&[0])?;
            let unbiased = var.f_mul_scalar(n / (n - 1.0).max(1.0))?;
            let m = self.momentum;
            let _ = self
                .running_mean
                .shallow_clone()
                .f_mul_scalar_(1.0 - m)?
                .f_add_(&mean.f_detach()?.f_mul_scalar(m)?)?;
            let _ = self
                .running_var
                .shallow_clone()
                .f_mul_scalar_(1.0 - m)?
                .f_add_(&unbiased.f_detach()?.f_mul_scalar(m)?)?;
            Ok(())
        })?;
        Ok(out)
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
        let synced = if train { sync() } else { None };
        let out = match &synced {
            Some(sum) => self.forward_synced(xs, sum)?,
            None => self.batch_norm(xs, train)?,
        };
        if train {
            // As PyTorch's BatchNorm: count the training-mode forwards (in place, so the store
            // and checkpoints see it).
            let _ = tch::no_grad(|| self.num_batches_tracked.shallow_clone().f_add_scalar_(1))?;
        }
        Ok(out)
    }
}

impl BatchNorm2d {
    fn batch_norm(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        Tensor::f_batch_norm(
            xs,
            Some(&self.weight),
            Some(&self.bias),
            Some(&self.running_mean),
            Some(&self.running_var),
            train,
            self.momentum,
            self.eps,
            true,
        )
    }
}
