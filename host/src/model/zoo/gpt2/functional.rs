//! What GPT-2's layers compute with: Hugging Face's `Conv1D`, dropout, and the init of their
//! weights.

use tch::{nn::Init, TchError, Tensor};

use crate::model::zoo::transformer::normal;
use crate::model::Gpt2Config;

/// Hugging Face's `initializer_range`: the standard deviation of every weight's normal init.
pub(super) const INIT_STD: f64 = 0.02;

/// Hugging Face's `Conv1D`: `x @ weight + bias` over the last dimension, `weight` `(in, out)`,
/// computed as its `addmm` is.
pub(super) fn conv1d(xs: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor, TchError> {
    let mut size = xs.size();
    let nx = size.pop().unwrap_or(0);
    size.push(weight.size().last().copied().unwrap_or(0));
    bias.f_addmm(&xs.f_reshape([-1, nx])?, weight)?
        .f_reshape(size.as_slice())
}

/// Dropout with probability `p` in training, the identity otherwise.
pub(super) fn dropout(xs: Tensor, p: f64, train: bool) -> Result<Tensor, TchError> {
    if train && p > 0.0 {
        xs.f_dropout(p, true)
    } else {
        Ok(xs)
    }
}

/// Hugging Face's init of every `c_proj.weight`: normal(0, 0.02 / sqrt(2 n_layer)).
pub(super) fn proj_init(config: &Gpt2Config) -> Init {
    normal(INIT_STD / (2.0 * config.n_layer as f64).sqrt())
}
