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
            ModelName::Bert => {
                let sizes = config.bert.clone().unwrap_or_default();
                // A masked LM's outputs are the vocabulary; a classifier's the classes, its
                // vocabulary the config's (or the data's, given as `vocab_size`).
                let (vocabulary, classes) =
                    match sizes.head {
                        zoo::BertHead::MaskedLm => (num_classes, num_classes),
                        zoo::BertHead::Classification => match sizes.vocab_size {
                            Some(v) => (v as i64, num_classes),
                            None => return Err(TchError::Shape(
                                "bert: a classifier needs its vocabulary: `[model] vocab_size`, \
                                 or labelled text, whose tokenizer gives it"
                                    .to_owned(),
                            )),
                        },
                    };
                Box::new(zoo::Bert::new(
                    store,
                    &sizes,
                    config.dropout,
                    vocabulary,
                    classes,
                )?)
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: ModelName) -> ModelConfig {
        ModelConfig {
            name,
            torchscript: None,
            hidden: vec![32, 16],
            widths: Vec::new(),
            width: None,
            num_classes: 10,
            dropout: 0.0,
            norm: None,
            gpt2: None,
            bert: None,
            llama: None,
            vit: None,
            init: None,
        }
    }

    fn shape(c: i64) -> InputShape {
        InputShape {
            channels: c,
            height: 28,
            width: 28,
        }
    }

    #[test]
    fn mlp_norm_and_dropout_shift_the_sequential_indices_as_pytorch() {
        let kinds = |c: &ModelConfig| -> Vec<(String, String)> {
            let m = Model::build(c, shape(1), 10, Device::Cpu).unwrap();
            m.root
                .walk()
                .into_iter()
                .filter(|i| i.path.starts_with("layers."))
                .map(|i| (i.path, i.kind))
                .collect()
        };
        let plain = kinds(&config(ModelName::Mlp));
        let plain: Vec<(&str, &str)> = plain.iter().map(|(p, k)| (&p[..], &k[..])).collect();
        assert_eq!(
            plain,
            [
                ("layers.0", "linear"),
                ("layers.1", "relu"),
                ("layers.2", "linear"),
                ("layers.3", "relu"),
                ("layers.4", "linear")
            ]
        );
        let mut c = config(ModelName::Mlp);
        c.norm = Some(Norm::Layer);
        c.dropout = 0.5;
        let both = kinds(&c);
        let both: Vec<&str> = both.iter().map(|(_, k)| &k[..]).collect();
        assert_eq!(
            both,
            [
                "linear",
                "layer_norm",
                "relu",
                "dropout",
                "linear",
                "layer_norm",
                "relu",
                "dropout",
                "linear"
            ]
        );
        let m = Model::build(&c, shape(1), 10, Device::Cpu).unwrap();
        let names: Vec<&str> = m.params.entries().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "layers.0.weight",
                "layers.0.bias",
                "layers.1.weight",
                "layers.1.bias",
                "layers.4.weight",
                "layers.4.bias",
                "layers.5.weight",
                "layers.5.bias",
                "layers.8.weight",
                "layers.8.bias"
            ]
        );
        let node = m.root.walk().into_iter().find(|i| i.path == "layers.3");
        assert_eq!(node.unwrap().attrs.get("p"), Some(&Attr::Float(0.5)));
        // Dropout is the identity in evaluation and changes training.
        let x = Tensor::ones([4, 1, 28, 28], (tch::Kind::Float, Device::Cpu));
        let eval = m.root.forward(&x, false).unwrap();
        assert!(eval.equal(&m.root.forward(&x, false).unwrap()));
    }

    #[test]
    fn cnn_group_norm_replaces_the_batch_norms() {
        let mut c = config(ModelName::Cnn);
        c.norm = Some(Norm::Group);
        let m = Model::build(&c, shape(1), 10, Device::Cpu).unwrap();
        let norms: Vec<(String, Option<Attr>)> = m
            .root
            .walk()
            .into_iter()
            .filter(|i| i.kind == "group_norm")
            .map(|i| (i.path, i.attrs.get("num_groups").cloned()))
            .collect();
        assert_eq!(
            norms,
            [
                ("features.1".to_owned(), Some(Attr::Int(8))),
                ("features.5".to_owned(), Some(Attr::Int(8)))
            ]
        );
        assert!(!m
            .params
            .entries()
            .iter()
            .any(|e| e.name.contains("running")));
        assert_eq!(Norm::groups(12), 4);
        assert_eq!(Norm::groups(6), 2);
    }

    #[test]
    fn resnet20_has_pytorch_names_and_paths() {
        let m = Model::build(&config(ModelName::Resnet20), shape(1), 10, Device::Cpu).unwrap();
        let names: Vec<&str> = m.params.entries().iter().map(|e| e.name.as_str()).collect();
        assert!(names.contains(&"conv1.weight"));
        assert!(names.contains(&"layer2.0.shortcut.0.weight"));
        assert!(names.contains(&"layer3.2.bn2.running_var"));
        assert!(names.contains(&"fc.bias"));
        // 3 stages x 3 blocks, 2 projection shortcuts.
        let blocks = m
            .root
            .walk()
            .iter()
            .filter(|i| i.kind == "residual_block")
            .count();
        assert_eq!(blocks, 9);
        let paths: Vec<String> = m.root.walk().into_iter().map(|i| i.path).collect();
        assert!(paths.contains(&"layer1.0.conv1".to_owned()));
        // ~0.27M parameters, as in the paper.
        let n = m.params.num_trainable_scalars();
        assert!((260_000..280_000).contains(&n), "{n}");
    }

    /// A host-side wrapper for the tests of `Model::wrap_module`: doubles its inner's output.
    #[derive(Debug)]
    struct Doubler {
        inner: Box<dyn Layer>,
        name: &'static str,
        scale: Tensor,
    }

    impl Layer for Doubler {
        fn kind(&self) -> &str {
            "doubler"
        }
        fn tensors(&self) -> Vec<(&str, &Tensor)> {
            let mut t = if self.name.is_empty() {
                self.inner.tensors()
            } else {
                Vec::new()
            };
            t.push(("scale", &self.scale));
            t
        }
        fn children(&self) -> Vec<(&str, &dyn Layer)> {
            if self.name.is_empty() {
                self.inner.children()
            } else {
                vec![(self.name, self.inner.as_ref())]
            }
        }
        fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
            self.inner.forward(xs, train)?.f_mul(&self.scale)
        }
    }

    #[test]
    fn wrapping_keeps_or_nests_the_wrapped_tensors_and_fails_cleanly() {
        let mut m = Model::build(&config(ModelName::Cnn), shape(1), 10, Device::Cpu).unwrap();
        let x = Tensor::randn([2, 1, 28, 28], (tch::Kind::Float, Device::Cpu));
        let before = m.forward(&x, false).unwrap();
        let count = m.params.entries().len();
        let scale = || Tensor::from(2.0f32).set_requires_grad(true);
        // Transparent: the layer's weight keeps its name; the wrapper's `scale` joins.
        let s = scale();
        m.wrap_module(
            "classifier.3",
            None,
            &[("scale".to_owned(), s.shallow_clone())],
            |inner| {
                Box::new(Doubler {
                    inner,
                    name: "",
                    scale: s,
                })
            },
        )
        .unwrap();
        assert!(m.params.get("classifier.3.weight").is_some());
        assert!(m.params.get("classifier.3.scale").is_some());
        assert_eq!(m.params.entries().len(), count + 1);
        let after = m.forward(&x, false).unwrap();
        assert!(after.allclose(&(&before * 2.0), 1e-6, 1e-6, false));
        let node = m.root.walk().into_iter().find(|i| i.path == "classifier.3");
        assert_eq!(node.map(|i| i.kind), Some("doubler".to_owned()));
        // Nested: the batch norm's tensors move under `bn`, in place and with their roles.
        let s = scale();
        m.wrap_module(
            "features.1",
            Some("bn"),
            &[("scale".to_owned(), s.shallow_clone())],
            |inner| {
                Box::new(Doubler {
                    inner,
                    name: "bn",
                    scale: s,
                })
            },
        )
        .unwrap();
        assert!(m.params.get("features.1.weight").is_none());
        let e = m.params.get("features.1.bn.running_mean").unwrap();
        assert_eq!(e.role, Role::Buffer);
        assert_eq!(
            m.params.get("features.1.bn.weight").unwrap().role,
            Role::Parameter
        );
        let names: Vec<String> = m.root.named_tensors().into_iter().map(|(n, _)| n).collect();
        let store: Vec<String> = m.params.entries().iter().map(|e| e.name.clone()).collect();
        let (mut a, mut b) = (names.clone(), store.clone());
        a.sort();
        b.sort();
        assert_eq!(a, b, "the tree and the store agree on every name");
        // A missing module or a taken name changes nothing.
        let entries = m.params.entries().len();
        let err = m
            .wrap_module("features.9", None, &[], |inner| inner)
            .unwrap_err();
        assert!(err.0.contains("features.9"), "{}", err.0);
        let taken = [("bn.weight".to_owned(), scale())];
        let err = m
            .wrap_module("features.1", None, &taken, |inner| inner)
            .unwrap_err();
        assert!(err.0.contains("features.1.bn.weight"), "{}", err.0);
        assert_eq!(m.params.entries().len(), entries);
    }

    #[test]
    fn imagenet_resnets_have_torchvision_names_and_blocks() {
        let r18 = Model::build(&config(ModelName::Resnet18), shape(3), 10, Device::Cpu).unwrap();
        let r50 = Model::build(&config(ModelName::Resnet50), shape(3), 10, Device::Cpu).unwrap();
        let names = |m: &Model| -> Vec<String> {
            m.params.entries().iter().map(|e| e.name.clone()).collect()
        };
        let (n18, n50) = (names(&r18), names(&r50));
        for n in [
            "conv1.weight",
            "bn1.running_mean",
            "layer2.0.downsample.0.weight",
            "fc.bias",
        ] {
            assert!(n18.iter().any(|x| x == n), "resnet18 lacks {n}");
        }
        // 64 -> 64 at stride 1: no projection in resnet18's first block, one in resnet50's.
        assert!(!n18.iter().any(|x| x.starts_with("layer1.0.downsample")));
        for n in [
            "layer1.0.downsample.1.weight",
            "layer4.2.conv3.weight",
            "layer3.5.bn3.bias",
        ] {
            assert!(n50.iter().any(|x| x == n), "resnet50 lacks {n}");
        }
        let count = |m: &Model, kind: &str| m.root.walk().iter().filter(|i| i.kind == kind).count();
        assert_eq!(count(&r18, "residual_block"), 8);
        assert_eq!(count(&r50, "bottleneck_block"), 16);
        let fc = r50.params.get("fc.weight").unwrap().tensor.size();
        assert_eq!(fc, [10, 2048]);
    }

    #[test]
    fn every_model_runs_on_one_and_three_channels() {
        for name in [
            ModelName::Mlp,
            ModelName::Cnn,
            ModelName::Resnet20,
            ModelName::Resnet56,
            ModelName::Resnet18,
            ModelName::Resnet50,
            ModelName::Airbench,
        ] {
            for c in [1, 3] {
                let m = Model::build(&config(name), shape(c), 10, Device::Cpu).unwrap();
                let x = Tensor::randn([2, c, 28, 28], (tch::Kind::Float, Device::Cpu));
                let y = m.forward(&x, true).unwrap();
                assert_eq!(y.size(), vec![2, 10], "{name:?} with {c} channels");
            }
        }
    }

    #[test]
    fn airbench_has_airbench94s_names_shapes_and_settings() {
        let mut c = ModelConfig::new(ModelName::Airbench, 10);
        let m = Model::build(&c, shape(1), 10, Device::Cpu).unwrap();
        let shapes: Vec<(String, Vec<i64>)> = m
            .params
            .entries()
            .iter()
            .map(|e| (e.name.clone(), e.tensor.size()))
            .collect();
        let find = |n: &str| {
            shapes
                .iter()
                .find(|(name, _)| name == n)
                .map(|(_, s)| s.clone())
        };
        // 2 x (1 x 2 x 2) whitening channels for one input channel.
        assert_eq!(find("whiten.weight"), Some(vec![8, 1, 2, 2]));
        assert_eq!(find("whiten.bias"), Some(vec![8]));
        assert_eq!(find("layers.1.conv1.weight"), Some(vec![64, 8, 3, 3]));
        assert_eq!(find("layers.2.conv1.weight"), Some(vec![256, 64, 3, 3]));
        assert_eq!(find("layers.3.conv2.weight"), Some(vec![256, 256, 3, 3]));
        assert_eq!(find("layers.3.norm2.running_var"), Some(vec![256]));
        assert_eq!(find("head.weight"), Some(vec![10, 256]));
        assert_eq!(find("head.bias"), None);
        assert!(!shapes.iter().any(|(n, _)| n.contains("conv1.bias")));
        // whiten 2, 3 groups x (2 convs + 2 norms x 5 tensors), head 1.
        assert_eq!(shapes.len(), 2 + 3 * 12 + 1);
        // Trainable scalars, counted by hand: whiten 8*4+8, group convs and norm scale/shift.
        let convs = 64 * 8 * 9 + 64 * 64 * 9 + 256 * 64 * 9 + 256 * 256 * 9 * 3;
        let norms = 2 * (2 * 64 + 4 * 256);
        assert_eq!(
            m.params.num_trainable_scalars(),
            40 + convs + norms + 256 * 10
        );
        let walk = m.root.walk();
        let node = |p: &str| walk.iter().find(|i| i.path == p).unwrap();
        assert_eq!(node("whiten").attrs.get("kernel_size"), Some(&Attr::Int(2)));
        assert_eq!(node("whiten").attrs.get("padding"), Some(&Attr::Int(0)));
        assert_eq!(node("layers.0").kind, "gelu");
        assert_eq!(node("layers.2").kind, "conv_group");
        assert_eq!(node("layers.2.pool").kind, "max_pool2d");
        assert_eq!(node("layers.4").kind, "global_max_pool");
        assert_eq!(
            node("scale").attrs.get("factor"),
            Some(&Attr::Float(1.0 / 9.0))
        );
        let bn = node("layers.1.norm1");
        assert_eq!(bn.attrs.get("momentum"), Some(&Attr::Float(0.4)));
        assert_eq!(bn.attrs.get("eps"), Some(&Attr::Float(1e-12)));
        // Fashion-MNIST and CIFAR sizes, and other widths.
        for (channels, size) in [(1, 28), (3, 32)] {
            let input = InputShape {
                channels,
                height: size,
                width: size,
            };
            c.widths = vec![8, 16, 24];
            let m = Model::build(&c, input, 10, Device::Cpu).unwrap();
            let whiten = m.params.get("whiten.weight").unwrap().tensor.size();
            assert_eq!(whiten, [8 * channels, channels, 2, 2]);
            let x = Tensor::randn([3, channels, size, size], (tch::Kind::Float, Device::Cpu));
            let features = walk_to_features(&m, &x);
            assert_eq!(features.size(), [3, 24, 3, 3], "{size}x{size}");
            assert_eq!(m.forward(&x, true).unwrap().size(), [3, 10]);
        }
    }

    /// airbench's activations before the global max-pool: whiten, then `layers.0..3`.
    fn walk_to_features(m: &Model, x: &Tensor) -> Tensor {
        let root = m.root.children();
        let whiten = root[0].1.forward(x, false).unwrap();
        let layers = root[1].1.children();
        layers[..4]
            .iter()
            .fold(whiten, |x, (_, l)| l.forward(&x, false).unwrap())
    }

    #[test]
    fn batch_norm_counts_training_forwards_like_pytorch() {
        let m = Model::build(&config(ModelName::Cnn), shape(1), 10, Device::Cpu).unwrap();
        let names: Vec<&str> = m.params.entries().iter().map(|e| e.name.as_str()).collect();
        // PyTorch's BatchNorm2d state_dict order.
        assert_eq!(
            names[1..6],
            [
                "features.1.weight",
                "features.1.bias",
                "features.1.running_mean",
                "features.1.running_var",
                "features.1.num_batches_tracked",
            ]
        );
        let bn = m
            .root
            .walk()
            .into_iter()
            .find(|i| i.path == "features.1")
            .unwrap();
        assert_eq!(bn.tensors, names[1..6]);
        let count = &m
            .params
            .get("features.1.num_batches_tracked")
            .unwrap()
            .tensor;
        assert_eq!((count.kind(), count.size()), (tch::Kind::Int64, vec![]));
        assert_eq!(
            m.params.get("features.1.num_batches_tracked").unwrap().role,
            Role::Buffer
        );
        let x = Tensor::randn([2, 1, 28, 28], (tch::Kind::Float, Device::Cpu));
        for _ in 0..3 {
            let _ = m.forward(&x, true).unwrap();
        }
        let _ = m.forward(&x, false).unwrap();
        assert_eq!(count.int64_value(&[]), 3);
        // Buffers are not trained.
        assert!(m.params.trainable().all(|e| e.tensor.is_floating_point()));
    }

    #[test]
    fn a_wrong_input_is_an_error_not_a_panic() {
        let m = Model::build(&config(ModelName::Cnn), shape(1), 10, Device::Cpu).unwrap();
        let x = Tensor::randn([2, 3, 28, 28], (tch::Kind::Float, Device::Cpu));
        assert!(m.forward(&x, true).is_err());
    }
}

