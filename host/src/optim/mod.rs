//! Optimizers (SGD, AdamW, Adam, Lion) with parameter groups, whose state is visible to
//! checkpoints (tch's C++ optimizers expose none), and learning-rate schedules.
//!
//! Two implementations of the same update rules ([`Implementation`]): the default runs each
//! parameter group through libtorch's fused multi-tensor kernels (`_fused_sgd_`, `_fused_adam_`,
//! `_fused_adamw_`; Lion on `_foreach_*` operators): a handful of libtorch calls per group and
//! step, whatever the number of parameters, on CPU and CUDA. `per_param` steps one parameter at
//! a time with plain tensor operations: the reference the fused path is tested against.

mod fused;
pub mod groups;
pub mod schedule;
mod shards;

pub use fused::{OpCount, OpCounter};
pub use groups::{GroupSpec, Groups, GroupsError, ParamKind};
pub use shards::Shards;

use serde::{Deserialize, Serialize};
use tch::{TchError, Tensor};

use crate::model::{LayerInfo, ParamStore};
use crate::time::{RunLength, Timestamp};
use schedule::Schedule;

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

/// An optimizer state that does not fit the model or this optimizer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OptimizerStateError(String);

impl From<GroupsError> for OptimizerStateError {
    fn from(e: GroupsError) -> Self {
        OptimizerStateError(e.0)
    }
}

/// The optimizer's position: what, besides its state tensors, it needs to continue exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Position {
    /// `sgd`, `adamw`, `adam` or `lion`.
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
    /// The parameter groups and their members (empty in checkpoints without groups: of
    /// Tessera before groups, or of a run that configured none).
    #[serde(default)]
    pub groups: Vec<GroupPosition>,
}

/// One parameter group as a checkpoint records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupPosition {
    /// The group's name (`[[optimizer.groups]] name`).
    pub name: String,
    /// Its learning-rate multiplier.
    pub lr_multiplier: f64,
    /// Its weight decay.
    pub weight_decay: f64,
    /// The parameters it trained, in the optimizer's order.
    pub members: Vec<String>,
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

/// Adam hyperparameters, with PyTorch's `torch.optim.Adam` semantics: weight decay is L2
/// regularization added to the gradient (`[optimizer] name = "adam"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Adam {
    /// Learning rate, > 0 (default 0.001); schedules multiply it.
    pub lr: f64,
    /// Exponential decay rates of the first and second moments, each in [0, 1)
    /// (default `[0.9, 0.999]`).
    pub betas: (f64, f64),
    /// Added to the denominator, > 0 (default 1e-8).
    pub eps: f64,
    /// L2 penalty: `g ← g + wd·p`, >= 0 (default 0).
    pub weight_decay: f64,
}

impl Default for Adam {
    fn default() -> Self {
        Adam {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// Lion hyperparameters (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", as
/// lucidrains' lion-pytorch; `[optimizer] name = "lion"`): `c = sign(β1·m + (1−β1)·g)`,
/// `p ← p·(1 − lr·wd) − lr·c`, `m ← β2·m + (1−β2)·g`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lion {
    /// Learning rate, > 0 (default 1e-4: Lion's updates have unit size, so its rate is 3–10×
    /// smaller than AdamW's); schedules multiply it.
    pub lr: f64,
    /// Interpolation of the update and decay rate of the momentum, each in [0, 1)
    /// (default `[0.9, 0.99]`).
    pub betas: (f64, f64),
    /// Decoupled weight decay: `p ← p·(1 − lr·wd)`, >= 0 (default 0).
    pub weight_decay: f64,
}

impl Default for Lion {
    fn default() -> Self {
        Lion {
            lr: 1e-4,
            betas: (0.9, 0.99),
            weight_decay: 0.0,
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
    /// Adam with L2 weight decay.
    #[serde(rename = "adam")]
    Adam(Adam),
    /// Lion (sign of an interpolated momentum).
    #[serde(rename = "lion")]
    Lion(Lion),
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
            Rule::Adam(h) => h.lr,
            Rule::Lion(h) => h.lr,
        }
    }

    /// The base weight decay (the default group's).
    pub fn weight_decay(&self) -> f64 {
        match self {
            Rule::Sgd(h) => h.weight_decay,
            Rule::AdamW(h) => h.weight_decay,
            Rule::Adam(h) => h.weight_decay,
            Rule::Lion(h) => h.weight_decay,
        }
    }

    /// The name as written in `[optimizer] name` and in checkpoints.
    pub fn name(&self) -> &'static str {
        match self {
            Rule::Sgd(_) => "sgd",
            Rule::AdamW(_) => "adamw",
            Rule::Adam(_) => "adam",
            Rule::Lion(_) => "lion",
        }
    }

    /// Whether the rule keeps a step count per parameter (Adam's bias correction).
    fn counts_steps(&self) -> bool {
        matches!(self, Rule::Adam(_) | Rule::AdamW(_))
    }

    /// The names of the state buffers kept per parameter.
    fn buffer_names(&self) -> &'static [&'static str] {
        match self {
            Rule::Sgd(_) => &["momentum_buffer"],
            Rule::AdamW(_) | Rule::Adam(_) => &["exp_avg", "exp_avg_sq"],
            Rule::Lion(_) => &["exp_avg"],
        }
    }
}

