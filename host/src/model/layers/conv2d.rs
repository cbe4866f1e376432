//! 2-D convolution (PyTorch `Conv2d`).

use tch::{nn::Init, TchError, Tensor};

use super::{init::torch_default_bias, Attr, Layer};
use crate::model::{tree::join, ParamStore};

/// A convolution's stride, padding, groups and bias; the defaults are PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dConfig {
    /// Stride in both dimensions.
    pub stride: i64,
    /// Zero padding on each side.
    pub padding: i64,
    /// Groups (`in_channels` and `out_channels` must be multiples of it).
    pub groups: i64,
    /// Whether the convolution adds a bias.
    pub bias: bool,
}

impl Default for Conv2dConfig {
    fn default() -> Self {
        Conv2dConfig {
            stride: 1,
            padding: 0,
            groups: 1,
            bias: true,
        }
    }
}

/// 2-D convolution with a square kernel.
#[derive(Debug)]
pub struct Conv2d {
    /// `(out, in/groups, kh, kw)`.
    weight: Tensor,
    /// `(out)` when the convolution has a bias.
    bias: Option<Tensor>,
    in_channels: i64,
    out_channels: i64,
    kernel_size: i64,
    config: Conv2dConfig,
}

impl Conv2d {
    /// A convolution whose tensors join `store` as `{path}.weight` (drawn from `init`) and
    /// `{path}.bias` (PyTorch's default bias init).
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        in_channels: i64,
        out_channels: i64,
        kernel_size: i64,
        config: Conv2dConfig,
        init: Init,
    ) -> Result<Conv2d, TchError> {
        let fan_in = in_channels / config.groups * kernel_size * kernel_size;
        let weight = store.parameter(
            join(path, "weight"),
            &[
                out_channels,
                in_channels / config.groups,
                kernel_size,
                kernel_size,
            ],
            init,
        )?;
        let bias = if config.bias {
            Some(store.parameter(
                join(path, "bias"),
                &[out_channels],
                torch_default_bias(fan_in),
            )?)
        } else {
            None
        };
        Ok(Conv2d {
            weight,
            bias,
            in_channels,
            out_channels,
            kernel_size,
            config,
        })
    }
}

impl Layer for Conv2d {
    fn kind(&self) -> &str {
        "conv2d"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("in_channels", Attr::Int(self.in_channels)),
            ("out_channels", Attr::Int(self.out_channels)),
            ("kernel_size", Attr::Int(self.kernel_size)),
            ("stride", Attr::Int(self.config.stride)),
            ("padding", Attr::Int(self.config.padding)),
            ("groups", Attr::Int(self.config.groups)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        let mut tensors = vec![("weight", &self.weight)];
        if let Some(bias) = &self.bias {
            tensors.push(("bias", bias));
        }
        tensors
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        let Conv2dConfig {
            stride,
            padding,
            groups,
            ..
        } = self.config;
        xs.f_conv2d(
            &self.weight,
            self.bias.as_ref(),
            [stride, stride],
            [padding, padding],
            [1, 1],
            groups,
        )
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;
    use crate::model::layers::init::TORCH_DEFAULT_WEIGHT;

    #[test]
    fn a_grouped_conv_with_bias_registers_pytorch_shapes_and_adds_the_bias() {
        let mut store = ParamStore::new(Device::Cpu);
        let config = Conv2dConfig {
            groups: 2,
            ..Conv2dConfig::default()
        };
        let conv = Conv2d::new(&mut store, "c", 4, 6, 3, config, TORCH_DEFAULT_WEIGHT).unwrap();
        let names: Vec<&str> = conv.tensors().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["weight", "bias"]);
        assert_eq!(store.get("c.weight").unwrap().tensor.size(), [6, 2, 3, 3]);
        assert_eq!(store.get("c.bias").unwrap().tensor.size(), [6]);
        // Zero weights: the output is the bias, broadcast over the positions.
        let _ = tch::no_grad(|| conv.weight.shallow_clone().zero_());
        let out = conv
            .forward(
                &Tensor::ones([1, 4, 5, 5], (Kind::Float, Device::Cpu)),
                false,
            )
            .unwrap();
        assert_eq!(out.size(), [1, 6, 3, 3]);
        let expected = conv
            .bias
            .as_ref()
            .unwrap()
            .view([1, 6, 1, 1])
            .expand_as(&out);
        assert!(out.equal(&expected));
    }
}
