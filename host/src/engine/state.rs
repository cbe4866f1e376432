//! What methods can see and change during an event.

use rand::RngCore;
use rand_chacha::{rand_core::SeedableRng, ChaCha8Rng};
use tch::{Device, Tensor};
use tessera_plugin_api::TimeInfo;

/// A batch: named tensors (`input`, `target`, ...) on the training device.
#[derive(Debug, Default)]
pub struct Batch {
    entries: Vec<(String, Tensor)>,
}

impl Batch {
    /// A batch of an input and a target.
    pub fn new(input: Tensor, target: Tensor) -> Batch {
        Batch {
            entries: vec![("input".into(), input), ("target".into(), target)],
        }
    }

    /// The tensor named `key`.
    pub fn get(&self, key: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, t)| t)
    }

    /// The input tensor.
    pub fn input(&self) -> Option<&Tensor> {
        self.get("input")
    }

    /// The target tensor.
    pub fn target(&self) -> Option<&Tensor> {
        self.get("target")
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

/// The host state methods act on during an event.
pub struct State {
    /// The training device; tensors handed back by methods must live there.
    pub device: Device,
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
    /// A fresh state; `seed` fixes the methods' random stream.
    pub fn new(device: Device, seed: u64) -> State {
        State {
            device,
            batch: Batch::default(),
            output: None,
            loss: None,
            time: TimeInfo::default(),
            metrics: Vec::new(),
            // A stream of its own, so methods drawing numbers never shift the data order.
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7e55_e4a0_0000_0001),
        }
    }

    /// A CPU state for unit tests.
    #[cfg(test)]
    pub fn for_tests() -> State {
        State::new(Device::Cpu, 0)
    }

    /// The next value of the methods' random stream.
    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// A shallow clone of the tensor named `key`: a batch entry, `output` or `loss`.
    pub fn tensor(&self, key: &str) -> Option<Tensor> {
        match key {
            "output" => self.output.as_ref().map(Tensor::shallow_clone),
            "loss" => self.loss.as_ref().map(Tensor::shallow_clone),
            _ => self.batch.get(key).map(Tensor::shallow_clone),
        }
    }

    /// Replaces the tensor named `key`, after checking it fits: same device as training, a
    /// one-element floating loss, an output of unchanged shape, batch entries keeping the batch
    /// size. The error says what was expected.
    pub fn set_tensor(&mut self, key: &str, value: Tensor) -> Result<(), String> {
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
        match key {
            "loss" => {
                if value.numel() != 1 || !value.is_floating_point() {
                    return Err(format!(
                        "`loss` must be a floating scalar, got shape {:?} of {:?}",
                        value.size(),
                        value.kind()
                    ));
                }
                self.loss = Some(value);
            }
            "output" => {
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
