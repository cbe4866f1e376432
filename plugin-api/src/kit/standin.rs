//! A stand-in model for unit tests of a surgery.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use abi_stable::std_types::{RString, RVec};
use tch::Tensor;

use super::walk;
use super::SurgeryModel;
use crate::abi::Attribute;
use crate::random::splitmix64;
use crate::{Error, Module, ModuleInfo, ParamInfo, Wrapper};

/// A model's module tree and tensors without the model: what a surgery reads and changes,
/// with the modules and wrappers it puts in kept for the test to run or inspect. Build it in
/// tree order with [`StandIn::module`]; a tensor that requires a gradient is a parameter, one
/// that does not a buffer, as in the host. It runs nothing itself: a test that needs outputs
/// runs its own forward over [`StandIn::tensor`] and [`StandIn::replaced`].
///
/// ```
/// use tessera_plugin_api::kit::{StandIn, SurgeryModel};
/// use tessera_plugin_api::tch::{kind::FLOAT_CPU, Tensor};
///
/// let w = Tensor::zeros([4, 3], FLOAT_CPU).set_requires_grad(true);
/// let model = StandIn::new(7)
///     .module("", "sequential", &[], vec![])
///     .module("fc", "linear", &[("in_features", 3.0), ("out_features", 4.0)], vec![("weight", w)]);
/// assert_eq!(model.modules().unwrap().len(), 2);
/// assert!(model.parameter("fc.weight").unwrap().is_some());
/// ```
pub struct StandIn {
    infos: Vec<ModuleInfo>,
    tensors: BTreeMap<String, Tensor>,
    buffers: BTreeSet<String>,
    frozen: BTreeSet<String>,
    replaced: HashMap<String, Box<dyn AnyModule>>,
    wrapped: HashMap<String, Box<dyn AnyWrapper>>,
    rng: u64,
}

trait AnyModule: Module {
    fn as_module(&self) -> &dyn Module;
    fn as_any(&self) -> &dyn Any;
}

