//! Which layers are frozen when ([`freeze_schedule`], [`freeze_depth`], [`layers`]) and the
//! freezing itself over any [`SurgeryModel`] ([`freeze_layers`]), as Composer's `freeze_layers`.

use tessera_plugin_api::kit::{walk, SurgeryModel};
use tessera_plugin_api::{Error, ModuleInfo, ParamInfo};

/// Composer's `_freeze_schedule`: the fraction of layers to freeze at `current_duration` (the
/// elapsed fraction of the run): 0 until `freeze_start`, then rising linearly to `freeze_level`
/// at the end of the run. Computed in Composer's order of operations,
/// `freeze_level · ((t − start) / (1 − start))`, so that the truncation in [`freeze_depth`]
/// falls on the same side (`0.6` with start `0.5` gives `0.19999999999999996`, not `0.2`).
pub fn freeze_schedule(current_duration: f64, freeze_start: f64, freeze_level: f64) -> f64 {
    if current_duration <= freeze_start {
        return 0.0;
    }
    let total_freezing_time = 1.0 - freeze_start;
    let freezing_time_elapsed = current_duration - freeze_start;
    freeze_level * (freezing_time_elapsed / total_freezing_time)
}

/// How many leading layers are frozen: Composer's `int(freeze_percentage · (layers − 1))`,
/// truncated toward zero — the last layer is never frozen — and at most `layers − 1`.
pub fn freeze_depth(freeze_percentage: f64, layers: usize) -> usize {
    let candidates = layers.saturating_sub(1);
    let depth = (freeze_percentage * candidates as f64).trunc();
    if depth >= 1.0 {
        (depth as usize).min(candidates)
    } else {
        0
    }
}

/// A layer in Composer's sense: a module with no children and at least one parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// The module's path in the tree (`features.0`).
    pub path: String,
    /// Its parameters' full names (buffers left out).
    pub params: Vec<String>,
}

/// Composer's `_get_layers` over the module tree (depth first, as [`SurgeryModel::modules`]
/// lists it): the modules without children that hold at least one parameter, in tree order. A
/// parameter counts whether it is trainable or already frozen; buffers (BatchNorm's running
/// statistics) do not. Tensors held by a module that has children are in no layer, so they are
/// never frozen, as in Composer.
pub fn layers(modules: &[ModuleInfo], params: &[ParamInfo]) -> Vec<Layer> {
    let is_parameter = |name: &str| params.iter().any(|p| p.name.as_str() == name && !p.buffer);
    let mut out = Vec::new();
    for (i, m) in modules.iter().enumerate() {
        // In a depth-first list a module has children exactly when the next entry lies below it.
        let has_children = modules.get(i + 1).is_some_and(|next| {
            next.path != m.path && walk::is_within(next.path.as_str(), m.path.as_str())
        });
        if has_children {
            continue;
        }
        let own: Vec<String> = m
            .params
            .iter()
            .map(|p| p.as_str())
            .filter(|p| is_parameter(p))
            .map(str::to_owned)
            .collect();
        if !own.is_empty() {
            out.push(Layer {
                path: m.path.to_string(),
                params: own,
            });
        }
    }
    out
}

/// What [`freeze_layers`] did: Composer's `(freeze_depth, freeze_percentage)` and more.
#[derive(Debug, Clone, PartialEq)]
pub struct Freezing {
    /// Leading layers frozen (Composer's `freeze_depth`).
    pub depth: usize,
    /// The schedule's fraction (Composer's `freeze_percentage`).
    pub percentage: f64,
    /// The model's layers ([`layers`]).
    pub layers: usize,
    /// Parameters frozen by this call (trainable before it).
    pub newly_frozen: Vec<String>,
}

/// Composer's `freeze_layers(model, optimizers, current_duration, freeze_start, freeze_level)`:
/// freezes every parameter of the first [`freeze_depth`] [`layers`] — no gradient, out of the
/// optimizer — and leaves the rest as it is (nothing is ever unfrozen).
pub fn freeze_layers(
    model: &mut impl SurgeryModel,
    current_duration: f64,
    freeze_start: f64,
    freeze_level: f64,
) -> Result<Freezing, Error> {
    let params = model.parameters()?;
    let layers = layers(&model.modules()?, &params);
    let percentage = freeze_schedule(current_duration, freeze_start, freeze_level);
    let depth = freeze_depth(percentage, layers.len());
    let mut newly_frozen = Vec::new();
    for layer in &layers[..depth] {
        for name in &layer.params {
            let trainable = params
                .iter()
                .any(|p| p.name.as_str() == name.as_str() && p.trainable);
            if trainable {
                model.set_trainable(name, false)?;
                newly_frozen.push(name.clone());
            }
        }
    }
    Ok(Freezing {
        depth,
        percentage,
        layers: layers.len(),
        newly_frozen,
    })
}
