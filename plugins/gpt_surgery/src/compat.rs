//! Transitional: the pre-kit API that the other GPT plugins (rotary, qk_norm, relu_squared,
//! logit_softcap, zero_init_projections) and their tests still call, over the kit. Delete this
//! file once they take a [`SurgeryModel`] and build their stand-in with [`crate::gpt2`].

use std::collections::BTreeMap;

use tessera_plugin_api::kit::{self, walk, OwnTensors, SurgeryModel};
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{Error, Module, ModuleInfo, ParamInfo, Wrapper};

use crate::positions::ZeroPositions;
use crate::standin::{gpt2, Sizes};

pub use walk::find as module_at;

/// Transitional: the surgery calls of the plugins written before the kit (rotary, qk_norm,
/// relu_squared, logit_softcap, zero_init_projections), implemented for every
/// [`SurgeryModel`] (its own [`Model::kit`]); delete it once they take a `SurgeryModel`.
pub trait Model {
    /// The model behind it.
    type Kit: SurgeryModel;
    /// The model, to change.
    fn kit(&mut self) -> &mut Self::Kit;
    /// The model, to read.
    fn kit_ref(&self) -> &Self::Kit;

    /// [`SurgeryModel::modules`].
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        SurgeryModel::modules(self.kit_ref())
    }
    /// [`SurgeryModel::parameter`].
    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error> {
        SurgeryModel::parameter(self.kit_ref(), name)
    }
    /// [`SurgeryModel::replace_module`].
    fn replace<M: Module>(
        &mut self,
        path: &str,
        module: M,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error> {
        self.kit().replace_module(path, module, tensors)
    }
    /// [`SurgeryModel::wrap_module`] transparently, without tensors of the wrapper's own.
    fn wrap<W: Wrapper>(&mut self, path: &str, wrapper: W) -> Result<(), Error> {
        self.kit().wrap_module(path, wrapper, None, Vec::new())
    }
}

impl<T: SurgeryModel> Model for T {
    type Kit = T;
    fn kit(&mut self) -> &mut T {
        self
    }
    fn kit_ref(&self) -> &T {
        self
    }
}

/// Transitional: [`SurgeryModel::tensor_of`] for a [`Model`].
pub fn tensor(model: &impl Model, module: &ModuleInfo, name: &str) -> Result<Tensor, Error> {
    model.kit_ref().tensor_of(module, name)
}

/// The paths of the modules of `kind`, in tree order.
pub fn paths_of_kind(modules: &[ModuleInfo], kind: &str) -> Vec<String> {
    walk::of_kind(modules, kind)
        .map(|m| m.path.to_string())
        .collect()
}

impl ZeroPositions {
    /// Transitional: [`OwnTensors::tensors`] without the trait in scope.
    pub fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        OwnTensors::tensors(self)
    }
}

/// Transitional: the GPT-2 stand-in as the other plugins' tests use it, its tree and tensors
/// as fields (a test changes a kind before the surgery to see it refused) and the kit's
/// [`kit::StandIn`] keeping the surgery's books. Reads see the fields; the first change builds
/// the kit's stand-in from them, and every change writes its tree and tensors back.
pub struct StandIn {
    /// The tree, depth first (edited before the first change only).
    pub infos: Vec<ModuleInfo>,
    /// Every tensor, by full name.
    pub tensors: BTreeMap<String, Tensor>,
    seed: u64,
    live: Option<kit::StandIn>,
}

impl StandIn {
    /// [`gpt2`] of `sizes` and `seed`.
    pub fn gpt2(sizes: Sizes, seed: u64) -> StandIn {
        let (infos, tensors) = view(&gpt2(sizes, seed));
        StandIn {
            infos,
            tensors,
            seed,
            live: None,
        }
    }

    /// The kind of the module at `path`.
    pub fn kind(&self, path: &str) -> Option<&str> {
        self.info(path).map(|m| m.kind.as_str())
    }

    /// The tree's node at `path`.
    pub fn info(&self, path: &str) -> Option<&ModuleInfo> {
        walk::find(&self.infos, path)
    }

    /// The module surgery put at `path`.
    pub fn module(&self, path: &str) -> Option<&dyn Module> {
        self.live.as_ref()?.replaced(path)
    }

    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// The kit's stand-in, built from the fields at the first change.
    fn live(&mut self) -> &mut kit::StandIn {
        self.live
            .get_or_insert_with(|| build(&self.infos, &self.tensors, self.seed))
    }

    /// The fields from the kit's stand-in.
    fn sync(&mut self) {
        if let Some(live) = &self.live {
            (self.infos, self.tensors) = view(live);
        }
    }
}

/// The kit's stand-in of the tree `infos` with `tensors`, drawing from `seed`.
fn build(infos: &[ModuleInfo], tensors: &BTreeMap<String, Tensor>, seed: u64) -> kit::StandIn {
    let mut model = kit::StandIn::new(seed);
    for m in infos {
        let path = m.path.as_str();
        let attrs: Vec<(&str, f64)> = m.attrs.iter().map(|a| (a.key.as_str(), a.value)).collect();
        let own = m
            .params
            .iter()
            .filter_map(|full| {
                let t = tensors.get(full.as_str())?.shallow_clone();
                let name = match path {
                    "" => full.as_str(),
                    _ => full.as_str().strip_prefix(path)?.strip_prefix('.')?,
                };
                Some((name, t))
            })
            .collect();
        model.add_module(path, m.kind.as_str(), &attrs, own);
    }
    model
}

/// The tree and tensors of `model`.
fn view(model: &kit::StandIn) -> (Vec<ModuleInfo>, BTreeMap<String, Tensor>) {
    let tensors = model
        .tensors()
        .iter()
        .map(|(name, t)| (name.clone(), t.shallow_clone()))
        .collect();
    (SurgeryModel::modules(model).unwrap_or_default(), tensors)
}

impl SurgeryModel for StandIn {
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        Ok(self.infos.clone())
    }

    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error> {
        Ok(self.tensors.get(name).map(Tensor::shallow_clone))
    }

    fn parameters(&self) -> Result<Vec<ParamInfo>, Error> {
        match &self.live {
            Some(live) => live.parameters(),
            None => build(&self.infos, &self.tensors, self.seed).parameters(),
        }
    }

    fn set_trainable(&mut self, name: &str, trainable: bool) -> Result<(), Error> {
        self.live().set_trainable(name, trainable)
    }

    fn uniform(&mut self) -> f64 {
        self.live().uniform()
    }

    fn replace_module<M: Module>(
        &mut self,
        path: &str,
        module: M,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error> {
        let done = self.live().replace_module(path, module, tensors);
        self.sync();
        done
    }

    fn wrap_module<W: Wrapper>(
        &mut self,
        path: &str,
        wrapper: W,
        inner_name: Option<&str>,
        tensors: Vec<(&str, Tensor)>,
    ) -> Result<(), Error> {
        let done = self.live().wrap_module(path, wrapper, inner_name, tensors);
        self.sync();
        done
    }
}
