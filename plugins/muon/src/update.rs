//! The functional form: the Muon step of a group of same-shape matrices, batched.
//!
//! Matrices of one shape are stepped together: their gradients are copied into one contiguous
//! `(n, rows, cols)` tensor (conv filters flattened to `(out, in·kh·kw)`), the momentum of the
//! group lives in one such tensor, and Newton–Schulz runs as batched matrix products, so a step
//! costs a fixed number of kernels per shape, not per parameter.

use tessera_plugin_api::tch::{self, Kind, Tensor};
use tessera_plugin_api::Error;

use crate::config::{MuonConfig, Variant};

/// `rows × cols`: a parameter's shape flattened to the matrix Muon orthogonalizes (the first
/// dimension against the rest, as conv filters are flattened in KellerJordan/Muon).
pub fn matrix_shape(shape: &[i64]) -> Option<(i64, i64)> {
    match shape {
        [rows, rest @ ..] if !rest.is_empty() => Some((*rows, rest.iter().product())),
        _ => None,
    }
}

/// Orthogonalizes every matrix of `update` (`(n, rows, cols)`) by the quintic Newton–Schulz
/// iteration in bfloat16, as the chosen variant computes it; returns bfloat16.
///
/// `torch` (`torch.optim.Muon`'s `_zeropower_via_newtonschulz`): `X ← X / max(‖X‖_F, eps)`, then
/// `A = X Xᵀ; B = b·A + c·A·A; X = a·X + B·X` with the last two as fused `addmm`s. `keller`
/// (`muon.py`'s `zeropower_via_newtonschulz5`): `X ← X / (‖X‖_F + eps)` and the same iteration
/// as separate products and sums. Both work on the wide orientation (rows ≤ cols).
pub fn newton_schulz(update: &Tensor, config: &MuonConfig) -> Result<Tensor, Error> {
    let size = update.size();
    let tall = size.len() == 3 && size[1] > size[2];
    let [a, b, c] = config.ns_coefficients;
    let mut x = update.f_to_kind(Kind::BFloat16)?;
    if tall {
        x = x.f_transpose(-2, -1)?;
    }
    let norm = x.f_norm_scalaropt_dim(2.0, [-2i64, -1].as_slice(), true)?;
    x = match config.variant {
        Variant::Torch => x.f_div(&norm.f_clamp_min(config.eps)?)?,
        Variant::Keller => x.f_div(&norm.f_add_scalar(config.eps)?)?,
    };
    for _ in 0..config.ns_steps {
        let xt = x.f_transpose(-2, -1)?;
        let gram = x.f_matmul(&xt)?;
        x = match config.variant {
            Variant::Torch => {
                let poly = gram.f_baddbmm(&gram, &gram, b, c)?;
                x.f_baddbmm(&poly, &x, a, 1.0)?
            }
            Variant::Keller => {
                // `b * A + c * A @ A` in Python: `(c·A) @ A`, rounded to bfloat16 first.
                let poly = gram
                    .f_mul_scalar(b)?
                    .f_add(&gram.f_mul_scalar(c)?.f_matmul(&gram)?)?;
                x.f_mul_scalar(a)?.f_add(&poly.f_matmul(&x)?)?
            }
        };
    }
    if tall {
        x = x.f_transpose(-2, -1)?;
    }
    Ok(x)
}

/// Parameters of one matrix shape and their momentum, stepped together.
pub struct MatrixGroup {
    /// The parameters' names, in the order of the rows of `momentum`.
    pub names: Vec<String>,
    /// The parameters' shape.
    pub shape: Vec<i64>,
    /// `rows` of the flattened matrix.
    pub rows: i64,
    /// `cols` of the flattened matrix.
    pub cols: i64,
    /// The momentum buffers, `(n, rows, cols)` in the parameters' kind and device.
    pub momentum: Tensor,
    /// Where the gradients are gathered each step (reused).
    gathered: Tensor,
}

impl MatrixGroup {
    /// A group of the parameters `names` of shape `shape`, with zero momentum of `kind` on
    /// `device`.
    pub fn new(
        names: Vec<String>,
        shape: Vec<i64>,
        kind: Kind,
        device: tch::Device,
    ) -> Result<MatrixGroup, Error> {
        let (rows, cols) = matrix_shape(&shape)
            .ok_or_else(|| Error::from(format!("Muon needs ≥ 2 dimensions, got {shape:?}")))?;
        let dims = [names.len() as i64, rows, cols];
        Ok(MatrixGroup {
            momentum: Tensor::f_zeros(dims, (kind, device))?,
            gathered: Tensor::f_zeros(dims, (kind, device))?,
            names,
            shape,
            rows,
            cols,
        })
    }

    /// The momentum of the `i`-th parameter, in the parameter's shape (a view).
    pub fn momentum_of(&self, i: usize) -> Result<Tensor, Error> {
        Ok(self
            .momentum
            .f_select(0, i as i64)?
            .f_view(self.shape.as_slice())?)
    }

