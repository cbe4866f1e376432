//! The one trait a surgery is written against.

use tch::Tensor;

use super::walk;

use crate::{Context, Error, ErrorKind, Module, ModuleInfo, ParamInfo, Wrapper};

/// A model as a surgery sees it: [`Context`] at `init`, or a [`crate::kit::StandIn`] in a unit
/// test. Write the surgery as a function of `&mut impl SurgeryModel`; the method calls it with
/// its context, the tests with a stand-in.
pub trait SurgeryModel {
    /// The module tree, depth first.
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error>;
    /// The parameter or buffer `name` (full dotted name), sharing storage with the model.
    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error>;
    /// Every parameter and buffer, with whether it is trainable now.
    fn parameters(&self) -> Result<Vec<ParamInfo>, Error>;
    /// Freezes (`false`) or unfreezes a parameter: gradient and optimizer membership together.
    fn set_trainable(&mut self, name: &str, trainable: bool) -> Result<(), Error>;
    /// A uniform draw in `[0, 1)` from the run's seeded stream.
    fn uniform(&mut self) -> f64;
    /// Replaces the module at `path` by `module`, registering `tensors` (named relative to
    /// `path`) in place of the old module's ([`Context::replace_module`]).
    fn replace_module<M: Module>(
        &mut self,
        path: &str,
        module: M,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error>;
    /// Wraps the module at `path`, which stays in the model under `inner_name` or, with `None`,
    /// transparently under its own names; `tensors` are the wrapper's own
    /// ([`Context::wrap_module`]).
    fn wrap_module<W: Wrapper>(
        &mut self,
        path: &str,
        wrapper: W,
        inner_name: Option<&str>,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error>;

    /// Replaces the module at `path` by `module` with the tensors it holds.
    fn replace<M: Module + OwnTensors>(&mut self, path: &str, module: M) -> Result<(), Error> {
        let tensors = module.tensors();
        self.replace_module(path, module, tensors)
    }

    /// The tensor `name` of `module` (`weight`: `<path>.weight`); an error naming the module
    /// when it has none.
    fn tensor_of(&self, module: &ModuleInfo, name: &str) -> Result<Tensor, Error> {
        let full = walk::child(&module.path, name);
        self.parameter(&full)?.ok_or_else(|| {
            Error::new(
                ErrorKind::HOST,
                format!("{} `{}` has no tensor `{full}`", module.kind, module.path),
            )
        })
    }

    /// The tensor `name` of `module` when the module itself holds one (a conv's `bias` may be
    /// absent), else `None`.
    fn optional_tensor_of(&self, module: &ModuleInfo, name: &str) -> Result<Option<Tensor>, Error> {
        let full = walk::child(&module.path, name);
        if module.params.iter().any(|p| p.as_str() == full) {
            self.parameter(&full)
        } else {
            Ok(None)
        }
    }
}

/// A module that holds its tensors, named relative to itself (`weight`, `conv.bias`), so
/// [`SurgeryModel::replace`] registers them with it.
pub trait OwnTensors {
    /// The module's tensors, sharing storage with it.
    fn tensors(&self) -> Vec<(&'static str, Tensor)>;
}

impl SurgeryModel for Context<'_> {
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        Context::modules(self)
    }

    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error> {
        Context::parameter(self, name)
    }

    fn parameters(&self) -> Result<Vec<ParamInfo>, Error> {
        Context::parameters(self)
    }

    fn set_trainable(&mut self, name: &str, trainable: bool) -> Result<(), Error> {
        Context::set_trainable(self, name, trainable)
    }

    fn uniform(&mut self) -> f64 {
        self.rng_f64()
    }

    fn replace_module<M: Module>(
        &mut self,
        path: &str,
        module: M,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error> {
        Context::replace_module(self, path, module, tensors)
    }

    fn wrap_module<W: Wrapper>(
        &mut self,
        path: &str,
        wrapper: W,
        inner_name: Option<&str>,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error> {
        Context::wrap_module(self, path, wrapper, inner_name, tensors)
    }
}
