//! Optimizers (SGD, AdamW, Adam, Lion) with parameter groups, whose state is visible to
//! checkpoints (tch's C++ optimizers expose none), and learning-rate schedules.
//!
//! Two implementations of the same update rules ([`Implementation`]): the default runs each
//! parameter group through libtorch's fused multi-tensor kernels (`_fused_sgd_`, `_fused_adam_`,
//! `_fused_adamw_`; Lion on `_foreach_*` operators): a handful of libtorch calls per group and
//! step, whatever the number of parameters, on CPU and CUDA. `per_param` steps one parameter at
//! a time with plain tensor operations: the reference the fused path is tested against.

mod capture;
mod fused;
mod fused_step;
pub mod groups;
mod per_param;
mod plateau;
mod rules;
pub mod schedule;
mod shards;
mod state;

pub use fused::{OpCount, OpCounter};
pub use groups::{GroupSpec, Groups, GroupsError, ParamKind};
pub use rules::{Adam, AdamW, Implementation, Lion, OptimizerConfig, Rule, Sgd};
pub use shards::Shards;
pub use state::{GroupPosition, OptimizerStateError, Position, Snapshot};

use tch::{TchError, Tensor};

use crate::model::{LayerInfo, ParamStore};
use crate::time::{RunLength, Timestamp};
use schedule::{PlateauState, Schedule};

extern "C" {
    /// `host/csrc/grad.cpp`: sets an `at::Tensor`'s gradient (shared), or resets it to
    /// undefined when `grad` is null.
    fn tessera_set_grad(tensor: *mut std::ffi::c_void, grad: *mut std::ffi::c_void) -> i32;
}

/// Sets `tensor`'s gradient to `grad` (shared, not copied), or clears it to undefined
/// (PyTorch's `param.grad = None`).
pub fn set_grad(tensor: &Tensor, grad: Option<&Tensor>) -> Result<(), TchError> {
    let g = grad.map_or(std::ptr::null_mut(), |g| {
        g.as_ptr() as *mut std::ffi::c_void
    });
    // SAFETY: both are live `at::Tensor*` of tch tensors for the call; the shim copies the
    // handle of `grad` (a reference count) and never frees either.
    let rc = unsafe { tessera_set_grad(tensor.as_ptr() as *mut std::ffi::c_void, g) };
    if rc == 0 {
        Ok(())
    } else {
        Err(TchError::Torch("setting a gradient failed".into()))
    }
}

struct Slot {
    name: String,
    /// What the step updates: the parameter, or under sharding this rank's piece of it (1-D,
    /// sharing its memory; see [`Shards`]).
    param: Tensor,
    /// Under sharding, the whole parameter (its gradient is what backward fills).
    whole: Option<Tensor>,
    /// SGD: momentum buffer. AdamW, Adam: first and second moments. Lion: momentum.
    state: Vec<Tensor>,
    /// Index into the optimizer's groups (the default group is last).
    group: usize,
    /// Adam, AdamW: the parameter's own step count (a float32 0-dim tensor on its device, as
    /// torch.optim's `state["step"]`): a parameter that skips steps (no gradient) or joins late
    /// (unfrozen, handed back) gets its own bias correction. Made with the moments.
    step: Option<Tensor>,
    /// SGD with momentum and dampening: the buffer was made in a step that may have been
    /// masked (a float32 0-dim flag on the device, 1: masked, so the buffer is still new and
    /// the next step takes the gradient as it is). Resolved without a read on the host.
    pending: Option<Tensor>,
}

impl Slot {
    fn new(name: String, param: Tensor, group: usize) -> Slot {
        Slot {
            name,
            param,
            whole: None,
            state: Vec::new(),
            group,
            step: None,
            pending: None,
        }
    }

    /// Makes Adam's zero moments and step count, or Lion's zero momentum, when missing.
    fn ensure_state(&mut self, buffers: usize, with_step: bool) -> Result<(), TchError> {
        while self.state.len() < buffers {
            self.state.push(self.param.f_zeros_like()?);
        }
        if with_step && self.step.is_none() {
            self.step = Some(Tensor::f_zeros(
                [] as [i64; 0],
                (tch::Kind::Float, self.param.device()),
            )?);
        }
        Ok(())
    }
}

/// A group's resolved hyperparameters.
#[derive(Debug, Clone)]
struct GroupHyper {
    name: String,
    lr_multiplier: f64,
    weight_decay: f64,
}

