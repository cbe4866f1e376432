//! Mixed precision (`fp32`, `amp_bf16`, `amp_fp16`): autocast on CPU or CUDA through a small C++
//! shim (tch's own `autocast` drives CUDA only), and for `amp_fp16` dynamic loss scaling
//! ([`GradScaler`], PyTorch's `torch.amp.GradScaler`).

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, TchError, Tensor};

/// Numeric precision of training (`train.precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Plain 32-bit floats (default).
    #[default]
    Fp32,
    /// Automatic mixed precision with bfloat16.
    AmpBf16,
    /// Automatic mixed precision with float16 and dynamic loss scaling ([`GradScaler`]).
    AmpFp16,
}

impl Precision {
    /// Every precision with the name used in `trainer.toml`.
    pub const CHOICES: [(&'static str, Precision); 3] = [
        ("fp32", Precision::Fp32),
        ("amp_bf16", Precision::AmpBf16),
        ("amp_fp16", Precision::AmpFp16),
    ];

    /// The name used in `trainer.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::AmpBf16 => "amp_bf16",
            Precision::AmpFp16 => "amp_fp16",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

extern "C" {
    fn tessera_autocast_set(device: i32, enabled: i32, dtype: i32) -> i32;
}

/// Enables autocast for its lifetime when the precision asks for it.
pub struct AutocastGuard {
    device: Option<i32>,
}

impl AutocastGuard {
    /// Turns autocast on for `device` when `precision` is `amp_bf16` (bfloat16) or `amp_fp16`
    /// (float16); does nothing for `fp32`.
    pub fn new(precision: Precision, device: Device) -> AutocastGuard {
        let dtype = match precision {
            Precision::Fp32 => return AutocastGuard { device: None },
            Precision::AmpBf16 => 0,
            Precision::AmpFp16 => 1,
        };
        let d = match device {
            Device::Cuda(_) => 1,
            _ => 0,
        };
        // SAFETY: plain C call into libtorch's thread-local autocast state.
        unsafe { tessera_autocast_set(d, 1, dtype) };
        AutocastGuard { device: Some(d) }
    }
}

/// Dynamic loss scaling for `amp_fp16`, with the semantics of PyTorch's `torch.amp.GradScaler`
/// (and Composer's use of it): the loss is multiplied by `scale` before the backward pass so
/// that small float16 gradients do not flush to zero; the gradients are divided by it again
/// (`unscale`) before `after_train_batch`, so methods and the optimizer see true gradients;
/// a step whose gradients hold an infinity or a NaN is skipped and the scale halves
/// (`backoff_factor`); after `growth_interval` steps in a row without one the scale doubles
/// (`growth_factor`). The scale and the count of good steps are saved in checkpoints, so a
/// resumed run scales exactly as the run that never stopped.
///
/// As PyTorch's, it lives on the device: the check and the unscaling are one multi-tensor call
/// (`_amp_foreach_non_finite_check_and_unscale_`), the skip decision is a device flag the
/// optimizer's kernels take ([`GradScaler::found_inf`]), and the scale is updated by
/// `_amp_update_scale_`; nothing is read on the host during a step. The public fields are the
/// host copy, brought up to date by [`GradScaler::sync`] (at log lines and checkpoints).
#[derive(Debug, Serialize, Deserialize)]
pub struct GradScaler {
    /// The current scale (PyTorch's `init_scale` 2^16 at the start).
    pub scale: f64,
    /// Factor applied after `growth_interval` good steps (2.0).
    pub growth_factor: f64,
    /// Factor applied after a step with non-finite gradients (0.5).
    pub backoff_factor: f64,
    /// Good steps in a row before the scale grows (2000).
    pub growth_interval: u64,
    /// Good steps in a row so far (PyTorch's `_growth_tracker`).
    pub growth_tracker: u64,
    /// Steps skipped because their gradients were not finite.
    pub skipped_steps: u64,
    /// The state on the device, made from the fields above at the first use.
    #[serde(skip)]
    live: Option<Live>,
}

/// The scaler's state on the training device.
#[derive(Debug)]
struct Live {
    /// `[1]` float32.
    scale: Tensor,
    /// `[1]` int32.
    growth_tracker: Tensor,
    /// `[1]` float32: 1 when the gradients unscaled in the current step were not finite.
    found_inf: Tensor,
    /// `[1]` float64: steps skipped.
    skipped: Tensor,
}

impl Clone for GradScaler {
    /// A copy of the host fields (the device state is made again from them at its first use);
    /// call [`GradScaler::sync`] first for the current values.
    fn clone(&self) -> Self {
        GradScaler {
            scale: self.scale,
            growth_factor: self.growth_factor,
            backoff_factor: self.backoff_factor,
            growth_interval: self.growth_interval,
            growth_tracker: self.growth_tracker,
            skipped_steps: self.skipped_steps,
            live: None,
        }
    }
}

impl PartialEq for GradScaler {
    fn eq(&self, other: &Self) -> bool {
        (
            self.scale,
            self.growth_factor,
            self.backoff_factor,
            self.growth_interval,
            self.growth_tracker,
            self.skipped_steps,
        ) == (
            other.scale,
            other.growth_factor,
            other.backoff_factor,
            other.growth_interval,
            other.growth_tracker,
            other.skipped_steps,
        )
    }
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            growth_tracker: 0,
            skipped_steps: 0,
            live: None,
        }
    }
}