/// How the update is computed (`[optimizer] implementation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Implementation {
    /// Multi-tensor kernels, one call per group and operation (default): libtorch's fused
    /// SGD, Adam and AdamW; Lion on `_foreach_*` operators.
    #[default]
    Fused,
    /// One parameter at a time with plain tensor operations (the reference).
    PerParam,
}

impl Implementation {
    /// The names written in `implementation = ...`, with their values.
    pub const CHOICES: [(&'static str, Implementation); 2] = [
        ("fused", Implementation::Fused),
        ("per_param", Implementation::PerParam),
    ];
}

/// `[optimizer]`: the update rule, its parameter groups and implementation.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OptimizerConfig {
    /// The update rule and its base hyperparameters (`name`, `lr`, ...).
    #[serde(flatten)]
    pub rule: Rule,
    /// How the update is computed.
    pub implementation: Implementation,
    /// `[[optimizer.groups]]`, in file order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupSpec>,
}

impl OptimizerConfig {
    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        self.rule.lr()
    }
}

impl From<Rule> for OptimizerConfig {
    fn from(rule: Rule) -> Self {
        OptimizerConfig {
            rule,
            ..OptimizerConfig::default()
        }
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

    /// The whole state (shallow copies of the state tensors, and Adam's per-parameter step
    /// counts as `<param>.step`), for checkpoints. Reads the step count from the device after
    /// masked steps (see [`Optimizer::steps`]), and whether an SGD buffer made in a masked step
    /// is still new (then it is left out: the resumed run makes it).
    pub fn snapshot(&self) -> Snapshot {
        let names = self.algorithm.buffer_names();
        let mut tensors = Vec::new();
        for s in &self.slots {
            let still_new = s
                .pending
                .as_ref()
                .is_some_and(|p| p.f_double_value(&[]).is_ok_and(|v| v != 0.0));
            if still_new {
                continue;
            }
            for (t, n) in s.state.iter().zip(names) {
                tensors.push((format!("{}.{n}", s.name), t.shallow_clone()));
            }
            if let Some(step) = &s.step {
                tensors.push((format!("{}.{STEP}", s.name), step.shallow_clone()));
            }
        }
        let groups = if self.groups.specs().is_empty() {
            Vec::new()
        } else {
            self.group_positions()
        };
        Snapshot {
            position: Position {
                algorithm: self.algorithm_name().to_owned(),
                lr: self.lr(),
                initial_lr: self.initial_lr,
                steps: self.steps(),
                members: self.slots.iter().map(|s| s.name.clone()).collect(),
                lr_multiplier: Some(self.lr_multiplier),
                lr_scale: Some(self.lr_scale),
                groups,
            },
            tensors,
        }
    }

    /// Restores a [`Snapshot`]: step count, learning rate, parameter membership (`members`,
    /// looked up in `params`) and the state tensors (copied, on the parameters' device). The
    /// checkpoint's groups, when it records any, must hold the same parameters as this run's
    /// (hyperparameters come from this run's configuration). Fails naming what does not fit.
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
        let names = self.algorithm.buffer_names();
        let default = self.hyper.len() - 1;
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
                        // In the parameter's layout (channels-last weights stay so): the
                        // fused kernels walk parameter, gradient and state as flat memory.
                        let copy = entry
                            .tensor
                            .f_empty_like()
                            .and_then(|mut c| c.f_copy_(t).map(|_| c))
                            .and_then(|c| c.f_detach())
                            .map_err(|e| {
                                OptimizerStateError(format!("optimizer state `{key}`: {e}"))
                            })?;
                        buffers.push(self.cut(name, copy).map_err(|e| {
                            OptimizerStateError(format!("optimizer state `{key}`: {e}"))
                        })?);
                    }
                    None => break,
                }
            }
            if !buffers.is_empty() && buffers.len() != names.len() {
                return fail(format!("optimizer state of `{name}` is incomplete"));
            }
            let group = self
                .groups
                .assign(name, entry.tensor.dim())
                .map_err(|e| OptimizerStateError(e.0))?
                .unwrap_or(default);
            let mut slot = self.slot_for(name.clone(), &entry.tensor, group);
            slot.state = buffers;
            if self.algorithm.counts_steps() && !slot.state.is_empty() {
                slot.step = Some(restored_step(name, tensors, position.steps, &entry.tensor)?);
            }
            slots.push(slot);
        }
        self.check_groups(&position.groups, &slots)?;
        for slot in &slots {
            let param = slot.whole.as_ref().unwrap_or(&slot.param);
            let _ = param.shallow_clone().set_requires_grad(true);
        }
        for entry in params.entries() {
            if entry.role == crate::model::Role::Parameter
                && !members.contains(&entry.name)
                && !self.is_handed_over(&entry.name)
            {
                let _ = entry.tensor.shallow_clone().set_requires_grad(false);
            }
        }
        self.slots = slots;
        self.steps = position.steps;
        self.skipped = None;
        self.initial_lr = position.initial_lr;
        self.lr_scale = position.lr_scale.unwrap_or(1.0);
        self.lr_multiplier = match position.lr_multiplier {
            Some(m) => m,
            None if position.initial_lr != 0.0 => position.lr / position.initial_lr,
            None => 1.0,
        };
        Ok(())
    }

    /// Checks a checkpoint's recorded groups against this run's assignment of `slots`.
    fn check_groups(
        &self,
        recorded: &[GroupPosition],
        slots: &[Slot],
    ) -> Result<(), OptimizerStateError> {
        let configured = self.groups.specs();
        if recorded.is_empty() {
            // A checkpoint without groups: of an older Tessera, or of a run without groups,
            // whose parameters are all in the default group.
            return match slots.iter().find(|s| s.group != self.hyper.len() - 1) {
                Some(s) if !configured.is_empty() => Err(OptimizerStateError(format!(
                    "the checkpoint's optimizer has no parameter groups; this run puts `{}` in group {}",
                    s.name, self.hyper[s.group].name
                ))),
                _ => Ok(()),
            };
        }
        let names: Vec<&str> = recorded.iter().map(|g| g.name.as_str()).collect();
        let ours: Vec<&str> = self.hyper.iter().map(|g| g.name.as_str()).collect();
        if names != ours {
            return Err(OptimizerStateError(format!(
                "the checkpoint's optimizer groups are {names:?}, this run's are {ours:?}"
            )));
        }
        for (i, g) in recorded.iter().enumerate() {
            let mine: Vec<&str> = slots
                .iter()
                .filter(|s| s.group == i)
                .map(|s| s.name.as_str())
                .collect();
            if g.members
                .iter()
                .map(String::as_str)
                .ne(mine.iter().copied())
            {
                return Err(OptimizerStateError(format!(
                    "optimizer group {} holds {:?} in the checkpoint but {:?} in this run",
                    g.name, g.members, mine
                )));
            }
        }
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

    /// Keeps the learning rates on `device` from now on (see [`Optimizer::stage_lr`]): the
    /// fused SGD, Adam and AdamW kernels read them there. The arithmetic is the same (the
    /// kernels round the rate to float32 either way).
    pub fn keep_lr_on_device(&mut self, device: tch::Device) -> Result<(), TchError> {
        let rates = (0..self.hyper.len())
            .map(|_| Tensor::f_zeros([] as [i64; 0], (tch::Kind::Float, device)))
            .collect::<Result<Vec<_>, _>>()?;
        self.device_lr = Some(rates);
        self.lr_staged = false;
        Ok(())
    }

    /// Writes the next step's rates into the device rates (a fill on the device, not a
    /// copy from the host); the next [`Optimizer::step_masked`] uses them as they are. Called
    /// before a captured step is replayed, whose fills would otherwise be the captured ones.
    pub fn stage_lr(&mut self) -> Result<(), TchError> {
        let lr = self.lr();
        if let Some(rates) = &self.device_lr {
            for (rate, h) in rates.iter().zip(&self.hyper) {
                let _ = rate.shallow_clone().f_fill_(lr * h.lr_multiplier)?;
            }
        }
        self.lr_staged = true;
        Ok(())
    }

    /// Makes the optimizer ready for its step to be captured in a CUDA graph and replayed:
    /// every piece of state the step writes exists already (so that the graph updates it in
    /// place), and the rates are on the device. Fails naming what cannot be captured: the
    /// `per_param` implementation, Lion (its masking and rate are host numbers of each call),
    /// Composer's decoupled SGD (its decay factor is), a momentum buffer not made yet.
    pub fn prepare_capture(&mut self) -> Result<(), String> {
        self.capturable()?;
        let device = self.slots.first().map(|s| s.param.device());
        let Some(device) = device else {
            return Err("the optimizer trains no parameter".into());
        };
        let error = |e: TchError| e.to_string();
        if self.device_lr.is_none() {
            self.keep_lr_on_device(device).map_err(error)?;
        }
        if self.skipped.is_none() {
            self.skipped =
                Some(Tensor::f_zeros([] as [i64; 0], (tch::Kind::Double, device)).map_err(error)?);
        }
        let buffers = self.algorithm.buffer_names().len();
        let counts = self.algorithm.counts_steps();
        for slot in &mut self.slots {
            match &self.algorithm {
                Rule::Sgd(s) if s.momentum != 0.0 && slot.state.is_empty() => {
                    return Err(format!(
                        "`{}` has no momentum buffer yet (it had no gradient in the steps \
                         before the capture)",
                        slot.name
                    ))
                }
                Rule::Sgd(_) => {}
                _ => slot.ensure_state(buffers, counts).map_err(error)?,
            }
        }
        Ok(())
    }

    /// Why this optimizer's step cannot be captured in a CUDA graph, naming the setting; `Ok`
    /// when it can (see [`Optimizer::prepare_capture`]).
    pub fn capturable(&self) -> Result<(), String> {
        if self.implementation != Implementation::Fused {
            return Err(
                "optimizer.implementation = \"per_param\" steps one parameter at a \
                        time with host numbers; use \"fused\""
                    .into(),
            );
        }
        match &self.algorithm {
            Rule::Lion(_) => {
                return Err(
                    "optimizer.name = \"lion\" has no fused kernel that reads its rate \
                            on the device; use sgd, adam or adamw"
                        .into(),
                )
            }
            Rule::Sgd(s) if s.decoupled_weight_decay && self.rule_decays() => {
                return Err(
                    "optimizer.decoupled_weight_decay = true scales the decay by a host \
                            number each step; leave it false"
                        .into(),
                )
            }
            _ => {}
        }
        Ok(())
    }

    /// Counts a step that a replayed CUDA graph took (its kernels updated parameters, state and
    /// the device counters; the host's bookkeeping is this).
    pub fn replayed_step(&mut self) {
        self.lr_scale = 1.0;
        self.steps += 1;
        self.lr_staged = false;
    }

    /// Whether any group decays its weights.
    fn rule_decays(&self) -> bool {
        self.hyper.iter().any(|h| h.weight_decay != 0.0)
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

    /// One parameter at a time (the reference). A masked step runs on zero gradients and then
    /// puts back what it changed, selected on the device by the flag.
    fn per_param_step(&mut self, lr: f64, found_inf: Option<&Tensor>) -> Result<(), TchError> {
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

    fn fused_step(&mut self, lr: f64, found_inf: Option<&Tensor>) -> Result<(), TchError> {
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

/// The name of Adam's per-parameter step count in a snapshot (`<param>.step`), as torch.optim's
/// `state["step"]`.
const STEP: &str = "step";

/// A restored parameter's Adam step count: its `<name>.step` in the snapshot, or (a checkpoint
/// of a Tessera that counted the optimizer's steps only) the optimizer's step count.
fn restored_step(
    name: &str,
    tensors: &[(String, Tensor)],
    steps: u64,
    param: &Tensor,
) -> Result<Tensor, OptimizerStateError> {
    let key = format!("{name}.{STEP}");
    let fail = |e: TchError| OptimizerStateError(format!("optimizer state `{key}`: {e}"));
    let options = (tch::Kind::Float, param.device());
    match tensors.iter().find(|(k, _)| *k == key) {
        Some((_, t)) if t.numel() == 1 => t
            .f_to_dtype(tch::Kind::Float, false, true)
            .and_then(|t| t.f_to_device(param.device()))
            .and_then(|t| t.f_reshape([] as [i64; 0]))
            .map_err(fail),
        Some((_, t)) => Err(OptimizerStateError(format!(
            "optimizer state `{key}` has shape {:?}, a step count has one value",
            t.size()
        ))),
        None => Tensor::f_full([] as [i64; 0], steps as f64, options).map_err(fail),
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
