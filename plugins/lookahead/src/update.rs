//! The update on tensors: pure functions, in place, on the tensors' own device.

use tessera_plugin_api::tch::{self, Tensor};
use tessera_plugin_api::Error;

/// One tensor's synchronisation, in place: `φ ← φ + w(θ − φ)` (`torch.lerp_`, as airbench's
/// `ema_param.lerp_(net_param, 1 - decay)` and timm's Lookahead), then `θ ← φ`. Two kernels,
/// no host read; `w` reaches the kernel as a number (no device tensor).
pub fn sync_tensor(slow: &Tensor, fast: &Tensor, weight: f64) -> Result<(), Error> {
    let _no_grad = tch::no_grad_guard();
    let _ = slow.shallow_clone().f_lerp_(fast, weight)?;
    fast.shallow_clone().f_copy_(slow)?;
    Ok(())
}

/// `θ ← φ` in place, without recording a gradient (the final copy).
pub fn copy_into(dst: &Tensor, src: &Tensor) -> Result<(), Error> {
    let _no_grad = tch::no_grad_guard();
    dst.shallow_clone().f_copy_(src)?;
    Ok(())
}

/// A detached copy of `t` (same shape, kind, device and memory layout) that shares nothing
/// with it.
pub fn detached_copy(t: &Tensor) -> Result<Tensor, Error> {
    let _no_grad = tch::no_grad_guard();
    let mut out = t.f_detach()?.f_empty_like()?;
    out.f_copy_(t)?;
    Ok(out)
}
