//! A 2-d convolution's hyperparameters.

use tch::Tensor;

use crate::{Error, ModuleInfo};

/// A 2-d convolution's hyperparameters, as the module tree gives them (square kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvSpec {
    /// Input channels.
    pub in_channels: i64,
    /// Output channels.
    pub out_channels: i64,
    /// Kernel side.
    pub kernel_size: i64,
    /// Stride.
    pub stride: i64,
    /// Zero padding on each side.
    pub padding: i64,
    /// Groups.
    pub groups: i64,
}

impl ConvSpec {
    /// The hyperparameters of the conv `info` (`stride` 1, `padding` 0 and `groups` 1 when it
    /// has none); an error naming the module when a channel count or the kernel is missing.
    pub fn of(info: &ModuleInfo) -> Result<ConvSpec, Error> {
        Ok(ConvSpec {
            in_channels: info.int_attr("in_channels", None)?,
            out_channels: info.int_attr("out_channels", None)?,
            kernel_size: info.int_attr("kernel_size", None)?,
            stride: info.int_attr("stride", Some(1))?,
            padding: info.int_attr("padding", Some(0))?,
            groups: info.int_attr("groups", Some(1))?,
        })
    }

    /// The attributes a module with these hyperparameters shows in the module tree.
    pub fn attrs(&self) -> Vec<(String, f64)> {
        [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("kernel_size", self.kernel_size),
            ("stride", self.stride),
            ("padding", self.padding),
            ("groups", self.groups),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v as f64))
        .collect()
    }

    /// The weight's shape, `(out, in / groups, k, k)`.
    pub fn weight_shape(&self) -> [i64; 4] {
        [
            self.out_channels,
            self.in_channels / self.groups.max(1),
            self.kernel_size,
            self.kernel_size,
        ]
    }

    /// The convolution of `input` with `weight` and `bias`.
    pub fn conv2d(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Tensor, Error> {
        Ok(input.f_conv2d(
            weight,
            bias,
            [self.stride, self.stride],
            [self.padding, self.padding],
            [1, 1],
            self.groups,
        )?)
    }
}
