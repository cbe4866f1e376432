//! Device→host reads the trainer makes, counted.
//!
//! A read of a tensor's value on the host (`loss.item()` in PyTorch) waits for every kernel queued
//! before it: on a GPU it drains the queue, and the next step starts with an idle device. The
//! training step is written to make none in the default configuration — the loss and the
//! non-finite guard stay on the device and are read at `train.log_interval`, at checkpoints and
//! at the end of the run — and every value the trainer does read goes through [`read`], which
//! counts it. The counts (in run.json: `host_reads`) prove it: `in_steps` is 0 for a default run
//! on any device. Methods (plugins) read what they need themselves; those reads are not counted
//! here, and a method that needs a host value says so in its card.

use std::cell::Cell;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, TchError, Tensor};

thread_local! {
    /// Per thread: the training loop runs on one thread, and tests run trainers side by side.
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// The device→host reads made through [`read`] on this thread so far.
pub fn reads() -> u64 {
    READS.with(|r| r.get())
}

/// Reads `tensor` (any shape, any numeric kind, any device) on the host as float64 values, in
/// row-major order: one device→host transfer, counted.
pub fn read(tensor: &Tensor) -> Result<Vec<f64>, TchError> {
    READS.with(|r| r.set(r.get() + 1));
    let host = tensor
        .f_detach()?
        .f_to_device(Device::Cpu)?
        .f_to_kind(Kind::Double)?
        .f_contiguous()?
        .f_flatten(0, -1)?;
    Vec::<f64>::try_from(&host)
}

/// Reads a one-element tensor on the host (counted, as [`read`]).
pub fn read_one(tensor: &Tensor) -> Result<f64, TchError> {
    read(tensor)?
        .first()
        .copied()
        .ok_or_else(|| TchError::Shape("expected a one-element tensor, got an empty one".into()))
}

/// The trainer's device→host reads of a run, as run.json records them (`host_reads`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostReads {
    /// Reads made inside training steps (from `after_dataloader` to `batch_end`): 0 in the
    /// default configuration.
    pub in_steps: u64,
    /// Every read of the run's training loop: log lines, checkpoints, evaluation, the end.
    pub total: u64,
    /// Training steps taken by this process.
    pub steps: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_counted_and_return_row_major_values() {
        let before = reads();
        let t = Tensor::from_slice(&[1.5f32, -2.0, 3.25, 4.0]).view([2, 2]);
        assert_eq!(read(&t).unwrap(), [1.5, -2.0, 3.25, 4.0]);
        assert_eq!(read_one(&Tensor::from(7i64)).unwrap(), 7.0);
        assert!(read_one(&Tensor::zeros([0], (Kind::Float, Device::Cpu))).is_err());
        assert_eq!(reads() - before, 3);
    }
}
