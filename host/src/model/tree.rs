//! The module tree: every layer has a path (`layer1.0.conv1`) made of its ancestors' child
//! names, a kind, attributes and tensors. Surgery finds and replaces layers by path.

use std::collections::BTreeMap;

use tch::{TchError, Tensor};

use super::layers::{Attr, ExportTree, Exported, Layer};

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

/// `prefix.name`, `prefix` when `name` is empty, `name` at the root.
fn join_path(prefix: &str, name: &str) -> String {
    if name.is_empty() {
        prefix.to_owned()
    } else {
        join(prefix, name)
    }
}

/// The layer at `path` as the module tree lists it.
fn info(path: &str, layer: &dyn Layer) -> LayerInfo {
    LayerInfo {
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
    }
}

/// Adds `layer` (at `path`) and its descendants to `out` as `tessera export` writes them.
fn export_visit(layer: &dyn Layer, path: &str, out: &mut ExportTree) -> Result<(), TchError> {
    match layer.export()? {
        Exported::Folded(tree) => {
            out.tensors.extend(
                tree.tensors
                    .into_iter()
                    .map(|(name, t)| (join_path(path, &name), t)),
            );
            out.kept.extend(tree.kept.into_iter().map(|mut kept| {
                kept.path = join_path(path, &kept.path);
                kept
            }));
            return Ok(());
        }
        Exported::Kept => out.kept.push(info(path, layer)),
        Exported::Plain => {}
    }
    for (name, tensor) in layer.tensors() {
        out.tensors.push((join(path, name), tensor.shallow_clone()));
    }
    for (name, child) in layer.children() {
        export_visit(child, &join(path, name), out)?;
    }
    Ok(())
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

    /// The layers whose forward is a plugin's code ([`Layer::is_plugin_code`]), depth first, as
    /// (path, kind).
    pub fn plugin_layers(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        visit(self, "", &mut |path, layer| {
            if layer.is_plugin_code() {
                out.push((path.to_owned(), layer.kind().to_owned()));
            }
        });
        out
    }

    /// Every layer, depth first, with paths prefixed as if this layer were at `path`.
    pub fn walk_at(&self, path: &str) -> Vec<LayerInfo> {
        let mut out = Vec::new();
        visit(self, path, &mut |path, layer| out.push(info(path, layer)));
        out
    }

    /// The tensors `tessera export` writes for this layer and its descendants, named relative
    /// to it, with plugin modules kept as they are or folded back into plain layers as their
    /// plugins say ([`Layer::export`]).
    pub fn export_tree(&self) -> Result<ExportTree, TchError> {
        let mut out = ExportTree::default();
        export_visit(self, "", &mut out)?;
        Ok(out)
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
