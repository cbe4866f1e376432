//! `train.activation_checkpointing`: which units of the model run without keeping their
//! activations, recomputed in backward ([`layers::Checkpointed`]); docs/memory.md.

use serde::Serialize;

use super::layers::{self, Layer};
use super::params::Role;
use super::tree::{join, SurgeryError};
use super::units::{unit_paths, Unit};
use super::Model;

/// `train.activation_checkpointing = { unit = "block", every = 1 }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ActivationCheckpointing {
    /// The units recomputed (default blocks).
    pub unit: Unit,
    /// Every `every`-th unit is checkpointed, from the first (default 1: all of them).
    pub every: usize,
}

impl Default for ActivationCheckpointing {
    fn default() -> Self {
        ActivationCheckpointing {
            unit: Unit::Block,
            every: 1,
        }
    }
}

impl ActivationCheckpointing {
    /// The paths of `model`'s units to checkpoint: units `0, every, 2 × every, …` of
    /// [`unit_paths`] (read it before a method's surgery: see there). Empty when the model has
    /// no such unit.
    pub fn select(&self, model: &Model) -> Vec<String> {
        unit_paths(model, self.unit)
            .into_iter()
            .step_by(self.every.max(1))
            .collect()
    }
}

impl Model {
    /// Wraps each layer at `paths` in a [`layers::Checkpointed`] layer: in training its forward
    /// keeps no activations and runs again in backward. The tensors keep their names.
    pub fn checkpoint_activations(&mut self, paths: &[String]) -> Result<(), SurgeryError> {
        for path in paths {
            let prefix = join(path, "");
            let buffers = self
                .params
                .entries()
                .iter()
                .filter(|e| e.role == Role::Buffer && e.name.starts_with(&prefix))
                .map(|e| e.tensor.shallow_clone())
                .collect();
            self.wrap_module(path, None, &[], |inner| -> Box<dyn Layer> {
                Box::new(layers::Checkpointed::new(inner, path, buffers))
            })?;
        }
        Ok(())
    }
}
