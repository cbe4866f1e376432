//! The ResNet bottleneck block as torchvision writes it (ResNet-50 and deeper): 1×1, 3×3 (with
//! the stride, "ResNet v1.5"), 1×1 to four times the width, and a shortcut.

use tch::{nn::Init, TchError, Tensor};

use super::residual_block::projection;
use super::{Attr, BatchNorm2d, Conv2d, Conv2dConfig, Layer};
use crate::model::{tree::join, ParamStore};

/// How much wider a bottleneck block's output is than its inner width (torchvision's
/// `Bottleneck.expansion`).
pub const EXPANSION: i64 = 4;

/// `relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + downsample(x))`, with
/// `downsample` the identity or, when the block changes the stride or the width, a projection
/// (1×1 conv + batch norm). Children named as torchvision's `Bottleneck`.
#[derive(Debug)]
pub struct Bottleneck {
    in_channels: i64,
    width: i64,
    stride: i64,
    conv1: Box<dyn Layer>,
    bn1: Box<dyn Layer>,
    conv2: Box<dyn Layer>,
    bn2: Box<dyn Layer>,
    conv3: Box<dyn Layer>,
    bn3: Box<dyn Layer>,
    downsample: Option<Box<dyn Layer>>,
}

impl Bottleneck {
    /// A block from `in_channels` to `width · 4` channels whose 3×3 convolution has `stride`;
    /// its tensors join `store` under `path` (`{path}.conv1.weight`, ...,
    /// `{path}.downsample.0.weight`), convolution weights drawn from `init`.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        in_channels: i64,
        width: i64,
        stride: i64,
        init: Init,
    ) -> Result<Bottleneck, TchError> {
        let out = width * EXPANSION;
        let config = |stride, padding| Conv2dConfig {
            stride,
            padding,
            bias: false,
            ..Conv2dConfig::default()
        };
        let at = |name| join(path, name);
        let conv1 = Conv2d::new(
            store,
            &at("conv1"),
            in_channels,
            width,
            1,
            config(1, 0),
            init,
        )?;
        let bn1 = BatchNorm2d::new(store, &at("bn1"), width)?;
        let conv2 = Conv2d::new(
            store,
            &at("conv2"),
            width,
            width,
            3,
            config(stride, 1),
            init,
        )?;
        let bn2 = BatchNorm2d::new(store, &at("bn2"), width)?;
        let conv3 = Conv2d::new(store, &at("conv3"), width, out, 1, config(1, 0), init)?;
        let bn3 = BatchNorm2d::new(store, &at("bn3"), out)?;
        let downsample: Option<Box<dyn Layer>> = if stride != 1 || in_channels != out {
            let path = at("downsample");
            Some(Box::new(projection(
                store,
                &path,
                in_channels,
                out,
                stride,
                init,
            )?))
        } else {
            None
        };
        Ok(Bottleneck {
            in_channels,
            width,
            stride,
            conv1: Box::new(conv1),
            bn1: Box::new(bn1),
            conv2: Box::new(conv2),
            bn2: Box::new(bn2),
            conv3: Box::new(conv3),
            bn3: Box::new(bn3),
            downsample,
        })
    }
}

impl Layer for Bottleneck {
    fn kind(&self) -> &str {
        "bottleneck_block"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("in_channels", Attr::Int(self.in_channels)),
            ("width", Attr::Int(self.width)),
            ("out_channels", Attr::Int(self.width * EXPANSION)),
            ("stride", Attr::Int(self.stride)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        let mut children: Vec<(&str, &dyn Layer)> = vec![
            ("conv1", self.conv1.as_ref()),
            ("bn1", self.bn1.as_ref()),
            ("conv2", self.conv2.as_ref()),
            ("bn2", self.bn2.as_ref()),
            ("conv3", self.conv3.as_ref()),
            ("bn3", self.bn3.as_ref()),
        ];
        if let Some(d) = &self.downsample {
            children.push(("downsample", d.as_ref()));
        }
        children
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "conv1" => Some(&mut self.conv1),
            "bn1" => Some(&mut self.bn1),
            "conv2" => Some(&mut self.conv2),
            "bn2" => Some(&mut self.bn2),
            "conv3" => Some(&mut self.conv3),
            "bn3" => Some(&mut self.bn3),
            "downsample" => self.downsample.as_mut(),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let out = self.conv1.forward(xs, train)?;
        let out = self.bn1.forward(&out, train)?.f_relu()?;
        let out = self.conv2.forward(&out, train)?;
        let out = self.bn2.forward(&out, train)?.f_relu()?;
        let out = self.conv3.forward(&out, train)?;
        let out = self.bn3.forward(&out, train)?;
        let identity = match &self.downsample {
            Some(d) => d.forward(xs, train)?,
            None => xs.shallow_clone(),
        };
        out.f_add(&identity)?.f_relu()
    }
}
