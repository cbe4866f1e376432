//! c10d's gradient Reducer (DDP's engine) over a group: bucketed all-reduce during backward,
//! and its timings.

use std::ffi::c_void;

use tch::Tensor;

use super::{
    check, last_error, ptrs, tessera_dist_reducer_free, tessera_dist_reducer_new,
    tessera_dist_reducer_prepare_backward, tessera_dist_reducer_prepare_forward,
    tessera_dist_reducer_stats, DistError, Group,
};

/// PyTorch DDP's timing of the sampled steps (c10d's logger), in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ReducerStats {
    /// Forward pass.
    pub forward: f64,
    /// Backward computation.
    pub backward_compute: f64,
    /// Gradient communication, from the first bucket's all-reduce to the last one's end.
    pub backward_comm: f64,
    /// Time communication and backward computation ran together.
    pub overlap: f64,
}

/// c10d's gradient reducer (see [`Group::reducer`]).
pub struct GradReducer {
    handle: *mut c_void,
}

impl GradReducer {
    /// Before the forward pass of a step whose gradients are all-reduced.
    pub fn prepare_forward(&self) -> Result<(), DistError> {
        // SAFETY: the handle is live.
        check(
            unsafe { tessera_dist_reducer_prepare_forward(self.handle) },
            || "gradient all-reduce (forward)".into(),
        )
    }

    /// Before `loss.backward()`: that backward pass all-reduces the gradients.
    pub fn prepare_backward(&self, loss: &Tensor) -> Result<(), DistError> {
        // SAFETY: the handle and the tensor are live.
        check(
            unsafe { tessera_dist_reducer_prepare_backward(self.handle, loss.as_ptr() as _) },
            || "gradient all-reduce".into(),
        )
    }

    /// The averaged timings so far (zero until c10d measured some steps).
    pub fn stats(&self) -> Result<ReducerStats, DistError> {
        let mut out = [0i64; 4];
        // SAFETY: `out` holds the 4 values the shim writes.
        check(
            unsafe { tessera_dist_reducer_stats(self.handle, out.as_mut_ptr()) },
            || "reading the all-reduce timings".into(),
        )?;
        let s = |ns: i64| ns as f64 / 1e9;
        Ok(ReducerStats {
            forward: s(out[0]),
            backward_compute: s(out[1]),
            backward_comm: s(out[2]),
            overlap: s(out[3]),
        })
    }
}

impl Drop for GradReducer {
    fn drop(&mut self) {
        // SAFETY: made by `tessera_dist_reducer_new`, freed once.
        unsafe { tessera_dist_reducer_free(self.handle) }
    }
}

impl Group {
    /// c10d's `Reducer` over `params` (the trainable parameters, identical on every rank):
    /// from now on, a backward pass announced with [`GradReducer::prepare_backward`] leaves
    /// every parameter's gradient averaged over the ranks. With `bucket_view` the gradients
    /// live in the reducer's buckets (PyTorch DDP's `gradient_as_bucket_view`: no second copy).
    pub fn reducer(
        &self,
        params: &[&Tensor],
        bucket_bytes: i64,
        find_unused: bool,
        bucket_view: bool,
    ) -> Result<GradReducer, DistError> {
        let mut p = ptrs(params);
        // SAFETY: `p` holds live tensors; c10d keeps its own references to them.
        let handle = unsafe {
            tessera_dist_reducer_new(
                self.handle,
                p.as_mut_ptr(),
                p.len() as i32,
                bucket_bytes,
                i32::from(find_unused),
                i32::from(bucket_view),
            )
        };
        if handle.is_null() {
            return Err(DistError::C10d {
                what: "setting up the gradient all-reduce".into(),
                message: last_error(),
            });
        }
        Ok(GradReducer { handle })
    }
}

// SAFETY: used from the training thread only; moved with the trainer.
unsafe impl Send for GradReducer {}
