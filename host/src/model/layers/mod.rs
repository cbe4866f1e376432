//! The layers a model is made of, one concept a file (as candle-nn's are). Every layer — built
//! in or put in by a plugin's surgery — implements [`Layer`]: the module tree, surgery, the
//! forward pass and the parameter store see nothing else.

mod activation;
mod batch_norm;
mod bottleneck;
mod checkpointed;
mod conv2d;
mod conv_group;
mod dropout;
mod embedding;
mod flatten;
mod gated;
pub mod init;
mod kv_cache;
mod linear;
mod lm_head;
pub mod mask;
mod norm;
mod pooling;
mod residual_block;
mod rms_norm;
mod sequential;

use std::fmt;

use tch::{TchError, Tensor};

pub use activation::{Gelu, Mul, Relu};
pub use batch_norm::{set_sync as set_batch_norm_sync, BatchNorm2d, RankSum};
pub use bottleneck::{Bottleneck, EXPANSION};
pub use checkpointed::Checkpointed;
pub use conv2d::{Conv2d, Conv2dConfig};
pub use conv_group::{ConvGroup, GroupNorms};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use flatten::Flatten;
pub use gated::{Gate, Gated};
pub use kv_cache::KvCache;
pub use linear::Linear;
pub use lm_head::LmHead;
pub use norm::{GroupNorm, LayerNorm};
pub use pooling::{GlobalAvgPool, GlobalMaxPool, MaxPool2d};
pub use residual_block::ResidualBlock;
pub use rms_norm::RmsNorm;
pub use sequential::Sequential;

/// An attribute value of a layer (`stride = 2`, `out_channels = 16`).
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

/// A node of the model: what it computes and what the module tree shows of it.
pub trait Layer: Send + fmt::Debug {
    /// The kind shown in the module tree (`conv2d`, `batch_norm2d`, `residual_block`, ...).
    fn kind(&self) -> &str;

    /// The attributes shown in the module tree (`stride`, `out_channels`, ...).
    fn attrs(&self) -> Vec<(&str, Attr)> {
        Vec::new()
    }

    /// The tensors the layer holds itself (not its children's), named relative to the layer,
    /// in PyTorch's `state_dict` order (`weight`, `bias`, ...).
    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        Vec::new()
    }

    /// The named children of a container, in order.
    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        Vec::new()
    }

    /// The child named `name`, for surgery to replace it.
    fn child_mut(&mut self, _name: &str) -> Option<&mut Box<dyn Layer>> {
        None
    }

    /// Runs the layer on `xs`; `train` selects training behaviour (BatchNorm batch statistics).
    /// Shape errors come back as errors, never as panics.
    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError>;

    /// How `tessera export` writes the layer (see [`Exported`]). Default: as built.
    fn export(&self) -> Result<Exported, TchError> {
        Ok(Exported::Plain)
    }

    /// Whether the layer's forward is a plugin's code (a module or wrapper a method's surgery
    /// put in), not the host's.
    fn is_plugin_code(&self) -> bool {
        false
    }

    /// Whether the layer computes each position of a sequence from that position's input
    /// alone (linear layers, norms, embeddings, activations, an MLP whose children all are), so
    /// that generation may run it on the new tokens only. Default: no.
    fn is_position_wise(&self) -> bool {
        false
    }

    /// Runs the layer in evaluation mode on the new tokens of sequences being generated, with
    /// what the earlier tokens left in `cache` (see [`KvCache`]). Default: the forward for a
    /// position-wise layer; any other layer records in `cache` that it cannot (generation then
    /// recomputes whole sequences). Decoders, their blocks and attention modules implement it.
    fn forward_cached(&self, xs: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        if self.is_position_wise() {
            self.forward(xs, false)
        } else {
            Err(cache.unsupported(self.kind()))
        }
    }
}

/// How `tessera export` writes a layer.
#[derive(Debug)]
pub enum Exported {
    /// A layer of the model as built: its own tensors and its children's.
    Plain,
    /// A plugin's module or wrapper that stays in the exported network: its tensors and
    /// children as for [`Exported::Plain`], and the layer listed (path, kind, attributes) in
    /// the export's `tessera.modules` metadata so that a PyTorch twin can be rebuilt.
    Kept,
    /// A plugin's module or wrapper folded back into the plain layer it replaced: these
    /// tensors instead of the layer's own and its children's.
    Folded(ExportTree),
}

/// What `tessera export` writes for a layer and everything below it.
#[derive(Debug, Default)]
pub struct ExportTree {
    /// The tensors, named relative to the layer.
    pub tensors: Vec<(String, Tensor)>,
    /// The plugin modules kept in the export ([`Exported::Kept`]), paths relative to the layer
    /// (`""`: the layer itself).
    pub kept: Vec<super::LayerInfo>,
}
