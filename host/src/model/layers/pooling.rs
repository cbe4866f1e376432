//! Pooling over the spatial dimensions.

use tch::{TchError, Tensor};

use super::{Attr, Layer};

/// Max pooling with a square window (PyTorch `MaxPool2d`).
#[derive(Debug)]
pub struct MaxPool2d {
    kernel_size: i64,
    stride: i64,
    padding: i64,
}

impl MaxPool2d {
    /// A `kernel_size` × `kernel_size` window moved by `stride`, no padding.
    pub fn new(kernel_size: i64, stride: i64) -> MaxPool2d {
        MaxPool2d::padded(kernel_size, stride, 0)
    }

    /// The same with `padding` (implicit −∞) on every side, as torchvision's ResNet stem
    /// (`MaxPool2d(3, 2, 1)`).
    pub fn padded(kernel_size: i64, stride: i64, padding: i64) -> MaxPool2d {
        MaxPool2d {
            kernel_size,
            stride,
            padding,
        }
    }
}

impl Layer for MaxPool2d {
    fn kind(&self) -> &str {
        "max_pool2d"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("kernel_size", Attr::Int(self.kernel_size)),
            ("stride", Attr::Int(self.stride)),
            ("padding", Attr::Int(self.padding)),
        ]
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_max_pool2d(
            [self.kernel_size, self.kernel_size],
            [self.stride, self.stride],
            [self.padding, self.padding],
            [1, 1],
            false,
        )
    }
}

/// Mean over the spatial dimensions, then flatten: `(N, C, H, W) -> (N, C)`.
#[derive(Debug)]
pub struct GlobalAvgPool;

impl Layer for GlobalAvgPool {
    fn kind(&self) -> &str {
        "global_avg_pool"
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_mean_dim(&[-2i64, -1][..], false, None)
    }
}

/// Maximum over the spatial dimensions, then flatten: `(N, C, H, W) -> (N, C)`. On airbench's
/// last 3×3 feature map (28×28 and 32×32 inputs) this is its `MaxPool2d(3)` + flatten.
#[derive(Debug)]
pub struct GlobalMaxPool;

impl Layer for GlobalMaxPool {
    fn kind(&self) -> &str {
        "global_max_pool"
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_amax(&[-2i64, -1][..], false)
    }
}
