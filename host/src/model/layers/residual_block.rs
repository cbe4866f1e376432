//! The ResNet basic block (He et al. 2016): two 3×3 convolutions with batch norm and a
//! shortcut.

use tch::{nn::Init, TchError, Tensor};

use super::{Attr, BatchNorm2d, Conv2d, Conv2dConfig, Layer, Sequential};
use crate::model::{tree::join, ParamStore};

/// `relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`, where the shortcut is the identity
/// or, when the block changes the stride or the width, a projection (1×1 conv + batch norm,
/// option B of the paper). Its children can be replaced by surgery like any other layer. The
/// projection is the child `shortcut` in the CIFAR ResNets and `downsample` in torchvision's
/// (`ResidualBlock::torchvision`), so each model keeps its PyTorch names.
#[derive(Debug)]
pub struct ResidualBlock {
    in_channels: i64,
    out_channels: i64,
    stride: i64,
    conv1: Box<dyn Layer>,
    bn1: Box<dyn Layer>,
    conv2: Box<dyn Layer>,
    bn2: Box<dyn Layer>,
    shortcut: Option<Box<dyn Layer>>,
    shortcut_name: &'static str,
}

/// The projection shortcut at `path`: `0` a 1×1 convolution with `stride`, `1` batch norm.
pub(super) fn projection(
    store: &mut ParamStore,
    path: &str,
    in_channels: i64,
    out_channels: i64,
    stride: i64,
    init: Init,
) -> Result<Sequential, TchError> {
    let config = Conv2dConfig {
        stride,
        padding: 0,
        bias: false,
        ..Conv2dConfig::default()
    };
    let conv = Conv2d::new(
        store,
        &join(path, "0"),
        in_channels,
        out_channels,
        1,
        config,
        init,
    )?;
    let bn = BatchNorm2d::new(store, &join(path, "1"), out_channels)?;
    Ok(Sequential::new().add("0", conv).add("1", bn))
}

impl ResidualBlock {
    /// A block from `in_channels` to `out_channels` whose first convolution has `stride`; its
    /// tensors join `store` under `path` (`{path}.conv1.weight`, ..., `{path}.shortcut.0.weight`),
    /// convolution weights drawn from `init`.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        in_channels: i64,
        out_channels: i64,
        stride: i64,
        init: Init,
    ) -> Result<ResidualBlock, TchError> {
        Self::build(
            store,
            path,
            in_channels,
            out_channels,
            stride,
            init,
            "shortcut",
        )
    }

    /// torchvision's `BasicBlock`: the same, its projection named `downsample`.
    pub fn torchvision(
        store: &mut ParamStore,
        path: &str,
        in_channels: i64,
        out_channels: i64,
        stride: i64,
        init: Init,
    ) -> Result<ResidualBlock, TchError> {
        Self::build(
            store,
            path,
            in_channels,
            out_channels,
            stride,
            init,
            "downsample",
        )
    }

    fn build(
        store: &mut ParamStore,
        path: &str,
        in_channels: i64,
        out_channels: i64,
        stride: i64,
        init: Init,
        shortcut_name: &'static str,
    ) -> Result<ResidualBlock, TchError> {
        let conv = |stride, padding| Conv2dConfig {
            stride,
            padding,
            bias: false,
            ..Conv2dConfig::default()
        };
        let (cin, cout) = (in_channels, out_channels);
        let conv1 = Conv2d::new(
            store,
            &join(path, "conv1"),
            cin,
            cout,
            3,
            conv(stride, 1),
            init,
        )?;
        let bn1 = BatchNorm2d::new(store, &join(path, "bn1"), cout)?;
        let conv2 = Conv2d::new(store, &join(path, "conv2"), cout, cout, 3, conv(1, 1), init)?;
        let bn2 = BatchNorm2d::new(store, &join(path, "bn2"), cout)?;
        let shortcut: Option<Box<dyn Layer>> = if stride != 1 || cin != cout {
            let path = join(path, shortcut_name);
            Some(Box::new(projection(store, &path, cin, cout, stride, init)?))
        } else {
            None
        };
        Ok(ResidualBlock {
            in_channels,
            out_channels,
            stride,
            conv1: Box::new(conv1),
            bn1: Box::new(bn1),
            conv2: Box::new(conv2),
            bn2: Box::new(bn2),
            shortcut,
            shortcut_name,
        })
    }
}

impl Layer for ResidualBlock {
    fn kind(&self) -> &str {
        "residual_block"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("in_channels", Attr::Int(self.in_channels)),
            ("out_channels", Attr::Int(self.out_channels)),
            ("stride", Attr::Int(self.stride)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        let mut children: Vec<(&str, &dyn Layer)> = vec![
            ("conv1", self.conv1.as_ref()),
            ("bn1", self.bn1.as_ref()),
            ("conv2", self.conv2.as_ref()),
            ("bn2", self.bn2.as_ref()),
        ];
        if let Some(shortcut) = &self.shortcut {
            children.push((self.shortcut_name, shortcut.as_ref()));
        }
        children
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "conv1" => Some(&mut self.conv1),
            "bn1" => Some(&mut self.bn1),
            "conv2" => Some(&mut self.conv2),
            "bn2" => Some(&mut self.bn2),
            n if n == self.shortcut_name => self.shortcut.as_mut(),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let out = self.conv1.forward(xs, train)?;
        let out = self.bn1.forward(&out, train)?.f_relu()?;
        let out = self.conv2.forward(&out, train)?;
        let out = self.bn2.forward(&out, train)?;
        let shortcut = match &self.shortcut {
            Some(shortcut) => shortcut.forward(xs, train)?,
            None => xs.shallow_clone(),
        };
        out.f_add(&shortcut)?.f_relu()
    }
}
