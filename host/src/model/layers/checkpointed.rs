//! Activation checkpointing's wrapper (`train.activation_checkpointing`): a unit of the model (a
//! transformer or residual block) whose training forward keeps no activations; backward runs it
//! again to get them. The autograd function is libtorch C++ (`csrc/checkpoint.cpp`, PyTorch's
//! reentrant `torch.utils.checkpoint`); this file gives it the unit to run as a callback.
//!
//! What the unit's forward reads besides its input is given back to the recompute, which may
//! run on another thread (a CUDA backward runs on the autograd engine's device threads): the
//! generators' states and autocast (by the shim), the batch's attention mask ([`super::mask`],
//! captured at forward time). Buffers the forward updates (BatchNorm's running statistics and
//! count) are put back after the recompute, so they move once per step, as without
//! checkpointing.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Weak};

use tch::{TchError, Tensor};

use super::mask::{attention_mask, with_attention_mask};
use super::{Attr, KvCache, Layer};

type UnitFn =
    extern "C" fn(*mut c_void, c_int, *mut c_void, *mut *mut c_void, *mut c_char, usize) -> c_int;
type UnitDrop = extern "C" fn(*mut c_void);

/// The callback's phases (`csrc/checkpoint.cpp`).
const FORWARD: c_int = 0;
const RECOMPUTE: c_int = 1;
const RECOMPUTED: c_int = 2;

extern "C" {
    fn tessera_checkpoint_last_error() -> *const c_char;
    fn tessera_checkpoint(
        input: *mut c_void,
        run: UnitFn,
        drop: UnitDrop,
        context: *mut c_void,
        output: *mut *mut c_void,
    ) -> c_int;
}

/// A unit run without keeping its activations in training, kind `activation_checkpoint`. It is
/// transparent: its tensors and children are the wrapped unit's, under the same names, so
/// checkpoints and exports see the model as built.
#[derive(Debug)]
pub struct Checkpointed {
    inner: Box<dyn Layer>,
    /// The unit's path, for messages.
    path: Arc<str>,
    /// The unit's buffers (shared with the store), put back after a recompute.
    buffers: Vec<Tensor>,
    /// Dropped with the layer: a backward pass that outlives it fails instead of running it.
    alive: Arc<()>,
}

impl Checkpointed {
    /// Wraps the unit `inner` at `path`, whose buffers (tensors that are not trained, such as
    /// BatchNorm's running statistics) are `buffers`.
    pub fn new(inner: Box<dyn Layer>, path: &str, buffers: Vec<Tensor>) -> Checkpointed {
        Checkpointed {
            inner,
            path: path.into(),
            buffers,
            alive: Arc::new(()),
        }
    }

    /// Copies of the buffers.
    fn snapshot(&self) -> Result<Vec<Tensor>, TchError> {
        tch::no_grad(|| {
            self.buffers
                .iter()
                .map(|b| {
                    let mut copy = b.f_empty_like()?;
                    copy.f_copy_(b)?;
                    Ok(copy)
                })
                .collect()
        })
    }

    /// Puts the buffers back as `snapshot` holds them.
    fn restore(&self, snapshot: &[Tensor]) -> Result<(), TchError> {
        tch::no_grad(|| {
            for (buffer, before) in self.buffers.iter().zip(snapshot) {
                buffer.shallow_clone().f_copy_(before)?;
            }
            Ok(())
        })
    }
}

impl Layer for Checkpointed {
    fn kind(&self) -> &str {
        "activation_checkpoint"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        self.inner.attrs()
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        self.inner.tensors()
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        self.inner.children()
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        self.inner.child_mut(name)
    }

    fn is_position_wise(&self) -> bool {
        self.inner.is_position_wise()
    }

