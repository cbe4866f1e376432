//! What methods can see and change during an event.

use rand::RngCore;
use rand_chacha::{rand_core::SeedableRng, ChaCha8Rng};
use tch::{Device, Tensor};
use tessera_plugin_api::{keys, TimeInfo};

use crate::config::Precision;
use crate::model::Model;
use crate::optim::Optimizer;

/// A batch: named tensors (`input`, `target`, ...) on the training device.
#[derive(Debug, Default)]
pub struct Batch {
    entries: Vec<(String, Tensor)>,
}

impl Batch {
    /// A batch of an input and a target.
    pub fn new(input: Tensor, target: Tensor) -> Batch {
        Batch {
            entries: vec![(keys::INPUT.into(), input), (keys::TARGET.into(), target)],
        }
    }

    /// The tensor named `key`.
    pub fn get(&self, key: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, t)| t)
    }

    /// The input tensor.
    pub fn input(&self) -> Option<&Tensor> {
        self.get(keys::INPUT)
    }

    /// The target tensor.
    pub fn target(&self) -> Option<&Tensor> {
        self.get(keys::TARGET)
    }

    /// The names of the batch's tensors.
    pub fn keys(&self) -> Vec<String> {
        self.entries.iter().map(|(k, _)| k.clone()).collect()
    }

    /// Replaces the tensor named `key`.
    pub fn set(&mut self, key: &str, value: Tensor) {
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some((_, t)) => *t = value,
            None => self.entries.push((key.to_owned(), value)),
        }
    }

    /// Number of samples (first dimension of the input).
    pub fn len(&self) -> i64 {
        self.input()
            .map(|t| t.size().first().copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Whether the batch has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Splits into microbatches of at most `size` samples (views, no copies).
    pub fn split(&self, size: i64) -> Result<Vec<Batch>, tch::TchError> {
        let mut parts: Vec<Batch> = Vec::new();
        for (key, tensor) in &self.entries {
            for (i, chunk) in tensor.f_split(size, 0)?.into_iter().enumerate() {
                if parts.len() <= i {
                    parts.push(Batch::default());
                }
                parts[i].entries.push((key.clone(), chunk));
            }
        }
        Ok(parts)
    }

    /// Shallow copies of every entry (same storage).
    pub fn shallow_clone(&self) -> Batch {
        Batch {
            entries: self
                .entries
                .iter()
                .map(|(k, t)| (k.clone(), t.shallow_clone()))
                .collect(),
        }
    }
}

/// The host state methods act on during an event (Composer's `State`): the model, the
/// optimizer, the batch, outputs and loss, the clock.
pub struct State {
    /// The training device; tensors handed back by methods must live there.
    pub device: Device,
    /// The model.
    pub model: Model,
    /// The optimizer; `None` until it is built right after `init`.
    pub optimizer: Option<Optimizer>,
    /// The run's precision (for extra forwards requested by methods).
    pub precision: Precision,
    /// Surgery is allowed (only during `init`).
    pub surgery_allowed: bool,
    /// A method asked for one more forward/backward pass in this step.
    pub extra_pass_requested: bool,
    /// The index of the current forward/backward pass within the step.
    pub pass_index: u32,
    /// Whether the current `*_checkpoint` event writes a checkpoint.
    pub checkpoint_pending: bool,
    /// Whether the current event is inside the microbatch loop or at `after_train_batch`.
    pub in_train_batch: bool,
    /// The current batch (a microbatch between `before_forward` and `after_backward`).
    pub batch: Batch,
    /// The model output of the current (micro)batch.
    pub output: Option<Tensor>,
    /// The loss of the current (micro)batch.
    pub loss: Option<Tensor>,
    /// The training clock as methods see it.
    pub time: TimeInfo,
    /// Metrics methods logged since the trainer last collected them.
    pub metrics: Vec<(String, f64)>,
    rng: ChaCha8Rng,
}

impl State {
    /// A fresh state for `model`; `seed` fixes the methods' random stream.
    pub fn new(model: Model, precision: Precision, seed: u64) -> State {
        State {
            device: model.params.device(),
            model,
            optimizer: None,
            precision,
            surgery_allowed: false,
            extra_pass_requested: false,
            pass_index: 0,
            checkpoint_pending: false,
            in_train_batch: false,
            batch: Batch::default(),
            output: None,
            loss: None,
            time: TimeInfo::default(),
            metrics: Vec::new(),
            // A stream of its own, so methods drawing numbers never shift the data order.
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7e55_e4a0_0000_0001),
        }
    }

    /// A CPU state over a tiny MLP, for unit tests.
    #[cfg(test)]
    pub fn for_tests() -> State {
        let config = crate::config::ModelConfig {
            name: crate::config::ModelName::Mlp,
            hidden: vec![4],
            width: None,
            num_classes: 2,
        };
        let shape = crate::model::InputShape {
            channels: 1,
            height: 2,
            width: 2,
        };
        let model = Model::build(&config, shape, 2, Device::Cpu).expect("tiny model");
        State::new(model, Precision::Fp32, 0)
    }

    /// The methods' random stream (saved in checkpoints).
    pub fn rng(&self) -> &ChaCha8Rng {
        &self.rng
    }

    /// Replaces the methods' random stream (restoring a checkpoint).
    pub fn set_rng(&mut self, rng: ChaCha8Rng) {
        self.rng = rng;
    }

    /// The next value of the methods' random stream.
    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// A shallow clone of the tensor named `key`: a batch entry, `output` or `loss`.
    pub fn tensor(&self, key: &str) -> Option<Tensor> {
        match key {
            keys::OUTPUT => self.output.as_ref().map(Tensor::shallow_clone),
            keys::LOSS => self.loss.as_ref().map(Tensor::shallow_clone),
            _ => self.batch.get(key).map(Tensor::shallow_clone),
        }
    }

    /// A tensor handed back by a method must be defined and live on the training device.
    fn check_device(&self, key: &str, value: &Tensor) -> Result<(), String> {
        if !value.defined() {
            return Err(format!("`{key}`: the tensor is undefined"));
        }
        if value.device() != self.device {
            return Err(format!(
                "`{key}` is on {:?} but training runs on {:?}",
                value.device(),
                self.device
            ));
        }
        Ok(())
    }

    /// Replaces the tensor named `key`, after checking it fits: same device as training, a
    /// one-element floating loss, an output of unchanged shape, batch entries keeping the batch
    /// size. The error says what was expected.
    pub fn set_tensor(&mut self, key: &str, value: Tensor) -> Result<(), String> {
        self.check_device(key, &value)?;
        match key {
            keys::LOSS => {
                if value.numel() != 1 || !value.is_floating_point() {
                    return Err(format!(
                        "`loss` must be a floating scalar, got shape {:?} of {:?}",
                        value.size(),
                        value.kind()
                    ));
                }
                self.loss = Some(value);
            }
            keys::OUTPUT => {
                let expected = self.output.as_ref().map(Tensor::size);
                if expected.as_ref().is_some_and(|e| *e != value.size()) {
                    return Err(format!(
                        "`output` must keep its shape {:?}, got {:?}",
                        expected.unwrap_or_default(),
                        value.size()
                    ));
                }
                self.output = Some(value);
            }
            _ => {
                let Some(current) = self.batch.get(key) else {
                    return Err(format!("the batch has no `{key}` (it has input, target)"));
                };
                let (now, new) = (current.size(), value.size());
                if now.first() != new.first() {
                    return Err(format!(
                        "`{key}` must keep the batch size {:?}, got shape {new:?}",
                        now.first().copied().unwrap_or(0)
                    ));
                }
                self.batch.set(key, value);
            }
        }
        Ok(())
    }
}

