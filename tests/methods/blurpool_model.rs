//! BlurPool on the host's real ResNet-20, in-process: the model after the plugin's surgery
//! (the real `libblurpool.so`, through the ABI, at `init`) must compute exactly what the
//! plugin's functional form (`blurpool::blur_conv2d`, checked against Composer's golden outputs
//! in `plugins/blurpool/tests/golden.rs` and below) computes on the same weights.
//!
//! The reference is the plain ResNet-20 with the surgically changed model's weights, in which
//! each conv that Composer's rule selects (`blurpool::conv_is_replaced` on the plain model's own
//! stride and channels) is swapped for a layer calling `blur_conv2d` on that conv's weights.

use tessera::config;
use tessera::model::{Attr, Layer, Model};
use tessera::trainer::Trainer;
use tessera_plugin_api::tch::{self, Device, Kind, TchError, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_tests::{target_dir, toml_string, TempDir};

/// The blurpool settings of this test; `min_channels = 16` keeps the stem conv (3 channels)
/// and selects the four stride-2 convs of ResNet-20 at width 16.
const MIN_CHANNELS: i64 = 16;

fn trainer_toml(blur_first: bool) -> String {
    format!(
        r#"run_name = "blurpool-model"
seed = 5
output_dir = "runs"
[data]
dataset = "synthetic"
batch_size = 8
eval_batch_size = 8
workers = 0
[data.synthetic]
samples = 16
eval_samples = 8
channels = 3
height = 16
width = 16
classes = 10
[model]
name = "resnet20"
width = 16
[optimizer]
name = "sgd"
lr = 0.1
[train]
max_duration = "1ba"
progress = false
[plugins]
dirs = [{dirs}]
[[algorithms]]
plugin = "blurpool"
blur_first = {blur_first}
min_channels = {MIN_CHANNELS}
"#,
        dirs = toml_string(&target_dir().display().to_string()),
    )
}

/// `blurpool::blur_conv2d` on fixed weights: the functional form as a host layer.
#[derive(Debug)]
struct FunctionalBlurConv {
    weight: Tensor,
    bias: Option<Tensor>,
    filter: Tensor,
    spec: blurpool::ConvSpec,
    blur_first: bool,
}

impl Layer for FunctionalBlurConv {
    fn kind(&self) -> &str {
        "functional_blur_conv2d"
    }
    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        blurpool::blur_conv2d(
            xs,
            &self.weight,
            self.bias.as_ref(),
            &self.filter,
            self.spec,
            self.blur_first,
        )
        .map_err(|e| TchError::Torch(e.to_string()))
    }
}

fn int(attrs: &std::collections::BTreeMap<String, Attr>, key: &str, path: &str) -> i64 {
    match attrs.get(key) {
        Some(Attr::Int(v)) => *v,
        other => panic!("conv `{path}`: attribute `{key}` is {other:?}"),
    }
}

/// The plain ResNet-20 of `cfg` with `blurred`'s weights and buffers (the surgery moved a
/// replaced conv's `<path>.weight` to `<path>.conv.weight`).
fn plain_with_weights_of(cfg: &config::Config, blurred: &Model) -> Model {
    let input = cfg.data.input_shape();
    let plain = Model::build(&cfg.model, input, cfg.model.num_classes as i64, Device::Cpu)
        .expect("the model builds");
    for e in plain.params.entries() {
        let (path, leaf) = e.name.rsplit_once('.').expect("a dotted tensor name");
        let source = blurred
            .params
            .get(&e.name)
            .or_else(|| blurred.params.get(&format!("{path}.conv.{leaf}")))
            .unwrap_or_else(|| panic!("the blurred model has no `{}`", e.name));
        tch::no_grad(|| e.tensor.shallow_clone().copy_(&source.tensor));
    }
    plain
}

