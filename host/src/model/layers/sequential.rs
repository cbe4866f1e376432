//! A container applying its children in order (PyTorch `Sequential`).

use tch::{TchError, Tensor};

use super::{Attr, KvCache, Layer};

/// Named children applied in order; with none, the input passes through.
#[derive(Debug, Default)]
pub struct Sequential {
    layers: Vec<(String, Box<dyn Layer>)>,
    attrs: Vec<(&'static str, Attr)>,
}

impl Sequential {
    /// An empty container.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends `layer` as the child `name` (builder style).
    pub fn add(mut self, name: impl Into<String>, layer: impl Layer + 'static) -> Sequential {
        self.layers.push((name.into(), Box::new(layer)));
        self
    }

    /// Appends an already boxed `layer` as the child `name` (builder style), for a child
    /// whose kind is chosen at run time.
    pub fn add_boxed(mut self, name: impl Into<String>, layer: Box<dyn Layer>) -> Sequential {
        self.layers.push((name.into(), layer));
        self
    }

    /// Adds an attribute shown in the module tree (builder style), e.g. a ResNet's `depth`.
    pub fn attr(mut self, key: &'static str, value: Attr) -> Sequential {
        self.attrs.push((key, value));
        self
    }
}

impl Layer for Sequential {
    fn kind(&self) -> &str {
        "sequential"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        self.attrs.clone()
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        self.layers
            .iter()
            .map(|(name, layer)| (name.as_str(), layer.as_ref()))
            .collect()
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        self.layers
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, layer)| layer)
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let mut iter = self.layers.iter();
        let Some((_, first)) = iter.next() else {
            return Ok(xs.shallow_clone());
        };
        let mut out = first.forward(xs, train)?;
        for (_, layer) in iter {
            out = layer.forward(&out, train)?;
        }
        Ok(out)
    }

    fn forward_cached(&self, xs: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let mut out = xs.shallow_clone();
        for (_, layer) in &self.layers {
            out = layer.forward_cached(&out, cache)?;
        }
        Ok(out)
    }
}
