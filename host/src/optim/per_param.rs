//! The `per_param` implementation: one parameter at a time with plain tensor operations, the
//! reference the fused path is tested against.

use tch::{TchError, Tensor};

use super::{Optimizer, Rule, Sgd, Slot};

impl Optimizer {
    /// One parameter at a time (the reference). A masked step runs on zero gradients and then
    /// puts back what it changed, selected on the device by the flag.
    pub(super) fn per_param_step(
        &mut self,
        lr: f64,
        found_inf: Option<&Tensor>,
    ) -> Result<(), TchError> {
        let masked = found_inf.map(|f| f.f_ne(0.0)).transpose()?;
        for slot in &mut self.slots {
            let grad = slot.param.grad();
            if !grad.defined() {
                continue;
            }
            let h = &self.hyper[slot.group];
            let (lr_g, wd) = (lr * h.lr_multiplier, h.weight_decay);
            match &self.algorithm {
                Rule::AdamW(_) | Rule::Adam(_) | Rule::Lion(_) => {
                    let buffers = self.algorithm.buffer_names().len();
                    slot.ensure_state(buffers, self.algorithm.counts_steps())?;
                }
                // A new momentum buffer in a step that may be masked: zeros (what a masked
                // step leaves), new until a step is taken (`pending`) when dampening is used
                // (without, `m·0 + g` is the first step's `g` exactly).
                Rule::Sgd(s) if s.momentum != 0.0 && masked.is_some() && slot.state.is_empty() => {
                    slot.ensure_state(1, false)?;
                    if s.dampening != 0.0 {
                        slot.pending = Some(Tensor::f_ones(
                            [] as [i64; 0],
                            (tch::Kind::Float, slot.param.device()),
                        )?);
                    }
                }
                Rule::Sgd(_) => {}
            }
            let saved = match &masked {
                Some(_) => Some(
                    std::iter::once(&slot.param)
                        .chain(&slot.state)
                        .map(Tensor::f_detach_copy)
                        .collect::<Result<Vec<_>, _>>()?,
                ),
                None => None,
            };
            let grad = match &masked {
                Some(m) => Tensor::f_where_scalarself(m, 0.0, &grad)?,
                None => grad,
            };
            match &self.algorithm {
                Rule::Sgd(s) => {
                    sgd_update(slot, &grad, s, lr_g, wd, lr / self.initial_lr, found_inf)?
                }
                Rule::AdamW(a) => adam_update(slot, &grad, a.betas, a.eps, lr_g, wd, true)?,
                Rule::Adam(a) => adam_update(slot, &grad, a.betas, a.eps, lr_g, wd, false)?,
                Rule::Lion(l) => lion_update(slot, &grad, l.betas, lr_g, wd)?,
            }
            if let (Some(m), Some(saved), Some(flag)) = (&masked, saved, found_inf) {
                let now = std::iter::once(&slot.param).chain(&slot.state);
                for (t, before) in now.zip(&saved) {
                    let kept = before.f_where_self(m, t)?;
                    t.shallow_clone().f_copy_(&kept)?;
                }
                if let Some(step) = &slot.step {
                    let _ = step.shallow_clone().f_sub_(flag)?;
                }
            }
        }
        Ok(())
    }
}

