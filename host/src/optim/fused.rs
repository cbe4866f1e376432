//! The multi-tensor kernels of `host/csrc/optim.cpp` (libtorch's fused SGD/Adam/AdamW and a
//! `_foreach_*` Lion), and a counter of libtorch operator calls.

use std::ffi::{c_char, c_void, CStr};

use tch::{TchError, Tensor};

extern "C" {
    fn tessera_optim_last_error() -> *const c_char;
    fn tessera_optim_fused_sgd(
        params: *mut *mut c_void,
        grads: *mut *mut c_void,
        bufs: *mut *mut c_void,
        n: i32,
        weight_decay: f64,
        momentum: f64,
        lr: f64,
        dampening: f64,
        nesterov: i32,
        is_first_step: i32,
        found_inf: *mut c_void,
        lr_tensor: *mut c_void,
    ) -> i32;
    fn tessera_optim_fused_adam(
        params: *mut *mut c_void,
        grads: *mut *mut c_void,
        exp_avgs: *mut *mut c_void,
        exp_avg_sqs: *mut *mut c_void,
        steps: *mut *mut c_void,
        n: i32,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        decoupled: i32,
        found_inf: *mut c_void,
        lr_tensor: *mut c_void,
    ) -> i32;
    fn tessera_optim_foreach_mul_scalar(tensors: *mut *mut c_void, n: i32, factor: f64) -> i32;
    fn tessera_optim_foreach_mul(tensors: *mut *mut c_void, n: i32, factor: *mut c_void) -> i32;
    fn tessera_optim_foreach_lion(
        params: *mut *mut c_void,
        grads: *mut *mut c_void,
        exp_avgs: *mut *mut c_void,
        n: i32,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        found_inf: *mut c_void,
    ) -> i32;
    fn tessera_optim_foreach_add_scalar(tensors: *mut *mut c_void, n: i32, value: f64) -> i32;
    fn tessera_optim_foreach_add_tensor(
        tensors: *mut *mut c_void,
        n: i32,
        other: *mut c_void,
        alpha: f64,
    ) -> i32;
    fn tessera_optim_count_start() -> i32;
    fn tessera_optim_count_stop(top: *mut i64, all: *mut i64) -> i32;
}

/// The shim's message for its last failure on this thread.
fn failure(what: &str) -> TchError {
    // SAFETY: the shim returns a pointer to its thread-local, NUL-terminated message, valid
    // until the next call on this thread.
    let msg = unsafe { CStr::from_ptr(tessera_optim_last_error()) }
        .to_string_lossy()
        .into_owned();
    TchError::Torch(format!("{what}: {msg}"))
}

fn check(rc: i32, what: &str) -> Result<(), TchError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(failure(what))
    }
}

/// The `at::Tensor*` of each tensor, for the shim (which only reads the pointers during the
/// call; the tensors outlive it).
fn ptrs(tensors: &[&Tensor]) -> Vec<*mut c_void> {
    tensors.iter().map(|t| t.as_ptr() as *mut c_void).collect()
}

fn len(n: usize) -> Result<i32, TchError> {
    i32::try_from(n).map_err(|_| TchError::Torch(format!("{n} tensors in one call")))
}

fn flag_ptr(found_inf: Option<&Tensor>) -> *mut c_void {
    found_inf.map_or(std::ptr::null_mut(), |t| t.as_ptr() as *mut c_void)
}

/// SGD hyperparameters of one fused call.
pub(super) struct SgdArgs {
    pub weight_decay: f64,
    pub momentum: f64,
    pub lr: f64,
    pub dampening: f64,
    pub nesterov: bool,
    /// The momentum buffers are new: they take the (decayed) gradient as it is.
    pub is_first_step: bool,
}

fn lr_ptr(lr_tensor: Option<&Tensor>) -> *mut c_void {
    lr_tensor.map_or(std::ptr::null_mut(), |t| t.as_ptr() as *mut c_void)
}

/// `torch._fused_sgd_` over `params` (with their `grads` and, when momentum is used,
/// `buffers`; empty otherwise). `lr_tensor`: the rate as a 0-dim tensor on the device, read
/// there instead of `a.lr`.
pub(super) fn sgd(
    params: &[&Tensor],
    grads: &[&Tensor],
    buffers: &[&Tensor],
    a: &SgdArgs,
    found_inf: Option<&Tensor>,
    lr_tensor: Option<&Tensor>,
) -> Result<(), TchError> {
    let n = len(params.len())?;
    let (mut p, mut g, mut b) = (ptrs(params), ptrs(grads), ptrs(buffers));
    let bufs = if buffers.is_empty() {
        std::ptr::null_mut()
    } else {
        b.as_mut_ptr()
    };
    // SAFETY: `p`, `g` and (when not null) `b` hold `n` live `at::Tensor*` each; `found_inf`
    // is null or a live tensor.
    let rc = unsafe {
        tessera_optim_fused_sgd(
            p.as_mut_ptr(),
            g.as_mut_ptr(),
            bufs,
            n,
            a.weight_decay,
            a.momentum,
            a.lr,
            a.dampening,
            i32::from(a.nesterov),
            i32::from(a.is_first_step),
            flag_ptr(found_inf),
            lr_ptr(lr_tensor),
        )
    };
    check(rc, "fused SGD step")
}

/// Adam hyperparameters of one fused call.
pub(super) struct AdamArgs {
    pub lr: f64,
    pub betas: (f64, f64),
    pub weight_decay: f64,
    pub eps: f64,
    /// AdamW's decoupled decay; else Adam's L2 decay.
    pub decoupled: bool,
}

