//! Wrapping a model's module (plugin-api 1.3): surgery that re-composes the modules a model
//! already has instead of re-implementing them. StochasticDepth runs a residual block's branch
//! and shortcut itself and drops the branch; SqueezeExcite runs the convolution, then its own
//! gate; GhostBatchNorm runs the batch norm on chunks of the batch. The wrapped module stays in
//! the model with its parameters, so the optimizer trains them and checkpoints save them; the
//! wrapper only decides how it is called. See [`crate::Context::wrap_module`].

use abi_stable::std_types::{ROption, RResult, RStr, RString, RVec};

use crate::abi::{
    Attribute, InnerCall, NamedTensor, PluginError, TensorHandle, WrapperBox, WrapperObject,
    WrapperObject_TO,
};
use crate::{guard, Error, ErrorKind};

/// The module a [`Wrapper`] wraps, callable during its `forward`.
pub struct Inner<'a> {
    call: InnerCall,
    _call: std::marker::PhantomData<&'a ()>,
}

impl Inner<'_> {
    /// Runs the wrapped module on `input`.
    pub fn forward(&mut self, input: &tch::Tensor, train: bool) -> Result<tch::Tensor, Error> {
        self.child("", input, train)
    }

    /// Runs the module at the dotted path `child` inside the wrapped one (`conv1`,
    /// `downsample.0`; as listed by [`crate::Context::modules`] under the wrapped path) on
    /// `input`; `""` is the wrapped module itself.
    pub fn child(
        &mut self,
        child: &str,
        input: &tch::Tensor,
        train: bool,
    ) -> Result<tch::Tensor, Error> {
        let handle = TensorHandle::from_tensor(input.shallow_clone());
        match (self.call.call)(self.call.ctx, RStr::from_str(child), handle, train) {
            RResult::ROk(out) => Ok(out.into_tensor()),
            RResult::RErr(message) => Err(Error::new(ErrorKind::HOST, message.into_string())),
        }
    }
}

/// A module wrapping one of the model's, installed by [`crate::Context::wrap_module`].
pub trait Wrapper: Send + 'static {
    /// The kind shown in the module tree (`stochastic_residual_block`); lets surgery recognise
    /// its own wrappers and stay idempotent.
    fn kind(&self) -> &str;
    /// Numeric attributes shown in the module tree, besides the wrapped module's.
    fn attrs(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
    /// Runs the wrapper; `inner` runs the wrapped module or its parts.
    fn forward(
        &self,
        input: &tch::Tensor,
        train: bool,
        inner: &mut Inner<'_>,
    ) -> Result<tch::Tensor, Error>;
    /// What `tessera export` writes for this node (plugin-api 1.4; an older host never asks).
    /// `inner` holds the wrapped module's exported tensors, named relative to it (`weight`,
    /// `conv1.weight`, ...).
    ///
    /// `Ok(None)` (the default): the wrapper is part of the trained network and is exported as
    /// it is, with its own tensors and the wrapped module's under the inner name, its kind and
    /// attributes in the export's `tessera.modules` metadata (SqueezeExcite). `Ok(Some(tensors))`:
    /// the wrapper folds away and the node is exported as the plain wrapped module with
    /// `tensors` (named relative to the node), computed so that it gives the wrapper's
    /// evaluation output: `inner` itself when the wrapper only changes training (Ghost
    /// BatchNorm), or `inner` with a factor folded in (stochastic depth's `1 − p`).
    fn export(
        &self,
        inner: Vec<(String, tch::Tensor)>,
    ) -> Result<Option<Vec<(String, tch::Tensor)>>, Error> {
        let _ = inner;
        Ok(None)
    }
}

struct WrapperAdapter<W: Wrapper>(W);

impl<W: Wrapper> WrapperObject for WrapperAdapter<W> {
    fn kind(&self) -> RString {
        self.0.kind().into()
    }

    fn attrs(&self) -> RVec<Attribute> {
        self.0
            .attrs()
            .into_iter()
            .map(|(key, value)| Attribute {
                key: key.into(),
                value,
            })
            .collect()
    }

    fn forward(
        &self,
        input: TensorHandle,
        train: bool,
        inner: InnerCall,
    ) -> RResult<TensorHandle, PluginError> {
        let input = input.into_tensor();
        let mut inner = Inner {
            call: inner,
            _call: std::marker::PhantomData,
        };
        guard(|| self.0.forward(&input, train, &mut inner))
            .map(TensorHandle::from_tensor)
            .map_err(PluginError::from)
            .into()
    }

    fn export(&self, inner: RVec<NamedTensor>) -> RResult<ROption<RVec<NamedTensor>>, PluginError> {
        let inner = inner
            .into_iter()
            .map(|t| (t.name.into_string(), t.tensor.into_tensor()))
            .collect();
        crate::export_answer(crate::guard(|| self.0.export(inner)))
    }
}

/// The ABI object of a [`Wrapper`].
pub(crate) fn wrapper_box(wrapper: impl Wrapper) -> WrapperBox {
    WrapperObject_TO::from_value(WrapperAdapter(wrapper), abi_stable::sabi_trait::TD_Opaque)
}
