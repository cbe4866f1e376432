//! Mixed precision (`fp32`, `amp_bf16`, `amp_fp16`): autocast on CPU or CUDA through a small C++
//! shim (tch's own `autocast` drives CUDA only), and for `amp_fp16` dynamic loss scaling
//! ([`GradScaler`], PyTorch's `torch.amp.GradScaler`).

use serde::{Deserialize, Serialize};
use tch::{Device, TchError, Tensor};

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Whether the gradients unscaled in the current step held an infinity or a NaN.
    #[serde(skip)]
    found_inf: bool,
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
            found_inf: false,
        }
    }
}

impl GradScaler {
    /// `loss · scale`, the tensor to run the backward pass on.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor, TchError> {
        loss.f_mul_scalar(self.scale)
    }

    /// Divides every defined gradient of `params` by the scale in place (multiplying by the
    /// float32 reciprocal, as PyTorch does) and records whether any held an infinity or a NaN.
    pub fn unscale<'a>(
        &mut self,
        params: impl Iterator<Item = &'a Tensor>,
    ) -> Result<(), TchError> {
        let inverse = f64::from((1.0 / self.scale) as f32);
        let _guard = tch::no_grad_guard();
        for p in params {
            let mut g = p.grad();
            if !g.defined() {
                continue;
            }
            if !self.found_inf && g.f_isfinite()?.f_all()?.f_int64_value(&[])? == 0 {
                self.found_inf = true;
            }
            let _ = g.f_mul_scalar_(inverse)?;
        }
        Ok(())
    }

    /// Whether the current step's gradients held an infinity or a NaN (its update is skipped).
    pub fn found_inf(&self) -> bool {
        self.found_inf
    }

    /// Ends the step: backs off after a non-finite step (counted as skipped), grows after
    /// `growth_interval` good steps in a row (PyTorch's `_amp_update_scale_`).
    pub fn update(&mut self) {
        if std::mem::take(&mut self.found_inf) {
            self.scale *= self.backoff_factor;
            self.growth_tracker = 0;
            self.skipped_steps += 1;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.growth_interval {
                self.scale *= self.growth_factor;
                self.growth_tracker = 0;
            }
        }
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
        let backward = |s: &GradScaler, value: f64| {
            let loss = (&p * value).sum(Kind::Float);
            s.scale_loss(&loss).unwrap().backward();
        };
        // A finite step: the gradient comes back unscaled, the step counts towards growth.
        backward(&s, 3.0);
        s.unscale([&p].into_iter()).unwrap();
        assert!(!s.found_inf());
        assert_eq!(Vec::<f32>::try_from(p.grad()).unwrap(), [3.0, 3.0]);
        s.update();
        assert_eq!((s.scale, s.growth_tracker), (65536.0, 1));
        // An overflowing step: found, skipped, the scale halves and the tracker resets.
        let _ = p.grad().zero_();
        backward(&s, f64::INFINITY);
        s.unscale([&p].into_iter()).unwrap();
        assert!(s.found_inf());
        s.update();
        assert_eq!(
            (s.scale, s.growth_tracker, s.skipped_steps),
            (32768.0, 0, 1)
        );
        assert!(!s.found_inf());
        // Three good steps in a row: the scale doubles.
        for _ in 0..3 {
            let _ = p.grad().zero_();
            backward(&s, 1.0);
            s.unscale([&p].into_iter()).unwrap();
            s.update();
        }
        assert_eq!((s.scale, s.growth_tracker), (65536.0, 0));
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