/// `torch._fused_adamw_` / `_fused_adam_` over `params`; `steps` (float32, already advanced)
/// are the parameters' own step counts; `lr_tensor` as in [`sgd`].
#[allow(clippy::too_many_arguments)]
pub(super) fn adam(
    params: &[&Tensor],
    grads: &[&Tensor],
    exp_avgs: &[&Tensor],
    exp_avg_sqs: &[&Tensor],
    steps: &[&Tensor],
    a: &AdamArgs,
    found_inf: Option<&Tensor>,
    lr_tensor: Option<&Tensor>,
) -> Result<(), TchError> {
    let n = len(params.len())?;
    let (mut p, mut g, mut m, mut v, mut s) = (
        ptrs(params),
        ptrs(grads),
        ptrs(exp_avgs),
        ptrs(exp_avg_sqs),
        ptrs(steps),
    );
    // SAFETY: every array holds `n` live `at::Tensor*`; `found_inf` is null or live.
    let rc = unsafe {
        tessera_optim_fused_adam(
            p.as_mut_ptr(),
            g.as_mut_ptr(),
            m.as_mut_ptr(),
            v.as_mut_ptr(),
            s.as_mut_ptr(),
            n,
            a.lr,
            a.betas.0,
            a.betas.1,
            a.weight_decay,
            a.eps,
            i32::from(a.decoupled),
            flag_ptr(found_inf),
            lr_ptr(lr_tensor),
        )
    };
    check(rc, "fused Adam step")
}

/// `torch._foreach_mul_(tensors, factor)`, by a number or by a 0-dim tensor.
pub(super) fn mul(tensors: &[&Tensor], factor: Factor<'_>) -> Result<(), TchError> {
    let n = len(tensors.len())?;
    let mut t = ptrs(tensors);
    // SAFETY: `t` holds `n` live `at::Tensor*`; the factor tensor is live.
    let rc = unsafe {
        match factor {
            Factor::Number(f) => tessera_optim_foreach_mul_scalar(t.as_mut_ptr(), n, f),
            Factor::Tensor(f) => {
                tessera_optim_foreach_mul(t.as_mut_ptr(), n, f.as_ptr() as *mut c_void)
            }
        }
    };
    check(rc, "foreach multiply")
}

/// A multiplier of [`mul`].
pub(super) enum Factor<'a> {
    /// A host number.
    Number(f64),
    /// A 0-dim tensor on the tensors' device.
    Tensor(&'a Tensor),
}

/// Lion hyperparameters of one call.
pub(super) struct LionArgs {
    pub lr: f64,
    pub betas: (f64, f64),
    pub weight_decay: f64,
}

/// Lion with `_foreach_*` operators over `params`, masked on the device by `found_inf` (a 0-dim
/// float32 0 or 1) when given.
pub(super) fn lion(
    params: &[&Tensor],
    grads: &[&Tensor],
    exp_avgs: &[&Tensor],
    a: &LionArgs,
    found_inf: Option<&Tensor>,
) -> Result<(), TchError> {
    let n = len(params.len())?;
    let (mut p, mut g, mut m) = (ptrs(params), ptrs(grads), ptrs(exp_avgs));
    // SAFETY: every array holds `n` live `at::Tensor*`.
    let rc = unsafe {
        tessera_optim_foreach_lion(
            p.as_mut_ptr(),
            g.as_mut_ptr(),
            m.as_mut_ptr(),
            n,
            a.lr,
            a.betas.0,
            a.betas.1,
            a.weight_decay,
            flag_ptr(found_inf),
        )
    };
    check(rc, "foreach Lion step")
}

/// `torch._foreach_add_(tensors, value)`.
pub(super) fn add_scalar(tensors: &[&Tensor], value: f64) -> Result<(), TchError> {
    let n = len(tensors.len())?;
    let mut t = ptrs(tensors);
    // SAFETY: `t` holds `n` live `at::Tensor*`.
    check(
        unsafe { tessera_optim_foreach_add_scalar(t.as_mut_ptr(), n, value) },
        "foreach add",
    )
}

/// `torch._foreach_add_(tensors, other, alpha=alpha)`, `other` a 0-dim tensor on their device.
pub(super) fn add_tensor(tensors: &[&Tensor], other: &Tensor, alpha: f64) -> Result<(), TchError> {
    let n = len(tensors.len())?;
    let mut t = ptrs(tensors);
    // SAFETY: `t` holds `n` live `at::Tensor*`; `other` is live.
    let rc = unsafe {
        tessera_optim_foreach_add_tensor(t.as_mut_ptr(), n, other.as_ptr() as *mut c_void, alpha)
    };
    check(rc, "foreach add")
}

/// Libtorch operator calls made on this thread while a [`OpCounter`] was alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpCount {
    /// Calls made at the top level (by Tessera, not by another operator).
    pub top: i64,
    /// Every call, operators called by operators included.
    pub all: i64,
}

/// Counts the libtorch operator calls of this thread (an `at::RecordFunction` thread-local
/// callback) from [`OpCounter::start`] to [`OpCounter::stop`].
pub struct OpCounter(());

impl OpCounter {
    /// Starts counting from zero.
    pub fn start() -> Result<Self, TchError> {
        // SAFETY: no arguments; the shim registers a callback for this thread.
        check(
            unsafe { tessera_optim_count_start() },
            "starting the op counter",
        )?;
        Ok(OpCounter(()))
    }

    /// Stops counting and returns the counts.
    pub fn stop(self) -> Result<OpCount, TchError> {
        let (mut top, mut all) = (0i64, 0i64);
        // SAFETY: both pointers outlive the call.
        let rc = unsafe { tessera_optim_count_stop(&mut top, &mut all) };
        check(rc, "stopping the op counter")?;
        Ok(OpCount { top, all })
    }
}
