//! Optimizers (SGD, AdamW) written over libtorch tensor ops, so that their state is visible to
//! checkpoints (tch's C++ optimizers expose no state), and learning-rate schedules.

pub mod schedule;

use serde::{Deserialize, Serialize};
use tch::{TchError, Tensor};

use crate::model::ParamStore;
use crate::time::{RunLength, Timestamp};
use schedule::Schedule;

extern "C" {
    /// `host/csrc/grad.cpp`: resets an `at::Tensor`'s gradient to undefined.
    fn tessera_reset_grad(tensor: *mut std::ffi::c_void) -> i32;
}

/// An optimizer state that does not fit the model or this optimizer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OptimizerStateError(String);

/// The optimizer's position: what, besides its state tensors, it needs to continue exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Position {
    /// `sgd` or `adamw`.
    pub algorithm: String,
    /// Learning rate of the next step.
    pub lr: f64,
    /// Learning rate at construction.
    pub initial_lr: f64,
    /// Steps taken.
    pub steps: u64,
    /// Names of the parameters it trains, in order.
    pub members: Vec<String>,
    /// The schedule's multiplier of `initial_lr` (absent in checkpoints of Tessera before 0.1:
    /// then `lr / initial_lr`).
    #[serde(default)]
    pub lr_multiplier: Option<f64>,
    /// Methods' pending scaling of the next step's rate (see [`Optimizer::scale_lr`]).
    #[serde(default)]
    pub lr_scale: Option<f64>,
}

/// The optimizer's whole state: its position and its state tensors, named
/// `<param>.<buffer>` (`fc.weight.momentum_buffer`, `fc.weight.exp_avg`, ...).
pub struct Snapshot {
    /// The position.
    pub position: Position,
    /// The state tensors.
    pub tensors: Vec<(String, Tensor)>,
}

/// SGD hyperparameters, with PyTorch's semantics (`[optimizer] name = "sgd"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sgd {
    /// Learning rate, > 0 (default 0.1); schedules multiply it.
    pub lr: f64,
    /// Momentum factor, in [0, 1); 0 disables momentum (default 0.9).
    pub momentum: f64,
    /// Nesterov momentum (default false); needs momentum > 0 and dampening 0.
    pub nesterov: bool,
    /// Dampening of the momentum, in [0, 1] (default 0).
    pub dampening: f64,
    /// Weight decay, >= 0 (default 0).
    pub weight_decay: f64,
    /// Decay weights directly instead of through the gradient; scaled by `lr / initial_lr` as
    /// in Composer's `DecoupledSGDW` (default false).
    pub decoupled_weight_decay: bool,
}

impl Default for Sgd {
    fn default() -> Self {
        Sgd {
            lr: 0.1,
            momentum: 0.9,
            nesterov: false,
            dampening: 0.0,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
        }
    }
}

/// AdamW hyperparameters, with PyTorch's `torch.optim.AdamW` semantics
/// (`[optimizer] name = "adamw"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdamW {
    /// Learning rate, > 0 (default 0.001); schedules multiply it.
    pub lr: f64,
    /// Exponential decay rates of the first and second moments, each in [0, 1)
    /// (default `[0.9, 0.999]`).
    pub betas: (f64, f64),
    /// Added to the denominator, > 0 (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay: `p ← p·(1 − lr·wd)`, >= 0 (default 0.01).
    pub weight_decay: f64,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// The update rule an [`Optimizer`] runs, with its hyperparameters (`[optimizer]`, tagged by
/// `name`; default SGD).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "name")]
pub enum Rule {
    /// Stochastic gradient descent.
    #[serde(rename = "sgd")]
    Sgd(Sgd),
    /// Adam with decoupled weight decay.
    #[serde(rename = "adamw")]
    AdamW(AdamW),
}

impl Default for Rule {
    fn default() -> Self {
        Rule::Sgd(Sgd::default())
    }
}

impl Rule {
    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            Rule::Sgd(h) => h.lr,
            Rule::AdamW(h) => h.lr,
        }
    }
}

