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
    let names =
        |m: &Model| -> Vec<String> { m.params.entries().iter().map(|e| e.name.clone()).collect() };
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
