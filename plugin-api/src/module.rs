//! Modules a plugin puts into the model ([`Module`]), and reading the model's modules
//! ([`ModuleInfo`]).

use abi_stable::std_types::{ROption, RResult, RString, RVec};

use crate::abi::{
    Attribute, ErrorKind, ModuleBox, ModuleInfo, ModuleObject, ModuleObject_TO, NamedTensor,
    PluginError, TensorHandle,
};
use crate::{guard, Error};

impl ModuleInfo {
    /// The numeric attribute `key` of the module (`stride`, `out_channels`, `eps`), if it has
    /// one (plugin-api 1.4).
    pub fn attr(&self, key: &str) -> Option<f64> {
        self.attrs
            .iter()
            .find(|a| a.key.as_str() == key)
            .map(|a| a.value)
    }

    /// The integer attribute `key`, or `default` when the module has none (plugin-api 1.4). An
    /// attribute that is not a finite integer, or a missing one without a default, is an error
    /// naming the module and the key.
    pub fn int_attr(&self, key: &str, default: Option<i64>) -> Result<i64, Error> {
        match (self.attr(key), default) {
            (Some(v), _) if v.fract() == 0.0 && v.is_finite() => Ok(v as i64),
            (Some(v), _) => Err(Error::new(
                ErrorKind::HOST,
                format!(
                    "{} `{}`: attribute `{key}` = {v} is not an integer",
                    self.kind, self.path
                ),
            )),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(Error::new(
                ErrorKind::HOST,
                format!("{} `{}` has no `{key}` attribute", self.kind, self.path),
            )),
        }
    }
}

/// A module a plugin puts into the model by surgery ([`Context::replace_module`](crate::Context::replace_module)).
pub trait Module: Send + 'static {
    /// The kind shown in the module tree (`blur_conv2d`); lets surgery recognise its own
    /// modules and stay idempotent.
    fn kind(&self) -> &str;
    /// Numeric attributes shown in the module tree.
    fn attrs(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
    /// Runs the module.
    fn forward(&self, input: &tch::Tensor, train: bool) -> Result<tch::Tensor, Error>;
    /// What `tessera export` writes for this module (plugin-api 1.4; an older host never asks).
    ///
    /// `Ok(None)` (the default): the module is part of the trained network and is exported as
    /// it is, its tensors under the names it registered, its kind and attributes in the
    /// export's `tessera.modules` metadata (BlurPool's `blur_conv2d`). `Ok(Some(tensors))`: the
    /// module is a train-time reparametrisation that folds back into the plain module it
    /// replaced; `tensors`, named relative to the module (`weight`, `bias`), are that plain
    /// module's, computed so that it gives this module's evaluation output (weight
    /// standardization writes the standardized weight).
    fn export(&self) -> Result<Option<Vec<(String, tch::Tensor)>>, Error> {
        Ok(None)
    }
    /// Runs the module on a batch that has an attention mask (plugin-api 1.7; an older host
    /// always calls [`Module::forward`]): `attention_mask` is the batch's
    /// [`keys::ATTENTION_MASK`](crate::keys::ATTENTION_MASK), `(B, T)` int64, 0 at padded positions. A module computing
    /// attention over the tokens (a replacement of BERT's `bert_self_attention`) gives padded
    /// keys no weight; the default ignores the mask and calls [`Module::forward`].
    fn forward_masked(
        &self,
        input: &tch::Tensor,
        attention_mask: &tch::Tensor,
        train: bool,
    ) -> Result<tch::Tensor, Error> {
        let _ = attention_mask;
        self.forward(input, train)
    }
}

/// Tensors across the ABI, named.
pub(crate) fn named_tensors<N: Into<RString>>(tensors: Vec<(N, tch::Tensor)>) -> RVec<NamedTensor> {
    tensors
        .into_iter()
        .map(|(name, t)| NamedTensor {
            name: name.into(),
            tensor: TensorHandle::from_tensor(t),
        })
        .collect()
}

/// The export answer of a plugin module or wrapper, across the ABI.
pub(crate) fn export_answer(
    answer: Result<Option<Vec<(String, tch::Tensor)>>, Error>,
) -> RResult<ROption<RVec<NamedTensor>>, PluginError> {
    match answer {
        Ok(Some(tensors)) => RResult::ROk(ROption::RSome(named_tensors(tensors))),
        Ok(None) => RResult::ROk(ROption::RNone),
        Err(e) => RResult::RErr(PluginError::from(e)),
    }
}

struct ModuleAdapter<M: Module>(M);

impl<M: Module> ModuleObject for ModuleAdapter<M> {
    fn kind(&self) -> RString {
        self.0.kind().into()
    }

    fn attrs(&self) -> RVec<Attribute> {
        self.0
            .attrs()
            .into_iter()
            .map(|(key, value)| Attribute {
                key: key.into(),
                value,
            })
            .collect()
    }

    fn forward(&self, input: TensorHandle, train: bool) -> RResult<TensorHandle, PluginError> {
        let input = input.into_tensor();
        guard(|| self.0.forward(&input, train))
            .map(TensorHandle::from_tensor)
            .map_err(PluginError::from)
            .into()
    }

    fn export(&self) -> RResult<ROption<RVec<NamedTensor>>, PluginError> {
        export_answer(guard(|| self.0.export()))
    }

    fn forward_masked(
        &self,
        input: TensorHandle,
        attention_mask: TensorHandle,
        train: bool,
    ) -> RResult<ROption<TensorHandle>, PluginError> {
        let input = input.into_tensor();
        let mask = attention_mask.into_tensor();
        guard(|| self.0.forward_masked(&input, &mask, train))
            .map(|t| ROption::RSome(TensorHandle::from_tensor(t)))
            .map_err(PluginError::from)
            .into()
    }
}

pub(crate) fn module_box(module: impl Module) -> ModuleBox {
    ModuleObject_TO::from_value(ModuleAdapter(module), abi_stable::sabi_trait::TD_Opaque)
}
