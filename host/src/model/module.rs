//! The module tree: every node has a path (`layer1.0.conv1`), a kind (`conv2d`,
//! `batch_norm2d`, `residual_block`, ...), attributes and parameters. Surgery methods find and
//! replace nodes by path and kind.

use std::borrow::Cow;
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
        /// Training-mode forwards so far: an int64 scalar buffer, as in PyTorch.
        num_batches_tracked: Tensor,
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
    /// A module computed outside the model crate (a plugin's, put in by surgery).
    External {
        /// The computation.
        layer: Box<dyn ExternalLayer>,
        /// Full names of the tensors registered with it.
        tensors: Vec<String>,
    },
}

/// A layer whose computation lives elsewhere (e.g. in a plugin).
pub trait ExternalLayer: Send + fmt::Debug {
    /// The kind shown in the module tree.
    fn kind(&self) -> String;
    /// Numeric attributes.
    fn attrs(&self) -> Vec<(String, f64)>;
    /// Runs the layer.
    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError>;
}

/// A node of the module tree.
#[derive(Debug)]
pub struct Module {
    kind: Cow<'static, str>,
    attrs: BTreeMap<String, Attr>,
    layer: Layer,
    children: Vec<(String, Module)>,
}

/// A node as listed by [`Module::walk`].
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleInfo {
    /// Dotted path from the root (`""` for the root).
    pub path: String,
    /// The node's kind.
    pub kind: String,
    /// Its attributes.
    pub attrs: BTreeMap<String, Attr>,
    /// Full names of the tensors the node itself holds.
    pub tensors: Vec<String>,
}

impl Module {
    /// A leaf or container node.
    pub fn new(kind: &'static str, layer: Layer) -> Self {
        Module {
            kind: Cow::Borrowed(kind),
            attrs: BTreeMap::new(),
            layer,
            children: Vec::new(),
        }
    }

    /// Adds an attribute (builder style).
    pub fn attr(mut self, key: &'static str, value: Attr) -> Self {
        self.attrs.insert(key.to_owned(), value);
        self
    }

    /// A node computed by an external layer that holds the tensors `tensors` (full names).
    pub fn external(layer: Box<dyn ExternalLayer>, tensors: Vec<String>) -> Self {
        let attrs = layer
            .attrs()
            .into_iter()
            .map(|(k, v)| (k, Attr::Float(v)))
            .collect();
        Module {
            kind: Cow::Owned(layer.kind()),
            attrs,
            layer: Layer::External { layer, tensors },
            children: Vec::new(),
        }
    }

    /// Adds a child (builder style).
    pub fn child(mut self, name: impl Into<String>, module: Module) -> Self {
        self.children.push((name.into(), module));
        self
    }

    /// The node's kind (`conv2d`, ...).
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Full names of the tensors this node holds itself (not its children's).
    fn own_tensors(&self, path: &str) -> Vec<String> {
        let name = |n: &str| {
            if path.is_empty() {
                n.to_owned()
            } else {
                format!("{path}.{n}")
            }
        };
        match &self.layer {
            Layer::Conv2d { bias, .. } | Layer::Linear { bias, .. } => {
                let mut v = vec![name("weight")];
                if bias.is_some() {
                    v.push(name("bias"));
                }
                v
            }
            Layer::BatchNorm2d { .. } => [
                "weight",
                "bias",
                "running_mean",
                "running_var",
                "num_batches_tracked",
            ]
            .iter()
            .map(|n| name(n))
            .collect(),
            Layer::External { tensors, .. } => tensors.clone(),
            _ => Vec::new(),
        }
    }

    /// Replaces the node at the dotted `path` (not the root) by `new`, returning the old node.
    pub fn replace(&mut self, path: &str, new: Module) -> Result<Module, String> {
        let (parent_path, name) = match path.rsplit_once('.') {
            Some((p, n)) => (Some(p), n),
            None => (None, path),
        };
        let parent = match parent_path {
            Some(p) => self
                .find_mut(p)
                .ok_or_else(|| format!("no module at `{p}`"))?,
            None => self,
        };
        let slot = parent
            .children
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, m)| m)
            .ok_or_else(|| format!("no module at `{path}`"))?;
        Ok(std::mem::replace(slot, new))
    }

    fn find_mut(&mut self, path: &str) -> Option<&mut Module> {
        let mut node = self;
        for part in path.split('.') {
            node = node
                .children
                .iter_mut()
                .find(|(n, _)| n == part)
                .map(|(_, m)| m)?;
        }
        Some(node)
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
        self.walk_at("")
    }

    /// Every node, depth first, with paths prefixed as if this node were at `path`.
    pub fn walk_at(&self, path: &str) -> Vec<ModuleInfo> {
        let mut out = Vec::new();
        self.walk_into(path, &mut out);
        out
    }

    fn walk_into(&self, path: &str, out: &mut Vec<ModuleInfo>) {
        out.push(ModuleInfo {
            path: path.to_owned(),
            kind: self.kind.to_string(),
            attrs: self.attrs.clone(),
            tensors: self.own_tensors(path),
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
                num_batches_tracked,
                momentum,
                eps,
            } => {
                let out = Tensor::f_batch_norm(
                    xs,
                    Some(weight),
                    Some(bias),
                    Some(running_mean),
                    Some(running_var),
                    train,
                    *momentum,
                    *eps,
                    true,
                )?;
                if train {
                    // As PyTorch's BatchNorm: count the training-mode forwards (in place, so
                    // the store and checkpoints see it).
                    let _ = tch::no_grad(|| num_batches_tracked.shallow_clone().f_add_scalar_(1))?;
                }
                Ok(out)
            }
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
            Layer::External { layer, .. } => layer.forward(xs, train),
        }
    }
}
