//! Normalization over features or channel groups (PyTorch `LayerNorm`, `GroupNorm`): no running
//! statistics, the same computation in training and evaluation.

use tch::{nn::Init, TchError, Tensor};

use super::{Attr, Layer};
use crate::model::{tree::join, ParamStore};

/// PyTorch's default epsilon for both norms.
const EPS: f64 = 1e-5;

/// Normalizes each sample over its last dimension, then scales and shifts it (PyTorch
/// `LayerNorm(normalized_shape)` with one normalized dimension, `elementwise_affine=True`).
#[derive(Debug)]
pub struct LayerNorm {
    /// Scale, `(normalized_shape)`.
    weight: Tensor,
    /// Shift, `(normalized_shape)`.
    bias: Tensor,
    normalized_shape: i64,
    eps: f64,
}

impl LayerNorm {
    /// A layer norm over a last dimension of `normalized_shape` features whose tensors join
    /// `store` as `{path}.weight` (ones) and `{path}.bias` (zeros), as PyTorch initialises them.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        normalized_shape: i64,
    ) -> Result<LayerNorm, TchError> {
        LayerNorm::with_eps(store, path, normalized_shape, EPS)
    }

    /// As [`LayerNorm::new`], with epsilon `eps` instead of PyTorch's default 1e-5.
    pub fn with_eps(
        store: &mut ParamStore,
        path: &str,
        normalized_shape: i64,
        eps: f64,
    ) -> Result<LayerNorm, TchError> {
        let shape = [normalized_shape];
        Ok(LayerNorm {
            weight: store.parameter(join(path, "weight"), &shape, Init::Const(1.0))?,
            bias: store.parameter(join(path, "bias"), &shape, Init::Const(0.0))?,
            normalized_shape,
            eps,
        })
    }
}

impl Layer for LayerNorm {
    fn kind(&self) -> &str {
        "layer_norm"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("normalized_shape", Attr::Int(self.normalized_shape)),
            ("eps", Attr::Float(self.eps)),
            ("elementwise_affine", Attr::Bool(true)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![("weight", &self.weight), ("bias", &self.bias)]
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        Tensor::f_layer_norm(
            xs,
            [self.normalized_shape],
            Some(&self.weight),
            Some(&self.bias),
            self.eps,
            true,
        )
    }
}

/// Normalizes each sample over groups of channels, then scales and shifts each channel
/// (PyTorch `GroupNorm(num_groups, num_channels)`, `affine=True`; Wu & He 2018).
#[derive(Debug)]
pub struct GroupNorm {
    /// Scale, `(num_channels)`.
    weight: Tensor,
    /// Shift, `(num_channels)`.
    bias: Tensor,
    num_groups: i64,
    num_channels: i64,
    eps: f64,
}

impl GroupNorm {
    /// A group norm of `num_channels` channels in `num_groups` groups (which must divide it)
    /// whose tensors join `store` as `{path}.weight` (ones) and `{path}.bias` (zeros).
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        num_groups: i64,
        num_channels: i64,
    ) -> Result<GroupNorm, TchError> {
        if num_groups < 1 || num_channels % num_groups != 0 {
            return Err(TchError::Shape(format!(
                "group norm `{path}`: {num_groups} groups do not divide {num_channels} channels"
            )));
        }
        let shape = [num_channels];
        Ok(GroupNorm {
            weight: store.parameter(join(path, "weight"), &shape, Init::Const(1.0))?,
            bias: store.parameter(join(path, "bias"), &shape, Init::Const(0.0))?,
            num_groups,
            num_channels,
            eps: EPS,
        })
    }
}

impl Layer for GroupNorm {
    fn kind(&self) -> &str {
        "group_norm"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("num_groups", Attr::Int(self.num_groups)),
            ("num_channels", Attr::Int(self.num_channels)),
            ("eps", Attr::Float(self.eps)),
            ("affine", Attr::Bool(true)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![("weight", &self.weight), ("bias", &self.bias)]
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        Tensor::f_group_norm(
            xs,
            self.num_groups,
            Some(&self.weight),
            Some(&self.bias),
            self.eps,
            true,
        )
    }
}
