//! Models: the layers ([`layers`], every one a [`Layer`]), the module tree they form
//! ([`LayerInfo`], paths and surgery), the named parameter store ([`ParamStore`]) and the model
//! zoo (MLP, small CNN, CIFAR-style ResNet-20/56, ImageNet-style ResNet-18/50, airbench's net, GPT-2), or a model made
//! in PyTorch and saved as TorchScript ([`TorchscriptModel`]). Names follow PyTorch conventions so weights
//! map 1:1 to a PyTorch `state_dict`. A model's repeated units ([`unit_paths`]) are what
//! activation checkpointing recomputes ([`ActivationCheckpointing`]).

mod activation_checkpointing;
mod aliases;
mod hf_json;
mod init_weights;
pub mod layers;
mod loss;
mod params;
mod spec;
mod torchscript;
mod tree;
mod units;
mod weight_files;
pub mod zoo;

pub use activation_checkpointing::ActivationCheckpointing;
pub use aliases::aliases;
pub(crate) use init_weights::listed;
pub use init_weights::{
    check_patterns as check_init_patterns, load_init_weights, read_state_dict, InitReport,
    InitWeightsError,
};
pub use layers::{Attr, ExportTree, Exported, Layer};
pub use loss::{
    binary_cross_entropy_with, cross_entropy, cross_entropy_ignoring, cross_entropy_with, Loss,
    LossKind, NonFiniteLoss, DEFAULT_IGNORE_INDEX,
};
pub use params::{Entry, ParamStore, Role};
pub use spec::{
    BertConfig, BertHead, Gpt2Config, InitWeights, LlamaConfig, ModelConfig, ModelName, Norm,
    TorchscriptFile, VitConfig,
};
pub use torchscript::TorchscriptModel;
pub use tree::{LayerInfo, SurgeryError};
pub use units::{unit_paths, Unit};
pub use zoo::RopeScaling;

use tch::{Device, TchError, Tensor};

/// A model: its module tree and the store holding its tensors.
#[derive(Debug)]
pub struct Model {
    /// The root of the module tree.
    pub root: Box<dyn Layer>,
    /// Parameters and buffers by name.
    pub params: ParamStore,
}

/// The input a model is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputShape {
    /// Channels (1 for Fashion-MNIST, 3 for RGB).
    pub channels: i64,
    /// Height in pixels.
    pub height: i64,
    /// Width in pixels.
    pub width: i64,
}

impl Model {
    /// Builds the model named in `config` for `input` and `num_classes`, on `device` (gpt2:
    /// `num_classes` is the vocabulary, `input` is unused; see [`zoo::Gpt2LmHeadModel`]). A
    /// TorchScript model is loaded from its file (errors name it) and checked to give
    /// `(N, num_classes)` on `input`.
    pub fn build(
        config: &ModelConfig,
        input: InputShape,
        num_classes: i64,
        device: Device,
    ) -> Result<Model, TchError> {
        let mut params = ParamStore::new(device);
        let store = &mut params;
        let zoo = |root: layers::Sequential| -> Box<dyn Layer> { Box::new(root) };
        let root = match config.name {
            ModelName::Mlp => zoo(zoo::mlp(
                store,
                input,
                &config.hidden,
                config.norm_or_default(),
                config.dropout,
                num_classes,
            )?),
            ModelName::Cnn => zoo(zoo::cnn(
                store,
                input,
                config.base_width(),
                config.norm_or_default(),
                num_classes,
            )?),
            ModelName::Resnet20 => zoo(zoo::resnet(
                store,
                input,
                20,
                config.base_width(),
                num_classes,
            )?),
            ModelName::Resnet56 => zoo(zoo::resnet(
                store,
                input,
                56,
                config.base_width(),
                num_classes,
            )?),
            ModelName::Resnet18 => zoo(zoo::imagenet_resnet(
                store,
                input,
                zoo::ImagenetDepth::Resnet18,
                config.base_width(),
                num_classes,
            )?),
            ModelName::Resnet50 => zoo(zoo::imagenet_resnet(
                store,
                input,
                zoo::ImagenetDepth::Resnet50,
                config.base_width(),
                num_classes,
            )?),
            ModelName::Airbench => zoo(zoo::airbench(
                store,
                input,
                config.airbench_widths(),
                num_classes,
            )?),
            ModelName::Gpt2 => {
                let sizes = config.gpt2.clone().unwrap_or_default();
                Box::new(zoo::Gpt2LmHeadModel::new(
                    store,
                    &sizes,
                    config.dropout,
                    num_classes,
                )?)
            }
            ModelName::Llama => {
                let sizes = config.llama.clone().unwrap_or_default();
                Box::new(zoo::LlamaForCausalLm::new(store, &sizes, num_classes)?)
            }
            ModelName::Bert => bert_with_head(store, config, num_classes)?,
            ModelName::VitTiny | ModelName::VitSmall | ModelName::VitBase => {
                let sizes = config
                    .vit
                    .or(config.name.vit_sizes())
                    .unwrap_or(VitConfig::TINY);
                Box::new(zoo::VisionTransformer::new(
                    store,
                    sizes,
                    input,
                    0.0,
                    num_classes,
                )?)
            }
            ModelName::Torchscript => {
                let file = config.torchscript.as_ref().ok_or_else(|| {
                    TchError::FileFormat(
                        "model \"torchscript\" names no file (`[model] torchscript`)".to_owned(),
                    )
                })?;
                Box::new(TorchscriptModel::load(
                    &file.path,
                    store,
                    input,
                    num_classes,
                )?)
            }
        };
        Ok(Model { root, params })
    }

