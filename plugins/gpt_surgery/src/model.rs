//! The model as the surgery sees it ([`Model`]: the host's [`Context`], or [`crate::StandIn`]
//! in tests) and the surgery the attention plugins share ([`rebuild_attention`]).

use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{Context, Error, ErrorKind, Module, ModuleInfo, Wrapper};

use crate::attention::{AttentionSpec, AttentionWeights, ExtAttention};

/// The model as the surgery sees it.
pub trait Model {
    /// The module tree, depth first.
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error>;
    /// The parameter or buffer `name` (full dotted name), sharing storage with the model.
    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error>;
    /// Replaces the module at `path` by `module`, registering `tensors` (named relative to
    /// `path`) in place of the old module's.
    fn replace<M: Module>(
        &mut self,
        path: &str,
        module: M,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error>;
    /// Wraps the module at `path` transparently (its tensors keep their names), without
    /// tensors of the wrapper's own.
    fn wrap<W: Wrapper>(&mut self, path: &str, wrapper: W) -> Result<(), Error>;
}

impl Model for Context<'_> {
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        Context::modules(self)
    }

    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error> {
        Context::parameter(self, name)
    }

    fn replace<M: Module>(
        &mut self,
        path: &str,
        module: M,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error> {
        self.replace_module(path, module, tensors)
    }

    fn wrap<W: Wrapper>(&mut self, path: &str, wrapper: W) -> Result<(), Error> {
        self.wrap_module(path, wrapper, None, Vec::new())
    }
}

/// The tensor `module.path` + `.` + `name`; an error naming both when the model has none.
pub fn tensor(model: &impl Model, module: &ModuleInfo, name: &str) -> Result<Tensor, Error> {
    let full = format!("{}.{name}", module.path);
    model.parameter(&full)?.ok_or_else(|| {
        Error::new(
            ErrorKind::HOST,
            format!("{} `{}` has no tensor `{full}`", module.kind, module.path),
        )
    })
}

/// The paths of the modules of `kind`, in tree order.
pub fn paths_of_kind(modules: &[ModuleInfo], kind: &str) -> Vec<String> {
    modules
        .iter()
        .filter(|m| m.kind.as_str() == kind)
        .map(|m| m.path.to_string())
        .collect()
}

/// The module at `path`, if any.
pub fn module_at<'a>(modules: &'a [ModuleInfo], path: &str) -> Option<&'a ModuleInfo> {
    modules.iter().find(|m| m.path.as_str() == path)
}

/// The attention surgery rotary and qk_norm share. Every `gpt2_attention` and
/// `gpt2_attention_ext` of the tree is read back into its [`AttentionSpec`] (kind and
/// attributes), `add` puts the plugin's feature into it (returning `false` when the spec
/// already has it: that module is left alone, so a second application changes nothing), and
/// the module is replaced by an [`ExtAttention`] of the new spec over the **same** four tensors
/// (`c_attn.weight`, `c_attn.bias`, `c_proj.weight`, `c_proj.bias`: the optimizer trains them
/// and checkpoints keep their names). Whichever of the two plugins runs first, the other finds
/// its `gpt2_attention_ext` and adds its own feature: both orders give the same module.
/// Returns the paths of the replaced modules.
pub fn rebuild_attention(
    model: &mut impl Model,
    mut add: impl FnMut(&mut AttentionSpec) -> Result<bool, Error>,
) -> Result<Vec<String>, Error> {
    let modules = model.modules()?;
    let mut done = Vec::new();
    for m in &modules {
        let Some(spec) = AttentionSpec::from_module(m)? else {
            continue;
        };
        let mut new = spec.clone();
        if !add(&mut new)? || new == spec {
            continue;
        }
        let weights = AttentionWeights {
            c_attn_weight: tensor(model, m, "c_attn.weight")?,
            c_attn_bias: tensor(model, m, "c_attn.bias")?,
            c_proj_weight: tensor(model, m, "c_proj.weight")?,
            c_proj_bias: tensor(model, m, "c_proj.bias")?,
        };
        let module = ExtAttention::new(new, weights)
            .map_err(|e| format!("{} `{}`: {}", m.kind, m.path, e.message()))?;
        let tensors = module.tensors();
        model.replace(&m.path, module, tensors)?;
        done.push(m.path.to_string());
    }
    Ok(done)
}
