//! Which convs are standardized ([`plan`]) and the surgery over any [`Model`]
//! ([`apply_weight_standardization`]).

use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{Context, Error, ErrorKind, ModuleInfo};

use crate::layer::{ConvSpec, StandardizedConv2d};
use crate::{CONV2D, WS_CONV2D};

/// The surgery's decision for a module tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Convs in the model, plain or already standardized (Composer's `conv_count`).
    pub convs: usize,
    /// Paths of the convs to standardize, in tree (= execution) order: the first
    /// `convs − n_last_layers_ignore`, less those already standardized.
    pub replace: Vec<String>,
    /// Standardized convs once the plan is carried out.
    pub standardized: usize,
}

/// Composer's choice: of the model's convs in order, all but the last `n_last_layers_ignore`
/// are standardized. A conv standardized earlier counts as a conv and stays standardized, so
/// planning again on the result replaces nothing (idempotence).
pub fn plan(modules: &[ModuleInfo], n_last_layers_ignore: usize) -> Plan {
    let convs: Vec<&ModuleInfo> = modules
        .iter()
        .filter(|m| matches!(m.kind.as_str(), CONV2D | WS_CONV2D))
        .collect();
    let target = convs.len().saturating_sub(n_last_layers_ignore);
    let replace = convs[..target]
        .iter()
        .filter(|m| m.kind.as_str() == CONV2D)
        .map(|m| m.path.to_string())
        .collect();
    let already_after = convs[target..]
        .iter()
        .filter(|m| m.kind.as_str() == WS_CONV2D)
        .count();
    Plan {
        convs: convs.len(),
        replace,
        standardized: target + already_after,
    }
}

/// The hyperparameters of the conv `info`.
pub fn conv_spec(info: &ModuleInfo) -> Result<ConvSpec, Error> {
    Ok(ConvSpec {
        in_channels: info.int_attr("in_channels", None)?,
        out_channels: info.int_attr("out_channels", None)?,
        kernel_size: info.int_attr("kernel_size", None)?,
        stride: info.int_attr("stride", Some(1))?,
        padding: info.int_attr("padding", Some(0))?,
        groups: info.int_attr("groups", Some(1))?,
    })
}

/// The model as the surgery sees it: the host's [`Context`], or a stand-in in tests.
pub trait Model {
    /// The module tree, depth first.
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error>;
    /// The parameter or buffer `name` (full dotted name).
    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error>;
    /// Replaces the module at `path` by `conv`, registering `conv.tensors()` under `path`.
    fn replace(&mut self, path: &str, conv: StandardizedConv2d) -> Result<(), Error>;
}

impl Model for Context<'_> {
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        Context::modules(self)
    }

    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error> {
        Context::parameter(self, name)
    }

    fn replace(&mut self, path: &str, conv: StandardizedConv2d) -> Result<(), Error> {
        let tensors = conv.tensors();
        self.replace_module(path, conv, tensors)
    }
}

/// What one application did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Convs in the model.
    pub convs: usize,
    /// Convs standardized by this application (Composer's return value).
    pub replaced: usize,
    /// Standardized convs in the model afterwards.
    pub standardized: usize,
}

/// Composer's `apply_weight_standardization(model, n_last_layers_ignore)`: every conv of
/// [`plan`] becomes a [`StandardizedConv2d`] holding the conv's own weight and bias tensors
/// (same names, same storage, so they stay trained and checkpointed).
pub fn apply_weight_standardization(
    model: &mut impl Model,
    n_last_layers_ignore: usize,
) -> Result<Outcome, Error> {
    let modules = model.modules()?;
    let plan = plan(&modules, n_last_layers_ignore);
    for path in &plan.replace {
        let info = modules
            .iter()
            .find(|m| m.path.as_str() == path)
            .ok_or_else(|| Error::new(ErrorKind::HOST, format!("no module `{path}`")))?;
        let tensor = |leaf: &str| -> Result<Option<Tensor>, Error> {
            let name = format!("{path}.{leaf}");
            if info.params.iter().any(|p| p.as_str() == name) {
                model.parameter(&name)
            } else {
                Ok(None)
            }
        };
        let weight = tensor("weight")?.ok_or_else(|| {
            Error::new(
                ErrorKind::HOST,
                format!("conv2d `{path}` has no tensor `{path}.weight`"),
            )
        })?;
        let bias = tensor("bias")?;
        let conv = StandardizedConv2d::new(conv_spec(info)?, &weight, bias.as_ref())?;
        model.replace(path, conv)?;
    }
    Ok(Outcome {
        convs: plan.convs,
        replaced: plan.replace.len(),
        standardized: plan.standardized,
    })
}