extern "C" {
    fn tessera_amp_unscale(
        grads: *mut *mut std::ffi::c_void,
        n: i32,
        found_inf: *mut std::ffi::c_void,
        inv_scale: *mut std::ffi::c_void,
    ) -> i32;
    fn tessera_amp_last_error() -> *const std::ffi::c_char;
}

impl GradScaler {
    fn live(&mut self, device: Device) -> Result<&mut Live, TchError> {
        let stale = match &self.live {
            Some(l) => l.scale.device() != device,
            None => true,
        };
        if stale {
            let on = |v: Tensor| v.f_to_device(device);
            self.live = Some(Live {
                scale: on(Tensor::f_from_slice(&[self.scale as f32])?)?,
                growth_tracker: on(Tensor::f_from_slice(&[self.growth_tracker as i32])?)?,
                found_inf: on(Tensor::f_from_slice(&[0f32])?)?,
                skipped: on(Tensor::f_from_slice(&[self.skipped_steps as f64])?)?,
            });
        }
        match &mut self.live {
            Some(l) => Ok(l),
            None => Err(TchError::Kind("the loss scaler has no device state".into())),
        }
    }

    /// Puts the scaler's state on `device` (an upload), so that the steps read and write it
    /// there without one; call before training.
    pub fn prepare(&mut self, device: Device) -> Result<(), TchError> {
        self.live(device).map(|_| ())
    }

    /// `loss · scale`, the tensor to run the backward pass on (a device multiplication).
    pub fn scale_loss(&mut self, loss: &Tensor) -> Result<Tensor, TchError> {
        let live = self.live(loss.device())?;
        loss.f_mul(&live.scale.f_view([])?)
    }

