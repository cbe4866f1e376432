//! A plugin's wrapper around one of the model's modules (plugin-api 1.3): the host runs the
//! wrapper in the module's place and lets it call the wrapped module, or modules inside it,
//! back through the host.

use std::panic::{catch_unwind, AssertUnwindSafe};

use abi_stable::std_types::{ROption, RResult, RStr, RString, RVec};
use tessera_plugin_api::abi::{InnerCall, InnerCtx, NamedTensor, TensorHandle, WrapperBox};

use crate::model::{Attr, ExportTree, Exported, Layer};

/// A plugin wrapper and the module it wraps. The wrapped module is the child `inner_name`, or,
/// when `inner_name` is empty, transparent: its tensors and children are the node's own.
pub struct WrappedLayer {
    wrapper: WrapperBox,
    kind: String,
    /// Host reads in the wrapper's own forward are charged to `module KIND`.
    source: crate::sync::observer::Source,
    attrs: Vec<(String, f64)>,
    inner: Box<dyn Layer>,
    inner_name: String,
    tensors: Vec<(String, tch::Tensor)>,
}

impl WrappedLayer {
    /// `wrapper` around `inner`, with the wrapper's own `tensors` (named relative to it).
    pub fn new(
        wrapper: WrapperBox,
        inner: Box<dyn Layer>,
        inner_name: String,
        tensors: Vec<(String, tch::Tensor)>,
    ) -> WrappedLayer {
        let kind = wrapper.kind().into_string();
        let attrs = wrapper
            .attrs()
            .into_iter()
            .map(|a| (a.key.into_string(), a.value))
            .collect();
        WrappedLayer {
            wrapper,
            source: crate::sync::observer::Source::new(&format!("module {kind}")),
            kind,
            attrs,
            inner,
            inner_name,
            tensors,
        }
    }

    fn transparent(&self) -> bool {
        self.inner_name.is_empty()
    }
}

impl std::fmt::Debug for WrappedLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WrappedLayer({} around {:?})", self.kind, self.inner)
    }
}

/// The module at the dotted `path` below `layer` (`""`: `layer` itself).
fn find<'a>(layer: &'a dyn Layer, path: &str) -> Option<&'a dyn Layer> {
    let mut node = layer;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        node = node
            .children()
            .into_iter()
            .find(|(name, _)| *name == part)
            .map(|(_, child)| child)?;
    }
    Some(node)
}

/// The host side of [`InnerCall`]: runs a module of the wrapped one for the plugin.
extern "C" fn call_inner(
    ctx: InnerCtx,
    child: RStr<'_>,
    input: TensorHandle,
    train: bool,
) -> RResult<TensorHandle, RString> {
    // SAFETY: `ctx` was made by `WrappedLayer::forward` from a `&&dyn Layer` that outlives
    // the plugin call it was passed to.
    let inner: &dyn Layer = unsafe { *(ctx.0 as *const &dyn Layer) };
    let input = input.into_tensor();
    let run = catch_unwind(AssertUnwindSafe(|| {
        let module = find(inner, child.as_str()).ok_or_else(|| {
            format!(
                "the wrapped {} has no module `{}`",
                inner.kind(),
                child.as_str()
            )
        })?;
        // The host's own module: its reads are the trainer's, not the wrapper's.
        crate::sync::observer::Source::trainer(|| module.forward(&input, train))
            .map_err(|e| e.to_string())
    }));
    match run {
        Ok(Ok(out)) => RResult::ROk(TensorHandle::from_tensor(out)),
        Ok(Err(e)) => RResult::RErr(e.into()),
        Err(_) => RResult::RErr("the wrapped module panicked (a host bug)".into()),
    }
}

impl Layer for WrappedLayer {
    fn is_plugin_code(&self) -> bool {
        true
    }

    /// A wrapper stands in for the module it wraps and is taken to compute per position when
    /// that module does (LoRA around a projection, a soft cap around the head), so generation
    /// runs it on the new tokens only; a wrapper around anything else cannot decode
    /// incrementally.
    fn is_position_wise(&self) -> bool {
        self.inner.is_position_wise()
    }

    fn kind(&self) -> &str {
        &self.kind
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        let mut attrs = if self.transparent() {
            self.inner.attrs()
        } else {
            Vec::new()
        };
        attrs.extend(
            self.attrs
                .iter()
                .map(|(key, value)| (key.as_str(), Attr::Float(*value))),
        );
        attrs
    }

    fn tensors(&self) -> Vec<(&str, &tch::Tensor)> {
        let mut tensors = if self.transparent() {
            self.inner.tensors()
        } else {
            Vec::new()
        };
        tensors.extend(self.tensors.iter().map(|(n, t)| (n.as_str(), t)));
        tensors
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        if self.transparent() {
            self.inner.children()
        } else {
            vec![(self.inner_name.as_str(), self.inner.as_ref())]
        }
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        if self.transparent() {
            self.inner.child_mut(name)
        } else if name == self.inner_name {
            Some(&mut self.inner)
        } else {
            None
        }
    }

    fn forward(&self, xs: &tch::Tensor, train: bool) -> Result<tch::Tensor, tch::TchError> {
        let inner: &dyn Layer = self.inner.as_ref();
        let call = InnerCall {
            call: call_inner,
            ctx: InnerCtx(&inner as *const &dyn Layer as *const std::ffi::c_void),
        };
        let input = TensorHandle::from_tensor(xs.shallow_clone());
        match self
            .source
            .charge(|| self.wrapper.forward(input, train, call))
        {
            RResult::ROk(out) => Ok(out.into_tensor()),
            RResult::RErr(e) => Err(tch::TchError::Torch(format!(
                "plugin wrapper `{}`: {}: {}",
                self.kind,
                e.kind.name(),
                e.message
            ))),
        }
    }

    fn export(&self) -> Result<Exported, tch::TchError> {
        let inner = self.inner.export_tree()?;
        let handed: RVec<NamedTensor> = inner
            .tensors
            .iter()
            .map(|(name, t)| NamedTensor {
                name: name.as_str().into(),
                tensor: TensorHandle::from_tensor(t.shallow_clone()),
            })
            .collect();
        // A wrapper built against plugin-api 1.3 lacks `export`: abi_stable then runs the
        // default body, which keeps the wrapper.
        match self.wrapper.export(handed) {
            RResult::ROk(ROption::RNone) => Ok(Exported::Kept),
            RResult::ROk(ROption::RSome(tensors)) => Ok(Exported::Folded(ExportTree {
                tensors: super::from_named(tensors),
                kept: inner.kept,
            })),
            RResult::RErr(e) => Err(tch::TchError::Torch(format!(
                "plugin wrapper `{}` at export: {}: {}",
                self.kind,
                e.kind.name(),
                e.message
            ))),
        }
    }
}