    /// The paths of the zoo's token embeddings, whose rows bound the ids a batch may hold.
    pub const TOKEN_EMBEDDINGS: [&'static str; 2] =
        ["transformer.wte", "bert.embeddings.word_embeddings"];

    /// The rows of the model's token embedding (GPT-2's `transformer.wte`, BERT's
    /// `bert.embeddings.word_embeddings`): the token ids a batch may hold are `[0, rows)`.
    /// `None` for models without one (vision models, TorchScript models, whose own checks
    /// stand).
    pub fn token_rows(&self) -> Option<i64> {
        self.root.walk().into_iter().find_map(|l| {
            if l.kind != "embedding" || !Self::TOKEN_EMBEDDINGS.contains(&l.path.as_str()) {
                return None;
            }
            match l.attrs.get("num_embeddings") {
                Some(Attr::Int(n)) => Some(*n),
                _ => None,
            }
        })
    }

    /// The plugin modules in the model (from methods' surgery), as (path, kind).
    pub fn plugin_modules(&self) -> Vec<(String, String)> {
        self.root.plugin_layers()
    }

    /// Runs the model.
    pub fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        self.root.forward(xs, train)
    }

    /// Runs the model with the batch's `attention_mask` (`(B, T)`, 0 at padding), which the
    /// attention layers that support padding read, and its `token_type_ids` (sentence pairs),
    /// which BERT's embeddings read ([`layers::mask`]).
    pub fn forward_masked(
        &self,
        xs: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
        train: bool,
    ) -> Result<Tensor, TchError> {
        layers::mask::with_token_type_ids(token_type_ids, || {
            layers::mask::with_attention_mask(attention_mask, || self.root.forward(xs, train))
        })
    }

    /// Surgery: replaces the layer at `path` by `layer`. The old layer's tensors (its whole
    /// subtree's) leave the store; the new layer's join it, named under `path`.
    pub fn replace_module(
        &mut self,
        path: &str,
        layer: Box<dyn Layer>,
    ) -> Result<(), SurgeryError> {
        if path.is_empty() {
            return Err(SurgeryError(
                "the root module cannot be replaced".to_owned(),
            ));
        }
        let tensors = layer.named_tensors();
        self.check_device(&tensors)?;
        let old = self.root.replace(path, layer)?;
        let old_names: Vec<String> = old
            .walk_at(path)
            .into_iter()
            .flat_map(|i| i.tensors)
            .collect();
        self.params.remove(&old_names);
        for (name, tensor) in tensors {
            self.params.insert(tree::join(path, &name), tensor)?;
        }
        Ok(())
    }

    /// Refuses surgery tensors that are not on the model's device, naming the first.
    fn check_device(&self, tensors: &[(String, Tensor)]) -> Result<(), SurgeryError> {
        let device = self.params.device();
        match tensors.iter().find(|(_, t)| t.device() != device) {
            Some((name, t)) => Err(SurgeryError(format!(
                "tensor `{name}` is on {:?} but the model is on {device:?}",
                t.device()
            ))),
            None => Ok(()),
        }
    }

    /// Surgery that keeps the module at `path`: `wrap` gets it and returns the layer that takes
    /// its place (holding it). The wrapped module's tensors keep their names, or move under
    /// `path.inner_name` when `inner_name` is given; `own` are the new layer's own tensors,
    /// named relative to `path`.
    pub fn wrap_module(
        &mut self,
        path: &str,
        inner_name: Option<&str>,
        own: &[(String, Tensor)],
        wrap: impl FnOnce(Box<dyn Layer>) -> Box<dyn Layer>,
    ) -> Result<(), SurgeryError> {
        if path.is_empty() {
            return Err(SurgeryError("the root module cannot be wrapped".to_owned()));
        }
        self.check_device(own)?;
        let own_names: Vec<String> = own.iter().map(|(n, _)| tree::join(path, n)).collect();
        if let Some(taken) = own_names.iter().find(|n| self.params.get(n).is_some()) {
            return Err(SurgeryError(format!(
                "the model already has a tensor named `{taken}`"
            )));
        }
        // A placeholder holds the slot while the wrapper is built around the module.
        let inner = self.root.replace(path, Box::new(layers::Flatten))?;
        if let Some(name) = inner_name {
            if let Err(e) = self.params.rename_prefix(path, &tree::join(path, name)) {
                self.root.replace(path, inner)?;
                return Err(e);
            }
        }
        self.root.replace(path, wrap(inner))?;
        for (name, (_, tensor)) in own_names.into_iter().zip(own) {
            self.params.insert(name, tensor.shallow_clone())?;
        }
        Ok(())
    }
}

/// BERT with its head: a masked LM's outputs are the vocabulary; a classifier's the classes,
/// its vocabulary the config's (or the data's, given as `vocab_size`).
fn bert_with_head(
    store: &mut ParamStore,
    config: &ModelConfig,
    num_classes: i64,
) -> Result<Box<dyn Layer>, TchError> {
    let sizes = config.bert.clone().unwrap_or_default();
    let (vocabulary, classes) = match sizes.head {
        zoo::BertHead::MaskedLm => (num_classes, num_classes),
        zoo::BertHead::Classification => match sizes.vocab_size {
            Some(v) => (v as i64, num_classes),
            None => {
                return Err(TchError::Shape(
                    "bert: a classifier needs its vocabulary: `[model] vocab_size`, \
                     or labelled text, whose tokenizer gives it"
                        .to_owned(),
                ))
            }
        },
    };
    Ok(Box::new(zoo::Bert::new(
        store,
        &sizes,
        config.dropout,
        vocabulary,
        classes,
    )?))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod surgery_tests;