struct Slot {
    name: String,
    param: Tensor,
    /// SGD: momentum buffer. AdamW: first and second moments.
    state: Vec<Tensor>,
}

/// An optimizer over the trainable parameters of a [`ParamStore`]. It owns the learning rate:
/// the rate of a step is `initial_lr × schedule multiplier × scale`, where the schedule sets the
/// multiplier ([`Optimizer::schedule_step`]) and methods the scale ([`Optimizer::scale_lr`]).
pub struct Optimizer {
    algorithm: Rule,
    schedule: Schedule,
    scale_schedule_ratio: f64,
    initial_lr: f64,
    lr_multiplier: f64,
    lr_scale: f64,
    steps: u64,
    slots: Vec<Slot>,
}

impl Optimizer {
    /// An optimizer over every parameter of `params` that requires a gradient, starting at the
    /// algorithm's learning rate and following `schedule` (stretched by `scale_schedule_ratio`).
    pub fn new(
        algorithm: Rule,
        schedule: Schedule,
        scale_schedule_ratio: f64,
        params: &ParamStore,
    ) -> Self {
        let lr = algorithm.lr();
        let slots = params
            .trainable()
            .map(|e| Slot {
                name: e.name.clone(),
                param: e.tensor.shallow_clone(),
                state: Vec::new(),
            })
            .collect();
        Optimizer {
            algorithm,
            schedule,
            scale_schedule_ratio,
            initial_lr: lr,
            lr_multiplier: 1.0,
            lr_scale: 1.0,
            steps: 0,
            slots,
        }
    }

    /// The learning rate the next step uses.
    pub fn lr(&self) -> f64 {
        self.initial_lr * self.lr_multiplier * self.lr_scale
    }

    /// Sets the schedule's multiplier for the clock at `t` of `run` (the trainer calls it before
    /// the clock advances, as Composer steps its schedulers).
    pub fn schedule_step(&mut self, t: &Timestamp, run: &RunLength) {
        self.lr_multiplier = self.schedule.multiplier(t, run, self.scale_schedule_ratio);
    }

    /// Scales the rate of the next step by `factor` (a method's request: SWA, SAM, ...). The
    /// scale lasts until that step is taken, whatever the schedule does meanwhile, and
    /// compounds when several methods ask.
    pub fn scale_lr(&mut self, factor: f64) {
        self.lr_scale *= factor;
    }

    /// The learning rate given at construction (schedules multiply it).
    pub fn initial_lr(&self) -> f64 {
        self.initial_lr
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The parameters this optimizer trains, in order.
    pub fn params(&self) -> impl Iterator<Item = &Tensor> {
        self.slots.iter().map(|s| &s.param)
    }

    /// Names of the parameters this optimizer trains, in order.
    pub fn param_names(&self) -> impl Iterator<Item = &str> {
        self.slots.iter().map(|s| s.name.as_str())
    }

    /// Adds (`member`) or removes a parameter; a removed parameter loses its optimizer state,
    /// as in Composer's layer freezing.
    pub fn set_member(&mut self, name: &str, param: &Tensor, member: bool) {
        let position = self.slots.iter().position(|s| s.name == name);
        match (position, member) {
            (None, true) => self.slots.push(Slot {
                name: name.to_owned(),
                param: param.shallow_clone(),
                state: Vec::new(),
            }),
            (Some(i), false) => {
                self.slots.remove(i);
            }
            _ => {}
        }
    }

    /// Clears every gradient to undefined, as PyTorch's `zero_grad()` (`set_to_none=True`): the
    /// next backward writes fresh gradients, and a parameter that gets none in a step (a
    /// stochastic-depth block that was dropped) is skipped by [`Optimizer::step`] instead of
    /// being stepped with zeros — and a resumed run, whose gradients start undefined, steps
    /// exactly as the run that never stopped.
    pub fn zero_grad(&mut self) {
        for slot in &mut self.slots {
            if slot.param.grad().defined() {
                // SAFETY: `as_mut_ptr` is the `at::Tensor*` of a live tensor; the shim only
                // resets its gradient slot.
                let failed = unsafe { tessera_reset_grad(slot.param.as_mut_ptr().cast()) } != 0;
                if failed {
                    // Not expected; zeroing keeps the step correct for this parameter.
                    let _ = slot.param.grad().f_zero_();
                }
            }
        }
    }

    /// The names of the state buffers kept per parameter.
    fn buffer_names(&self) -> &'static [&'static str] {
        match self.algorithm {
            Rule::Sgd(_) => &["momentum_buffer"],
            Rule::AdamW(_) => &["exp_avg", "exp_avg_sq"],
        }
    }