/// The reference: [`plain_with_weights_of`] with each conv that Composer's rule selects replaced
/// by [`FunctionalBlurConv`] on that conv's weights. Returns it with the replaced paths.
fn functional_reference(
    cfg: &config::Config,
    blurred: &Model,
    blur_first: bool,
) -> (Model, Vec<String>) {
    let mut model = plain_with_weights_of(cfg, blurred);
    let mut replaced = Vec::new();
    for info in model.root.walk() {
        if info.kind != "conv2d" {
            continue;
        }
        let path = &info.path;
        let spec = blurpool::ConvSpec {
            in_channels: int(&info.attrs, "in_channels", path),
            out_channels: int(&info.attrs, "out_channels", path),
            kernel_size: int(&info.attrs, "kernel_size", path),
            stride: int(&info.attrs, "stride", path),
            padding: int(&info.attrs, "padding", path),
            groups: int(&info.attrs, "groups", path),
        };
        if !blurpool::conv_is_replaced(spec.stride, spec.in_channels, MIN_CHANNELS) {
            continue;
        }
        let tensor = |leaf: &str| {
            model
                .params
                .get(&format!("{path}.{leaf}"))
                .map(|e| e.tensor.shallow_clone())
        };
        let weight = tensor("weight").unwrap_or_else(|| panic!("conv `{path}` has no weight"));
        let channels = blurpool::blur_channels(spec.in_channels, spec.out_channels, blur_first);
        let filter = blurpool::default_filter(Kind::Float, Device::Cpu)
            .and_then(|f| f.f_repeat([channels, 1, 1, 1]))
            .expect("the default filter");
        let layer = FunctionalBlurConv {
            weight,
            bias: tensor("bias"),
            filter,
            spec,
            blur_first,
        };
        model
            .replace_module(path, Box::new(layer))
            .unwrap_or_else(|e| panic!("replacing `{path}`: {e}"));
        replaced.push(path.clone());
    }
    (model, replaced)
}

fn check(blur_first: bool) {
    let dir = TempDir::new(&format!("blurpool-model-{blur_first}"));
    let cfg = config::from_str(&trainer_toml(blur_first), dir.path(), "trainer.toml")
        .expect("the test's trainer.toml");
    let trainer = Trainer::new(cfg.clone(), Vec::new()).expect("the trainer with blurpool");
    let blurred = trainer.model();
    let surgery: Vec<String> = blurred
        .root
        .walk()
        .into_iter()
        .filter(|m| m.kind == "blur_conv2d")
        .map(|m| m.path)
        .collect();
    let (reference, replaced) = functional_reference(&cfg, blurred, blur_first);
    assert_eq!(surgery, replaced, "the convs the plugin replaced");
    assert_eq!(
        replaced.len(),
        4,
        "ResNet-20 has four stride-2 convs with >= 16 channels"
    );

    tch::manual_seed(3);
    let x = Tensor::randn([4, 3, 16, 16], (Kind::Float, Device::Cpu));
    let got = blurred.forward(&x, false).expect("the blurred model runs");
    let want = reference.forward(&x, false).expect("the reference runs");
    assert_close(
        &format!("blur_first = {blur_first}"),
        &got,
        &want,
        1e-6,
        1e-6,
    );
    // Not vacuous: the plain model on the same weights computes something else.
    let plain = plain_with_weights_of(&cfg, blurred)
        .forward(&x, false)
        .expect("the plain model runs");
    let difference = (&plain - &got).abs().max().double_value(&[]);
    assert!(difference > 1e-3, "the blur changed nothing: {difference}");
}

#[test]
fn blur_first_resnet20_equals_the_functional_form() {
    check(true);
}

#[test]
fn blur_last_resnet20_equals_the_functional_form() {
    check(false);
}

#[test]
fn the_functional_form_reproduces_the_golden_blur() {
    // The reference's building block against Composer: blur_2d at each stride in the golden.
    let g = Golden::load("blurpool");
    let filter = blurpool::default_filter(Kind::Float, Device::Cpu).unwrap();
    assert_close("filter", &filter, g.tensor("filter"), 1e-7, 0.0);
    let input = g.tensor("blur_2d/input");
    let channels = input.size()[1];
    let repeated = filter.repeat([channels, 1, 1, 1]);
    let mut checked = 0;
    for key in g.names_with_role("output") {
        let Some(stride) = key.strip_prefix("blur_2d/stride") else {
            continue;
        };
        let stride: i64 = stride.parse().unwrap_or_else(|e| panic!("{key}: {e}"));
        let ours = blurpool::blur_2d(input, stride, &repeated).expect("blur_2d");
        assert_close(&key, &ours, g.tensor(&key), 1e-6, 1e-7);
        checked += 1;
    }
    assert!(checked >= 2, "no blur_2d outputs in the golden case");
}
