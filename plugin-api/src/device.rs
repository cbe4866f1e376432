//! Moving host-made tensors to the device without making the host wait (plugin-api 1.8).
//!
//! `tensor.to_device(cuda)` of a tensor in ordinary (pageable) host memory is a blocking copy:
//! libtorch waits for the CUDA stream to finish everything queued before it, so a method that
//! uploads a permutation or a mask that way every step drains the GPU's queue every step.
//! [`upload`] copies through pinned (page-locked) memory with `non_blocking`, as PyTorch's
//! `pin_memory()` + `to(device, non_blocking=True)`: the host goes on at once and the copy
//! runs in order on the current stream. The host's observer of host reads (run.json's
//! `host_reads`) counts a blocking upload as a read; [`upload`] is not one.

use tch::{Device, TchError, Tensor};

/// `host` (a tensor in host memory, made by the method: a permutation, a mask, a drawn value)
/// on `device` without a blocking copy: on CUDA it is copied into pinned memory from
/// libtorch's caching host allocator (which keeps the block until the copy has read it) and
/// then `non_blocking` to the device. A tensor already on `device` is returned as it is (the
/// same storage; on the CPU always), and one on another GPU is copied `non_blocking` (in
/// stream order), so `upload(&t, like.device())` is also the wait-free form of
/// `t.to_device(like.device())`.
///
/// ```
/// use tessera_plugin_api::{device::upload, tch::{Device, Tensor}};
/// let perm = Tensor::from_slice(&[2i64, 0, 1]);
/// let on_device = upload(&perm, Device::Cpu).unwrap();
/// assert_eq!(Vec::<i64>::try_from(&on_device).unwrap(), [2, 0, 1]);
/// ```
pub fn upload(host: &Tensor, device: Device) -> Result<Tensor, TchError> {
    let staged = if device.is_cuda() && host.device() == Device::Cpu {
        host.f_pin_memory(device)?
    } else {
        host.shallow_clone()
    };
    staged.f_to_device_(device, staged.kind(), true, false)
}
