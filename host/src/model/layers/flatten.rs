//! Flattening to one feature dimension.

use tch::{TchError, Tensor};

use super::Layer;

/// Flattens all but the batch dimension (PyTorch `Flatten`).
#[derive(Debug)]
pub struct Flatten;

impl Layer for Flatten {
    fn kind(&self) -> &str {
        "flatten"
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_flatten(1, -1)
    }
}
