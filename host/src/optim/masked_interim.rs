//! Interim `step_masked` until the fused optimizer lands (reads the flag on the host).
use tch::{TchError, Tensor};

use super::Optimizer;

impl Optimizer {
    /// Applies one update unless `found_inf` (a 0-dim device flag) is 1.
    pub fn step_masked(&mut self, found_inf: Option<&Tensor>) -> Result<(), TchError> {
        match found_inf {
            Some(f) if crate::sync::read_one(f)? > 0.0 => {
                self.skip_step();
                Ok(())
            }
            _ => self.step(),
        }
    }
}