/// What methods can ask of the host beyond reading and writing tensors (plugin-api 1.1).
impl State {
    /// Replaces several batch tensors at once. Afterwards every batch tensor must share the
    /// first dimension (which may differ from before: methods may shrink or grow the batch).
    pub fn set_batch(&mut self, entries: Vec<(String, Tensor)>) -> Result<(), String> {
        let mut batch = self.batch.shallow_clone();
        for (key, value) in entries {
            self.check_device(&key, &value)?;
            if batch.get(&key).is_none() {
                return Err(format!(
                    "the batch has no `{key}` (it has {})",
                    batch.keys().join(", ")
                ));
            }
            batch.set(&key, value);
        }
        let sizes: Vec<(String, i64)> = batch
            .entries
            .iter()
            .map(|(k, t)| (k.clone(), t.size().first().copied().unwrap_or(-1)))
            .collect();
        let first = sizes.first().map(|(_, n)| *n).unwrap_or(0);
        if first <= 0 || sizes.iter().any(|(_, n)| *n != first) {
            return Err(format!(
                "batch tensors must share a non-empty first dimension, got {}",
                sizes
                    .iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        self.batch = batch;
        Ok(())
    }

    /// Runs the model on `input` in training mode, under the run's precision.
    pub fn forward(&self, input: &Tensor, grad: bool) -> Result<Tensor, String> {
        self.check_device(keys::INPUT, input)?;
        let _autocast = crate::precision::AutocastGuard::new(self.precision, self.device);
        let run = || self.model.forward(input, true);
        let out = if grad { run() } else { tch::no_grad(run) };
        out.map_err(|e| format!("forward failed: {e}"))
    }

    /// The training loss of `output` against `target`.
    pub fn loss(
        &self,
        output: &Tensor,
        target: &Tensor,
        per_sample: bool,
    ) -> Result<Tensor, String> {
        let _autocast = crate::precision::AutocastGuard::new(self.precision, self.device);
        crate::model::cross_entropy_with(output, target, per_sample)
            .map_err(|e| format!("loss failed: {e}"))
    }

    /// Freezes or unfreezes parameter `name`: `requires_grad` and optimizer membership.
    pub fn set_trainable(&mut self, name: &str, trainable: bool) -> Result<(), String> {
        let entry = self
            .model
            .params
            .get(name)
            .ok_or_else(|| format!("the model has no parameter `{name}`"))?;
        if entry.role != crate::model::Role::Parameter {
            return Err(format!("`{name}` is a buffer, not a parameter"));
        }
        let tensor = entry.tensor.shallow_clone();
        let _ = tensor.set_requires_grad(trainable);
        if let Some(optimizer) = &mut self.optimizer {
            optimizer.set_member(name, &tensor, trainable);
        }
        Ok(())
    }
}
