//! The vision models built from the generic layers: MLP, a small CNN, CIFAR-style ResNets,
//! torchvision's ImageNet ResNets and airbench's network,
//! named as their PyTorch counterparts so weights map 1:1 to a PyTorch `state_dict`.

use tch::nn::init::{FanInOut, NonLinearity, NormalOrUniform};
use tch::nn::Init;
use tch::TchError;

use crate::model::layers::init::TORCH_DEFAULT_WEIGHT;
use crate::model::layers::{
    Attr, BatchNorm2d, Bottleneck, Conv2d, Conv2dConfig, ConvGroup, Dropout, Flatten, Gelu,
    GlobalAvgPool, GlobalMaxPool, GroupNorm, GroupNorms, Layer, LayerNorm, Linear, MaxPool2d, Mul,
    Relu, ResidualBlock, Sequential, EXPANSION,
};
use crate::model::{InputShape, Norm, ParamStore};

/// Convolutions in ResNets use He (fan_out) normal init, as torchvision does.
const RESNET_CONV: Init = Init::Kaiming {
    dist: NormalOrUniform::Normal,
    fan: FanInOut::FanOut,
    non_linearity: NonLinearity::ReLU,
};

/// A 3×3 convolution with padding 1 and no bias.
fn conv3x3(
    store: &mut ParamStore,
    path: &str,
    in_channels: i64,
    out_channels: i64,
    init: Init,
) -> Result<Conv2d, TchError> {
    let config = Conv2dConfig {
        padding: 1,
        bias: false,
        ..Conv2dConfig::default()
    };
    Conv2d::new(store, path, in_channels, out_channels, 3, config, init)
}

/// `flatten → (linear → [layer_norm] → relu → [dropout])* → linear`, as `layers.N` numbered
/// like PyTorch's `nn.Sequential` (with neither option: `linear`, `relu` at 0, 1, 2, ...).
/// `norm` is [`Norm::None`] or [`Norm::Layer`]; `dropout` > 0 adds a `Dropout(dropout)` after
/// each hidden `ReLU`.
pub fn mlp(
    store: &mut ParamStore,
    input: InputShape,
    hidden: &[usize],
    norm: Norm,
    dropout: f64,
    classes: i64,
) -> Result<Sequential, TchError> {
    let mut fin = input.channels * input.height * input.width;
    let mut layers = Sequential::new();
    let mut index = 0;
    for &h in hidden {
        let h = h as i64;
        let mut block: Vec<Box<dyn Layer>> = Vec::new();
        block.push(Box::new(Linear::new(
            store,
            &format!("layers.{index}"),
            fin,
            h,
        )?));
        if norm == Norm::Layer {
            let path = format!("layers.{}", index + 1);
            block.push(Box::new(LayerNorm::new(store, &path, h)?));
        }
        block.push(Box::new(Relu));
        if dropout > 0.0 {
            block.push(Box::new(Dropout::new(dropout)));
        }
        for layer in block {
            layers = layers.add_boxed(index.to_string(), layer);
            index += 1;
        }
        fin = h;
    }
    let last = Linear::new(store, &format!("layers.{index}"), fin, classes)?;
    layers = layers.add(index.to_string(), last);
    Ok(Sequential::new()
        .add("flatten", Flatten)
        .add("layers", layers))
}

/// The cnn's normalization of `channels` channels at `path`: `BatchNorm2d`, or `GroupNorm` in
/// [`Norm::groups`] groups.
fn channel_norm(
    store: &mut ParamStore,
    path: &str,
    norm: Norm,
    channels: i64,
) -> Result<Box<dyn Layer>, TchError> {
    Ok(match norm {
        Norm::Group => Box::new(GroupNorm::new(
            store,
            path,
            Norm::groups(channels),
            channels,
        )?),
        _ => Box::new(BatchNorm2d::new(store, path, channels)?),
    })
}

