//! airbench's `ConvGroup` (Keller Jordan's cifar10-airbench): two 3×3 convolutions, a 2×2
//! max-pool after the first, batch norms and GELUs.

use tch::{nn::Init, TchError, Tensor};

use super::{Attr, BatchNorm2d, Conv2d, Conv2dConfig, Gelu, Layer, MaxPool2d};
use crate::model::{tree::join, ParamStore};

/// `activ(norm2(conv2(activ(norm1(pool(conv1(x)))))))`: `conv1` (`in → out`) and `conv2`
/// (`out → out`) are 3×3, padding 1, without bias; `pool` is `MaxPool2d(2)`; `norm1`, `norm2`
/// are batch norms with the momentum and epsilon given; `activ` is GELU. Children are named and
/// ordered as airbench's PyTorch module registers them (`conv1`, `pool`, `norm1`, `conv2`,
/// `norm2`, `activ`), so the `state_dict` names match, and each can be replaced by surgery.
#[derive(Debug)]
pub struct ConvGroup {
    in_channels: i64,
    out_channels: i64,
    conv1: Box<dyn Layer>,
    pool: Box<dyn Layer>,
    norm1: Box<dyn Layer>,
    conv2: Box<dyn Layer>,
    norm2: Box<dyn Layer>,
    activ: Box<dyn Layer>,
}

/// The batch-norm settings of a [`ConvGroup`] (PyTorch's convention for `momentum`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupNorms {
    /// Weight of the new batch's statistics in the running ones.
    pub momentum: f64,
    /// Added to the variance.
    pub eps: f64,
}

impl ConvGroup {
    /// A group from `in_channels` to `out_channels` whose tensors join `store` under `path`
    /// (`{path}.conv1.weight`, `{path}.norm1.bias`, ...), convolution weights drawn from `init`.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        in_channels: i64,
        out_channels: i64,
        norms: GroupNorms,
        init: Init,
    ) -> Result<ConvGroup, TchError> {
        let config = Conv2dConfig {
            padding: 1,
            bias: false,
            ..Conv2dConfig::default()
        };
        let (cin, cout) = (in_channels, out_channels);
        let norm = |store: &mut ParamStore, name: &str| {
            BatchNorm2d::with_settings(store, &join(path, name), cout, norms.momentum, norms.eps)
        };
        let conv1 = Conv2d::new(store, &join(path, "conv1"), cin, cout, 3, config, init)?;
        let norm1 = norm(store, "norm1")?;
        let conv2 = Conv2d::new(store, &join(path, "conv2"), cout, cout, 3, config, init)?;
        let norm2 = norm(store, "norm2")?;
        Ok(ConvGroup {
            in_channels,
            out_channels,
            conv1: Box::new(conv1),
            pool: Box::new(MaxPool2d::new(2, 2)),
            norm1: Box::new(norm1),
            conv2: Box::new(conv2),
            norm2: Box::new(norm2),
            activ: Box::new(Gelu),
        })
    }
}

impl Layer for ConvGroup {
    fn kind(&self) -> &str {
        "conv_group"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("in_channels", Attr::Int(self.in_channels)),
            ("out_channels", Attr::Int(self.out_channels)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("conv1", self.conv1.as_ref()),
            ("pool", self.pool.as_ref()),
            ("norm1", self.norm1.as_ref()),
            ("conv2", self.conv2.as_ref()),
            ("norm2", self.norm2.as_ref()),
            ("activ", self.activ.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "conv1" => Some(&mut self.conv1),
            "pool" => Some(&mut self.pool),
            "norm1" => Some(&mut self.norm1),
            "conv2" => Some(&mut self.conv2),
            "norm2" => Some(&mut self.norm2),
            "activ" => Some(&mut self.activ),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let x = self.conv1.forward(xs, train)?;
        let x = self.pool.forward(&x, train)?;
        let x = self.norm1.forward(&x, train)?;
        let x = self.activ.forward(&x, train)?;
        let x = self.conv2.forward(&x, train)?;
        let x = self.norm2.forward(&x, train)?;
        self.activ.forward(&x, train)
    }
}