    /// Divides every defined gradient of `params` by the scale in place (multiplying by the
    /// float32 reciprocal, as PyTorch does) and records on the device whether any held an
    /// infinity or a NaN ([`GradScaler::found_inf`]): one multi-tensor call per device, no read.
    pub fn unscale<'a>(
        &mut self,
        params: impl Iterator<Item = &'a Tensor>,
    ) -> Result<(), TchError> {
        let _guard = tch::no_grad_guard();
        let mut grads: Vec<Tensor> = params.map(|p| p.grad()).filter(|g| g.defined()).collect();
        let device = match grads.first() {
            Some(g) => g.device(),
            None => return Ok(()),
        };
        let live = self.live(device)?;
        let _ = live.found_inf.f_zero_()?;
        let mut inverse = live
            .scale
            .f_to_kind(Kind::Double)?
            .f_reciprocal()?
            .f_to_kind(Kind::Float)?;
        let mut pointers: Vec<*mut std::ffi::c_void> =
            grads.iter_mut().map(|g| g.as_mut_ptr().cast()).collect();
        // SAFETY: every pointer is the `at::Tensor*` of a live tensor owned by `grads`,
        // `live.found_inf` or `inverse`, all alive for the call; the shim catches libtorch's
        // exceptions.
        let rc = unsafe {
            tessera_amp_unscale(
                pointers.as_mut_ptr(),
                pointers.len() as i32,
                live.found_inf.as_mut_ptr().cast(),
                inverse.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            // SAFETY: the shim returns a pointer to its thread-local, NUL-terminated message.
            let message = unsafe { std::ffi::CStr::from_ptr(tessera_amp_last_error()) };
            return Err(TchError::Torch(format!(
                "unscaling the gradients: {}",
                message.to_string_lossy()
            )));
        }
        Ok(())
    }

    /// The current step's flag on the device: a 0-dim float32 tensor, 1 when the gradients
    /// unscaled in this step held an infinity or a NaN (the update is skipped), else 0.
    /// `None` before the first [`GradScaler::unscale`].
    pub fn found_inf(&self) -> Option<Tensor> {
        self.live.as_ref().and_then(|l| l.found_inf.f_view([]).ok())
    }

    /// Ends the step on the device: backs off after a non-finite step (counted as skipped),
    /// grows after `growth_interval` good steps in a row (PyTorch's `_amp_update_scale_`).
    pub fn update(&mut self) -> Result<(), TchError> {
        let (growth, backoff, interval) = (
            self.growth_factor,
            self.backoff_factor,
            self.growth_interval as i64,
        );
        let Some(live) = self.live.as_mut() else {
            return Ok(());
        };
        let _ = live.scale.f_internal_amp_update_scale_(
            &live.growth_tracker,
            &live.found_inf,
            growth,
            backoff,
            interval,
        )?;
        let _ = live.skipped.f_add_(&live.found_inf)?;
        let _ = live.found_inf.f_zero_()?;
        Ok(())
    }

    /// Brings the host fields up to date with the device state (one counted read, see
    /// [`crate::sync`]); nothing to do before the first step.
    pub fn sync(&mut self) -> Result<(), TchError> {
        let Some(live) = &self.live else {
            return Ok(());
        };
        let values = crate::sync::read(&Tensor::f_cat(
            &[
                live.scale.f_to_kind(Kind::Double)?,
                live.growth_tracker.f_to_kind(Kind::Double)?,
                live.skipped.shallow_clone(),
            ],
            0,
        )?)?;
        if let [scale, tracker, skipped] = values[..] {
            self.scale = scale;
            self.growth_tracker = tracker as u64;
            self.skipped_steps = skipped as u64;
        }
        Ok(())
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        if let Some(d) = self.device {
            // SAFETY: as above; restores the state set in `new`.
            unsafe { tessera_autocast_set(d, 0, 0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    #[test]
    fn fp16_autocast_runs_matmul_in_half_on_cpu() {
        let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        {
            let _g = AutocastGuard::new(Precision::AmpFp16, Device::Cpu);
            assert_eq!(a.matmul(&a).kind(), Kind::Half);
        }
        assert_eq!(a.matmul(&a).kind(), Kind::Float);
    }

    #[test]
    fn the_scale_backs_off_on_inf_and_grows_after_the_interval() {
        let mut s = GradScaler {
            growth_interval: 3,
            ..GradScaler::default()
        };
        let p = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let backward = |s: &mut GradScaler, value: f64| {
            let loss = (&p * value).sum(Kind::Float);
            s.scale_loss(&loss).unwrap().backward();
        };
        let found = |s: &GradScaler| f64::try_from(s.found_inf().unwrap()).unwrap();
        // A finite step: the gradient comes back unscaled, the step counts towards growth.
        backward(&mut s, 3.0);
        s.unscale([&p].into_iter()).unwrap();
        assert_eq!(found(&s), 0.0);
        assert_eq!(Vec::<f32>::try_from(p.grad()).unwrap(), [3.0, 3.0]);
        s.update().unwrap();
        s.sync().unwrap();
        assert_eq!((s.scale, s.growth_tracker), (65536.0, 1));
        // An overflowing step: found, skipped, the scale halves and the tracker resets.
        let _ = p.grad().zero_();
        backward(&mut s, f64::INFINITY);
        s.unscale([&p].into_iter()).unwrap();
        assert_eq!(found(&s), 1.0);
        s.update().unwrap();
        s.sync().unwrap();
        assert_eq!(
            (s.scale, s.growth_tracker, s.skipped_steps),
            (32768.0, 0, 1)
        );
        assert_eq!(found(&s), 0.0);
        // Three good steps in a row: the scale doubles.
        for _ in 0..3 {
            let _ = p.grad().zero_();
            backward(&mut s, 1.0);
            s.unscale([&p].into_iter()).unwrap();
            s.update().unwrap();
        }
        s.sync().unwrap();
        assert_eq!((s.scale, s.growth_tracker), (65536.0, 0));
        // A copy (a checkpoint's) starts its device state from the synced fields.
        let mut copy = s.clone();
        assert_eq!(copy, s);
        let loss = Tensor::from(2.0f32);
        assert_eq!(
            f64::try_from(copy.scale_loss(&loss).unwrap()).unwrap(),
            131072.0
        );
    }

    #[test]
    fn bf16_autocast_runs_matmul_in_bf16_on_cpu() {
        let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        {
            let _g = AutocastGuard::new(Precision::AmpBf16, Device::Cpu);
            assert_eq!(a.matmul(&a).kind(), Kind::BFloat16);
        }
        assert_eq!(a.matmul(&a).kind(), Kind::Float);
        let _g = AutocastGuard::new(Precision::Fp32, Device::Cpu);
        assert_eq!(a.matmul(&a).kind(), Kind::Float);
    }
}
