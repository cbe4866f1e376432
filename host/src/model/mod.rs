//! Models: the module tree ([`Module`]), the named parameter store ([`ParamStore`]) and the
//! model zoo (MLP, small CNN, CIFAR-style ResNet-20/56). Names follow PyTorch conventions so
//! weights map 1:1 to a PyTorch `state_dict`.

mod loss;
mod module;
mod params;
mod spec;

pub use loss::{cross_entropy, cross_entropy_with, NonFiniteLoss};

pub use module::{Attr, ExternalLayer, Layer, Module, ModuleInfo};
pub use params::{Entry, ParamStore, Role};
pub use spec::{ModelConfig, ModelName};

use tch::{
    nn::init::{FanInOut, NonLinearity, NormalOrUniform},
    nn::Init,
    Device, TchError, Tensor,
};

/// A model: its module tree and the store holding its tensors.
#[derive(Debug)]
pub struct Model {
    /// The root of the module tree.
    pub root: Module,
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
    /// Builds the model named in `config` for `input` and `num_classes`, on `device`.
    pub fn build(
        config: &ModelConfig,
        input: InputShape,
        num_classes: i64,
        device: Device,
    ) -> Result<Model, TchError> {
        let mut b = Builder {
            params: ParamStore::new(device),
        };
        let root = match config.name {
            ModelName::Mlp => b.mlp(input, &config.hidden, num_classes)?,
            ModelName::Cnn => b.cnn(input, config.base_width(), num_classes)?,
            ModelName::Resnet20 => b.resnet(input, 20, config.base_width(), num_classes)?,
            ModelName::Resnet56 => b.resnet(input, 56, config.base_width(), num_classes)?,
        };
        Ok(Model {
            root,
            params: b.params,
        })
    }

    /// Runs the model.
    pub fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        self.root.forward(xs, train)
    }

    /// Surgery: replaces the module at `path` by `layer`. The old module's tensors (its whole
    /// subtree's) leave the store; `tensors`, named relative to `path`, join it.
    pub fn replace_module(
        &mut self,
        path: &str,
        layer: Box<dyn ExternalLayer>,
        tensors: Vec<(String, Tensor)>,
    ) -> Result<(), String> {
        if path.is_empty() {
            return Err("the root module cannot be replaced".to_owned());
        }
        let device = self.params.device();
        let mut full = Vec::with_capacity(tensors.len());
        for (name, tensor) in tensors {
            if tensor.device() != device {
                return Err(format!(
                    "tensor `{name}` is on {:?} but the model is on {device:?}",
                    tensor.device()
                ));
            }
            full.push((format!("{path}.{name}"), tensor));
        }
        let names: Vec<String> = full.iter().map(|(n, _)| n.clone()).collect();
        let old = self.root.replace(path, Module::external(layer, names))?;
        let old_names: Vec<String> = old
            .walk_at(path)
            .into_iter()
            .flat_map(|i| i.tensors)
            .collect();
        self.params.remove(&old_names);
        for (name, tensor) in full {
            self.params.insert(name, tensor)?;
        }
        Ok(())
    }
}

// PyTorch's default init for conv and linear layers: kaiming_uniform(a = sqrt(5)) for weights,
// uniform(±1/sqrt(fan_in)) for biases. Convolutions in ResNets use He (fan_out) normal init,
// as torchvision does.
const TORCH_DEFAULT_WEIGHT: Init = Init::Kaiming {
    dist: NormalOrUniform::Uniform,
    fan: FanInOut::FanIn,
    non_linearity: NonLinearity::ExplicitGain(0.577_350_269_189_625_8), // gain sqrt(2/(1+5)) = 1/sqrt(3)
};
const RESNET_CONV: Init = Init::Kaiming {
    dist: NormalOrUniform::Normal,
    fan: FanInOut::FanOut,
    non_linearity: NonLinearity::ReLU,
};

struct Builder {
    params: ParamStore,
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}.{name}")
    }
}