    /// The algorithm's name as written in checkpoints (`sgd`, `adamw`).
    pub fn algorithm_name(&self) -> &'static str {
        match self.algorithm {
            Rule::Sgd(_) => "sgd",
            Rule::AdamW(_) => "adamw",
        }
    }

    /// The whole state (shallow copies of the state tensors), for checkpoints.
    pub fn snapshot(&self) -> Snapshot {
        let names = self.buffer_names();
        let tensors = self
            .slots
            .iter()
            .flat_map(|s| {
                s.state
                    .iter()
                    .zip(names)
                    .map(move |(t, n)| (format!("{}.{n}", s.name), t.shallow_clone()))
            })
            .collect();
        Snapshot {
            position: Position {
                algorithm: self.algorithm_name().to_owned(),
                lr: self.lr(),
                initial_lr: self.initial_lr,
                steps: self.steps,
                members: self.slots.iter().map(|s| s.name.clone()).collect(),
                lr_multiplier: Some(self.lr_multiplier),
                lr_scale: Some(self.lr_scale),
            },
            tensors,
        }
    }

    /// Restores a [`Snapshot`]: step count, learning rate, parameter membership (`members`,
    /// looked up in `params`) and the state tensors (copied, on the parameters' device). Fails
    /// naming what does not fit.
    pub fn restore(
        &mut self,
        snapshot: &Snapshot,
        params: &ParamStore,
    ) -> Result<(), OptimizerStateError> {
        let fail = |m: String| Err(OptimizerStateError(m));
        let Snapshot { position, tensors } = snapshot;
        let algorithm = position.algorithm.as_str();
        let members = &position.members;
        if algorithm != self.algorithm_name() {
            return fail(format!(
                "the checkpoint's optimizer is {algorithm}, this run's is {}",
                self.algorithm_name()
            ));
        }
        let names = self.buffer_names();
        let mut slots = Vec::with_capacity(members.len());
        for name in members {
            let Some(entry) = params.get(name) else {
                return fail(format!(
                    "the optimizer trains `{name}`, which this model lacks"
                ));
            };
            let mut buffers = Vec::new();
            for b in names {
                let key = format!("{name}.{b}");
                match tensors.iter().find(|(k, _)| *k == key) {
                    Some((_, t)) => {
                        if t.size() != entry.tensor.size() {
                            return fail(format!(
                                "optimizer state `{key}` has shape {:?}, the parameter {:?}",
                                t.size(),
                                entry.tensor.size()
                            ));
                        }
                        let copy = t
                            .f_to_device(entry.tensor.device())
                            .and_then(|t| t.f_to_kind(entry.tensor.kind()))
                            .and_then(|t| t.f_detach_copy())
                            .map_err(|e| {
                                OptimizerStateError(format!("optimizer state `{key}`: {e}"))
                            })?;
                        buffers.push(copy);
                    }
                    None => break,
                }
            }
            if !buffers.is_empty() && buffers.len() != names.len() {
                return fail(format!("optimizer state of `{name}` is incomplete"));
            }
            let _ = entry.tensor.shallow_clone().set_requires_grad(true);
            slots.push(Slot {
                name: name.clone(),
                param: entry.tensor.shallow_clone(),
                state: buffers,
            });
        }
        for entry in params.entries() {
            if entry.role == crate::model::Role::Parameter && !members.contains(&entry.name) {
                let _ = entry.tensor.shallow_clone().set_requires_grad(false);
            }
        }
        self.slots = slots;
        self.steps = position.steps;
        self.initial_lr = position.initial_lr;
        self.lr_scale = position.lr_scale.unwrap_or(1.0);
        self.lr_multiplier = match position.lr_multiplier {
            Some(m) => m,
            None if position.initial_lr != 0.0 => position.lr / position.initial_lr,
            None => 1.0,
        };
        Ok(())
    }

    /// Skips the update of this step (`amp_fp16` found non-finite gradients): the gradients
    /// are cleared and a method's rate scaling, meant for this step, is dropped, as if the
    /// step had been taken; the step count (AdamW's bias correction) does not advance, as in
    /// PyTorch, where a skipped `optimizer.step()` never runs.
    pub fn skip_step(&mut self) {
        self.zero_grad();
        self.lr_scale = 1.0;
    }

    /// Applies one update with the current learning rate.
    pub fn step(&mut self) -> Result<(), TchError> {
        let _guard = tch::no_grad_guard();
        self.steps += 1;
        let lr = self.lr();
        // A method's scaling was meant for this step only.
        self.lr_scale = 1.0;
        match &self.algorithm {
            Rule::Sgd(h) => {
                for slot in &mut self.slots {
                    sgd_update(slot, h, lr, self.initial_lr)?;
                }
            }
            Rule::AdamW(h) => {
                for slot in &mut self.slots {
                    adamw_update(slot, h, lr, self.steps)?;
                }
            }
        }
        Ok(())
    }
}

