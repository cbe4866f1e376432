//! Activation functions and a constant scale.

use tch::{TchError, Tensor};

use super::{Attr, Layer};

/// Rectified linear unit (PyTorch `ReLU`).
#[derive(Debug)]
pub struct Relu;

impl Layer for Relu {
    fn kind(&self) -> &str {
        "relu"
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_relu()
    }
}

/// Gaussian error linear unit, exact (erf) form (PyTorch `GELU()`, `approximate="none"`).
#[derive(Debug)]
pub struct Gelu;

impl Layer for Gelu {
    fn kind(&self) -> &str {
        "gelu"
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_gelu("none")
    }
}

/// Multiplies by a constant (airbench's `Mul`): no tensors, the factor is an attribute.
#[derive(Debug)]
pub struct Mul {
    factor: f64,
}

impl Mul {
    /// Multiplies its input by `factor`.
    pub fn new(factor: f64) -> Mul {
        Mul { factor }
    }
}

impl Layer for Mul {
    fn kind(&self) -> &str {
        "mul"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![("factor", Attr::Float(self.factor))]
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_mul_scalar(self.factor)
    }
}