impl Builder {
    #[allow(clippy::too_many_arguments)]
    fn conv(
        &mut self,
        path: &str,
        cin: i64,
        cout: i64,
        kernel: i64,
        stride: i64,
        padding: i64,
        bias: bool,
        init: Init,
    ) -> Result<Module, TchError> {
        let weight =
            self.params
                .parameter(join(path, "weight"), &[cout, cin, kernel, kernel], init)?;
        let bias = if bias {
            let bound = 1.0 / ((cin * kernel * kernel) as f64).sqrt();
            Some(self.params.parameter(
                join(path, "bias"),
                &[cout],
                Init::Uniform {
                    lo: -bound,
                    up: bound,
                },
            )?)
        } else {
            None
        };
        Ok(Module::new(
            "conv2d",
            Layer::Conv2d {
                weight,
                bias,
                stride,
                padding,
                groups: 1,
            },
        )
        .attr("in_channels", Attr::Int(cin))
        .attr("out_channels", Attr::Int(cout))
        .attr("kernel_size", Attr::Int(kernel))
        .attr("stride", Attr::Int(stride))
        .attr("padding", Attr::Int(padding))
        .attr("groups", Attr::Int(1)))
    }

    fn batch_norm(&mut self, path: &str, channels: i64) -> Result<Module, TchError> {
        let weight = self
            .params
            .parameter(join(path, "weight"), &[channels], Init::Const(1.0))?;
        let bias = self
            .params
            .parameter(join(path, "bias"), &[channels], Init::Const(0.0))?;
        let running_mean = self
            .params
            .buffer(join(path, "running_mean"), &[channels], 0.0)?;
        let running_var = self
            .params
            .buffer(join(path, "running_var"), &[channels], 1.0)?;
        let num_batches_tracked = self
            .params
            .buffer_int64(join(path, "num_batches_tracked"), 0)?;
        Ok(Module::new(
            "batch_norm2d",
            Layer::BatchNorm2d {
                weight,
                bias,
                running_mean,
                running_var,
                num_batches_tracked,
                momentum: 0.1,
                eps: 1e-5,
            },
        )
        .attr("num_features", Attr::Int(channels)))
    }

    fn linear(&mut self, path: &str, fin: i64, fout: i64) -> Result<Module, TchError> {
        let weight =
            self.params
                .parameter(join(path, "weight"), &[fout, fin], TORCH_DEFAULT_WEIGHT)?;
        let bound = 1.0 / (fin as f64).sqrt();
        let bias = self.params.parameter(
            join(path, "bias"),
            &[fout],
            Init::Uniform {
                lo: -bound,
                up: bound,
            },
        )?;
        Ok(Module::new(
            "linear",
            Layer::Linear {
                weight,
                bias: Some(bias),
            },
        )
        .attr("in_features", Attr::Int(fin))
        .attr("out_features", Attr::Int(fout)))
    }

    fn max_pool(kernel: i64, stride: i64) -> Module {
        Module::new("max_pool2d", Layer::MaxPool2d { kernel, stride })
            .attr("kernel_size", Attr::Int(kernel))
            .attr("stride", Attr::Int(stride))
    }

    fn relu() -> Module {
        Module::new("relu", Layer::Relu)
    }

    /// `flatten → (linear → relu)* → linear`, as `layers.N`.
    fn mlp(
        &mut self,
        input: InputShape,
        hidden: &[usize],
        classes: i64,
    ) -> Result<Module, TchError> {
        let mut root = Module::new("sequential", Layer::Sequential)
            .child("flatten", Module::new("flatten", Layer::Flatten));
        let mut fin = input.channels * input.height * input.width;
        let mut layers = Module::new("sequential", Layer::Sequential);
        let mut index = 0;
        for &h in hidden {
            let h = h as i64;
            layers = layers.child(
                index.to_string(),
                self.linear(&format!("layers.{index}"), fin, h)?,
            );
            layers = layers.child((index + 1).to_string(), Self::relu());
            index += 2;
            fin = h;
        }
        layers = layers.child(
            index.to_string(),
            self.linear(&format!("layers.{index}"), fin, classes)?,
        );
        root = root.child("layers", layers);
        Ok(root)
    }