fn sgd_update(slot: &mut Slot, h: &Sgd, lr: f64, initial_lr: f64) -> Result<(), TchError> {
    let grad = slot.param.grad();
    if !grad.defined() {
        return Ok(());
    }
    let mut d_p = if h.weight_decay != 0.0 && !h.decoupled_weight_decay {
        grad.f_add(&slot.param.f_mul_scalar(h.weight_decay)?)?
    } else {
        grad
    };
    if h.momentum != 0.0 {
        match slot.state.first_mut() {
            None => slot.state.push(d_p.f_detach_copy()?),
            Some(buf) => {
                let _ = buf.f_mul_scalar_(h.momentum)?;
                let _ = buf.f_add_(&d_p.f_mul_scalar(1.0 - h.dampening)?)?;
            }
        }
        let buf = &slot.state[0];
        d_p = if h.nesterov {
            d_p.f_add(&buf.f_mul_scalar(h.momentum)?)?
        } else {
            buf.shallow_clone()
        };
    }
    if h.decoupled_weight_decay && h.weight_decay != 0.0 {
        let _ = slot
            .param
            .f_mul_scalar_(1.0 - (lr / initial_lr) * h.weight_decay)?;
    }
    let _ = slot.param.f_sub_(&d_p.f_mul_scalar(lr)?)?;
    Ok(())
}

fn adamw_update(slot: &mut Slot, h: &AdamW, lr: f64, step: u64) -> Result<(), TchError> {
    let grad = slot.param.grad();
    if !grad.defined() {
        return Ok(());
    }
    if slot.state.is_empty() {
        slot.state.push(slot.param.f_zeros_like()?);
        slot.state.push(slot.param.f_zeros_like()?);
    }
    let (b1, b2) = h.betas;
    if h.weight_decay != 0.0 {
        let _ = slot.param.f_mul_scalar_(1.0 - lr * h.weight_decay)?;
    }
    let (m, v) = slot.state.split_at_mut(1);
    let (m, v) = (&mut m[0], &mut v[0]);
    let _ = m.f_lerp_(&grad, 1.0 - b1)?;
    let _ = v.f_mul_scalar_(b2)?;
    let _ = v.f_addcmul_(&grad, &grad.f_mul_scalar(1.0 - b2)?)?;
    let bias1 = 1.0 - b1.powi(step as i32);
    let bias2 = 1.0 - b2.powi(step as i32);
    let denom = v
        .f_sqrt()?
        .f_div_scalar(bias2.sqrt())?
        .f_add_scalar(h.eps)?;
    let _ = slot
        .param
        .f_addcdiv_(&m.f_mul_scalar(-lr / bias1)?, &denom)?;
    Ok(())
}

