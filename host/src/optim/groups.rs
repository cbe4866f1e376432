//! Parameter groups (`[[optimizer.groups]]`): which parameters get their own learning-rate
//! multiplier and weight decay, with `torch.optim` param-group semantics.
//!
//! A group selects parameters by name pattern (`params`, globs over the full dotted name) and/or
//! by kind (`kinds`: `bias`, `norm`, `embedding`) and/or by number of dimensions (`ndim`). Within
//! one selector the alternatives are OR-ed (any pattern, any kind); the selectors a group gives
//! are AND-ed (`params = ["transformer.h.*"]` with `kinds = ["bias"]` is the blocks' biases).
//! Parameters matched by no group form the default group, with the base hyperparameters. A group
//! that matches no parameter of the model, and a parameter matched by two groups, are errors.
//!
//! # How a parameter's kind is decided
//!
//! From its name, its shape and the kind of the layer that holds it (Tessera's module tree), so
//! that zoo models, plugin layers and TorchScript models (whose layers are not known) are all
//! classified:
//! - `bias`: the last component of the name is `bias`.
//! - `norm`: held by a layer whose kind contains `norm` (`batch_norm2d`, `layer_norm`,
//!   `group_norm`, a plugin's `rms_norm`), or a 1-dimensional parameter whose last name
//!   component is `weight` (the scale of every normalization layer; linear, convolution and
//!   embedding weights have 2 or more dimensions).
//! - `embedding`: held by a layer of kind `embedding`, or a parameter of 2 or more dimensions
//!   named `weight` whose module's name is `wte` or `wpe` or contains `emb` (GPT-2's `wte`/`wpe`,
//!   Hugging Face's `word_embeddings`, `embed_tokens`), case-insensitively.
//!
//! A bias of a norm layer is both `bias` and `norm`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::model::{LayerInfo, ParamStore, Role};

/// A kind of parameter a group can select (`kinds = [...]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamKind {
    /// A bias (`*.bias`).
    Bias,
    /// A normalization layer's parameter (scale or shift).
    Norm,
    /// An embedding table.
    Embedding,
}

impl ParamKind {
    /// The names written in `kinds = [...]`, with their kinds.
    pub const CHOICES: [(&'static str, ParamKind); 3] = [
        ("bias", ParamKind::Bias),
        ("norm", ParamKind::Norm),
        ("embedding", ParamKind::Embedding),
    ];
}

/// One `[[optimizer.groups]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupSpec {
    /// The group's name in messages and checkpoints (default `groups[i]`).
    pub name: String,
    /// Glob patterns over full parameter names (`*`, `?`, `[abc]`); any may match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<String>,
    /// Kinds of parameter; any may match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<ParamKind>,
    /// Exact number of dimensions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ndim: Option<usize>,
    /// Multiplies the learning rate of the group's parameters (default 1).
    pub lr_multiplier: f64,
    /// The group's weight decay (default: the optimizer's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
}

impl GroupSpec {
    /// A group named `name` that selects nothing yet, with the base hyperparameters.
    pub fn named(name: impl Into<String>) -> Self {
        GroupSpec {
            name: name.into(),
            params: Vec::new(),
            kinds: Vec::new(),
            ndim: None,
            lr_multiplier: 1.0,
            weight_decay: None,
        }
    }

    /// Whether the group gives at least one selector.
    pub fn selects(&self) -> bool {
        !self.params.is_empty() || !self.kinds.is_empty() || self.ndim.is_some()
    }

    fn matches(&self, patterns: &[glob::Pattern], p: &ParamInfo) -> bool {
        (self.params.is_empty() || patterns.iter().any(|g| g.matches(&p.name)))
            && (self.kinds.is_empty() || self.kinds.iter().any(|k| p.kinds.contains(k)))
            && self.ndim.is_none_or(|n| n == p.ndim)
    }
}

/// A parameter as groups see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamInfo {
    /// Full dotted name.
    pub name: String,
    /// Number of dimensions.
    pub ndim: usize,
    /// Its kinds (see the module documentation).
    pub kinds: Vec<ParamKind>,
}

impl ParamInfo {
    /// Classifies the parameter `name` of `ndim` dimensions held by a layer of kind
    /// `layer_kind` (`None` when no layer is known to hold it).
    pub fn classify(name: &str, ndim: usize, layer_kind: Option<&str>) -> Self {
        let mut parts = name.rsplit('.');
        let last = parts.next().unwrap_or_default();
        let module = parts.next().unwrap_or_default().to_ascii_lowercase();
        let mut kinds = Vec::new();
        if last == "bias" {
            kinds.push(ParamKind::Bias);
        }
        if layer_kind.is_some_and(|k| k.contains("norm")) || (ndim == 1 && last == "weight") {
            kinds.push(ParamKind::Norm);
        }
        let embedding_name = module == "wte" || module == "wpe" || module.contains("emb");
        if layer_kind == Some("embedding") || (ndim >= 2 && last == "weight" && embedding_name) {
            kinds.push(ParamKind::Embedding);
        }
        ParamInfo {
            name: name.to_owned(),
            ndim,
            kinds,
        }
    }
}