/// An optimizer over the trainable parameters of a [`ParamStore`]. It owns the learning rate:
/// the rate of a step is `initial_lr × schedule multiplier × scale` (× the group's
/// multiplier), where the schedule sets the multiplier ([`Optimizer::schedule_step`]) and
/// methods the scale ([`Optimizer::scale_lr`]).
pub struct Optimizer {
    algorithm: Rule,
    implementation: Implementation,
    groups: Groups,
    /// The configured groups' hyperparameters, then the default group's.
    hyper: Vec<GroupHyper>,
    schedule: Schedule,
    scale_schedule_ratio: f64,
    initial_lr: f64,
    lr_multiplier: f64,
    lr_scale: f64,
    /// Steps attempted (taken, or masked by a `found_inf` the host has not read).
    steps: u64,
    /// The sum of the `found_inf` flags of masked steps (a device scalar; `None` before the
    /// first masked step): steps taken = `steps` − this.
    skipped: Option<Tensor>,
    slots: Vec<Slot>,
    /// Each group's learning rate as a 0-dim float32 tensor on the parameters' device, read
    /// there by the fused kernels (`train.cuda_graphs`: a captured step replays with the rate of
    /// the moment); `None`: the rate is a host number of each call.
    device_lr: Option<Vec<Tensor>>,
    /// The device rates hold this step's values already ([`Optimizer::stage_lr`]).
    lr_staged: bool,
    /// Parameters a method updates itself (plugin-api 1.6 `claim_parameters`): left out of
    /// the steps and the state, but their gradients are cleared and unscaled with the others.
    external: Vec<(String, Tensor)>,
    /// `[distributed] sharding`: this rank's pieces of the parameters ([`Optimizer::shard`]).
    shards: Option<Box<dyn Shards>>,
    /// A `reduce_on_plateau` schedule's state, which holds the rate (`plateau.rs`).
    plateau: Option<PlateauState>,
}

impl Optimizer {
    /// An optimizer over every parameter of `params` that requires a gradient, starting at the
    /// algorithm's learning rate and following `schedule` (stretched by `scale_schedule_ratio`),
    /// with the parameter groups of `config` resolved against `params` (every parameter,
    /// frozen ones included, so that a parameter unfrozen later joins its group) and the layer
    /// kinds of `layers` (the model's `root.walk()`; may be empty). Fails naming a group that
    /// selects nothing or a parameter two groups select.
    pub fn new(
        config: OptimizerConfig,
        schedule: Schedule,
        scale_schedule_ratio: f64,
        params: &ParamStore,
        layers: &[LayerInfo],
    ) -> Result<Self, GroupsError> {
        let OptimizerConfig {
            rule,
            groups,
            implementation,
        } = config;
        let groups = Groups::new(&groups, params, layers)?;
        let mut hyper: Vec<GroupHyper> = groups
            .specs()
            .iter()
            .map(|g| GroupHyper {
                name: g.name.clone(),
                lr_multiplier: g.lr_multiplier,
                weight_decay: g.weight_decay.unwrap_or(rule.weight_decay()),
            })
            .collect();
        hyper.push(GroupHyper {
            name: "default".to_owned(),
            lr_multiplier: 1.0,
            weight_decay: rule.weight_decay(),
        });
        let mut slots = Vec::new();
        for e in params.trainable() {
            let group = groups
                .assign(&e.name, e.tensor.dim())?
                .unwrap_or(hyper.len() - 1);
            slots.push(Slot::new(e.name.clone(), e.tensor.shallow_clone(), group));
        }
        let lr = rule.lr();
        let plateau =
            matches!(schedule, Schedule::ReduceOnPlateau { .. }).then(|| PlateauState::new(lr));
        Ok(Optimizer {
            algorithm: rule,
            implementation,
            groups,
            hyper,
            schedule,
            scale_schedule_ratio,
            initial_lr: lr,
            lr_multiplier: 1.0,
            lr_scale: 1.0,
            steps: 0,
            skipped: None,
            slots,
            device_lr: None,
            lr_staged: false,
            external: Vec::new(),
            shards: None,
            plateau,
        })
    }

    /// Leaves the parameters `names` to the methods that claimed them: they leave the steps
    /// (and the state, groups and checkpoints of this optimizer) but stay in
    /// [`Optimizer::params`], so their gradients are still cleared, unscaled and averaged.
    /// Call once, right after construction.
    pub fn hand_over(&mut self, names: &[String]) {
        let mut kept = Vec::with_capacity(self.slots.len());
        for slot in self.slots.drain(..) {
            if names.contains(&slot.name) {
                self.external.push((slot.name, slot.param));
            } else {
                kept.push(slot);
            }
        }
        self.slots = kept;
    }