/// SGD on one parameter. A `pending` buffer (made in a step that may have been masked) takes
/// the gradient as it is when it is still new, and stays pending when this step may be masked
/// too (`found_inf`).
fn sgd_update(
    slot: &mut Slot,
    grad: &Tensor,
    h: &Sgd,
    lr: f64,
    weight_decay: f64,
    schedule_ratio: f64,
    found_inf: Option<&Tensor>,
) -> Result<(), TchError> {
    let mut d_p = if weight_decay != 0.0 && !h.decoupled_weight_decay {
        grad.f_add(&slot.param.f_mul_scalar(weight_decay)?)?
    } else {
        grad.shallow_clone()
    };
    if h.momentum != 0.0 {
        match slot.state.first_mut() {
            None => slot.state.push(d_p.f_detach_copy()?),
            Some(buf) => {
                let _ = buf.f_mul_scalar_(h.momentum)?;
                let _ = buf.f_add_(&d_p.f_mul_scalar(1.0 - h.dampening)?)?;
                if let Some(pending) = slot.pending.take() {
                    // Made in a masked step: still new, it takes the gradient as it is.
                    let first = d_p.f_where_self(&pending.f_ne(0.0)?, buf)?;
                    buf.f_copy_(&first)?;
                    if let Some(flag) = found_inf {
                        let _ = pending.shallow_clone().f_mul_(flag)?;
                        slot.pending = Some(pending);
                    }
                }
            }
        }
        let buf = &slot.state[0];
        d_p = if h.nesterov {
            d_p.f_add(&buf.f_mul_scalar(h.momentum)?)?
        } else {
            buf.shallow_clone()
        };
    }
    if h.decoupled_weight_decay && weight_decay != 0.0 {
        let _ = slot
            .param
            .f_mul_scalar_(1.0 - schedule_ratio * weight_decay)?;
    }
    let _ = slot.param.f_sub_(&d_p.f_mul_scalar(lr)?)?;
    Ok(())
}

/// Adam on one parameter, its bias correction computed on the device from its own step count.
fn adam_update(
    slot: &mut Slot,
    grad: &Tensor,
    betas: (f64, f64),
    eps: f64,
    lr: f64,
    weight_decay: f64,
    decoupled: bool,
) -> Result<(), TchError> {
    let mut grad = grad.shallow_clone();
    let (b1, b2) = betas;
    if weight_decay != 0.0 {
        if decoupled {
            let _ = slot.param.f_mul_scalar_(1.0 - lr * weight_decay)?;
        } else {
            grad = grad.f_add(&slot.param.f_mul_scalar(weight_decay)?)?;
        }
    }
    let Some(step) = &slot.step else {
        return Err(TchError::Torch(format!(
            "Adam step of `{}` without a step count",
            slot.name
        )));
    };
    let step = step.shallow_clone().f_add_scalar_(1.0)?;
    let step = step.f_to_kind(tch::Kind::Double)?;
    // 1 − β^t in float64, as torch.optim computes it on the host.
    let bias = |beta: f64| -> Result<Tensor, TchError> {
        Tensor::f_pow_scalar(beta, &step)?
            .f_neg()?
            .f_add_scalar(1.0)
    };
    let (bias1, bias2) = (bias(b1)?, bias(b2)?);
    let (m, v) = slot.state.split_at_mut(1);
    let (m, v) = (&mut m[0], &mut v[0]);
    let _ = m.f_lerp_(&grad, 1.0 - b1)?;
    let _ = v.f_mul_scalar_(b2)?;
    let _ = v.f_addcmul_(&grad, &grad.f_mul_scalar(1.0 - b2)?)?;
    let denom = v.f_sqrt()?.f_div(&bias2.f_sqrt()?)?.f_add_scalar(eps)?;
    let step_size = bias1.f_reciprocal()?.f_mul_scalar(-lr)?;
    let _ = slot.param.f_addcdiv_(&m.f_mul(&step_size)?, &denom)?;
    Ok(())
}

/// Lion on one parameter.
fn lion_update(
    slot: &mut Slot,
    grad: &Tensor,
    betas: (f64, f64),
    lr: f64,
    weight_decay: f64,
) -> Result<(), TchError> {
    let (b1, b2) = betas;
    let m = &mut slot.state[0];
    let update = m
        .f_mul_scalar(b1)?
        .f_add(&grad.f_mul_scalar(1.0 - b1)?)?
        .f_sign()?;
    if weight_decay != 0.0 {
        let _ = slot.param.f_mul_scalar_(1.0 - lr * weight_decay)?;
    }
    let _ = slot.param.f_sub_(&update.f_mul_scalar(lr)?)?;
    let _ = m.f_mul_scalar_(b2)?;
    let _ = m.f_add_(&grad.f_mul_scalar(1.0 - b2)?)?;
    Ok(())
}
