//! The second names of tied weights, which the export writes and `init_weights` reads.

use std::collections::BTreeSet;

use tch::TchError;

use super::{Entry, Model};

/// The second names of tied weights: where `model`'s export tree lists a tensor of the store
/// twice, once under its store name and once under another (GPT-2's `lm_head.weight`, which is
/// `transformer.wte.weight`), as (other name, store name), in tree order. A tensor a plugin's
/// export only renames (its store name not exported) is no alias.
pub fn aliases(model: &Model) -> Result<Vec<(String, String)>, TchError> {
    let tree = model.root.export_tree()?;
    let exported: BTreeSet<&str> = tree.tensors.iter().map(|(n, _)| n.as_str()).collect();
    let stored: Vec<&Entry> = model
        .params
        .entries()
        .iter()
        .filter(|e| exported.contains(e.name.as_str()))
        .collect();
    Ok(tree
        .tensors
        .iter()
        .filter(|(name, _)| model.params.get(name).is_none())
        .filter_map(|(name, t)| {
            stored
                .iter()
                .find(|e| {
                    e.tensor.numel() > 0
                        && e.tensor.data_ptr() == t.data_ptr()
                        && e.tensor.size() == t.size()
                        && e.tensor.kind() == t.kind()
                })
                .map(|e| (name.clone(), e.name.clone()))
        })
        .collect())
}
