//! Activation functions.

use tch::{TchError, Tensor};

use super::Layer;

/// Rectified linear unit (PyTorch `ReLU`).
#[derive(Debug)]
pub struct Relu;

impl Layer for Relu {
    fn kind(&self) -> &str {
        "relu"
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_relu()
    }
}