    /// Two conv-BN-ReLU-maxpool stages, then a hidden linear layer: a small, fast CNN that
    /// reaches ~91% on Fashion-MNIST in a few epochs.
    fn cnn(&mut self, input: InputShape, width: i64, classes: i64) -> Result<Module, TchError> {
        let c1 = width;
        let c2 = 2 * width;
        let mut features = Module::new("sequential", Layer::Sequential);
        features = features.child(
            "0",
            self.conv(
                "features.0",
                input.channels,
                c1,
                3,
                1,
                1,
                false,
                TORCH_DEFAULT_WEIGHT,
            )?,
        );
        features = features.child("1", self.batch_norm("features.1", c1)?);
        features = features.child("2", Self::relu());
        features = features.child("3", Builder::max_pool(2, 2));
        features = features.child(
            "4",
            self.conv("features.4", c1, c2, 3, 1, 1, false, TORCH_DEFAULT_WEIGHT)?,
        );
        features = features.child("5", self.batch_norm("features.5", c2)?);
        features = features.child("6", Self::relu());
        features = features.child("7", Builder::max_pool(2, 2));
        let flat = c2 * (input.height / 4) * (input.width / 4);
        let hidden = 4 * width;
        let classifier = Module::new("sequential", Layer::Sequential)
            .child("0", Module::new("flatten", Layer::Flatten))
            .child("1", self.linear("classifier.1", flat, hidden)?)
            .child("2", Self::relu())
            .child("3", self.linear("classifier.3", hidden, classes)?);
        Ok(Module::new("sequential", Layer::Sequential)
            .child("features", features)
            .child("classifier", classifier))
    }

    fn basic_block(
        &mut self,
        path: &str,
        cin: i64,
        cout: i64,
        stride: i64,
    ) -> Result<Module, TchError> {
        let mut block = Module::new("residual_block", Layer::BasicBlock)
            .attr("in_channels", Attr::Int(cin))
            .attr("out_channels", Attr::Int(cout))
            .attr("stride", Attr::Int(stride))
            .child(
                "conv1",
                self.conv(
                    &join(path, "conv1"),
                    cin,
                    cout,
                    3,
                    stride,
                    1,
                    false,
                    RESNET_CONV,
                )?,
            )
            .child("bn1", self.batch_norm(&join(path, "bn1"), cout)?)
            .child(
                "conv2",
                self.conv(
                    &join(path, "conv2"),
                    cout,
                    cout,
                    3,
                    1,
                    1,
                    false,
                    RESNET_CONV,
                )?,
            )
            .child("bn2", self.batch_norm(&join(path, "bn2"), cout)?);
        if stride != 1 || cin != cout {
            // Projection shortcut (option B of the ResNet paper): 1x1 conv + BN.
            let shortcut = Module::new("sequential", Layer::Sequential)
                .child(
                    "0",
                    self.conv(
                        &join(path, "shortcut.0"),
                        cin,
                        cout,
                        1,
                        stride,
                        0,
                        false,
                        RESNET_CONV,
                    )?,
                )
                .child("1", self.batch_norm(&join(path, "shortcut.1"), cout)?);
            block = block.child("shortcut", shortcut);
        }
        Ok(block)
    }

    /// CIFAR-style ResNet (He et al. 2016, §4.2): depth = 6n + 2, three stages of n basic
    /// blocks with widths w, 2w, 4w, global average pooling and a linear classifier `fc`.
    fn resnet(
        &mut self,
        input: InputShape,
        depth: usize,
        width: i64,
        classes: i64,
    ) -> Result<Module, TchError> {
        let n = (depth - 2) / 6;
        let mut root = Module::new("sequential", Layer::Sequential)
            .attr("depth", Attr::Int(depth as i64))
            .child(
                "conv1",
                self.conv("conv1", input.channels, width, 3, 1, 1, false, RESNET_CONV)?,
            )
            .child("bn1", self.batch_norm("bn1", width)?)
            .child("relu", Self::relu());
        let mut cin = width;
        for stage in 0..3 {
            let cout = width << stage;
            let mut layer = Module::new("sequential", Layer::Sequential);
            for i in 0..n {
                let stride = if stage > 0 && i == 0 { 2 } else { 1 };
                let path = format!("layer{}.{i}", stage + 1);
                layer = layer.child(i.to_string(), self.basic_block(&path, cin, cout, stride)?);
                cin = cout;
            }
            root = root.child(format!("layer{}", stage + 1), layer);
        }
        root = root
            .child(
                "avgpool",
                Module::new("global_avg_pool", Layer::GlobalAvgPool),
            )
            .child("fc", self.linear("fc", cin, classes)?);
        Ok(root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: ModelName) -> ModelConfig {
        ModelConfig {
            name,
            hidden: vec![32, 16],
            width: None,
            num_classes: 10,
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

    #[test]
    fn every_model_runs_on_one_and_three_channels() {
        for name in [
            ModelName::Mlp,
            ModelName::Cnn,
            ModelName::Resnet20,
            ModelName::Resnet56,
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