    fn forward_cached(&self, xs: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        self.inner.forward_cached(xs, cache)
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        if !train {
            return self.inner.forward(xs, train);
        }
        let context = Box::into_raw(Box::new(Unit {
            layer: self,
            alive: Arc::downgrade(&self.alive),
            path: Arc::clone(&self.path),
            mask: attention_mask(),
            buffers: RefCell::new(Vec::new()),
        }));
        let mut output: *mut c_void = std::ptr::null_mut();
        // SAFETY: `xs` is a live tensor's `at::Tensor*`, only read by the shim. The shim owns
        // `context` from here and frees it exactly once with `drop_unit`; `run_unit` reads it
        // while it lives. On success `output` is a new `at::Tensor*` that the tensor below owns.
        let rc = unsafe {
            tessera_checkpoint(
                xs.as_ptr() as *mut c_void,
                run_unit,
                drop_unit,
                context.cast(),
                &mut output,
            )
        };
        if rc != 0 || output.is_null() {
            // SAFETY: a NUL-terminated thread-local string, copied at once.
            let message = unsafe { CStr::from_ptr(tessera_checkpoint_last_error()) };
            return Err(TchError::Torch(message.to_string_lossy().into_owned()));
        }
        // SAFETY: see above.
        Ok(unsafe { Tensor::from_ptr(output.cast()) })
    }
}

/// What the autograd function's callback needs: the layer and what its forward read.
struct Unit {
    layer: *const Checkpointed,
    alive: Weak<()>,
    path: Arc<str>,
    mask: Option<Tensor>,
    /// The buffers as they were before the recompute, until the backward through it ends.
    buffers: RefCell<Vec<Tensor>>,
}

impl Unit {
    /// Runs `phase` (the shim's calls happen one at a time, on one thread at a time).
    fn run(&self, phase: c_int, xs: Option<&Tensor>) -> Result<Option<Tensor>, TchError> {
        let Some(_alive) = self.alive.upgrade() else {
            return Err(TchError::Torch(
                "the model was dropped before its backward pass".into(),
            ));
        };
        // SAFETY: the layer lives while `alive` can be upgraded (it drops the `Arc` with
        // itself), and a layer's address does not change: it sits in a `Box` in the tree.
        // While a backward pass runs the recompute, the thread that owns the model waits in
        // it, so the layer is not used from two threads at once.
        let layer = unsafe { &*self.layer };
        if phase == RECOMPUTED {
            return layer.restore(&self.buffers.take()).map(|()| None);
        }
        let xs = xs.ok_or_else(|| TchError::Torch("no input".into()))?;
        if phase == RECOMPUTE {
            self.buffers.replace(layer.snapshot()?);
        }
        let out = with_attention_mask(self.mask.as_ref(), || layer.inner.forward(xs, true));
        if out.is_err() && phase == RECOMPUTE {
            layer.restore(&self.buffers.take())?;
        }
        out.map(Some)
    }
}

/// A panic's message.
fn panic_text(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => format!("panicked: {text}"),
        Err(other) => match other.downcast_ref::<&'static str>() {
            Some(text) => format!("panicked: {text}"),
            None => "panicked".to_owned(),
        },
    }
}

/// The shim's callback: runs `phase` of the unit on `input` (owned; null after the backward).
/// Never unwinds: a panic or an error becomes a message and a nonzero return.
extern "C" fn run_unit(
    context: *mut c_void,
    phase: c_int,
    input: *mut c_void,
    output: *mut *mut c_void,
    message: *mut c_char,
    capacity: usize,
) -> c_int {
    // SAFETY: the shim passes an owned `at::Tensor*` (or null) and the context it was given,
    // alive.
    let input = (!input.is_null()).then(|| unsafe { Tensor::from_ptr(input.cast()) });
    let unit = unsafe { &*(context as *const Unit) };
    let text = match catch_unwind(AssertUnwindSafe(|| unit.run(phase, input.as_ref()))) {
        Ok(Ok(Some(mut out))) => {
            // SAFETY: `output` is the shim's out-parameter; it takes ownership of the tensor.
            unsafe { *output = out.as_mut_ptr().cast() };
            std::mem::forget(out);
            return 0;
        }
        Ok(Ok(None)) => return 0,
        Ok(Err(TchError::Torch(text))) => text,
        Ok(Err(e)) => e.to_string(),
        Err(payload) => panic_text(payload),
    };
    let text = match phase {
        FORWARD => text,
        _ => format!(
            "activation checkpointing: recomputing `{}` in backward: {text}",
            unit.path
        ),
    };
    let bytes = text.as_bytes();
    let n = bytes.len().min(capacity.saturating_sub(1));
    if capacity > 0 {
        // SAFETY: `message` has room for `capacity` bytes; `n + 1 <= capacity`.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), message.cast::<u8>(), n);
            *message.add(n) = 0;
        }
    }
    1
}

