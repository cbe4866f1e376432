//! A batch: the named tensors (`input`, `target`, ...) methods read and replace.

use tch::Tensor;
use tessera_plugin_api::keys;

/// A batch: named tensors (`input`, `target`, ...) on the training device.
#[derive(Debug, Default)]
pub struct Batch {
    pub(super) entries: Vec<(String, Tensor)>,
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

    /// Tokens in the input: every element of a `[B, T]` integer input (token ids); 0 for
    /// anything else (images).
    pub fn tokens(&self) -> u64 {
        match self.input() {
            Some(t) if t.dim() == 2 && !t.is_floating_point() => t.numel() as u64,
            _ => 0,
        }
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