/// Two conv-norm-ReLU-maxpool stages (norm: [`Norm::Batch`] or [`Norm::Group`]), then a hidden
/// linear layer: a small, fast CNN that reaches ~91% on Fashion-MNIST in a few epochs.
pub fn cnn(
    store: &mut ParamStore,
    input: InputShape,
    width: i64,
    norm: Norm,
    classes: i64,
) -> Result<Sequential, TchError> {
    let c1 = width;
    let c2 = 2 * width;
    let init = TORCH_DEFAULT_WEIGHT;
    let features = Sequential::new()
        .add("0", conv3x3(store, "features.0", input.channels, c1, init)?)
        .add_boxed("1", channel_norm(store, "features.1", norm, c1)?)
        .add("2", Relu)
        .add("3", MaxPool2d::new(2, 2))
        .add("4", conv3x3(store, "features.4", c1, c2, init)?)
        .add_boxed("5", channel_norm(store, "features.5", norm, c2)?)
        .add("6", Relu)
        .add("7", MaxPool2d::new(2, 2));
    let flat = c2 * (input.height / 4) * (input.width / 4);
    let hidden = 4 * width;
    let classifier = Sequential::new()
        .add("0", Flatten)
        .add("1", Linear::new(store, "classifier.1", flat, hidden)?)
        .add("2", Relu)
        .add("3", Linear::new(store, "classifier.3", hidden, classes)?);
    Ok(Sequential::new()
        .add("features", features)
        .add("classifier", classifier))
}

/// CIFAR-style ResNet (He et al. 2016, §4.2): depth = 6n + 2, three stages of n basic
/// blocks with widths w, 2w, 4w, global average pooling and a linear classifier `fc`.
pub fn resnet(
    store: &mut ParamStore,
    input: InputShape,
    depth: usize,
    width: i64,
    classes: i64,
) -> Result<Sequential, TchError> {
    let n = (depth - 2) / 6;
    let mut root = Sequential::new()
        .attr("depth", Attr::Int(depth as i64))
        .add(
            "conv1",
            conv3x3(store, "conv1", input.channels, width, RESNET_CONV)?,
        )
        .add("bn1", BatchNorm2d::new(store, "bn1", width)?)
        .add("relu", Relu);
    let mut cin = width;
    for stage in 0..3 {
        let cout = width << stage;
        let mut layer = Sequential::new();
        for i in 0..n {
            let stride = if stage > 0 && i == 0 { 2 } else { 1 };
            let path = format!("layer{}.{i}", stage + 1);
            let block = ResidualBlock::new(store, &path, cin, cout, stride, RESNET_CONV)?;
            layer = layer.add(i.to_string(), block);
            cin = cout;
        }
        root = root.add(format!("layer{}", stage + 1), layer);
    }
    Ok(root
        .add("avgpool", GlobalAvgPool)
        .add("fc", Linear::new(store, "fc", cin, classes)?))
}

/// The ImageNet ResNets of the zoo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImagenetDepth {
    /// Basic blocks `[2, 2, 2, 2]`.
    Resnet18,
    /// Bottleneck blocks `[3, 4, 6, 3]`.
    Resnet50,
}

/// torchvision's ResNet (`torchvision.models.resnet18/50`, He et al. 2016, with the stride of
/// a bottleneck on its 3×3 convolution, "v1.5"): a 7×7 stride-2 stem `conv1`-`bn1`-`relu`,
/// `maxpool` (3, stride 2, padding 1), four stages `layer1`..`layer4` of widths w, 2w, 4w, 8w
/// (stride 2 from the second), global average pooling and `fc`. Parameter names, shapes and
/// initialisation (He normal fan-out for convolutions, BatchNorm 1/0, PyTorch's default for
/// `fc`) are torchvision's, so with `width = 64` and 3 input channels the exported weights
/// load into `torchvision.models.resnet18/50(num_classes=...)` with `strict=True`; other widths
/// and channel counts scale the same architecture.
pub fn imagenet_resnet(
    store: &mut ParamStore,
    input: InputShape,
    depth: ImagenetDepth,
    width: i64,
    classes: i64,
) -> Result<Sequential, TchError> {
    let (blocks, bottleneck) = match depth {
        ImagenetDepth::Resnet18 => ([2, 2, 2, 2], false),
        ImagenetDepth::Resnet50 => ([3, 4, 6, 3], true),
    };
    let stem = Conv2dConfig {
        stride: 2,
        padding: 3,
        bias: false,
        ..Conv2dConfig::default()
    };
    let mut root = Sequential::new()
        .add(
            "conv1",
            Conv2d::new(store, "conv1", input.channels, width, 7, stem, RESNET_CONV)?,
        )
        .add("bn1", BatchNorm2d::new(store, "bn1", width)?)
        .add("relu", Relu)
        .add("maxpool", MaxPool2d::padded(3, 2, 1));
    let mut cin = width;
    for (stage, &n) in blocks.iter().enumerate() {
        let planes = width << stage;
        let mut layer = Sequential::new();
        for i in 0..n {
            let stride = if stage > 0 && i == 0 { 2 } else { 1 };
            let path = format!("layer{}.{i}", stage + 1);
            layer = if bottleneck {
                let block = Bottleneck::new(store, &path, cin, planes, stride, RESNET_CONV)?;
                cin = planes * EXPANSION;
                layer.add(i.to_string(), block)
            } else {
                let block =
                    ResidualBlock::torchvision(store, &path, cin, planes, stride, RESNET_CONV)?;
                cin = planes;
                layer.add(i.to_string(), block)
            };
        }
        root = root.add(format!("layer{}", stage + 1), layer);
    }
    Ok(root
        .add("avgpool", GlobalAvgPool)
        .add("fc", Linear::new(store, "fc", cin, classes)?))
}

