//! A unit of the model whose parameters live elsewhere between uses (`[distributed] sharding =
//! "full"`: each rank keeps only its shard of them): a [`Gate`] makes them whole before the
//! unit's forward pass and lets them go after it, and arranges the same around the unit's part
//! of the backward pass. The wrapper is transparent: its tensors and children are the unit's,
//! under the same names.

use std::fmt;
use std::sync::Arc;

use tch::{TchError, Tensor};

use super::{Attr, Layer};

/// What makes a unit's parameters present around its passes (the `dist` module's sharding).
pub trait Gate: Send + Sync + fmt::Debug {
    /// Before the forward pass: the parameters are there when this returns.
    fn open(&self) -> Result<(), TchError>;

    /// After the forward pass from `input` to `output` (also when it failed: `None`): the
    /// parameters may go, and come back when backward reaches `output`.
    fn close(&self, input: &Tensor, output: Option<&Tensor>) -> Result<(), TchError>;
}

/// A unit behind a [`Gate`], kind `sharded_unit`.
#[derive(Debug)]
pub struct Gated {
    inner: Box<dyn Layer>,
    gate: Arc<dyn Gate>,
}

impl Gated {
    /// Wraps `inner` behind `gate`.
    pub fn new(inner: Box<dyn Layer>, gate: Arc<dyn Gate>) -> Gated {
        Gated { inner, gate }
    }
}

impl Layer for Gated {
    fn kind(&self) -> &str {
        "sharded_unit"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        self.inner.attrs()
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        self.inner.tensors()
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        self.inner.children()
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        self.inner.child_mut(name)
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        self.gate.open()?;
        let out = self.inner.forward(xs, train);
        let closed = self.gate.close(xs, out.as_ref().ok());
        let out = out?;
        closed?;
        Ok(out)
    }

    fn export(&self) -> Result<super::Exported, TchError> {
        self.inner.export()
    }

    fn is_plugin_code(&self) -> bool {
        self.inner.is_plugin_code()
    }
}