/// Frees the callback's context.
extern "C" fn drop_unit(context: *mut c_void) {
    // SAFETY: made by `Box::into_raw` in `Checkpointed::forward`, freed once by the shim.
    drop(unsafe { Box::from_raw(context as *mut Unit) });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tch::Kind;

    use super::*;

    /// Multiplies by `weight` and by the attention mask of the forward, if any; fails at the
    /// forward numbered `fail_at` (from 1) by a panic or, with `panics` false, an error.
    #[derive(Debug)]
    struct Probe {
        weight: Tensor,
        forwards: Arc<AtomicUsize>,
        fail_at: usize,
        panics: bool,
    }

    impl Layer for Probe {
        fn kind(&self) -> &str {
            "probe"
        }

        fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
            let n = self.forwards.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.fail_at {
                if self.panics {
                    panic!("probe exploded");
                }
                return Err(TchError::Shape("probe refused".into()));
            }
            let ys = xs.f_mul(&self.weight)?;
            match attention_mask() {
                Some(mask) => ys.f_mul(&mask.f_to_kind(Kind::Float)?),
                None => Ok(ys),
            }
        }
    }

    fn probe(fail_at: usize, panics: bool) -> (Checkpointed, Arc<AtomicUsize>) {
        let forwards = Arc::new(AtomicUsize::new(0));
        let layer = Probe {
            weight: Tensor::from_slice(&[2.0f32, 3.0, 4.0]).set_requires_grad(true),
            forwards: Arc::clone(&forwards),
            fail_at,
            panics,
        };
        (
            Checkpointed::new(Box::new(layer), "unit", Vec::new()),
            forwards,
        )
    }

    fn leaf() -> Tensor {
        Tensor::from_slice(&[1.0f32, 1.0, 1.0]).set_requires_grad(true)
    }

    #[test]
    fn a_panic_or_an_error_in_the_recompute_is_an_error_of_backward() {
        for (panics, expected) in [(true, "panicked: probe exploded"), (false, "probe refused")] {
            let (unit, forwards) = probe(2, panics);
            let loss = unit.forward(&leaf(), true).unwrap().sum(Kind::Float);
            let e = loss.f_backward().unwrap_err().to_string();
            assert!(e.contains("recomputing `unit` in backward"), "{e}");
            assert!(e.contains(expected), "{e}");
            assert_eq!(forwards.load(Ordering::SeqCst), 2);
        }
        // In the forward too, and the process goes on.
        let (unit, _) = probe(1, true);
        let e = unit.forward(&leaf(), true).unwrap_err().to_string();
        assert!(e.contains("panicked: probe exploded"), "{e}");
    }

    #[test]
    fn the_recompute_sees_the_forwards_attention_mask() {
        let mask = Tensor::from_slice(&[1i64, 0, 1]);
        let (unit, forwards) = probe(0, false);
        let x = leaf();
        let out = with_attention_mask(Some(&mask), || unit.forward(&x, true)).unwrap();
        assert!(out.requires_grad());
        // Backward runs outside the mask's scope, as the trainer's does.
        out.sum(Kind::Float).backward();
        assert_eq!(forwards.load(Ordering::SeqCst), 2);
        assert_eq!(Vec::<f32>::try_from(&x.grad()).unwrap(), [2.0, 0.0, 4.0]);
    }

    #[test]
    fn evaluation_and_no_grad_run_the_unit_once_and_a_dropped_model_fails_cleanly() {
        let (unit, forwards) = probe(0, false);
        let _ = unit.forward(&leaf(), false).unwrap();
        let out = tch::no_grad(|| unit.forward(&leaf(), true).unwrap());
        assert!(!out.requires_grad());
        assert_eq!(
            forwards.load(Ordering::SeqCst),
            2,
            "one forward each, no recompute"
        );
        let loss = unit.forward(&leaf(), true).unwrap().sum(Kind::Float);
        drop(unit);
        let e = loss.f_backward().unwrap_err().to_string();
        assert!(e.contains("dropped before its backward pass"), "{e}");
    }
}