    /// Whether `name` is updated by a method rather than by this optimizer.
    pub fn is_handed_over(&self, name: &str) -> bool {
        self.external.iter().any(|(n, _)| n == name)
    }

    /// The parameter groups as methods see them (plugin-api 1.6): name, learning-rate
    /// multiplier, weight decay and members, the default group last.
    pub fn groups(&self) -> Vec<GroupPosition> {
        self.group_positions()
    }

    /// Sets group `name`'s learning-rate multiplier and weight decay from the next step on (a
    /// method's request). Both must be finite and not negative.
    pub fn set_group(
        &mut self,
        name: &str,
        lr_multiplier: f64,
        weight_decay: f64,
    ) -> Result<(), String> {
        for (what, v) in [
            ("lr_multiplier", lr_multiplier),
            ("weight_decay", weight_decay),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("{what} = {v}: must be finite and not negative"));
            }
        }
        let names: Vec<String> = self.hyper.iter().map(|h| h.name.clone()).collect();
        match self.hyper.iter_mut().find(|h| h.name == name) {
            Some(h) => {
                h.lr_multiplier = lr_multiplier;
                h.weight_decay = weight_decay;
                Ok(())
            }
            None => Err(format!(
                "there is no parameter group `{name}` (the groups are {})",
                names.join(", ")
            )),
        }
    }

    /// The learning rate the next step uses (the default group's).
    pub fn lr(&self) -> f64 {
        match &self.plateau {
            Some(p) => p.lr * self.lr_scale,
            None => self.initial_lr * self.lr_multiplier * self.lr_scale,
        }
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

    /// Steps taken so far. After a [`Optimizer::step_masked`] with a flag, the count lives on
    /// the device and this reads it (a device→host transfer); [`Optimizer::attempted_steps`]
    /// never does.
    pub fn steps(&self) -> u64 {
        let skipped = self
            .skipped
            .as_ref()
            .and_then(|s| s.f_double_value(&[]).ok())
            .map_or(0, |s| s.max(0.0).round() as u64);
        self.steps.saturating_sub(skipped)
    }

    /// Steps attempted so far: taken, or masked by a flag the host has not read (known on the
    /// host, no transfer).
    pub fn attempted_steps(&self) -> u64 {
        self.steps
    }

    /// The parameters this optimizer trains, in order, then those it handed over to methods
    /// ([`Optimizer::hand_over`]): every parameter whose gradient the step uses.
    pub fn params(&self) -> impl Iterator<Item = &Tensor> {
        self.slots
            .iter()
            .map(|s| s.whole.as_ref().unwrap_or(&s.param))
            .chain(self.external.iter().map(|(_, t)| t))
    }

    /// Names of the parameters this optimizer trains, in order.
    pub fn param_names(&self) -> impl Iterator<Item = &str> {
        self.slots.iter().map(|s| s.name.as_str())
    }

    /// The parameter groups and their current members (the default group last, also when it
    /// has no members), as checkpoints record them.
    pub fn group_positions(&self) -> Vec<GroupPosition> {
        self.hyper
            .iter()
            .enumerate()
            .map(|(i, h)| GroupPosition {
                name: h.name.clone(),
                lr_multiplier: h.lr_multiplier,
                weight_decay: h.weight_decay,
                members: self
                    .slots
                    .iter()
                    .filter(|s| s.group == i)
                    .map(|s| s.name.clone())
                    .collect(),
            })
            .collect()
    }

    /// Adds (`member`) or removes a parameter; a removed parameter loses its optimizer state,
    /// as in Composer's layer freezing. An added parameter joins the group its name and kind
    /// select (the default group when none, or when two groups would: an error that
    /// construction already reports for the model's parameters).
    pub fn set_member(&mut self, name: &str, param: &Tensor, member: bool) {
        // A parameter a method updates stays with the method; its gradient switches alone.
        if self.is_handed_over(name) {
            return;
        }
        let position = self.slots.iter().position(|s| s.name == name);
        match (position, member) {
            (None, true) => {
                let default = self.hyper.len() - 1;
                let group = self
                    .groups
                    .assign(name, param.dim())
                    .ok()
                    .flatten()
                    .unwrap_or(default);
                let slot = self.slot_for(name.to_owned(), param, group);
                self.slots.push(slot)
            }
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
        let params = self
            .slots
            .iter()
            .flat_map(|s| std::iter::once(&s.param).chain(s.whole.as_ref()))
            .chain(self.external.iter().map(|(_, t)| t));
        for param in params {
            // A failure is not expected; zeroing keeps the step correct for this parameter.
            if param.grad().defined() && set_grad(param, None).is_err() {
                let _ = param.grad().f_zero_();
            }
        }
    }

    /// The algorithm's name as written in checkpoints (`sgd`, `adamw`, `adam`, `lion`).
    pub fn algorithm_name(&self) -> &'static str {
        self.algorithm.name()
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
        self.step_masked(None)
    }

    /// Applies one update unless `found_inf` (a 0-dim float32 tensor on the parameters' device
    /// holding 0 or 1) holds 1: then parameters, state and the step counts stay as they were,
    /// as with torch.optim's fused optimizers under a `GradScaler`. The host never reads the
    /// flag: the fused kernels read it on the device, Lion and the `per_param` implementation
    /// mask their arithmetic with it there, and the step count is kept on the device until
    /// [`Optimizer::steps`] is asked. The pending [`Optimizer::scale_lr`] is used up either way,
    /// as by [`Optimizer::skip_step`]. Parameters without a gradient are left alone (Adam's
    /// step count of such a parameter does not advance, as in torch.optim).
    pub fn step_masked(&mut self, found_inf: Option<&Tensor>) -> Result<(), TchError> {
        let _guard = tch::no_grad_guard();
        let lr = self.lr();
        if self.device_lr.is_some() && !self.lr_staged {
            self.stage_lr()?;
        }
        self.lr_staged = false;
        // A method's scaling was meant for this step only.
        self.lr_scale = 1.0;
        let previous = self.steps;
        self.steps += 1;
        let result = match self.implementation {
            Implementation::PerParam => self.per_param_step(lr, found_inf),
            Implementation::Fused => self.fused_step(lr, found_inf),
        };
        if let Err(e) = result {
            self.steps = previous;
            return Err(e);
        }
        if let Some(flag) = found_inf {
            self.count_masked(flag)?;
        }
        Ok(())
    }

    /// Counts a masked step in `skipped` (on the device).
    fn count_masked(&mut self, found_inf: &Tensor) -> Result<(), TchError> {
        match &mut self.skipped {
            Some(s) => {
                let _ = s.f_add_(found_inf)?;
            }
            // A copy: the caller's flag must not be added to.
            None => self.skipped = Some(found_inf.f_to_dtype(tch::Kind::Double, false, true)?),
        }
        Ok(())
    }
}

