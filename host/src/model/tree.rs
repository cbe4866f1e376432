//! The module tree: every layer has a path (`layer1.0.conv1`) made of its ancestors' child
//! names, a kind, attributes and tensors. Surgery finds and replaces layers by path.

use std::collections::BTreeMap;

use tch::Tensor;

use super::layers::{Attr, Layer};

/// Surgery that cannot be done: the path, the device or a name does not fit; the message says
/// which.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SurgeryError(pub String);

/// A layer as listed by `<dyn Layer>::walk`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerInfo {
    /// Dotted path from the root (`""` for the root).
    pub path: String,
    /// The layer's kind.
    pub kind: String,
    /// Its attributes.
    pub attrs: BTreeMap<String, Attr>,
    /// Full names of the tensors the layer itself holds.
    pub tensors: Vec<String>,
}

/// `prefix.name`, or `name` at the root.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Calls `visit_one` on `layer` (at `path`) and then on each of its descendants, depth first.
fn visit(layer: &dyn Layer, path: &str, visit_one: &mut dyn FnMut(&str, &dyn Layer)) {
    visit_one(path, layer);
    for (name, child) in layer.children() {
        visit(child, &join(path, name), visit_one);
    }
}

impl dyn Layer {
    /// Every layer, depth first, with its path.
    pub fn walk(&self) -> Vec<LayerInfo> {
        self.walk_at("")
    }

    /// Every layer, depth first, with paths prefixed as if this layer were at `path`.
    pub fn walk_at(&self, path: &str) -> Vec<LayerInfo> {
        let mut out = Vec::new();
        visit(self, path, &mut |path, layer| {
            out.push(LayerInfo {
                path: path.to_owned(),
                kind: layer.kind().to_owned(),
                attrs: layer
                    .attrs()
                    .into_iter()
                    .map(|(key, value)| (key.to_owned(), value))
                    .collect(),
                tensors: layer
                    .tensors()
                    .into_iter()
                    .map(|(name, _)| join(path, name))
                    .collect(),
            })
        });
        out
    }

    /// The tensors of this layer and all its descendants, named relative to this layer.
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        visit(self, "", &mut |path, layer| {
            for (name, tensor) in layer.tensors() {
                out.push((join(path, name), tensor.shallow_clone()));
            }
        });
        out
    }

    /// Replaces the layer at the dotted `path` (not the root) by `new`, returning the old one.
    pub fn replace(
        &mut self,
        path: &str,
        new: Box<dyn Layer>,
    ) -> Result<Box<dyn Layer>, SurgeryError> {
        let (parent_path, name) = match path.rsplit_once('.') {
            Some((p, n)) => (Some(p), n),
            None => (None, path),
        };
        let parent = match parent_path {
            Some(p) => self
                .find_mut(p)
                .ok_or_else(|| SurgeryError(format!("no module at `{p}`")))?,
            None => self,
        };
        let slot = parent
            .child_mut(name)
            .ok_or_else(|| SurgeryError(format!("no module at `{path}`")))?;
        Ok(std::mem::replace(slot, new))
    }

    fn find_mut(&mut self, path: &str) -> Option<&mut dyn Layer> {
        let mut node = self;
        for part in path.split('.') {
            node = node.child_mut(part)?.as_mut();
        }
        Some(node)
    }
}
