//! A module a plugin put into the model by surgery (`PluginLayer`), and the tensors it registered.

use abi_stable::std_types::{ROption, RResult, RVec};
use tessera_plugin_api::abi::{ModuleBox, NamedTensor, TensorHandle};

use crate::model::{Attr, ExportTree, Exported, Layer};

/// A module a plugin put into the model by surgery, with the tensors it registered.
pub struct PluginLayer {
    module: ModuleBox,
    kind: String,
    /// Host reads in the module's forward are charged to `module KIND`.
    source: crate::sync::observer::Source,
    attrs: Vec<(String, f64)>,
    tensors: Vec<(String, tch::Tensor)>,
}

impl PluginLayer {
    /// Wraps a plugin's module holding `tensors` (named relative to the module).
    pub fn new(module: ModuleBox, tensors: Vec<(String, tch::Tensor)>) -> PluginLayer {
        let kind = module.kind().into_string();
        let attrs = module
            .attrs()
            .into_iter()
            .map(|a| (a.key.into_string(), a.value))
            .collect();
        PluginLayer {
            module,
            source: crate::sync::observer::Source::new(&format!("module {kind}")),
            kind,
            attrs,
            tensors,
        }
    }

    /// The plugin's forward (masked when the batch is padded and the module has one).
    fn forward_plugin(&self, xs: &tch::Tensor, train: bool) -> Result<tch::Tensor, tch::TchError> {
        let failed = |e: tessera_plugin_api::abi::PluginError| {
            tch::TchError::Torch(format!(
                "plugin module `{}`: {}: {}",
                self.kind,
                e.kind.name(),
                e.message
            ))
        };
        // A batch with padding: the module's masked forward (plugin-api 1.7), when it has one.
        if let Some(mask) = crate::model::layers::mask::attention_mask() {
            let input = TensorHandle::from_tensor(xs.shallow_clone());
            match self
                .module
                .forward_masked(input, TensorHandle::from_tensor(mask), train)
            {
                RResult::ROk(ROption::RSome(out)) => return Ok(out.into_tensor()),
                RResult::ROk(ROption::RNone) => {}
                RResult::RErr(e) => return Err(failed(e)),
            }
        }
        let input = TensorHandle::from_tensor(xs.shallow_clone());
        match self.module.forward(input, train) {
            RResult::ROk(out) => Ok(out.into_tensor()),
            RResult::RErr(e) => Err(failed(e)),
        }
    }
}

impl std::fmt::Debug for PluginLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PluginLayer({})", self.kind)
    }
}

impl Layer for PluginLayer {
    fn kind(&self) -> &str {
        &self.kind
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        self.attrs
            .iter()
            .map(|(key, value)| (key.as_str(), Attr::Float(*value)))
            .collect()
    }

    fn tensors(&self) -> Vec<(&str, &tch::Tensor)> {
        self.tensors
            .iter()
            .map(|(name, tensor)| (name.as_str(), tensor))
            .collect()
    }

    fn forward(&self, xs: &tch::Tensor, train: bool) -> Result<tch::Tensor, tch::TchError> {
        self.source.charge(|| self.forward_plugin(xs, train))
    }

    fn is_plugin_code(&self) -> bool {
        true
    }

    fn export(&self) -> Result<Exported, tch::TchError> {
        // A plugin built against plugin-api < 1.4 lacks `export`: abi_stable then runs the
        // default body, which keeps the module.
        match self.module.export() {
            RResult::ROk(ROption::RNone) => Ok(Exported::Kept),
            RResult::ROk(ROption::RSome(tensors)) => Ok(Exported::Folded(ExportTree {
                tensors: from_named(tensors),
                kept: Vec::new(),
            })),
            RResult::RErr(e) => Err(tch::TchError::Torch(format!(
                "plugin module `{}` at export: {}: {}",
                self.kind,
                e.kind.name(),
                e.message
            ))),
        }
    }
}

/// Tensors handed over by a plugin, owned.
pub(crate) fn from_named(tensors: RVec<NamedTensor>) -> Vec<(String, tch::Tensor)> {
    tensors
        .into_iter()
        .map(|t| (t.name.into_string(), t.tensor.into_tensor()))
        .collect()
}
