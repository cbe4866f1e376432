//! The fused implementation (the default): the parameters with a gradient in buckets of one
//! group, device and dtype, each stepped by a handful of multi-tensor kernels ([`super::fused`]).

use tch::{TchError, Tensor};

use super::fused;
use super::{Adam, AdamW, Lion, Optimizer, Rule, Sgd};

impl Optimizer {
    /// The slots with a gradient, by group and by (device, dtype) within a group (the fused
    /// kernels take tensors of one device and dtype), in slot order.
    fn buckets(&self) -> Vec<Vec<usize>> {
        let mut keys: Vec<(usize, tch::Device, tch::Kind)> = Vec::new();
        let mut out: Vec<Vec<usize>> = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            if !s.param.grad().defined() {
                continue;
            }
            let key = (s.group, s.param.device(), s.param.kind());
            match keys.iter().position(|k| *k == key) {
                Some(b) => out[b].push(i),
                None => {
                    keys.push(key);
                    out.push(vec![i]);
                }
            }
        }
        out
    }

    pub(super) fn fused_step(
        &mut self,
        lr: f64,
        found_inf: Option<&Tensor>,
    ) -> Result<(), TchError> {
        let buckets = self.buckets();
        match self.algorithm.clone() {
            Rule::Sgd(h) => {
                for bucket in &buckets {
                    self.fused_sgd(bucket, &h, lr, found_inf)?;
                }
            }
            Rule::AdamW(AdamW { betas, eps, .. }) | Rule::Adam(Adam { betas, eps, .. }) => {
                let decoupled = matches!(self.algorithm, Rule::AdamW(_));
                for bucket in &buckets {
                    self.fused_adam(bucket, lr, betas, eps, decoupled, found_inf)?;
                }
            }
            Rule::Lion(h) => {
                for bucket in &buckets {
                    self.foreach_lion(bucket, &h, lr, found_inf)?;
                }
            }
        }
        Ok(())
    }

    fn fused_sgd(
        &mut self,
        bucket: &[usize],
        h: &Sgd,
        lr: f64,
        found_inf: Option<&Tensor>,
    ) -> Result<(), TchError> {
        let group = &self.hyper[self.slots[bucket[0]].group];
        let (lr_g, wd) = (lr * group.lr_multiplier, group.weight_decay);
        let params: Vec<Tensor> = bucket
            .iter()
            .map(|&i| self.slots[i].param.shallow_clone())
            .collect();
        if h.decoupled_weight_decay && wd != 0.0 {
            // Composer's DecoupledSGDW: p ← p·(1 − (lr/initial_lr)·wd), before the update.
            let c = (lr / self.initial_lr) * wd;
            let refs: Vec<&Tensor> = params.iter().collect();
            match found_inf {
                None => fused::mul(&refs, fused::Factor::Number(1.0 - c))?,
                Some(flag) => {
                    // 1 − c·(1 − found_inf): 1 when the step is masked.
                    let factor = flag.f_mul_scalar(c)?.f_add_scalar(1.0 - c)?;
                    fused::mul(&refs, fused::Factor::Tensor(&factor))?
                }
            }
        }
        let l2 = if h.decoupled_weight_decay { 0.0 } else { wd };
        let args = |is_first_step| fused::SgdArgs {
            weight_decay: l2,
            momentum: h.momentum,
            lr: lr_g,
            dampening: h.dampening,
            nesterov: h.nesterov,
            is_first_step,
        };
        if h.momentum == 0.0 {
            return self.sgd_call(bucket, &args(false), found_inf);
        }
        // New momentum buffers take the gradient as it is (`is_first_step`). A masked step
        // leaves a new buffer at zero, which the next step would treat as momentum
        // (`m·0 + (1 − dampening)·g`): the same as a first step (`g`) only without dampening.
        // With dampening, such a buffer stays `pending` (its flag on the device) and its next
        // step makes both calls, a first step masked unless it is pending and an ordinary one
        // masked when it is: exactly one of them runs, and the host reads nothing.
        let fresh: Vec<usize> = bucket
            .iter()
            .copied()
            .filter(|&i| self.slots[i].state.is_empty())
            .collect();
        let pending: Vec<usize> = bucket
            .iter()
            .copied()
            .filter(|&i| self.slots[i].pending.is_some())
            .collect();
        let old: Vec<usize> = bucket
            .iter()
            .copied()
            .filter(|i| !fresh.contains(i) && !pending.contains(i))
            .collect();
        for &i in &fresh {
            // Zeros, not uninitialized memory: a masked first step leaves them so.
            let buf = self.slots[i].param.f_zeros_like()?;
            self.slots[i].state.push(buf);
        }
        self.sgd_call(&fresh, &args(true), found_inf)?;
        self.sgd_call(&old, &args(false), found_inf)?;
        for i in pending {
            let Some(pending) = self.slots[i].pending.take() else {
                continue;
            };
            let not_pending = pending.f_neg()?.f_add_scalar(1.0)?;
            let (as_first, as_next) = match found_inf {
                Some(flag) => (flag.f_maximum(&not_pending)?, flag.f_maximum(&pending)?),
                None => (not_pending, pending.shallow_clone()),
            };
            self.sgd_call(&[i], &args(true), Some(&as_first))?;
            self.sgd_call(&[i], &args(false), Some(&as_next))?;
            // Still new only when this step was masked too (in place: a captured step
            // replays on the same tensor).
            if let Some(flag) = found_inf {
                let _ = pending.shallow_clone().f_mul_(flag)?;
                self.slots[i].pending = Some(pending);
            }
        }
        if h.dampening != 0.0 {
            if let Some(flag) = found_inf {
                for &i in &fresh {
                    self.slots[i].pending = Some(flag.f_detach_copy()?);
                }
            }
        }
        Ok(())
    }

    /// One fused SGD call over the slots `part` (nothing when empty).
    fn sgd_call(
        &self,
        part: &[usize],
        args: &fused::SgdArgs,
        found_inf: Option<&Tensor>,
    ) -> Result<(), TchError> {
        if part.is_empty() {
            return Ok(());
        }
        let p: Vec<&Tensor> = part.iter().map(|&i| &self.slots[i].param).collect();
        let grads: Vec<Tensor> = part
            .iter()
            .map(|&i| same_layout(&self.slots[i].param.grad(), &self.slots[i].param))
            .collect::<Result<_, _>>()?;
        let g: Vec<&Tensor> = grads.iter().collect();
        let b: Vec<&Tensor> = if args.momentum == 0.0 {
            Vec::new()
        } else {
            part.iter().map(|&i| &self.slots[i].state[0]).collect()
        };
        let rate = self.device_rate(self.slots[part[0]].group);
        fused::sgd(&p, &g, &b, args, found_inf, rate)
    }

    fn fused_adam(
        &mut self,
        bucket: &[usize],
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        decoupled: bool,
        found_inf: Option<&Tensor>,
    ) -> Result<(), TchError> {
        let group = &self.hyper[self.slots[bucket[0]].group];
        let args = fused::AdamArgs {
            lr: lr * group.lr_multiplier,
            betas,
            weight_decay: group.weight_decay,
            eps,
            decoupled,
        };
        for &i in bucket {
            self.slots[i].ensure_state(2, true)?;
        }
        let p: Vec<&Tensor> = bucket.iter().map(|&i| &self.slots[i].param).collect();
        let grads: Vec<Tensor> = bucket
            .iter()
            .map(|&i| same_layout(&self.slots[i].param.grad(), &self.slots[i].param))
            .collect::<Result<_, _>>()?;
        let g: Vec<&Tensor> = grads.iter().collect();
        let m: Vec<&Tensor> = bucket.iter().map(|&i| &self.slots[i].state[0]).collect();
        let v: Vec<&Tensor> = bucket.iter().map(|&i| &self.slots[i].state[1]).collect();
        let steps: Vec<&Tensor> = bucket
            .iter()
            .filter_map(|&i| self.slots[i].step.as_ref())
            .collect();
        // torch.optim's `_fused_adam`: the counts advance before the kernel and a masked step
        // takes them back after it.
        fused::add_scalar(&steps, 1.0)?;
        let rate = self.device_rate(self.slots[bucket[0]].group);
        fused::adam(&p, &g, &m, &v, &steps, &args, found_inf, rate)?;
        if let Some(flag) = found_inf {
            fused::add_tensor(&steps, flag, -1.0)?;
        }
        Ok(())
    }

    /// Group `group`'s rate on the device, when the rates are kept there.
    fn device_rate(&self, group: usize) -> Option<&Tensor> {
        self.device_lr.as_ref().and_then(|r| r.get(group))
    }

    fn foreach_lion(
        &mut self,
        bucket: &[usize],
        h: &Lion,
        lr: f64,
        found_inf: Option<&Tensor>,
    ) -> Result<(), TchError> {
        let group = &self.hyper[self.slots[bucket[0]].group];
        let args = fused::LionArgs {
            lr: lr * group.lr_multiplier,
            betas: h.betas,
            weight_decay: group.weight_decay,
        };
        for &i in bucket {
            self.slots[i].ensure_state(1, false)?;
        }
        let p: Vec<&Tensor> = bucket.iter().map(|&i| &self.slots[i].param).collect();
        let grads: Vec<Tensor> = bucket
            .iter()
            .map(|&i| same_layout(&self.slots[i].param.grad(), &self.slots[i].param))
            .collect::<Result<_, _>>()?;
        let g: Vec<&Tensor> = grads.iter().collect();
        let m: Vec<&Tensor> = bucket.iter().map(|&i| &self.slots[i].state[0]).collect();
        fused::lion(&p, &g, &m, &args, found_inf)
    }
}

/// `t` in the layout (strides) of `like`: the fused kernels walk a parameter, its gradient and
/// its state as flat memory, so all must share one layout. A copy only when they differ (a
/// gradient computed in another memory format).
fn same_layout(t: &Tensor, like: &Tensor) -> Result<Tensor, TchError> {
    if t.stride() == like.stride() {
        return Ok(t.shallow_clone());
    }
    let mut out = like.f_empty_like()?;
    out.f_copy_(t)?;
    Ok(out)
}