/// Groups or their selectors that do not fit the model.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct GroupsError(pub String);

/// Groups resolved against a model: which group each parameter belongs to.
#[derive(Debug)]
pub struct Groups {
    specs: Vec<GroupSpec>,
    patterns: Vec<Vec<glob::Pattern>>,
    /// Every parameter of the model at construction, classified (for `assign` of a parameter
    /// re-added later).
    known: HashMap<String, ParamInfo>,
}

impl Groups {
    /// Resolves `specs` against every parameter of `params` (trainable or frozen), classified
    /// with the layer kinds of `layers`. Fails naming a group with no selector, a bad pattern,
    /// a group that matches no parameter, or a parameter matched by two groups.
    pub fn new(
        specs: &[GroupSpec],
        params: &ParamStore,
        layers: &[LayerInfo],
    ) -> Result<Self, GroupsError> {
        let mut layer_of: HashMap<&str, &str> = HashMap::new();
        for layer in layers {
            for t in &layer.tensors {
                layer_of.insert(t.as_str(), layer.kind.as_str());
            }
        }
        let mut patterns = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            if !spec.selects() {
                return Err(GroupsError(format!(
                    "optimizer.groups[{i}] ({}) selects nothing: give `params`, `kinds` or `ndim`",
                    spec.name
                )));
            }
            let compiled = spec
                .params
                .iter()
                .map(|p| {
                    glob::Pattern::new(p).map_err(|e| {
                        GroupsError(format!(
                            "optimizer.groups[{i}] ({}): pattern {p:?}: {e}",
                            spec.name
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            patterns.push(compiled);
        }
        let known: HashMap<String, ParamInfo> = params
            .entries()
            .iter()
            .filter(|e| e.role == Role::Parameter)
            .map(|e| {
                let info = ParamInfo::classify(
                    &e.name,
                    e.tensor.dim(),
                    layer_of.get(e.name.as_str()).copied(),
                );
                (e.name.clone(), info)
            })
            .collect();
        let groups = Groups {
            specs: specs.to_vec(),
            patterns,
            known,
        };
        let mut used = vec![false; specs.len()];
        for e in params
            .entries()
            .iter()
            .filter(|e| e.role == Role::Parameter)
        {
            if let Some(g) = groups.assign(&e.name, e.tensor.dim())? {
                used[g] = true;
            }
        }
        if let Some(i) = used.iter().position(|u| !u) {
            return Err(GroupsError(format!(
                "optimizer.groups[{i}] ({}) matches no parameter of the model",
                specs[i].name
            )));
        }
        Ok(groups)
    }

    /// The configured groups, in order (the default group is not among them).
    pub fn specs(&self) -> &[GroupSpec] {
        &self.specs
    }

    /// The group of parameter `name` (`ndim` dimensions): `Some(index)` into
    /// [`Groups::specs`], `None` for the default group. Fails when two groups match.
    pub fn assign(&self, name: &str, ndim: usize) -> Result<Option<usize>, GroupsError> {
        let fallback;
        let info = match self.known.get(name) {
            Some(info) => info,
            None => {
                fallback = ParamInfo::classify(name, ndim, None);
                &fallback
            }
        };
        let mut found: Option<usize> = None;
        for (i, (spec, patterns)) in self.specs.iter().zip(&self.patterns).enumerate() {
            if spec.matches(patterns, info) {
                if let Some(first) = found {
                    return Err(GroupsError(format!(
                        "parameter `{name}` is matched by two groups: optimizer.groups[{first}] ({}) and optimizer.groups[{i}] ({})",
                        self.specs[first].name, spec.name
                    )));
                }
                found = Some(i);
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_documented_rule() {
        let k = |name: &str, ndim, layer| ParamInfo::classify(name, ndim, layer).kinds;
        use ParamKind::*;
        assert_eq!(k("fc.bias", 1, Some("linear")), vec![Bias]);
        assert_eq!(k("fc.weight", 2, Some("linear")), vec![]);
        assert_eq!(k("bn1.weight", 1, Some("batch_norm2d")), vec![Norm]);
        assert_eq!(k("bn1.bias", 1, Some("batch_norm2d")), vec![Bias, Norm]);
        assert_eq!(k("transformer.ln_f.weight", 1, None), vec![Norm]);
        assert_eq!(
            k("transformer.wte.weight", 2, Some("embedding")),
            vec![Embedding]
        );
        // Without a layer (TorchScript): by name.
        assert_eq!(k("transformer.wpe.weight", 2, None), vec![Embedding]);
        assert_eq!(
            k("embeddings.word_embeddings.weight", 2, None),
            vec![Embedding]
        );
        assert_eq!(k("h.0.attn.c_attn.weight", 2, None), vec![]);
        assert_eq!(k("conv.weight", 4, Some("conv2d")), vec![]);
    }
}