#[cfg(test)]
mod surgery_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A layer from outside the zoo, as a plugin's would be: multiplies by a held tensor and
    /// counts its forwards.
    #[derive(Debug)]
    struct Scale {
        factor: Tensor,
        forwards: Arc<AtomicUsize>,
    }

    impl Layer for Scale {
        fn kind(&self) -> &str {
            "scale"
        }

        fn attrs(&self) -> Vec<(&str, Attr)> {
            vec![("factor", Attr::Float(2.0))]
        }

        fn tensors(&self) -> Vec<(&str, &Tensor)> {
            vec![("factor", &self.factor)]
        }

        fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
            self.forwards.fetch_add(1, Ordering::SeqCst);
            xs.f_mul(&self.factor)
        }
    }

    fn resnet20() -> Model {
        let config = ModelConfig {
            name: ModelName::Resnet20,
            torchscript: None,
            hidden: Vec::new(),
            widths: Vec::new(),
            width: None,
            num_classes: 10,
            dropout: 0.0,
            norm: None,
            gpt2: None,
            bert: None,
            llama: None,
            vit: None,
            init: None,
        };
        let input = InputShape {
            channels: 3,
            height: 8,
            width: 8,
        };
        Model::build(&config, input, 10, Device::Cpu).unwrap()
    }

    fn scale(forwards: &Arc<AtomicUsize>) -> Box<dyn Layer> {
        Box::new(Scale {
            factor: Tensor::from(2.0f32),
            forwards: Arc::clone(forwards),
        })
    }

    #[test]
    fn a_layer_from_outside_replaces_a_block_child_in_the_tree_store_and_forward() {
        let mut m = resnet20();
        let forwards = Arc::new(AtomicUsize::new(0));
        m.replace_module("layer1.0.conv1", scale(&forwards))
            .unwrap();
        let node = m
            .root
            .walk()
            .into_iter()
            .find(|i| i.path == "layer1.0.conv1")
            .unwrap();
        assert_eq!(node.kind, "scale");
        assert_eq!(node.attrs.get("factor"), Some(&Attr::Float(2.0)));
        assert_eq!(node.tensors, ["layer1.0.conv1.factor"]);
        assert!(m.params.get("layer1.0.conv1.weight").is_none());
        let factor = m.params.get("layer1.0.conv1.factor").unwrap();
        assert_eq!(factor.role, Role::Buffer);
        let x = Tensor::randn([2, 3, 8, 8], (tch::Kind::Float, Device::Cpu));
        assert_eq!(m.forward(&x, true).unwrap().size(), [2, 10]);
        assert_eq!(m.forward(&x, false).unwrap().size(), [2, 10]);
        assert_eq!(forwards.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn replacing_a_subtree_removes_all_its_tensors() {
        let mut m = resnet20();
        let before = m.params.entries().len();
        let forwards = Arc::new(AtomicUsize::new(0));
        m.replace_module("layer2.0", scale(&forwards)).unwrap();
        // conv1, bn1, conv2, bn2 and the projection shortcut (conv + bn): 3 convs, 3 BNs of 5.
        assert_eq!(m.params.entries().len(), before - 18 + 1);
        assert!(m
            .params
            .entries()
            .iter()
            .all(|e| !e.name.starts_with("layer2.0.") || e.name == "layer2.0.factor"));
        let paths: Vec<String> = m.root.walk().into_iter().map(|i| i.path).collect();
        assert!(paths.contains(&"layer2.0".to_owned()));
        assert!(!paths.iter().any(|p| p.starts_with("layer2.0.")));
    }

    #[test]
    fn surgery_refuses_the_root_and_unknown_paths_without_changing_the_model() {
        let mut m = resnet20();
        let forwards = Arc::new(AtomicUsize::new(0));
        let before = m.root.walk();
        for (path, message) in [
            ("", "the root module cannot be replaced"),
            ("layer9.0", "no module at `layer9`"),
            ("layer1.7", "no module at `layer1.7`"),
            ("layer1.0.shortcut", "no module at `layer1.0.shortcut`"),
        ] {
            assert_eq!(
                m.replace_module(path, scale(&forwards)).unwrap_err().0,
                message
            );
        }
        assert_eq!(m.root.walk(), before);
        assert!(m.params.get("layer1.0.conv1.weight").is_some());
    }

    #[test]
    fn a_hugging_face_gpt2_config_reads_or_names_what_is_not_computed() {
        let json = serde_json::json!({
            "model_type": "gpt2", "n_layer": 3, "n_head": 2, "n_embd": 16, "n_positions": 40,
            "vocab_size": 99, "n_inner": null, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-6, "tie_word_embeddings": false
        });
        let c = Gpt2Config::from_hf_config(&json).unwrap();
        assert_eq!(
            (c.n_layer, c.n_head, c.n_embd, c.n_positions, c.vocab_size),
            (3, 2, 16, 40, Some(99))
        );
        assert!(!c.tie_embeddings && c.layer_norm_epsilon == 1e-6);
        for (key, value, says) in [
            (
                "activation_function",
                serde_json::json!("relu"),
                "activation_function",
            ),
            ("n_inner", serde_json::json!(20), "n_inner"),
            (
                "add_cross_attention",
                serde_json::json!(true),
                "add_cross_attention",
            ),
            ("n_layer", serde_json::json!("two"), "whole number"),
            ("model_type", serde_json::json!("bert"), "model_type"),
        ] {
            let mut bad = json.clone();
            bad[key] = value;
            let e = Gpt2Config::from_hf_config(&bad).unwrap_err();
            assert!(e.contains(says), "{key}: {e}");
        }
    }
}
