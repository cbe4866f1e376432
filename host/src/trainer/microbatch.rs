//! `train.microbatch_size = "auto"`: when a pass runs out of device memory, the batch is trained
//! again with half the microbatch, as Composer's `device_train_microbatch_size = "auto"` does.
//!
//! An out-of-memory error is recognised by the allocator's own report (`host/csrc/oom.cpp`), not
//! by the text of the error: the count of allocations libtorch's allocators could not serve is
//! compared before and after the failed pass.
//!
//! How microbatches weigh: a language model's by their shares of the batch's scored tokens
//! ([`scored_tokens`]), every other model's by their samples (as Composer).

use tch::Tensor;

use crate::config::MicrobatchSize;

use super::error::{fail, Result};
use super::Trainer;

extern "C" {
    fn tessera_oom_watch() -> i32;
    fn tessera_oom_count() -> i64;
    fn tessera_empty_cuda_cache() -> i32;
}

/// Starts counting the allocators' out-of-memory reports on this thread (idempotent). Returns
/// false when the slot is taken (a profiler), so OOMs cannot be recognised.
pub(super) fn watch_oom() -> bool {
    // SAFETY: plain C call; installs a thread-local reporter in libtorch.
    unsafe { tessera_oom_watch() == 0 }
}

/// Allocations libtorch's allocators refused on watched threads, since the process started.
pub(super) fn oom_count() -> i64 {
    // SAFETY: plain C call reading an atomic.
    unsafe { tessera_oom_count() }
}

impl Trainer {
    /// Whether the microbatch adapts to the device memory.
    pub(super) fn auto_microbatch(&self) -> bool {
        self.config.train.microbatch_size == MicrobatchSize::Auto
    }

    /// [`Trainer::forward_backward`], retried with half the microbatch after an out-of-memory
    /// error when `train.microbatch_size = "auto"`. The retry starts from the batch the failed
    /// pass started from, with cleared gradients.
    pub(super) fn forward_backward_fitting(&mut self) -> Result<Option<Tensor>> {
        if !self.auto_microbatch() {
            return self.forward_backward();
        }
        let batch = self.state.batch.shallow_clone();
        loop {
            let before = oom_count();
            let error = match self.forward_backward() {
                Ok(loss) => return Ok(loss),
                Err(e) if oom_count() > before => e,
                Err(e) => return Err(e),
            };
            self.state.batch = batch.shallow_clone();
            self.state.in_train_batch = false;
            self.state.output = None;
            self.state.loss = None;
            self.state.optimizer.zero_grad();
            let (at, size) = (self.state.clock.timestamp.batch + 1, self.microbatch);
            if size <= 1 {
                fail!(
                    "out of memory at batch {at} with a microbatch of 1 sample (train.microbatch_size = \"auto\"): the model does not fit this device: {error}"
                );
            }
            let smaller = (size / 2).max(1);
            if self.state.device().is_cuda() {
                // SAFETY: plain C call into the CUDA caching allocator.
                unsafe { tessera_empty_cuda_cache() };
            }
            tracing::warn!(
                "out of memory at batch {at} with a microbatch of {size} samples; training the batch again with {smaller} (train.microbatch_size = \"auto\")"
            );
            self.microbatch = smaller;
            self.report_metrics(vec![("train/microbatch_size".to_owned(), smaller as f64)]);
        }
    }
}

/// The scored tokens of a language model's targets (`(B, T)` int64 ids: those other than
/// `ignore_index`) as a float64 device tensor, at least 1; `None` for other targets (class
/// labels, soft targets), which microbatches weigh by their samples.
pub(super) fn scored_tokens(
    target: &tch::Tensor,
    ignore_index: i64,
) -> Result<Option<tch::Tensor>, tch::TchError> {
    if target.kind() != tch::Kind::Int64 || target.dim() < 2 {
        return Ok(None);
    }
    let n = target
        .f_ne(ignore_index)?
        .f_sum(tch::Kind::Double)?
        .f_clamp_min(1.0)?;
    Ok(Some(n))
}
