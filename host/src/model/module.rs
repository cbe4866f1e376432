//! The module tree: every node has a path (`layer1.0.conv1`), a kind (`conv2d`,
//! `batch_norm2d`, `residual_block`, ...), attributes and parameters. Surgery methods find and
//! replace nodes by path and kind.

use std::collections::BTreeMap;
use std::fmt;

use tch::{TchError, Tensor};

/// An attribute value of a module (`stride = 2`, `channels = 16`).
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Float(v) => write!(f, "{v}"),
            Attr::Bool(v) => write!(f, "{v}"),
        }
    }
}

/// What a node computes.
#[derive(Debug)]
pub enum Layer {
    /// 2-D convolution (PyTorch `Conv2d`).
    Conv2d {
        /// `(out, in/groups, kh, kw)`.
        weight: Tensor,
        /// `(out)` when the conv has a bias.
        bias: Option<Tensor>,
        /// Stride.
        stride: i64,
        /// Zero padding on each side.
        padding: i64,
        /// Groups.
        groups: i64,
    },
    /// Batch normalization over channels (PyTorch `BatchNorm2d`).
    BatchNorm2d {
        /// Scale.
        weight: Tensor,
        /// Shift.
        bias: Tensor,
        /// Running mean (buffer).
        running_mean: Tensor,
        /// Running variance (buffer).
        running_var: Tensor,
        /// Running-stat momentum.
        momentum: f64,
        /// Epsilon.
        eps: f64,
    },
    /// Affine map (PyTorch `Linear`).
    Linear {
        /// `(out, in)`.
        weight: Tensor,
        /// `(out)`.
        bias: Option<Tensor>,
    },
    /// Rectified linear unit.
    Relu,
    /// Max pooling with a square window.
    MaxPool2d {
        /// Window side.
        kernel: i64,
        /// Stride.
        stride: i64,
    },
    /// Mean over the spatial dimensions, then flatten: `(N, C, H, W) -> (N, C)`.
    GlobalAvgPool,
    /// Flatten all but the batch dimension.
    Flatten,
    /// Children applied in order.
    Sequential,
    /// A ResNet basic block over its children `conv1, bn1, conv2, bn2` and an optional
    /// `shortcut`: `relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`.
    BasicBlock,
}

/// A node of the module tree.
#[derive(Debug)]
pub struct Module {
    kind: &'static str,
    attrs: BTreeMap<&'static str, Attr>,
    layer: Layer,
    children: Vec<(String, Module)>,
}

/// A node as listed by [`Module::walk`].
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleInfo {
    /// Dotted path from the root (`""` for the root).
    pub path: String,
    /// The node's kind.
    pub kind: &'static str,
    /// Its attributes.
    pub attrs: BTreeMap<&'static str, Attr>,
}

impl Module {
    /// A leaf or container node.
    pub fn new(kind: &'static str, layer: Layer) -> Self {
        Module {
            kind,
            attrs: BTreeMap::new(),
            layer,
            children: Vec::new(),
        }
    }

    /// Adds an attribute (builder style).
    pub fn attr(mut self, key: &'static str, value: Attr) -> Self {
        self.attrs.insert(key, value);
        self
    }

    /// Adds a child (builder style).
    pub fn child(mut self, name: impl Into<String>, module: Module) -> Self {
        self.children.push((name.into(), module));
        self
    }

    /// The node's kind (`conv2d`, ...).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The node's layer.
    pub fn layer(&self) -> &Layer {
        &self.layer
    }

    /// The named children, in order.
    pub fn children(&self) -> &[(String, Module)] {
        &self.children
    }

    fn named(&self, name: &str) -> Result<&Module, TchError> {
        self.children
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, m)| m)
            .ok_or_else(|| TchError::Kind(format!("{} has no child `{name}`", self.kind)))
    }

    /// Every node, depth first, with its path.
    pub fn walk(&self) -> Vec<ModuleInfo> {
        let mut out = Vec::new();
        self.walk_into("", &mut out);
        out
    }

    fn walk_into(&self, path: &str, out: &mut Vec<ModuleInfo>) {
        out.push(ModuleInfo {
            path: path.to_owned(),
            kind: self.kind,
            attrs: self.attrs.clone(),
        });
        for (name, child) in &self.children {
            let child_path = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            child.walk_into(&child_path, out);
        }
    }

    /// Runs the node on `xs`; `train` selects training behaviour (BatchNorm batch statistics).
    /// Shape errors come back as errors, never as panics.
    pub fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        match &self.layer {
            Layer::Conv2d {
                weight,
                bias,
                stride,
                padding,
                groups,
            } => xs.f_conv2d(
                weight,
                bias.as_ref(),
                [*stride, *stride],
                [*padding, *padding],
                [1, 1],
                *groups,
            ),
            Layer::BatchNorm2d {
                weight,
                bias,
                running_mean,
                running_var,
                momentum,
                eps,
            } => Tensor::f_batch_norm(
                xs,
                Some(weight),
                Some(bias),
                Some(running_mean),
                Some(running_var),
                train,
                *momentum,
                *eps,
                true,
            ),
            Layer::Linear { weight, bias } => xs.f_linear(weight, bias.as_ref()),
            Layer::Relu => xs.f_relu(),
            Layer::MaxPool2d { kernel, stride } => xs.f_max_pool2d(
                [*kernel, *kernel],
                [*stride, *stride],
                [0, 0],
                [1, 1],
                false,
            ),
            Layer::GlobalAvgPool => xs.f_mean_dim(&[-2i64, -1][..], false, None),
            Layer::Flatten => xs.f_flatten(1, -1),
            Layer::Sequential => {
                let mut iter = self.children.iter();
                let Some((_, first)) = iter.next() else {
                    return Ok(xs.shallow_clone());
                };
                let mut out = first.forward(xs, train)?;
                for (_, child) in iter {
                    out = child.forward(&out, train)?;
                }
                Ok(out)
            }
            Layer::BasicBlock => {
                let out = self.named("conv1")?.forward(xs, train)?;
                let out = self.named("bn1")?.forward(&out, train)?.f_relu()?;
                let out = self.named("conv2")?.forward(&out, train)?;
                let out = self.named("bn2")?.forward(&out, train)?;
                let shortcut = match self.children.iter().find(|(n, _)| n == "shortcut") {
                    Some((_, s)) => s.forward(xs, train)?,
                    None => xs.shallow_clone(),
                };
                out.f_add(&shortcut)?.f_relu()
            }
        }
    }
}