#[cfg(test)]
mod pytorch_steps;
#[cfg(test)]
mod step_tests;

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
        let mut opt =
            Optimizer::new(Rule::Sgd(h).into(), Schedule::default(), 1.0, &store, &[]).unwrap();
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
        let mut opt =
            Optimizer::new(Rule::AdamW(h).into(), Schedule::default(), 1.0, &store, &[]).unwrap();
        set_grad(&p, &[3.0, -0.5]);
        opt.step().unwrap();
        // The first bias-corrected Adam step is lr·sign(g).
        let got = values(&p);
        assert!(
            (got[0] - 0.99).abs() < 1e-6 && (got[1] - 1.01).abs() < 1e-6,
            "{got:?}"
        );
        // The two moments and the parameter's own step count.
        assert_eq!(opt.snapshot().tensors.len(), 3);
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
        let mut opt = Optimizer::new(
            Rule::Sgd(h.clone()).into(),
            Schedule::default(),
            1.0,
            &store,
            &[],
        )
        .unwrap();
        opt.scale_lr(0.5);
        opt.scale_lr(0.5);
        assert_eq!(opt.lr(), 0.125, "scales compound");
        // A checkpoint taken now carries the pending scale.
        let snapshot = opt.snapshot();
        let mut restored =
            Optimizer::new(Rule::Sgd(h).into(), Schedule::default(), 1.0, &store, &[]).unwrap();
        restored.restore(&snapshot, &store).unwrap();
        assert_eq!(restored.lr(), 0.125);
        set_grad(&p, &[1.0]);
        opt.step().unwrap();
        assert!((values(&p)[0] - 0.875).abs() < 1e-7, "the step used 0.125");
        assert_eq!(opt.lr(), 0.5, "the scale was for that step only");
    }
}
