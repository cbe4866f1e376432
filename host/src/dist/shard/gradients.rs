//! The gradients of sharded parameters: the hooks that reduce-scatter a bucket's gradients as
//! backward makes them (over csrc/dist.cpp's shard reducer), and gathering or scattering them.

use std::ffi::c_void;

use tch::Tensor;

use super::alias;
use super::{torch, ShardError, ShardedParams, Wire};
use crate::dist::{check, last_error, DistError, Group};
use crate::optim::set_grad;

extern "C" {
    fn tessera_shard_reducer_new(
        group: *mut c_void,
        world: i32,
        params: *mut *mut c_void,
        offsets: *const i64,
        dims: *const i64,
        sizes: *const i64,
        strides: *const i64,
        counts: *const i64,
        shards: *const i64,
        n_flats: i32,
        reduce_bf16: i32,
    ) -> *mut c_void;
    fn tessera_shard_reducer_free(reducer: *mut c_void);
    fn tessera_shard_reducer_arm(reducer: *mut c_void) -> i32;
    fn tessera_shard_reducer_finish(
        reducer: *mut c_void,
        outs: *mut *mut c_void,
        fired: *mut u8,
    ) -> i32;
}

/// `gradients`: c10d-style hooks on the parameters' gradient accumulators that reduce-scatter
/// each flat buffer as soon as backward produced its gradients (`csrc/dist.cpp`).
pub(super) struct GradHooks {
    pub(super) handle: *mut c_void,
}

impl Drop for GradHooks {
    fn drop(&mut self) {
        // SAFETY: made by `tessera_shard_reducer_new`, freed once.
        unsafe { tessera_shard_reducer_free(self.handle) }
    }
}

/// What the backward passes of a step reduce-scattered so far: per buffer this rank's slice
/// (summed over the passes), per parameter whether it got a gradient on this rank.
#[derive(Debug, Default)]
pub(super) struct Reduced {
    pub(super) slices: Vec<Tensor>,
    pub(super) fired: Vec<bool>,
}

impl std::fmt::Debug for GradHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GradHooks")
    }
}

impl ShardedParams {
    /// `optimizer`: gives each piece its slice of the parameter's gradient (all-reduced whole
    /// already), without a copy when the gradient has the parameter's layout; a parameter
    /// without a gradient leaves its piece without one.
    pub fn take_whole_grads(&self) -> Result<(), ShardError> {
        let what = "handing the gradients to the shards";
        for piece in &self.pieces {
            let member = &self.flats[piece.flat].members[piece.member];
            let grad = member.param.grad();
            if !grad.defined() {
                torch(what, set_grad(&piece.tensor, None))?;
                continue;
            }
            let grad = torch(what, member.laid_out(grad))?;
            let offset = torch(what, grad.f_storage_offset())? + piece.start;
            let slice = torch(what, alias(&grad, offset, piece.len))?;
            torch(what, set_grad(&piece.tensor, Some(&slice)))?;
        }
        Ok(())
    }

