//! Dropout (PyTorch `Dropout(p)`).

use tch::{TchError, Tensor};

use super::{Attr, Layer};

/// In training, zeroes each element with probability `p` (libtorch's generator, seeded by the
/// run's `seed`) and scales the others by `1 / (1 − p)`; the identity in evaluation.
#[derive(Debug)]
pub struct Dropout {
    p: f64,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1)`.
    pub fn new(p: f64) -> Dropout {
        Dropout { p }
    }
}

impl Layer for Dropout {
    fn kind(&self) -> &str {
        "dropout"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![("p", Attr::Float(self.p))]
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        if train && self.p > 0.0 {
            xs.f_dropout(self.p, true)
        } else {
            Ok(xs.shallow_clone())
        }
    }
}