impl<M: Module> AnyModule for M {
    fn as_module(&self) -> &dyn Module {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

trait AnyWrapper: Wrapper {
    fn as_wrapper(&self) -> &dyn Wrapper;
    fn as_any(&self) -> &dyn Any;
}

impl<W: Wrapper> AnyWrapper for W {
    fn as_wrapper(&self) -> &dyn Wrapper {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn attributes(attrs: impl IntoIterator<Item = (String, f64)>) -> RVec<Attribute> {
    attrs
        .into_iter()
        .map(|(key, value)| Attribute {
            key: key.into(),
            value,
        })
        .collect()
}

impl StandIn {
    /// An empty model whose [`SurgeryModel::uniform`] draws come from SplitMix64 seeded with
    /// `seed`.
    pub fn new(seed: u64) -> StandIn {
        StandIn {
            infos: Vec::new(),
            tensors: BTreeMap::new(),
            buffers: BTreeSet::new(),
            frozen: BTreeSet::new(),
            replaced: HashMap::new(),
            wrapped: HashMap::new(),
            rng: seed,
        }
    }

    /// The model with the module `path` of `kind` appended (tree order: a parent before its
    /// children), holding `tensors` named relative to it.
    pub fn module(
        mut self,
        path: &str,
        kind: &str,
        attrs: &[(&str, f64)],
        tensors: Vec<(&str, Tensor)>,
    ) -> StandIn {
        self.add_module(path, kind, attrs, tensors);
        self
    }

    /// Appends the module `path` of `kind` holding `tensors` ([`StandIn::module`]).
    pub fn add_module(
        &mut self,
        path: &str,
        kind: &str,
        attrs: &[(&str, f64)],
        tensors: Vec<(&str, Tensor)>,
    ) {
        let params = self.register(path, tensors);
        self.infos.push(ModuleInfo {
            path: path.into(),
            kind: kind.into(),
            attrs: attributes(attrs.iter().map(|(k, v)| ((*k).to_owned(), *v))),
            params,
        });
    }

    fn register(&mut self, path: &str, tensors: Vec<(&str, Tensor)>) -> RVec<RString> {
        let mut names = RVec::new();
        for (name, t) in tensors {
            let full = walk::child(path, name);
            if !t.requires_grad() {
                self.buffers.insert(full.clone());
            }
            assert!(
                self.tensors.insert(full.clone(), t).is_none(),
                "stand-in: tensor `{full}` registered twice"
            );
            names.push(full.into());
        }
        names
    }

    fn remove_tensor(&mut self, name: &str) {
        self.tensors.remove(name);
        self.buffers.remove(name);
        self.frozen.remove(name);
    }

    /// The module at `path`.
    pub fn info(&self, path: &str) -> Option<&ModuleInfo> {
        walk::find(&self.infos, path)
    }

    /// The module at `path`, to edit: a test that stands in for another method's surgery
    /// (a kind changed in place, an attribute added).
    pub fn info_mut(&mut self, path: &str) -> Option<&mut ModuleInfo> {
        self.infos.iter_mut().find(|m| m.path.as_str() == path)
    }

    /// The kind of the module at `path`.
    pub fn kind(&self, path: &str) -> Option<&str> {
        self.info(path).map(|m| m.kind.as_str())
    }

    /// The tensor `name` (full dotted name).
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Every tensor, by full name.
    pub fn tensors(&self) -> &BTreeMap<String, Tensor> {
        &self.tensors
    }

    /// Whether the parameter `name` is trainable (a buffer never is).
    pub fn trainable(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
            && !self.buffers.contains(name)
            && !self.frozen.contains(name)
    }

    /// The module a surgery put in at `path`.
    pub fn replaced(&self, path: &str) -> Option<&dyn Module> {
        self.replaced.get(path).map(|m| m.as_module())
    }

    /// The module a surgery put in at `path`, as its own type.
    pub fn replaced_as<M: Module>(&self, path: &str) -> Option<&M> {
        self.replaced.get(path)?.as_any().downcast_ref()
    }

    /// The wrapper a surgery put around the module at `path`.
    pub fn wrapper(&self, path: &str) -> Option<&dyn Wrapper> {
        self.wrapped.get(path).map(|w| w.as_wrapper())
    }

    /// The wrapper a surgery put around the module at `path`, as its own type.
    pub fn wrapper_as<W: Wrapper>(&self, path: &str) -> Option<&W> {
        self.wrapped.get(path)?.as_any().downcast_ref()
    }

    fn position(&self, path: &str) -> Result<usize, Error> {
        self.infos
            .iter()
            .position(|m| m.path.as_str() == path)
            .ok_or_else(|| format!("no module `{path}`").into())
    }
}

impl SurgeryModel for StandIn {
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        Ok(self.infos.clone())
    }

    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error> {
        Ok(self.tensors.get(name).map(Tensor::shallow_clone))
    }

    fn parameters(&self) -> Result<Vec<ParamInfo>, Error> {
        // In tree order, as the host lists them.
        Ok(self
            .infos
            .iter()
            .flat_map(|m| m.params.iter())
            .filter_map(|name| {
                let t = self.tensors.get(name.as_str())?;
                Some(ParamInfo {
                    name: name.clone(),
                    shape: t.size().into(),
                    buffer: self.buffers.contains(name.as_str()),
                    trainable: self.trainable(name.as_str()),
                })
            })
            .collect())
    }

    fn set_trainable(&mut self, name: &str, trainable: bool) -> Result<(), Error> {
        if !self.tensors.contains_key(name) || self.buffers.contains(name) {
            return Err(format!("no parameter `{name}`").into());
        }
        if trainable {
            self.frozen.remove(name);
        } else {
            self.frozen.insert(name.to_owned());
        }
        Ok(())
    }

    fn uniform(&mut self) -> f64 {
        (splitmix64(&mut self.rng) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The module at `path` and everything below it leave, with their tensors; `module` takes
    /// its place with `tensors`.
    fn replace_module<M: Module>(
        &mut self,
        path: &str,
        module: M,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error> {
        let at = self.position(path)?;
        let old: Vec<String> = self
            .infos
            .iter()
            .filter(|m| walk::is_within(m.path.as_str(), path))
            .flat_map(|m| m.params.iter().map(|p| p.to_string()))
            .collect();
        for name in &old {
            self.remove_tensor(name);
        }
        let below =
            |m: &ModuleInfo| m.path.as_str() != path && walk::is_within(m.path.as_str(), path);
        let params = self.register(path, tensors);
        self.infos[at] = ModuleInfo {
            path: path.into(),
            kind: module.kind().into(),
            attrs: attributes(module.attrs()),
            params,
        };
        self.infos.retain(|m| !below(m));
        self.replaced.insert(path.to_owned(), Box::new(module));
        Ok(())
    }

    /// With `inner_name`, the module and its subtree move below `<path>.<inner_name>` (their
    /// tensors renamed with them) and the wrapper takes `path`; without, the node shows the
    /// wrapper's kind and both modules' attributes, and every name stays.
    fn wrap_module<W: Wrapper>(
        &mut self,
        path: &str,
        wrapper: W,
        inner_name: Option<&str>,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error> {
        let at = self.position(path)?;
        match inner_name {
            None => {
                let own = self.register(path, tensors);
                let node = &mut self.infos[at];
                node.kind = wrapper.kind().into();
                node.attrs.extend(attributes(wrapper.attrs()));
                node.params.extend(own);
            }
            Some(inner) => {
                let moved = walk::child(path, inner);
                let rename = |name: &str| -> String {
                    let rest = &name[path.len()..];
                    if path.is_empty() {
                        format!("{moved}.{rest}")
                    } else {
                        format!("{moved}{rest}")
                    }
                };
                for m in self.infos.iter_mut() {
                    if !walk::is_within(m.path.as_str(), path) {
                        continue;
                    }
                    m.path = rename(m.path.as_str()).trim_end_matches('.').into();
                    for p in m.params.iter_mut() {
                        let new = rename(p.as_str());
                        if let Some(t) = self.tensors.remove(p.as_str()) {
                            self.tensors.insert(new.clone(), t);
                        }
                        for set in [&mut self.buffers, &mut self.frozen] {
                            if set.remove(p.as_str()) {
                                set.insert(new.clone());
                            }
                        }
                        *p = new.into();
                    }
                }
                let params = self.register(path, tensors);
                self.infos.insert(
                    at,
                    ModuleInfo {
                        path: path.into(),
                        kind: wrapper.kind().into(),
                        attrs: attributes(wrapper.attrs()),
                        params,
                    },
                );
            }
        }
        self.wrapped.insert(path.to_owned(), Box::new(wrapper));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Inner;
    use tch::kind::FLOAT_CPU;

    struct Twice;

    impl Module for Twice {
        fn kind(&self) -> &str {
            "twice"
        }
        fn attrs(&self) -> Vec<(String, f64)> {
            vec![("factor".into(), 2.0)]
        }
        fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, Error> {
            Ok(input * 2)
        }
    }

    struct Gate;

    impl Wrapper for Gate {
        fn kind(&self) -> &str {
            "gate"
        }
        fn forward(&self, x: &Tensor, train: bool, inner: &mut Inner<'_>) -> Result<Tensor, Error> {
            inner.forward(x, train)
        }
    }

    fn model() -> StandIn {
        let p = |n: i64| Tensor::zeros([n], FLOAT_CPU).set_requires_grad(true);
        StandIn::new(1)
            .module("", "net", &[], vec![])
            .module("block", "sequential", &[], vec![])
            .module(
                "block.bn",
                "batch_norm2d",
                &[("eps", 1e-5)],
                vec![
                    ("weight", p(2)),
                    ("running_mean", Tensor::zeros([2], FLOAT_CPU)),
                ],
            )
            .module("block.fc", "linear", &[], vec![("weight", p(3))])
            .module("head", "linear", &[], vec![("weight", p(4))])
    }

    fn paths(m: &StandIn) -> Vec<String> {
        m.infos.iter().map(|i| i.path.to_string()).collect()
    }

    #[test]
    fn replacing_removes_the_subtree_and_its_tensors() {
        let mut m = model();
        let w = Tensor::ones([5], FLOAT_CPU).set_requires_grad(true);
        m.replace_module("block", Twice, vec![("scale", w)])
            .unwrap();
        assert_eq!(paths(&m), ["", "block", "head"]);
        assert_eq!(m.kind("block"), Some("twice"));
        assert_eq!(m.info("block").unwrap().attr("factor"), Some(2.0));
        let names: Vec<&String> = m.tensors().keys().collect();
        assert_eq!(names, ["block.scale", "head.weight"]);
        assert!(m.replaced_as::<Twice>("block").is_some());
        assert!(m.replace_module("nowhere", Twice, vec![]).is_err());
    }

    #[test]
    fn wrapping_under_a_name_moves_the_module_and_renames_its_tensors() {
        let mut m = model();
        m.set_trainable("block.bn.weight", false).unwrap();
        m.wrap_module("block.bn", Gate, Some("inner"), vec![])
            .unwrap();
        assert_eq!(
            paths(&m),
            [
                "",
                "block",
                "block.bn",
                "block.bn.inner",
                "block.fc",
                "head"
            ]
        );
        assert_eq!(m.kind("block.bn"), Some("gate"));
        assert_eq!(m.kind("block.bn.inner"), Some("batch_norm2d"));
        assert!(m.tensor("block.bn.inner.weight").is_some());
        assert!(!m.trainable("block.bn.inner.weight"));
        let params = m.parameters().unwrap();
        let mean = params
            .iter()
            .find(|p| p.name.as_str() == "block.bn.inner.running_mean");
        assert!(mean.unwrap().buffer);
        m.wrap_module("head", Gate, None, vec![]).unwrap();
        assert_eq!(m.kind("head"), Some("gate"));
        assert!(m.tensor("head.weight").is_some());
        assert!(m.wrapper_as::<Gate>("head").is_some());
    }

    #[test]
    fn freezing_knows_parameters_from_buffers() {
        let mut m = model();
        assert!(m.set_trainable("block.bn.running_mean", false).is_err());
        assert!(m.set_trainable("missing", false).is_err());
        m.set_trainable("head.weight", false).unwrap();
        let trainable: Vec<String> = m
            .parameters()
            .unwrap()
            .iter()
            .filter(|p| p.trainable)
            .map(|p| p.name.to_string())
            .collect();
        assert_eq!(trainable, ["block.bn.weight", "block.fc.weight"]);
        let (a, b) = (m.uniform(), m.uniform());
        assert!((0.0..1.0).contains(&a) && a != b);
    }
}