    /// `gradients`: hooks the parameters' gradient accumulators so that each backward pass
    /// reduce-scatters every buffer as soon as its gradients are there (overlapping the rest of
    /// the backward pass, as DDP's buckets do), freeing the whole gradients as it goes.
    /// `wire`: the dtype the gradients are reduced in (`[distributed] reduce_dtype`).
    pub fn hook_gradients(&mut self, group: &Group, wire: Wire) -> Result<(), ShardError> {
        let mut params: Vec<*mut c_void> = Vec::new();
        let (mut offsets, mut dims, mut sizes, mut strides) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut counts, mut shards) = (Vec::new(), Vec::new());
        for flat in &self.flats {
            counts.push(flat.members.len() as i64);
            shards.push(flat.shard);
            for m in &flat.members {
                params.push(m.param.as_ptr() as *mut c_void);
                offsets.push(m.offset);
                dims.push(m.size.len() as i64);
                sizes.extend_from_slice(&m.size);
                strides.extend_from_slice(&m.strides);
            }
        }
        // SAFETY: every pointer and slice is live for the call; the shim copies what it keeps
        // (tensor handles are reference-counted).
        let handle = unsafe {
            tessera_shard_reducer_new(
                group.handle,
                self.world as i32,
                params.as_mut_ptr(),
                offsets.as_ptr(),
                dims.as_ptr(),
                sizes.as_ptr(),
                strides.as_ptr(),
                counts.as_ptr(),
                shards.as_ptr(),
                self.flats.len() as i32,
                i32::from(wire == Wire::Bf16),
            )
        };
        if handle.is_null() {
            return Err(ShardError::Dist(DistError::C10d {
                what: "setting up the gradient reduce-scatter".into(),
                message: last_error(),
            }));
        }
        self.hooks = Some(GradHooks { handle });
        Ok(())
    }

    /// `gradients`: forgets what earlier passes of an abandoned step reduced.
    pub fn start_step(&self) {
        *self.reduced.borrow_mut() = Reduced::default();
    }

    /// `gradients`: before a backward pass.
    pub fn before_backward(&self) -> Result<(), ShardError> {
        if let Some(h) = &self.hooks {
            // SAFETY: the handle is live.
            check(unsafe { tessera_shard_reducer_arm(h.handle) }, || {
                "preparing the gradient reduce-scatter".into()
            })?;
        }
        Ok(())
    }

    /// `gradients`: after a backward pass: waits for its reduce-scatters and adds this rank's
    /// slices to the step's.
    pub fn after_backward(&self) -> Result<(), ShardError> {
        // `full`: a unit whose input had no gradient is still gathered.
        self.full.free_gathered()?;
        let Some(h) = &self.hooks else {
            return Ok(());
        };
        let members: usize = self.flats.iter().map(|f| f.members.len()).sum();
        let mut outs: Vec<*mut c_void> = vec![std::ptr::null_mut(); self.flats.len()];
        let mut fired = vec![0u8; members];
        // SAFETY: `outs` and `fired` hold as many entries as the shim writes.
        check(
            unsafe {
                tessera_shard_reducer_finish(h.handle, outs.as_mut_ptr(), fired.as_mut_ptr())
            },
            || "reduce-scattering the gradients".into(),
        )?;
        // SAFETY: each entry is a fresh `at::Tensor*` the shim handed over.
        let slices: Vec<Tensor> = outs
            .into_iter()
            .map(|p| unsafe { Tensor::from_ptr(p.cast()) })
            .collect();
        let mut reduced = self.reduced.borrow_mut();
        if reduced.slices.is_empty() {
            reduced.slices = slices;
            reduced.fired = fired.iter().map(|f| *f != 0).collect();
        } else {
            let _guard = tch::no_grad_guard();
            for (sum, s) in reduced.slices.iter_mut().zip(&slices) {
                let _ = torch("adding a pass's gradients", sum.f_add_(s))?;
            }
            for (a, f) in reduced.fired.iter_mut().zip(&fired) {
                *a |= *f != 0;
            }
        }
        Ok(())
    }

    /// `gradients`: gives each piece its slice of the step's reduced gradients. A parameter
    /// that got a gradient on no rank leaves its piece without one (as DDP leaves it `None`);
    /// one that got a gradient on some ranks only was reduced with zeros from the others. One
    /// host all-reduce of the flags per step.
    pub fn take_reduced_grads(&self, group: &Group) -> Result<(), ShardError> {
        let what = "handing the reduced gradients to the shards";
        let reduced = std::mem::take(&mut *self.reduced.borrow_mut());
        let members: usize = self.flats.iter().map(|f| f.members.len()).sum();
        let local: Vec<f64> = if reduced.fired.is_empty() {
            vec![0.0; members]
        } else {
            reduced
                .fired
                .iter()
                .map(|f| f64::from(u8::from(*f)))
                .collect()
        };
        let used = group.all_reduce_values(&local, crate::dist::Op::Max)?;
        let mut first = Vec::with_capacity(self.flats.len());
        let mut at = 0;
        for flat in &self.flats {
            first.push(at);
            at += flat.members.len();
        }
        for piece in &self.pieces {
            let flat = &self.flats[piece.flat];
            let member = &flat.members[piece.member];
            let slice = reduced.slices.get(piece.flat);
            let slice = match slice {
                Some(s) if used[first[piece.flat] + piece.member] > 0.0 => s,
                _ => {
                    torch(what, set_grad(&piece.tensor, None))?;
                    continue;
                }
            };
            let start = if piece.len > 0 {
                member.offset + piece.start - self.rank as i64 * flat.shard
            } else {
                0
            };
            let g = torch(what, alias(slice, start, piece.len))?;
            torch(what, set_grad(&piece.tensor, Some(&g)))?;
        }
        Ok(())
    }

    /// `gradients`/`full`, before methods that read the gradients between the backward pass and
    /// the optimizer step (gradient clipping, SAM): every parameter gets its whole reduced
    /// gradient, all-gathered from the ranks' slices (a parameter that got a gradient on no
    /// rank gets none). Collective; [`ShardedParams::scatter_gradients`] undoes it.
    pub fn gather_gradients(&self, group: &Group) -> Result<(), ShardError> {
        let _guard = tch::no_grad_guard();
        let what = "gathering the reduced gradients for the methods";
        let reduced = self.reduced.borrow();
        let local: Vec<f64> = self
            .flats
            .iter()
            .flat_map(|f| f.members.iter())
            .enumerate()
            .map(|(i, _)| f64::from(u8::from(reduced.fired.get(i).copied().unwrap_or(false))))
            .collect();
        let used = group.all_reduce_values(&local, crate::dist::Op::Max)?;
        let mut at = 0;
        for (f, flat) in self.flats.iter().enumerate() {
            let first = at;
            at += flat.members.len();
            let Some(slice) = reduced.slices.get(f) else {
                continue;
            };
            let whole = torch(
                what,
                Tensor::f_empty(
                    [flat.shard * self.world as i64],
                    (slice.kind(), slice.device()),
                ),
            )?;
            group.all_gather_base(&whole, torch(what, slice.f_detach_copy())?)?;
            for (m, member) in flat.members.iter().enumerate() {
                let grad = match used[first + m] > 0.0 {
                    true => Some(torch(
                        what,
                        whole.f_as_strided(&member.size, &member.strides, member.offset),
                    )?),
                    false => None,
                };
                torch(what, set_grad(&member.param, grad.as_ref()))?;
            }
        }
        Ok(())
    }

    /// After [`ShardedParams::gather_gradients`] and the methods: this rank's slices take what
    /// the methods left in the whole gradients (clipped, say), and the whole gradients go.
    pub fn scatter_gradients(&self) -> Result<(), ShardError> {
        let _guard = tch::no_grad_guard();
        let what = "taking back the gradients the methods saw";
        let reduced = self.reduced.borrow();
        for (f, flat) in self.flats.iter().enumerate() {
            let (lo, hi) = (
                self.rank as i64 * flat.shard,
                (self.rank as i64 + 1) * flat.shard,
            );
            for member in &flat.members {
                let grad = member.param.grad();
                if let Some(slice) = reduced.slices.get(f).filter(|_| grad.defined()) {
                    let (a, b) = (lo.max(member.offset), hi.min(member.offset + member.numel));
                    if b > a {
                        // A method may have put a gradient of another layout there.
                        let g = torch(what, member.laid_out(grad))?;
                        let offset = torch(what, g.f_storage_offset())? + (a - member.offset);
                        let src = torch(what, alias(&g, offset, b - a))?;
                        let dst = torch(what, slice.f_narrow(0, a - lo, b - a))?;
                        torch(what, dst.shallow_clone().f_copy_(&src))?;
                    }
                }
                torch(what, set_grad(&member.param, None))?;
            }
        }
        Ok(())
    }
}