/// airbench's batch norms: `BatchNorm(momentum=0.6)` in airbench's convention (the weight of the
/// old statistics), i.e. PyTorch's `momentum=0.4`, and `eps=1e-12`.
pub const AIRBENCH_NORMS: GroupNorms = GroupNorms {
    momentum: 0.4,
    eps: 1e-12,
};

/// airbench's factor on the head's output (`scaling_factor: 1/9` in legacy/airbench94.py).
pub const AIRBENCH_SCALING: f64 = 1.0 / 9.0;

/// The output channels of airbench's first convolution for `channels` input channels: twice
/// the length of a 2×2 patch (`2 · C · 2 · 2`), room for the patch-whitening filters and their
/// negatives (24 for RGB, 8 for one channel).
pub fn airbench_whiten_width(channels: i64) -> i64 {
    2 * channels * 2 * 2
}

/// Keller Jordan's airbench network (cifar10-airbench `airbench94_muon.py`'s `CifarNet`; the
/// legacy `airbench94.py` is the same net as one `nn.Sequential`): `whiten`, a 2×2 convolution
/// without padding, with bias, to [`airbench_whiten_width`] channels; `layers`: `0` GELU, `1`..`3`
/// [`ConvGroup`]s of `widths` (each halves the size with its max-pool), `4` a global max-pool;
/// `head`, a linear layer without bias; `scale`, the output times [`AIRBENCH_SCALING`]. Batch
/// norms use [`AIRBENCH_NORMS`]. The initialisation is PyTorch's default everywhere (airbench's
/// patch-whitening, identity init and frozen norm scales are the `patch_whitening`,
/// `dirac_init` and `batchnorm_tricks` plugins). On 28×28 (Fashion-MNIST) the sizes run
/// 27 → 13 → 6 → 3, on 32×32 (CIFAR-10) 31 → 15 → 7 → 3, so the global max-pool is airbench's
/// `MaxPool2d(3)`; any input of at least 10×10 works (9 → 4 → 2 → 1).
pub fn airbench(
    store: &mut ParamStore,
    input: InputShape,
    widths: [i64; 3],
    classes: i64,
) -> Result<Sequential, TchError> {
    let whiten_width = airbench_whiten_width(input.channels);
    let whiten = Conv2d::new(
        store,
        "whiten",
        input.channels,
        whiten_width,
        2,
        Conv2dConfig::default(),
        TORCH_DEFAULT_WEIGHT,
    )?;
    let mut layers = Sequential::new().add("0", Gelu);
    let mut cin = whiten_width;
    for (i, &cout) in widths.iter().enumerate() {
        let path = format!("layers.{}", i + 1);
        let group = ConvGroup::new(
            store,
            &path,
            cin,
            cout,
            AIRBENCH_NORMS,
            TORCH_DEFAULT_WEIGHT,
        )?;
        layers = layers.add((i + 1).to_string(), group);
        cin = cout;
    }
    layers = layers.add("4", GlobalMaxPool);
    Ok(Sequential::new()
        .add("whiten", whiten)
        .add("layers", layers)
        .add("head", Linear::no_bias(store, "head", cin, classes)?)
        .add("scale", Mul::new(AIRBENCH_SCALING)))
}