#[cfg(test)]
mod pytorch_steps;

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{nn::Init, Device, Kind};

    fn store_with(values: &[f32]) -> (ParamStore, Tensor) {
        let mut store = ParamStore::new(Device::Cpu);
        let mut p = store
            .parameter("w".into(), &[values.len() as i64], Init::Const(0.0))
            .unwrap();
        tch::no_grad(|| p.copy_(&Tensor::from_slice(values)));
        (store, p)
    }

    fn set_grad(p: &Tensor, g: &[f32]) {
        let loss = (p * Tensor::from_slice(g)).sum(Kind::Float);
        loss.backward();
    }

    fn values(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.detach().flatten(0, -1)).unwrap()
    }

    #[test]
    fn sgd_momentum_nesterov_matches_pytorch_formula() {
        let (store, p) = store_with(&[1.0, -2.0]);
        let h = Sgd {
            lr: 0.5,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: true,
            weight_decay: 0.1,
            decoupled_weight_decay: false,
        };
        let mut opt = Optimizer::new(Rule::Sgd(h), Schedule::default(), 1.0, &store);
        // step 1: d = g + wd p = [0.5+0.1, 1-0.2] = [0.6, 0.8]; buf = d; nesterov d + 0.9 buf
        set_grad(&p, &[0.5, 1.0]);
        opt.step().unwrap();
        let expect1 = [1.0 - 0.5 * (0.6 + 0.54), -2.0 - 0.5 * (0.8 + 0.72)];
        let got = values(&p);
        for (g, e) in got.iter().zip(expect1) {
            assert!((g - e as f32).abs() < 1e-6, "{got:?} vs {expect1:?}");
        }
        // step 2 with the same raw gradient.
        opt.zero_grad();
        set_grad(&p, &[0.5, 1.0]);
        opt.step().unwrap();
        let mut expect2 = [0.0f64; 2];
        for i in 0..2 {
            let w = expect1[i];
            let d = [0.5, 1.0][i] + 0.1 * w;
            let buf = 0.9 * [0.6, 0.8][i] + d;
            expect2[i] = w - 0.5 * (d + 0.9 * buf);
        }
        let got = values(&p);
        for (g, e) in got.iter().zip(expect2) {
            assert!((g - e as f32).abs() < 1e-5, "{got:?} vs {expect2:?}");
        }
        assert_eq!(opt.snapshot().tensors[0].0, "w.momentum_buffer");
    }

    #[test]
    fn adamw_first_step_moves_by_lr() {
        let (store, p) = store_with(&[1.0, 1.0]);
        let h = AdamW {
            lr: 0.01,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
        };
        let mut opt = Optimizer::new(Rule::AdamW(h), Schedule::default(), 1.0, &store);
        set_grad(&p, &[3.0, -0.5]);
        opt.step().unwrap();
        // The first bias-corrected Adam step is lr·sign(g).
        let got = values(&p);
        assert!(
            (got[0] - 0.99).abs() < 1e-6 && (got[1] - 1.01).abs() < 1e-6,
            "{got:?}"
        );
        assert_eq!(opt.snapshot().tensors.len(), 2);
    }

    #[test]
    fn a_scaled_rate_is_used_by_the_next_step_only_and_survives_restore() {
        let (store, p) = store_with(&[1.0]);
        let h = Sgd {
            lr: 0.5,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
        };
        let mut opt = Optimizer::new(Rule::Sgd(h.clone()), Schedule::default(), 1.0, &store);
        opt.scale_lr(0.5);
        opt.scale_lr(0.5);
        assert_eq!(opt.lr(), 0.125, "scales compound");
        // A checkpoint taken now carries the pending scale.
        let snapshot = opt.snapshot();
        let mut restored = Optimizer::new(Rule::Sgd(h), Schedule::default(), 1.0, &store);
        restored.restore(&snapshot, &store).unwrap();
        assert_eq!(restored.lr(), 0.125);
        set_grad(&p, &[1.0]);
        opt.step().unwrap();
        assert!((values(&p)[0] - 0.875).abs() < 1e-7, "the step used 0.125");
        assert_eq!(opt.lr(), 0.5, "the scale was for that step only");
    }
}
