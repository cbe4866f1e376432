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
