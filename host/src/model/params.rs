//! The model's parameters and buffers, by PyTorch-style name, in registration order.

use tch::{nn::Init, Device, Kind, TchError, Tensor};

/// Whether a tensor is trained (a parameter) or only carried along (a buffer such as
/// BatchNorm's running mean).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Trained by the optimizer.
    Parameter,
    /// Saved in checkpoints, not trained.
    Buffer,
}

/// Saved weights that do not fit the model: every difference found (names, shapes, kinds).
#[derive(Debug, thiserror::Error)]
#[error("{} difference(s): {}{}", .0.len(), .0.iter().take(4).cloned().collect::<Vec<_>>().join("; "), if .0.len() > 4 { "; ..." } else { "" })]
pub struct WeightsMismatch(pub Vec<String>);

/// Restoring weights failed.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The saved weights do not fit.
    #[error(transparent)]
    Mismatch(#[from] WeightsMismatch),
    /// Copying them failed.
    #[error("copying the weights: {0}")]
    Copy(#[from] TchError),
}

/// One named tensor of the model.
#[derive(Debug)]
pub struct Entry {
    /// Full dotted name, as in a PyTorch `state_dict` (`layer1.0.conv1.weight`).
    pub name: String,
    /// The tensor (shared with the module that uses it).
    pub tensor: Tensor,
    /// Parameter or buffer.
    pub role: Role,
}

/// All named tensors of a model. The order is the registration order, so it is stable across
/// runs (unlike a hash map), which keeps optimizer state and checkpoints deterministic.
#[derive(Debug)]
pub struct ParamStore {
    device: Device,
    entries: Vec<Entry>,
}

impl ParamStore {
    /// An empty store whose tensors live on `device`.
    pub fn new(device: Device) -> Self {
        ParamStore {
            device,
            entries: Vec::new(),
        }
    }

    /// The device the tensors live on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Creates a trainable float parameter named `name`.
    pub fn parameter(
        &mut self,
        name: String,
        dims: &[i64],
        init: Init,
    ) -> Result<Tensor, TchError> {
        let tensor = match init {
            // As tch's `f_init` (`randn * stdev + mean`, the same draws and the same rounding),
            // but in place: no temporaries of the tensor's size, which for a large embedding
            // would double the memory of building the model.
            Init::Randn { mean, stdev } => {
                let mut t = Tensor::f_randn(dims, (Kind::Float, self.device))?;
                if mean != 0.0 || (stdev - 1.0).abs() > f64::EPSILON {
                    let _ = t.f_mul_scalar_(stdev)?;
                    let _ = t.f_add_scalar_(mean)?;
                }
                t
            }
            init => tch::nn::f_init(init, dims, self.device, Kind::Float)?,
        }
        .set_requires_grad(true);
        self.push(name, &tensor, Role::Parameter);
        Ok(tensor)
    }

    /// Creates a non-trained float buffer named `name` filled with `value`.
    pub fn buffer(&mut self, name: String, dims: &[i64], value: f64) -> Result<Tensor, TchError> {
        let tensor = Tensor::f_full(dims, value, (Kind::Float, self.device))?;
        self.push(name, &tensor, Role::Buffer);
        Ok(tensor)
    }

    /// Creates a non-trained int64 scalar buffer named `name` holding `value` (BatchNorm's
    /// `num_batches_tracked`).
    pub fn buffer_int64(&mut self, name: String, value: i64) -> Result<Tensor, TchError> {
        let tensor = Tensor::f_full([] as [i64; 0], value, (Kind::Int64, self.device))?;
        self.push(name, &tensor, Role::Buffer);
        Ok(tensor)
    }

    /// Adds an existing tensor: a parameter when it requires a gradient, else a buffer. Fails
    /// when the name is taken.
    pub fn insert(&mut self, name: String, tensor: Tensor) -> Result<(), super::SurgeryError> {
        if self.get(&name).is_some() {
            return Err(super::SurgeryError(format!(
                "the model already has a tensor named `{name}`"
            )));
        }
        let role = if tensor.requires_grad() {
            Role::Parameter
        } else {
            Role::Buffer
        };
        self.push(name, &tensor, role);
        Ok(())
    }

    /// Renames every tensor under `from.` to the same name under `to.`, keeping its place and
    /// role; returns how many were renamed. Fails, renaming nothing, when a new name is taken.
    pub fn rename_prefix(&mut self, from: &str, to: &str) -> Result<usize, super::SurgeryError> {
        let old = format!("{from}.");
        let renamed: Vec<(usize, String)> = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                e.name
                    .strip_prefix(&old)
                    .map(|rest| (i, format!("{to}.{rest}")))
            })
            .collect();
        if let Some((_, taken)) = renamed.iter().find(|(_, n)| self.get(n).is_some()) {
            return Err(super::SurgeryError(format!(
                "the model already has a tensor named `{taken}`"
            )));
        }
        for (i, name) in &renamed {
            self.entries[*i].name = name.clone();
        }
        Ok(renamed.len())
    }

    /// Removes the named tensors; returns how many there were.
    pub fn remove(&mut self, names: &[String]) -> usize {
        let before = self.entries.len();
        self.entries.retain(|e| !names.contains(&e.name));
        before - self.entries.len()
    }

    /// Adds a tensor made elsewhere (a TorchScript model's) under `name` with `role`; the
    /// caller guarantees that names are unique.
    pub(crate) fn adopt(&mut self, name: String, tensor: &Tensor, role: Role) {
        self.push(name, tensor, role);
    }

    fn push(&mut self, name: String, tensor: &Tensor, role: Role) {
        self.entries.push(Entry {
            name,
            tensor: tensor.shallow_clone(),
            role,
        });
    }

    /// Every entry, in registration order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The trainable parameters that currently require a gradient, with their names.
    pub fn trainable(&self) -> impl Iterator<Item = &Entry> {
        self.entries
            .iter()
            .filter(|e| e.role == Role::Parameter && e.tensor.requires_grad())
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Number of trainable scalars.
    pub fn num_trainable_scalars(&self) -> i64 {
        self.trainable().map(|e| e.tensor.numel() as i64).sum()
    }

    /// Shallow copies of every tensor with its name, in registration order (for checkpoints).
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        self.entries
            .iter()
            .map(|e| (e.name.clone(), e.tensor.shallow_clone()))
            .collect()
    }

    /// Copies saved tensors into the model's. The names, shapes and kinds must match exactly
    /// (no tensor missing, none extra); otherwise nothing is copied and the error lists the
    /// differences.
    pub fn restore(&self, saved: &[(String, Tensor)]) -> Result<(), WeightsError> {
        let by_name: std::collections::HashMap<&str, &Tensor> =
            saved.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut problems = Vec::new();
        for e in &self.entries {
            match by_name.get(e.name.as_str()) {
                None => problems.push(format!("`{}` is missing", e.name)),
                Some(t) if t.size() != e.tensor.size() => problems.push(format!(
                    "`{}` has shape {:?} in the checkpoint but {:?} in this model",
                    e.name,
                    t.size(),
                    e.tensor.size()
                )),
                Some(t) if t.kind() != e.tensor.kind() => problems.push(format!(
                    "`{}` is {:?} in the checkpoint but {:?} in this model",
                    e.name,
                    t.kind(),
                    e.tensor.kind()
                )),
                Some(_) => {}
            }
        }
        for (name, _) in saved {
            if self.get(name).is_none() {
                problems.push(format!("`{name}` is not in this model"));
            }
        }
        if !problems.is_empty() {
            return Err(WeightsMismatch(problems).into());
        }
        tch::no_grad(|| -> Result<(), TchError> {
            for e in &self.entries {
                if let Some(t) = by_name.get(e.name.as_str()) {
                    e.tensor.shallow_clone().f_copy_(t)?;
                }
            }
            Ok(())
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_normal_init_in_place_draws_tchs_values_to_the_bit() {
        for (mean, stdev) in [(0.0, 0.02), (0.5, 3.0), (0.0, 1.0)] {
            let init = Init::Randn { mean, stdev };
            tch::manual_seed(7);
            let want = tch::nn::f_init(init, &[33, 17], Device::Cpu, Kind::Float).unwrap();
            tch::manual_seed(7);
            let mut store = ParamStore::new(Device::Cpu);
            let got = store.parameter("w".into(), &[33, 17], init).unwrap();
            assert!(got.equal(&want), "mean {mean}, stdev {stdev}");
            assert!(got.requires_grad());
        }
    }
}
