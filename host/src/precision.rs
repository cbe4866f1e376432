//! Mixed precision (`fp32`, `amp_bf16`): autocast on CPU or CUDA through a small C++ shim (tch's own `autocast`
//! drives CUDA only).

use serde::Serialize;
use tch::Device;

/// Numeric precision of training (`train.precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Plain 32-bit floats (default).
    #[default]
    Fp32,
    /// Automatic mixed precision with bfloat16.
    AmpBf16,
}

impl Precision {
    /// Every precision with the name used in `trainer.toml`.
    pub const CHOICES: [(&'static str, Precision); 2] =
        [("fp32", Precision::Fp32), ("amp_bf16", Precision::AmpBf16)];

    /// The name used in `trainer.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::AmpBf16 => "amp_bf16",
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
    /// Turns autocast on for `device` when `precision` is `amp_bf16`; does nothing for `fp32`.
    pub fn new(precision: Precision, device: Device) -> AutocastGuard {
        let device = match (precision, device) {
            (Precision::Fp32, _) => None,
            (Precision::AmpBf16, Device::Cuda(_)) => Some(1),
            (Precision::AmpBf16, _) => Some(0),
        };
        if let Some(d) = device {
            // SAFETY: plain C call into libtorch's thread-local autocast state.
            unsafe { tessera_autocast_set(d, 1, 0) };
        }
        AutocastGuard { device }
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
