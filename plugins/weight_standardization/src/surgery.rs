//! Which convs are standardized ([`plan`]) and the surgery over any [`SurgeryModel`]
//! ([`apply_weight_standardization`]).

use tessera_plugin_api::kit::{walk, ConvSpec, SurgeryModel};
use tessera_plugin_api::{Error, ErrorKind, ModuleInfo};

use crate::layer::StandardizedConv2d;
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
    model: &mut impl SurgeryModel,
    n_last_layers_ignore: usize,
) -> Result<Outcome, Error> {
    let modules = model.modules()?;
    let plan = plan(&modules, n_last_layers_ignore);
    for path in &plan.replace {
        let info = walk::find(&modules, path)
            .ok_or_else(|| Error::new(ErrorKind::HOST, format!("no module `{path}`")))?;
        let weight = model.tensor_of(info, "weight")?;
        let bias_name = format!("{path}.bias");
        let bias = if info.params.iter().any(|p| p.as_str() == bias_name) {
            model.parameter(&bias_name)?
        } else {
            None
        };
        let conv = StandardizedConv2d::new(ConvSpec::of(info)?, &weight, bias.as_ref())?;
        model.replace(path, conv)?;
    }
    Ok(Outcome {
        convs: plan.convs,
        replaced: plan.replace.len(),
        standardized: plan.standardized,
    })
}
