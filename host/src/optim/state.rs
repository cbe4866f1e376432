//! The optimizer's state as checkpoints see it: its [`Position`], the state tensors of a
//! [`Snapshot`], and restoring one into a run (checked against its groups and parameters).

use serde::{Deserialize, Serialize};
use tch::{TchError, Tensor};

use super::schedule::PlateauState;
use super::{GroupsError, Optimizer, Slot};
use crate::model::ParamStore;

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
    /// A `reduce_on_plateau` schedule's state (its rate and counters); absent for the other
    /// schedules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plateau: Option<PlateauState>,
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

impl Optimizer {
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
                plateau: self.plateau.clone(),
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
        // A plateau schedule continues where it stood; from a checkpoint of another schedule
        // it starts afresh at the configured rate.
        if self.plateau.is_some() {
            self.plateau = Some(
                position
                    .plateau
                    .clone()
                    .unwrap_or_else(|| PlateauState::new(position.initial_lr)),
            );
        }
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