    /// One Muon step of `params` (aligned with `names`) from their gradients `grads`, at base
    /// rate `lr` (already scheduled): [`MatrixGroup::advance`], [`newton_schulz`],
    /// [`MatrixGroup::apply`]. A parameter whose gradient is undefined (frozen, or not used by
    /// the forward) keeps its value and momentum, as `torch.optim.Muon` skips it. With `skip`
    /// (a 0-dim flag on the device, 1: the host skipped this step) parameters and momentum
    /// stay bit for bit as they were when it is set, without reading it on the host.
    pub fn step(
        &mut self,
        params: &[Tensor],
        grads: &[Tensor],
        config: &MuonConfig,
        lr: f64,
        skip: Option<&Tensor>,
    ) -> Result<(), Error> {
        let update = self.advance(grads, config, skip)?;
        let ortho = newton_schulz(&update, config)?;
        self.apply(params, grads, &ortho, config, lr, skip)
    }

    /// The momentum step: `M ← lerp(M, G, 1 − β)`; returns the `(n, rows, cols)` matrices to
    /// orthogonalize (`lerp(G, M, β)` with Nesterov, else `M`). A skipped step (`skip` set)
    /// leaves the momentum as it was.
    pub fn advance(
        &mut self,
        grads: &[Tensor],
        config: &MuonConfig,
        skip: Option<&Tensor>,
    ) -> Result<Tensor, Error> {
        let _no_grad = tch::no_grad_guard();
        for (i, g) in grads.iter().enumerate() {
            let mut row = self.gathered.f_select(0, i as i64)?;
            if g.defined() {
                row.f_view(self.shape.as_slice())?.f_copy_(g)?;
            } else {
                // No gradient (frozen, or unused by the forward): the momentum's own row, which
                // `lerp` leaves as it is; the parameter is not touched by `apply`.
                row.f_copy_(&self.momentum.f_select(0, i as i64)?)?;
            }
        }
        let skip = match skip {
            Some(flag) => Some(flag.f_to_kind(Kind::Bool)?),
            None => None,
        };
        // A skipped step's gradient may be non-finite: it is replaced by the momentum itself,
        // which `lerp` then leaves exactly as it is.
        let mut grad = match &skip {
            Some(s) => self.momentum.f_where_self(s, &self.gathered)?,
            None => self.gathered.shallow_clone(),
        };
        let _ = self.momentum.f_lerp_(&grad, 1.0 - config.momentum)?;
        Ok(if config.nesterov {
            let _ = grad.f_lerp_(&self.momentum, config.momentum)?;
            grad
        } else {
            self.momentum.shallow_clone()
        })
    }

    /// The parameter step from the orthogonalized update `ortho` (bfloat16, as
    /// [`newton_schulz`] returns it): `W ← W·(1 − lr·wd) − lr_adj·O`, for the parameters that
    /// have a gradient; a skipped step leaves them as they were.
    pub fn apply(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        ortho: &Tensor,
        config: &MuonConfig,
        lr: f64,
        skip: Option<&Tensor>,
    ) -> Result<(), Error> {
        let _no_grad = tch::no_grad_guard();
        let skip = match skip {
            Some(flag) => Some(flag.f_to_kind(Kind::Bool)?),
            None => None,
        };
        let mut ortho = ortho.shallow_clone();
        if let Some(scale) = config.update_scale(self.rows, self.cols) {
            ortho = ortho.f_mul_scalar(scale)?;
        }
        let kind = self.momentum.kind();
        let step_lr = config.matrix_lr(lr, self.rows, self.cols);
        let decay = 1.0 - lr * config.weight_decay;
        let mut delta = ortho.f_to_kind(kind)?;
        // `W ← W·(1 − lr·wd) − lr_adj·O` (decoupled decay with the unadjusted rate, as both
        // references); a skipped step multiplies by 1 and adds 0.
        let decay = match &skip {
            Some(s) => Some(Tensor::f_where_scalar(s, 1.0, decay)?.f_to_kind(kind)?),
            None if config.weight_decay != 0.0 => Some(Tensor::f_scalar_tensor(
                decay,
                (kind, self.momentum.device()),
            )?),
            None => None,
        };
        match &skip {
            Some(s) => {
                let alpha = Tensor::f_where_scalar(s, 0.0, -step_lr)?.f_to_kind(kind)?;
                let _ = delta.f_mul_(&alpha)?;
            }
            None => {
                let _ = delta.f_mul_scalar_(-step_lr)?;
            }
        }
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            if !g.defined() {
                continue;
            }
            let mut p = p.shallow_clone();
            if let Some(d) = &decay {
                let _ = p.f_mul_(d)?;
            }
            let _ = p.f_add_(&delta.f_select(0, i as i64)?.f_view(self.shape.as_slice())?)?;
        }
        Ok(())
    }
}
