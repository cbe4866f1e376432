//! Tests of the `trainer.toml` loader.

use super::*;
use crate::data::{Dataset, HorizontalFlip, Normalize, RandomCrop, SyntheticConfig, Transforms};
use crate::device::Device;
use crate::engine::OnError;
use crate::model::{ModelConfig, ModelName};
use crate::optim::{AdamW, Rule, Sgd};
use crate::precision::Precision;
use crate::time::{Time, TimeUnit};

/// The smallest valid config (shared with the other config test modules).
pub(super) const MINIMAL: &str = r#"
[data]
dataset = "fashion-mnist"

[model]
name = "cnn"

[train]
max_duration = "3ep"
"#;

const FULL: &str = r#"run_name = "fmnist-cnn"
seed = 7
output_dir = "out/runs"
usd_per_hour = 0.10

[data]
dataset = "synthetic"
data_dir = "cache"
fetch = false
batch_size = 64
eval_batch_size = 256
workers = 0
prefetch = 2
drop_last = false
shuffle = false

[data.synthetic]
samples = 100
eval_samples = 20
channels = 3
height = 32
width = 32
classes = 5

[data.transforms]
normalize = { mean = [0.5, 0.5, 0.5], std = [0.25] }
random_crop = { size = 32, padding = 4 }
horizontal_flip = { p = 0.25 }

[model]
name = "resnet20"
width = 8
num_classes = 7

[optimizer]
name = "adamw"
lr = 3e-4
betas = [0.8, 0.99]
eps = 1e-6
weight_decay = 0

[scheduler]
name = "cosine_with_warmup"
t_warmup = "1ep"

[train]
max_duration = "100ba"
microbatch_size = 16
precision = "amp_bf16"
device = "cuda:1"
scale_schedule_ratio = 0.5
eval_interval = "0.25dur"
eval_subset_batches = 3
threads = 4
log_interval = "10ba"
progress = false

[plugins]
dirs = ["../../target/release", "/abs/plugins"]

[[algorithms]]
plugin = "label_smoothing"
sha256 = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
smoothing = 0.1

[[algorithms]]
plugin = "cutout"
on_error = "disable"
length = 8
enabled = true
sizes = [1, 2.5, "x"]
nested = { a = 1, b = { c = "d" } }
"#;

/// Reads `text` as a trainer.toml in `/base/dir` (shared with the other config test modules).
pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
    from_str(text, Path::new("/base/dir"), "trainer.toml")
}

fn parse_with(text: &str, overrides: &[&str]) -> Result<Config, ConfigError> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    from_str_with_overrides(text, Path::new("/base/dir"), "trainer.toml", &overrides)
}

fn ok(text: &str) -> Config {
    match parse(text) {
        Ok(c) => c,
        Err(e) => panic!("expected a valid config, got: {e}"),
    }
}

fn err(text: &str) -> ConfigError {
    match parse(text) {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => e,
    }
}

/// The minimal file with `extra` appended (tables after the minimal ones).
fn with(extra: &str) -> String {
    format!("{MINIMAL}{extra}")
}

#[test]
fn full_file() {
    let c = ok(FULL);
    assert_eq!(c.run_name, "fmnist-cnn");
    assert_eq!(c.seed, 7);
    assert_eq!(c.output_dir, PathBuf::from("/base/dir/out/runs"));
    assert_eq!(c.run_dir(), PathBuf::from("/base/dir/out/runs/fmnist-cnn"));
    assert_eq!(c.usd_per_hour, Some(0.10));
    let d = &c.data;
    assert_eq!(d.dataset, Dataset::Synthetic);
    assert_eq!(d.data_dir, Some(PathBuf::from("/base/dir/cache")));
    assert!(!d.fetch && !d.drop_last && !d.shuffle);
    assert_eq!(
        (d.batch_size, d.eval_batch_size, d.workers, d.prefetch),
        (64, 256, 0, 2)
    );
    assert_eq!(
        d.synthetic,
        Some(SyntheticConfig {
            samples: 100,
            eval_samples: 20,
            channels: 3,
            height: 32,
            width: 32,
            classes: 5
        })
    );
    assert_eq!(d.channels(), 3);
    assert_eq!(d.image_size(), (32, 32));
    assert_eq!(
        d.transforms,
        Transforms {
            normalize: Some(Normalize {
                mean: vec![0.5, 0.5, 0.5],
                std: vec![0.25]
            }),
            random_crop: Some(RandomCrop {
                size: 32,
                padding: 4
            }),
            horizontal_flip: Some(HorizontalFlip { p: 0.25 }),
        }
    );
    assert_eq!(
        c.model,
        ModelConfig {
            name: ModelName::Resnet20,
            torchscript: None,
            hidden: vec![],
            widths: Vec::new(),
            width: Some(8),
            num_classes: 7,
            dropout: 0.0,
            norm: None,
            gpt2: None,
            bert: None,
            llama: None,
            vit: None,
            init: None
        }
    );
    assert_eq!(
        c.optimizer.rule,
        Rule::AdamW(AdamW {
            lr: 3e-4,
            betas: (0.8, 0.99),
            eps: 1e-6,
            weight_decay: 0.0
        })
    );
    let t = &c.train;
    assert_eq!(
        t.max_duration.to_string(),
        "100ba"
            .parse::<Time>()
            .map(|t| t.to_string())
            .unwrap_or_default()
    );
    assert!(matches!(t.max_duration.unit(), TimeUnit::Batch));
    assert!(matches!(t.eval_interval.unit(), TimeUnit::Duration));
    assert_eq!(t.microbatch_size, 16);
    assert_eq!(t.precision, Precision::AmpBf16);
    assert_eq!(t.device, Device::Cuda(1));
    assert_eq!(t.scale_schedule_ratio, 0.5);
    assert_eq!((t.eval_subset_batches, t.threads), (3, 4));
    assert!(!t.progress);
    assert_eq!(
        c.plugins.dirs,
        vec![
            PathBuf::from("/base/dir/../../target/release"),
            PathBuf::from("/abs/plugins")
        ]
    );
    assert_eq!(c.algorithms.len(), 2);
    let a = &c.algorithms[0];
    assert_eq!(a.plugin, "label_smoothing");
    assert_eq!(
        a.sha256.as_deref(),
        Some("abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789")
    );
    assert_eq!(a.on_error, OnError::Stop);
    assert_eq!(a.line, 61);
    assert_eq!(a.settings_json(), r#"{"smoothing":0.1}"#);
    let b = &c.algorithms[1];
    assert_eq!(b.on_error, OnError::Disable);
    assert_eq!(b.line, 66);
}

#[test]
fn algorithm_settings_keep_their_types() {
    let c = ok(FULL);
    let s = &c.algorithms[1].settings;
    assert_eq!(s.len(), 4, "plugin/on_error are not settings: {s:?}");
    assert!(s["length"].is_i64());
    assert_eq!(s["length"], serde_json::json!(8));
    assert_eq!(s["enabled"], serde_json::json!(true));
    assert_eq!(s["sizes"], serde_json::json!([1, 2.5, "x"]));
    assert!(s["sizes"][0].is_i64() && s["sizes"][1].is_f64());
    assert_eq!(s["nested"], serde_json::json!({"a": 1, "b": {"c": "d"}}));
    let keys: Vec<&str> = s.keys().map(String::as_str).collect();
    assert!(keys.contains(&"nested") && keys.contains(&"sizes"));
}

#[test]
fn defaults() {
    let c = ok(MINIMAL);
    assert_eq!(c.run_name, "trainer");
    assert_eq!(c.seed, 42);
    assert_eq!(c.output_dir, PathBuf::from("/base/dir/runs"));
    assert_eq!(c.usd_per_hour, None);
    assert_eq!(c.instance, None);
    let d = &c.data;
    assert_eq!(d.dataset, Dataset::FashionMnist);
    assert_eq!(d.data_dir, None);
    assert!(d.fetch && d.drop_last && d.shuffle);
    assert_eq!(
        (d.batch_size, d.eval_batch_size, d.workers, d.prefetch),
        (128, 512, 2, 4)
    );
    assert_eq!(d.synthetic, None);
    assert_eq!(d.transforms, Transforms::default());
    assert_eq!(c.model.width, Some(32));
    assert_eq!(c.model.num_classes, 10);
    assert!(c.model.hidden.is_empty());
    assert_eq!(c.optimizer.rule, Rule::Sgd(Sgd::default()));
    assert_eq!(c.optimizer.lr(), 0.1);
    assert!(matches!(&c.optimizer.rule, Rule::Sgd(s) if s.weight_decay == 0.0));
    let t = &c.train;
    assert_eq!(t.microbatch_size, 128);
    assert_eq!(t.precision, Precision::Fp32);
    assert_eq!(t.device, Device::Auto);
    assert_eq!(t.scale_schedule_ratio, 1.0);
    assert!(matches!(t.eval_interval.unit(), TimeUnit::Epoch));
    assert!(matches!(t.log_interval.unit(), TimeUnit::Batch));
    assert_eq!((t.eval_subset_batches, t.threads), (0, 0));
    assert!(t.progress);
    assert!(c.plugins.dirs.is_empty());
    assert!(c.algorithms.is_empty());
}

#[test]
fn model_and_optimizer_defaults_by_name() {
    let c = ok(&MINIMAL.replace("\"cnn\"", "\"mlp\""));
    assert_eq!(c.model.hidden, vec![256, 128]);
    assert_eq!(c.model.width, None);
    let c = ok(&MINIMAL.replace("\"cnn\"", "\"resnet56\""));
    assert_eq!(c.model.width, Some(16));
    let c = ok(&with("[optimizer]\nname = \"adamw\"\n"));
    assert_eq!(c.optimizer.rule, Rule::AdamW(AdamW::default()));
    assert!(matches!(&c.optimizer.rule, Rule::AdamW(a) if a.weight_decay == 0.01));
    let c = ok(&with("[optimizer]\nlr = 1\nnesterov = true\n"));
    assert_eq!(
        c.optimizer.rule,
        Rule::Sgd(Sgd {
            lr: 1.0,
            nesterov: true,
            ..Sgd::default()
        })
    );
    let c = ok(&with("[data.synthetic]\n").replace("fashion-mnist", "synthetic"));
    assert_eq!(c.data.synthetic, Some(SyntheticConfig::default()));
    let c = ok(&MINIMAL.replace("fashion-mnist", "synthetic"));
    assert_eq!(c.data.synthetic, Some(SyntheticConfig::default()));
    let c = ok(&with("[data.transforms]\nrandom_crop = { padding = 4 }\nhorizontal_flip = {}\nnormalize = { mean = 0.5, std = 0.5 }\n"));
    assert_eq!(
        c.data.transforms.random_crop,
        Some(RandomCrop {
            size: 28,
            padding: 4
        })
    );
    assert_eq!(
        c.data.transforms.horizontal_flip,
        Some(HorizontalFlip { p: 0.5 })
    );
    assert_eq!(
        c.data.transforms.normalize,
        Some(Normalize {
            mean: vec![0.5],
            std: vec![0.5]
        })
    );
}

#[test]
fn devices() {
    for (text, dev) in [
        ("auto", Device::Auto),
        ("cpu", Device::Cpu),
        ("cuda", Device::CudaLocalRank),
        ("cuda:3", Device::Cuda(3)),
    ] {
        assert_eq!(text.parse::<Device>(), Ok(dev));
        let c = ok(&with(&format!("device = {text:?}\n")));
        assert_eq!(c.train.device, dev);
    }
    assert_eq!(Device::Cuda(0).to_string(), "cuda:0");
    for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU"] {
        assert!(bad.parse::<Device>().is_err(), "{bad}");
    }
}

#[test]
fn serializes_with_snake_case_names() {
    let c = ok(FULL);
    let j = serde_json::to_value(&c).expect("config serializes to JSON");
    assert_eq!(j["data"]["dataset"], "synthetic");
    assert_eq!(j["model"]["name"], "resnet20");
    assert_eq!(j["optimizer"]["name"], "adamw");
    assert_eq!(j["optimizer"]["betas"], serde_json::json!([0.8, 0.99]));
    assert_eq!(j["train"]["precision"], "amp_bf16");
    assert_eq!(j["train"]["device"], "cuda:1");
    assert_eq!(j["algorithms"][1]["on_error"], "disable");
    assert_eq!(j["algorithms"][1]["settings"]["length"], 8);
    assert_eq!(j["output_dir"], "/base/dir/out/runs");
    let c = ok(MINIMAL);
    let j = serde_json::to_value(&c).expect("config serializes to JSON");
    assert_eq!(j["data"]["dataset"], "fashion-mnist");
    assert_eq!(j["optimizer"]["name"], "sgd");
    assert_eq!(j["train"]["device"], "auto");
    assert!(j["model"].get("hidden").is_none());
    // The resolved config also serializes to TOML (for the run record).
    let text = toml::to_string(&c).expect("config serializes to TOML");
    assert!(text.contains("run_name = \"trainer\""), "{text}");
}

/// One error case: the file text, the overrides, the expected class, the key
/// and the line (`None` = no line: from `--set` or a missing table).
struct Case {
    name: &'static str,
    text: String,
    set: &'static [&'static str],
    kind: ErrorKind,
    key: &'static str,
    line: Option<usize>,
    needle: &'static str,
}

fn case(
    name: &'static str,
    text: impl Into<String>,
    kind: ErrorKind,
    key: &'static str,
    line: Option<usize>,
    needle: &'static str,
) -> Case {
    Case {
        name,
        text: text.into(),
        set: &[],
        kind,
        key,
        line,
        needle,
    }
}

fn check(cases: Vec<Case>) {
    for c in cases {
        let e = match parse_with(&c.text, c.set) {
            Ok(_) => panic!("{}: expected an error", c.name),
            Err(e) => e,
        };
        let shown = e.to_string();
        assert_eq!(e.kind, c.kind, "{}: {shown}", c.name);
        assert_eq!(e.key, c.key, "{}: {shown}", c.name);
        assert_eq!(e.location.line(), c.line, "{}: {shown}", c.name);
        assert!(
            shown.contains(c.needle),
            "{}: {shown:?} lacks {:?}",
            c.name,
            c.needle
        );
        assert!(shown.starts_with("trainer.toml"), "{}: {shown}", c.name);
        assert!(
            shown.contains(&format!("{}: ", c.key)),
            "{}: {shown}",
            c.name
        );
        if let Some(line) = c.line {
            assert!(
                shown.starts_with(&format!("trainer.toml:{line}:")),
                "{}: {shown}",
                c.name
            );
        }
    }
}

// MINIMAL's lines: 1 empty, 2 [data], 3 dataset, 4 empty, 5 [model], 6 name,
// 7 empty, 8 [train], 9 max_duration; `with` appends from line 10.

#[test]
fn syntax_errors() {
    use ErrorKind::Syntax;
    check(vec![
        case(
            "bad value",
            with("lr = -\n"),
            Syntax,
            "train.lr",
            Some(10),
            "invalid TOML",
        ),
        case(
            "unterminated string",
            "[data]\ndataset = \"mnist\n",
            Syntax,
            "data.dataset",
            Some(2),
            "invalid TOML",
        ),
        case(
            "duplicate key",
            "[optimizer]\nlr = 1\nlr = 2\n",
            Syntax,
            "optimizer.lr",
            Some(3),
            "duplicate key",
        ),
        case(
            "in an algorithm",
            "[[algorithms]]\nplugin = \"a\"\n[[algorithms]]\nx = [1,\n",
            Syntax,
            "",
            Some(5),
            "invalid TOML",
        ),
        case(
            "bad header",
            "[data\n",
            Syntax,
            "data",
            Some(1),
            "invalid TOML",
        ),
    ]);
    let e = err("[[algorithms]]\nplugin = \"a\"\n[[algorithms]]\nsmoothing = 0..1\n");
    assert_eq!(e.key, "algorithms.1.smoothing", "{e}");
    assert_eq!(e.location.line(), Some(4), "{e}");
}

#[test]
fn column_is_reported() {
    let e = err(&with("[optimizer]\nlr = -0.1\n"));
    assert_eq!(
        e.to_string(),
        "trainer.toml:11:6: optimizer.lr: must be > 0, got -0.1"
    );
    assert_eq!(
        e.location,
        Location::File {
            line: 11,
            column: 6
        }
    );
}

#[test]
fn unknown_keys() {
    use ErrorKind::UnknownKey;
    check(vec![
        case(
            "top",
            with("[trian]\n"),
            UnknownKey,
            "trian",
            Some(10),
            "did you mean `train`?",
        ),
        case(
            "top scalar",
            format!("lr = 1\n{MINIMAL}"),
            UnknownKey,
            "lr",
            Some(1),
            "valid keys at the top level: run_name",
        ),
        case(
            "data",
            MINIMAL.replace("[model]", "batchsize = 1\n[model]"),
            UnknownKey,
            "data.batchsize",
            Some(5),
            "did you mean `batch_size`?",
        ),
        case(
            "model",
            with("[model.extra]\n").replace("name = \"cnn\"", "name = \"cnn\"\nlayers = 3"),
            UnknownKey,
            "model.layers",
            Some(7),
            "valid keys in `model`: name, torchscript, sha256, hidden, width, num_classes",
        ),
        case(
            "train",
            with("max_epochs = 3\n"),
            UnknownKey,
            "train.max_epochs",
            Some(10),
            "max_duration",
        ),
        case(
            "optimizer",
            with("[optimizer]\nlearning_rate = 0.1\n"),
            UnknownKey,
            "optimizer.learning_rate",
            Some(11),
            "valid keys in `optimizer`",
        ),
        case(
            "transforms",
            with("[data.transforms]\ncutout = 1\n"),
            UnknownKey,
            "data.transforms.cutout",
            Some(11),
            "normalize, random_crop, horizontal_flip",
        ),
        case(
            "inline table",
            with("[data.transforms]\nrandom_crop = { size = 28, pad = 4 }\n"),
            UnknownKey,
            "data.transforms.random_crop.pad",
            Some(11),
            "did you mean `padding`?",
        ),
        case(
            "synthetic",
            with("[data.synthetic]\nsamples = 1\nimages = 3\n")
                .replace("fashion-mnist", "synthetic"),
            UnknownKey,
            "data.synthetic.images",
            Some(12),
            "eval_samples",
        ),
        case(
            "plugins",
            with("[plugins]\ndir = []\n"),
            UnknownKey,
            "plugins.dir",
            Some(11),
            "did you mean `dirs`?",
        ),
        case(
            "dotted",
            with("optimizer.lrr = 1\n"),
            UnknownKey,
            "train.optimizer",
            Some(10),
            "valid keys in `train`",
        ),
    ]);
}

#[test]
fn keys_of_another_variant() {
    use ErrorKind::UnknownKey;
    check(vec![
        case(
            "momentum for adamw",
            with("[optimizer]\nname = \"adamw\"\nmomentum = 0.9\n"),
            UnknownKey,
            "optimizer.momentum",
            Some(12),
            "setting of optimizer \"sgd\", not \"adamw\"",
        ),
        case(
            "betas for sgd",
            with("[optimizer]\nbetas = [0.9, 0.99]\n"),
            UnknownKey,
            "optimizer.betas",
            Some(11),
            "valid keys for \"sgd\": name, lr, weight_decay, momentum",
        ),
        case(
            "hidden for cnn",
            MINIMAL.replace("name = \"cnn\"", "name = \"cnn\"\nhidden = [1]"),
            UnknownKey,
            "model.hidden",
            Some(7),
            "only applies to model \"mlp\"",
        ),
        case(
            "width for mlp",
            MINIMAL.replace("name = \"cnn\"", "name = \"mlp\"\nwidth = 3"),
            UnknownKey,
            "model.width",
            Some(7),
            "not \"mlp\"",
        ),
        case(
            "synthetic for mnist",
            with("[data.synthetic]\n"),
            UnknownKey,
            "data.synthetic",
            Some(10),
            "only applies to dataset = \"synthetic\"",
        ),
    ]);
}

#[test]
fn wrong_types() {
    use ErrorKind::WrongType;
    check(vec![
        case(
            "string for int",
            MINIMAL.replace("[model]", "batch_size = \"128\"\n[model]"),
            WrongType,
            "data.batch_size",
            Some(5),
            "expected an integer >= 1, got a string (\"128\")",
        ),
        case(
            "float for int",
            MINIMAL.replace("[model]", "workers = 2.0\n[model]"),
            WrongType,
            "data.workers",
            Some(5),
            "got a float (2.0)",
        ),
        case(
            "string for float",
            with("[optimizer]\nlr = \"0.1\"\n"),
            WrongType,
            "optimizer.lr",
            Some(11),
            "expected a number",
        ),
        case(
            "int for bool",
            with("progress = 1\n"),
            WrongType,
            "train.progress",
            Some(10),
            "expected true or false",
        ),
        case(
            "number for string",
            format!("run_name = 5\n{MINIMAL}"),
            WrongType,
            "run_name",
            Some(1),
            "expected a string",
        ),
        case(
            "table for value",
            format!("seed = {{ a = 1 }}\n{MINIMAL}"),
            WrongType,
            "seed",
            Some(1),
            "got a table",
        ),
        case(
            "value for table",
            format!("plugins = 3\n{MINIMAL}"),
            WrongType,
            "plugins",
            Some(1),
            "expected a table, got an integer (3)",
        ),
        case(
            "list item",
            with("[plugins]\ndirs = [\"a\", 3]\n"),
            WrongType,
            "plugins.dirs.1",
            Some(11),
            "expected a string",
        ),
        case(
            "hidden item",
            MINIMAL.replace("name = \"cnn\"", "name = \"mlp\"\nhidden = [64, \"x\"]"),
            WrongType,
            "model.hidden.1",
            Some(7),
            "expected an integer >= 1",
        ),
        case(
            "duration number",
            MINIMAL.replace("\"3ep\"", "3"),
            WrongType,
            "train.max_duration",
            Some(9),
            "expected a duration string",
        ),
        case(
            "device number",
            with("device = 0\n"),
            WrongType,
            "train.device",
            Some(10),
            "\"cuda:N\"",
        ),
        case(
            "dataset number",
            MINIMAL.replace("\"fashion-mnist\"", "1"),
            WrongType,
            "data.dataset",
            Some(3),
            "expected one of \"fashion-mnist\", \"mnist\", \"synthetic\", \"folder\", \"mds\", \"wds\", \"sotu\", \"shakespeare\", \"synthetic-text\", \"text\", \"labelled-text\" or \"chat\"",
        ),
        case(
            "algorithms table",
            format!("algorithms = {{ plugin = \"x\" }}\n{MINIMAL}"),
            WrongType,
            "algorithms",
            Some(1),
            "expected [[algorithms]]",
        ),
        case(
            "algorithm item",
            format!("algorithms = [1]\n{MINIMAL}"),
            WrongType,
            "algorithms.0",
            Some(1),
            "expected a table",
        ),
        case(
            "scheduler",
            format!("scheduler = \"cosine\"\n{MINIMAL}"),
            WrongType,
            "scheduler",
            Some(1),
            "expected a table",
        ),
    ]);
}

#[test]
fn bad_values() {
    use ErrorKind::InvalidValue;
    check(vec![
        case(
            "lr",
            with("[optimizer]\nlr = 0\n"),
            InvalidValue,
            "optimizer.lr",
            Some(11),
            "must be > 0, got 0",
        ),
        case(
            "momentum",
            with("[optimizer]\nmomentum = 1.0\n"),
            InvalidValue,
            "optimizer.momentum",
            Some(11),
            "must be in [0, 1), got 1.0",
        ),
        case(
            "dampening",
            with("[optimizer]\ndampening = 1.5\n"),
            InvalidValue,
            "optimizer.dampening",
            Some(11),
            "must be in [0, 1]",
        ),
        case(
            "weight decay",
            with("[optimizer]\nweight_decay = -1e-4\n"),
            InvalidValue,
            "optimizer.weight_decay",
            Some(11),
            "must be >= 0, got -0.0001",
        ),
        case(
            "nan",
            with("[optimizer]\nlr = nan\n"),
            InvalidValue,
            "optimizer.lr",
            Some(11),
            "finite",
        ),
        case(
            "nesterov",
            with("[optimizer]\nmomentum = 0\nnesterov = true\n"),
            InvalidValue,
            "optimizer.nesterov",
            Some(12),
            "needs momentum > 0",
        ),
        case(
            "betas range",
            with("[optimizer]\nname = \"adamw\"\nbetas = [0.9, 1.0]\n"),
            InvalidValue,
            "optimizer.betas.1",
            Some(12),
            "must be in [0, 1)",
        ),
        case(
            "betas length",
            with("[optimizer]\nname = \"adamw\"\nbetas = [0.9]\n"),
            InvalidValue,
            "optimizer.betas",
            Some(12),
            "2 numbers",
        ),
        case(
            "eps",
            with("[optimizer]\nname = \"adamw\"\neps = 0\n"),
            InvalidValue,
            "optimizer.eps",
            Some(12),
            "must be > 0",
        ),
        case(
            "batch size",
            MINIMAL.replace("[model]", "batch_size = 0\n[model]"),
            InvalidValue,
            "data.batch_size",
            Some(5),
            "must be >= 1, got 0",
        ),
        case(
            "prefetch",
            MINIMAL.replace("[model]", "prefetch = 0\n[model]"),
            InvalidValue,
            "data.prefetch",
            Some(5),
            "must be >= 1",
        ),
        case(
            "workers",
            MINIMAL.replace("[model]", "workers = -1\n[model]"),
            InvalidValue,
            "data.workers",
            Some(5),
            "must be >= 0, got -1",
        ),
        case(
            "seed",
            format!("seed = -5\n{MINIMAL}"),
            InvalidValue,
            "seed",
            Some(1),
            "must be >= 0, got -5",
        ),
        case(
            "cost",
            format!("usd_per_hour = -1\n{MINIMAL}"),
            InvalidValue,
            "usd_per_hour",
            Some(1),
            "must be >= 0",
        ),
        case(
            "instance and price",
            format!("usd_per_hour = 1\ninstance = \"aws/p4d.24xlarge\"\n{MINIMAL}"),
            InvalidValue,
            "instance",
            Some(2),
            "not both",
        ),
        case(
            "unknown instance",
            format!("instance = \"aws/p4d.24xlarg\"\n{MINIMAL}"),
            InvalidValue,
            "instance",
            Some(1),
            "close names: aws/",
        ),
        case(
            "run name",
            format!("run_name = \"a/b\"\n{MINIMAL}"),
            InvalidValue,
            "run_name",
            Some(1),
            "not a folder name",
        ),
        case(
            "microbatch",
            with("microbatch_size = 256\n"),
            InvalidValue,
            "train.microbatch_size",
            Some(10),
            "must be <= data.batch_size (128), got 256",
        ),
        case(
            "ssr",
            with("scale_schedule_ratio = 0\n"),
            InvalidValue,
            "train.scale_schedule_ratio",
            Some(10),
            "must be > 0",
        ),
        case(
            "precision",
            with("precision = \"fp16\"\n"),
            InvalidValue,
            "train.precision",
            Some(10),
            "\"fp32\", \"amp_bf16\" or \"amp_fp16\"",
        ),
        case(
            "device",
            with("device = \"gpu\"\n"),
            InvalidValue,
            "train.device",
            Some(10),
            "unknown device \"gpu\"",
        ),
        case(
            "std",
            with("[data.transforms]\nnormalize = { mean = 0.5, std = [0.0] }\n"),
            InvalidValue,
            "data.transforms.normalize.std.0",
            Some(11),
            "must be > 0, got 0.0",
        ),
        case(
            "normalize channels",
            with("[data.transforms]\nnormalize = { mean = [0.5, 0.5], std = 1 }\n"),
            InvalidValue,
            "data.transforms.normalize.mean",
            Some(11),
            "1 value or one per channel (1 for fashion-mnist), got 2",
        ),
        case(
            "flip p",
            with("[data.transforms]\nhorizontal_flip = { p = 1.5 }\n"),
            InvalidValue,
            "data.transforms.horizontal_flip.p",
            Some(11),
            "must be in [0, 1], got 1.5",
        ),
        case(
            "crop size",
            with("[data.transforms]\nrandom_crop = { size = 40, padding = 2 }\n"),
            InvalidValue,
            "data.transforms.random_crop.size",
            Some(11),
            "must be <= 32",
        ),
        case(
            "num classes",
            MINIMAL.replace("name = \"cnn\"", "name = \"cnn\"\nnum_classes = 5"),
            InvalidValue,
            "model.num_classes",
            Some(7),
            "must be >= 10",
        ),
        case(
            "hidden zero",
            MINIMAL.replace("name = \"cnn\"", "name = \"mlp\"\nhidden = [64, 0]"),
            InvalidValue,
            "model.hidden.1",
            Some(7),
            "must be >= 1, got 0",
        ),
        case(
            "synthetic zero",
            with("[data.synthetic]\nclasses = 0\n").replace("fashion-mnist", "synthetic"),
            InvalidValue,
            "data.synthetic.classes",
            Some(11),
            "must be >= 1",
        ),
        case(
            "sha256",
            with("[[algorithms]]\nplugin = \"x\"\nsha256 = \"abc\"\n"),
            InvalidValue,
            "algorithms.0.sha256",
            Some(12),
            "64 hexadecimal digits",
        ),
        case(
            "plugin name",
            with("[[algorithms]]\nplugin = \"../evil\"\n"),
            InvalidValue,
            "algorithms.0.plugin",
            Some(11),
            "not a plugin name",
        ),
        case(
            "on_error",
            with("[[algorithms]]\nplugin = \"x\"\non_error = \"ignore\"\n"),
            InvalidValue,
            "algorithms.0.on_error",
            Some(12),
            "\"stop\" or \"disable\"",
        ),
        case(
            "nan setting",
            with("[[algorithms]]\nplugin = \"x\"\nk = { v = [1.0, inf] }\n"),
            InvalidValue,
            "algorithms.0.k.v.1",
            Some(12),
            "JSON has no nan or inf",
        ),
    ]);
}

#[test]
fn unknown_names() {
    use ErrorKind::InvalidValue;
    check(vec![
        case(
            "dataset",
            MINIMAL.replace("fashion-mnist", "cifar10"),
            InvalidValue,
            "data.dataset",
            Some(3),
            "unknown dataset \"cifar10\"; expected \"fashion-mnist\", \"mnist\", \"synthetic\", \"folder\", \"mds\", \"wds\", \"sotu\", \"shakespeare\", \"synthetic-text\", \"text\", \"labelled-text\" or \"chat\"",
        ),
        case(
            "dataset typo",
            MINIMAL.replace("fashion-mnist", "fashion_mnist"),
            InvalidValue,
            "data.dataset",
            Some(3),
            "did you mean \"fashion-mnist\"?",
        ),
        case(
            "model",
            MINIMAL.replace("\"cnn\"", "\"transformer\""),
            InvalidValue,
            "model.name",
            Some(6),
            "unknown model \"transformer\"; expected \"mlp\", \"cnn\", \"resnet20\", \"resnet56\", \"resnet18\", \"resnet50\", \"gpt2\", \"llama\", \"bert\", \"airbench\", \"vit_tiny\", \"vit_small\" or \"vit_base\"",
        ),
        case(
            "optimizer",
            with("[optimizer]\nname = \"lionn\"\n"),
            InvalidValue,
            "optimizer.name",
            Some(11),
            "unknown optimizer \"lionn\" (did you mean \"lion\"?)",
        ),
        case(
            "scheduler",
            with("[scheduler]\nname = \"linear-ish\"\n"),
            InvalidValue,
            "scheduler.name",
            Some(11),
            "linear-ish",
        ),
    ]);
}

#[test]
fn missing_required() {
    use ErrorKind::MissingKey;
    check(vec![
        case(
            "data table",
            MINIMAL.replace("[data]\ndataset = \"fashion-mnist\"\n", ""),
            MissingKey,
            "data",
            None,
            "missing required table [data]",
        ),
        case(
            "model table",
            MINIMAL.replace("[model]\nname = \"cnn\"\n", ""),
            MissingKey,
            "model",
            None,
            "missing required table [model]",
        ),
        case(
            "train table",
            MINIMAL.replace("[train]\nmax_duration = \"3ep\"\n", ""),
            MissingKey,
            "train",
            None,
            "missing required table [train]",
        ),
        case(
            "dataset",
            MINIMAL.replace("dataset = \"fashion-mnist\"", "batch_size = 2"),
            MissingKey,
            "data.dataset",
            Some(2),
            "expected \"fashion-mnist\", \"mnist\", \"synthetic\", \"folder\", \"mds\", \"wds\", \"sotu\", \"shakespeare\", \"synthetic-text\", \"text\", \"labelled-text\" or \"chat\"",
        ),
        case(
            "model name",
            MINIMAL.replace("name = \"cnn\"", ""),
            MissingKey,
            "model.name",
            Some(5),
            "missing required key in `model`",
        ),
        case(
            "max_duration",
            MINIMAL.replace("max_duration = \"3ep\"", ""),
            MissingKey,
            "train.max_duration",
            Some(8),
            "such as \"3ep\"",
        ),
        case(
            "plugin",
            with("[[algorithms]]\nplugin = \"a\"\n[[algorithms]]\nsmoothing = 0.1\n"),
            MissingKey,
            "algorithms.1.plugin",
            Some(12),
            "plugin's name",
        ),
        case(
            "normalize std",
            with("[data.transforms]\nnormalize = { mean = 0.5 }\n"),
            MissingKey,
            "data.transforms.normalize.std",
            Some(11),
            "each > 0",
        ),
        case(
            "scheduler field",
            with("[scheduler]\nname = \"step\"\n"),
            MissingKey,
            "scheduler.step_size",
            Some(10),
            "missing required key in `scheduler`",
        ),
    ]);
}

#[test]
fn bad_durations() {
    use ErrorKind::InvalidValue;
    check(vec![
        case(
            "garbage",
            MINIMAL.replace("\"3ep\"", "\"three epochs\""),
            InvalidValue,
            "train.max_duration",
            Some(9),
            "invalid time \"three epochs\"",
        ),
        case(
            "no unit",
            MINIMAL.replace("\"3ep\"", "\"3\""),
            InvalidValue,
            "train.max_duration",
            Some(9),
            "invalid time",
        ),
        case(
            "dur for max",
            MINIMAL.replace("\"3ep\"", "\"1dur\""),
            InvalidValue,
            "train.max_duration",
            Some(9),
            "unit \"dur\" is not allowed here; use \"ep\", \"ba\", \"sp\", \"tok\" or \"iter\"",
        ),
        case(
            "sec for max",
            MINIMAL.replace("\"3ep\"", "\"60sec\""),
            InvalidValue,
            "train.max_duration",
            Some(9),
            "unit \"sec\" is not allowed",
        ),
        case(
            "sec for eval",
            with("eval_interval = \"10sec\"\n"),
            InvalidValue,
            "train.eval_interval",
            Some(10),
            "\"iter\" or \"dur\"",
        ),
        case(
            "bad log",
            with("log_interval = \"5 bats\"\n"),
            InvalidValue,
            "train.log_interval",
            Some(10),
            "invalid time",
        ),
    ]);
}

#[test]
fn scheduler_errors() {
    check(vec![
        case(
            "wrong type",
            with("[scheduler]\nname = \"step\"\ngamma = \"big\"\nstep_size = \"1ep\"\n"),
            ErrorKind::InvalidValue,
            "scheduler.gamma",
            Some(12),
            "invalid type",
        ),
        case(
            "bad time",
            with("[scheduler]\nname = \"multistep\"\nmilestones = [\"1ep\", \"2 epochs\"]\n"),
            ErrorKind::InvalidValue,
            "scheduler.milestones",
            Some(12),
            "2 epochs",
        ),
        case(
            "number time",
            with("[scheduler]\nname = \"step\"\nstep_size = 30\n"),
            ErrorKind::InvalidValue,
            "scheduler.step_size",
            Some(12),
            "number 30",
        ),
        case(
            "validate",
            with("[scheduler]\nname = \"step\"\nstep_size = \"1ep\"\ngamma = -1\n"),
            ErrorKind::InvalidValue,
            "scheduler.gamma",
            Some(13),
            "must be a finite number",
        ),
        case(
            "default table name",
            with("[scheduler]\nname = \"cosin\"\n"),
            ErrorKind::InvalidValue,
            "scheduler.name",
            Some(11),
            "did you mean",
        ),
        case(
            "unknown key",
            with("[scheduler]\nname = \"cosine\"\nt_maxx = \"1ep\"\n"),
            ErrorKind::UnknownKey,
            "scheduler.t_maxx",
            Some(12),
            "unknown key for this schedule",
        ),
        case(
            "no name",
            with("[scheduler]\nwarmup = \"1ep\"\n"),
            ErrorKind::MissingKey,
            "scheduler.name",
            Some(10),
            "missing required key",
        ),
    ]);
}

#[test]
fn overrides() {
    let c = parse_with(
        FULL,
        &[
            "optimizer.lr=0.05",
            "train.max_duration=1ep",
            "data.transforms.random_crop.padding=2",
            "algorithms.0.smoothing=0.2",
            "algorithms.1.sizes=[3, 4]",
            "run_name=\"quoted\"",
            "seed = 9",
            "train.device=cpu",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.optimizer.lr(), 0.05);
    assert!(matches!(c.train.max_duration.unit(), TimeUnit::Epoch));
    assert_eq!(
        c.data.transforms.random_crop.as_ref().map(|r| r.padding),
        Some(2)
    );
    assert_eq!(
        c.algorithms[0].settings["smoothing"],
        serde_json::json!(0.2)
    );
    assert_eq!(c.algorithms[1].settings["sizes"], serde_json::json!([3, 4]));
    assert_eq!(c.run_name, "quoted");
    assert_eq!(c.seed, 9);
    assert_eq!(c.train.device, Device::Cpu);
}

#[test]
fn overrides_create_missing_tables() {
    let c = parse_with(
        MINIMAL,
        &[
            "data.transforms.horizontal_flip.p=0.3",
            "optimizer.name=adamw",
            "plugins.dirs=[\"p\"]",
            "algorithms.0.plugin=cutout",
            "algorithms.0.length=4",
            "algorithms.1.plugin=label_smoothing",
            "scheduler.name=constant",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.data.transforms.horizontal_flip,
        Some(HorizontalFlip { p: 0.3 })
    );
    assert_eq!(c.optimizer.rule, Rule::AdamW(AdamW::default()));
    assert_eq!(c.plugins.dirs, vec![PathBuf::from("/base/dir/p")]);
    assert_eq!(c.algorithms.len(), 2);
    assert_eq!(c.algorithms[0].plugin, "cutout");
    assert_eq!(c.algorithms[0].settings["length"], serde_json::json!(4));
    assert_eq!(c.algorithms[0].line, 0);
    // A required table can come entirely from overrides.
    let c = parse_with(
        "",
        &[
            "data.dataset=mnist",
            "model.name=mlp",
            "train.max_duration=2ba",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.data.dataset, Dataset::Mnist);
}

#[test]
fn bad_overrides() {
    let run = |set: &'static [&'static str], text: &str| -> ConfigError {
        match parse_with(text, set) {
            Ok(_) => panic!("{set:?}: expected an error"),
            Err(e) => e,
        }
    };
    let cases: Vec<(&'static [&'static str], &str, ErrorKind, &str, &str)> = vec![
        (
            &["optimizer.lr=-1"],
            MINIMAL,
            ErrorKind::InvalidValue,
            "optimizer.lr",
            "must be > 0, got -1",
        ),
        (
            &["train.max_duration=3dur"],
            MINIMAL,
            ErrorKind::InvalidValue,
            "train.max_duration",
            "unit \"dur\" is not allowed",
        ),
        (
            &["optimizer.lrr=1"],
            MINIMAL,
            ErrorKind::UnknownKey,
            "optimizer.lrr",
            "did you mean `lr`?",
        ),
        (
            &["data.batch_size=big"],
            MINIMAL,
            ErrorKind::WrongType,
            "data.batch_size",
            "got a string (\"big\")",
        ),
        (
            &["nonsense"],
            MINIMAL,
            ErrorKind::BadOverride,
            "",
            "expected KEY=VALUE",
        ),
        (
            &["data.dataset.x=1"],
            MINIMAL,
            ErrorKind::BadOverride,
            "data.dataset",
            "not a table",
        ),
        (
            &["algorithms.3.plugin=x"],
            FULL,
            ErrorKind::BadOverride,
            "algorithms.3",
            "out of range",
        ),
        (
            &["data.transforms.random_crop.size=40"],
            MINIMAL,
            ErrorKind::InvalidValue,
            "data.transforms.random_crop.size",
            "must be <= 28",
        ),
        (
            &["algorithms.0.smoothing=0.1"],
            MINIMAL,
            ErrorKind::MissingKey,
            "algorithms.0.plugin",
            "missing required key",
        ),
    ];
    for (set, text, kind, key, needle) in cases {
        let e = run(set, text);
        let shown = e.to_string();
        assert_eq!(e.kind, kind, "{set:?}: {shown}");
        assert_eq!(e.key, key, "{set:?}: {shown}");
        assert_eq!(
            e.location,
            Location::Override(set[0].to_string()),
            "{set:?}: {shown}"
        );
        assert!(
            shown.starts_with(&format!("trainer.toml: --set {}: ", set[0])),
            "{shown}"
        );
        assert!(
            shown.contains(needle),
            "{set:?}: {shown:?} lacks {needle:?}"
        );
    }
    // An override of one key leaves errors elsewhere pointing into the file.
    let e = match parse_with(&with("[optimizer]\nlr = -1\n"), &["optimizer.momentum=0.5"]) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    };
    assert_eq!(e.location.line(), Some(11), "{e}");
}

#[test]
fn relative_paths_resolve_against_the_file_folder() {
    let text = with("[plugins]\ndirs = [\"plugins\", \"/opt/p\"]\n").replace(
        "dataset = \"fashion-mnist\"",
        "dataset = \"mnist\"\ndata_dir = \"../cache\"",
    );
    let text = format!("output_dir = \"out\"\n{text}");
    let c = from_str(&text, Path::new("exp/one"), "exp/one/trainer.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.output_dir, PathBuf::from("exp/one/out"));
    assert_eq!(c.data.data_dir, Some(PathBuf::from("exp/one/../cache")));
    assert_eq!(
        c.plugins.dirs,
        vec![PathBuf::from("exp/one/plugins"), PathBuf::from("/opt/p")]
    );
    assert_eq!(c.run_name, "trainer");
}

#[test]
fn load_reads_a_file_and_names_it() {
    let dir = std::env::temp_dir().join(format!("tessera-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let path = dir.join("my-run.toml");
    std::fs::write(&path, with("[optimizer]\nlr = 0\n")).unwrap_or_else(|e| panic!("{e}"));
    let e = match load(&path, &[]) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    };
    assert!(
        e.to_string()
            .starts_with(&format!("{}:11:6: optimizer.lr:", path.display())),
        "{e}"
    );
    let c = load(&path, &["optimizer.lr=0.5".to_string()]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.run_name, "my-run");
    assert_eq!(c.output_dir, dir.join("runs"));
    let missing = dir.join("absent.toml");
    let e = match load(&missing, &[]) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    };
    assert_eq!(e.kind, ErrorKind::Io);
    assert!(
        e.to_string().starts_with(&missing.display().to_string()),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reference_file_parses() {
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/trainer-reference.toml"
    ));
    let c = load(path, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.run_name, "fmnist-cnn");
    assert_eq!(c.data.dataset, Dataset::FashionMnist);
    assert_eq!(c.algorithms.len(), 2);
    assert_eq!(c.algorithms[0].plugin, "label_smoothing");
}

#[test]
fn loading_is_deterministic_and_overrides_are_ordered() {
    assert_eq!(ok(FULL), ok(FULL));
    let later_wins = parse_with(MINIMAL, &["optimizer.lr=0.2", "optimizer.lr=0.3"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(later_wins.optimizer.lr(), 0.3);
}

/// Every file in `tests/fuzz_regressions/config` (crash reproducers and hand-made nasty inputs)
/// and in the seed corpus `fuzz/corpus/config` loads without a panic, the way the `config` fuzz
/// target feeds it: as a whole, and with its first line as a `--set` override. Errors name the
/// source; each seed file is valid one way or the other.
#[test]
fn fuzz_regressions_and_seed_corpus() {
    let base = Path::new("/fuzz/base");
    let mut checked = 0;
    for (folder, path) in
        crate::test_support::files_in(&["tests/fuzz_regressions/config", "fuzz/corpus/config"])
    {
        let bytes = std::fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let whole = from_str(&text, base, &name);
        let overridden = text
            .split_once('\n')
            .map(|(first, rest)| from_str_with_overrides(rest, base, &name, &[first.to_string()]));
        for e in [
            whole.as_ref().err(),
            overridden.as_ref().and_then(|r| r.as_ref().err()),
        ]
        .into_iter()
        .flatten()
        {
            let msg = e.to_string();
            assert!(msg.starts_with(&name), "error does not name {name}: {msg}");
        }
        if folder.ends_with("fuzz/corpus/config") && path.extension() == Some("toml".as_ref()) {
            assert!(
                whole.is_ok() || matches!(overridden, Some(Ok(_))),
                "seed {name} is not a valid configuration: {:?}",
                whole.err()
            );
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} files checked");
}

/// Every key the reader knows (each section's `KEYS`, and each schedule's fields as serde
/// reports them) is mentioned in its table's part of `docs/trainer-reference.toml`.
#[test]
fn reference_documents_every_key() {
    use super::de::{DeError, NodeDe};
    use super::section::Section;
    use crate::optim::schedule::Schedule;
    use serde::Deserialize;

    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/trainer-reference.toml"
    ))
    .unwrap();
    // The text of each table, commented-out headers included; "" is the top level.
    let mut parts: Vec<(String, String)> = vec![(String::new(), String::new())];
    for line in text.lines() {
        let bare = line.trim_start_matches(['#', ' ']);
        let name = bare.trim_start_matches('[').trim_end_matches(']');
        if bare.starts_with('[')
            && bare.ends_with(']')
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || "_.".contains(c))
        {
            parts.push((name.to_string(), String::new()));
        } else if let Some((_, part)) = parts.last_mut() {
            part.push_str(line);
            part.push('\n');
        }
    }
    let headers: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
    let mentions = |table: &str, key: &str| {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        parts.iter().filter(|(n, _)| n == table).any(|(_, part)| {
            part.match_indices(key).any(|(i, _)| {
                !part[..i].ends_with(word) && !part[i + key.len()..].starts_with(word)
            })
        })
    };
    let probe = |toml: &str| {
        let map = tree::SourceMap::new(toml);
        let doc = toml_edit::ImDocument::parse(toml).unwrap();
        Schedule::deserialize(NodeDe(&tree::from_document(&doc, &map))).err()
    };
    let Some(DeError::UnknownVariant {
        expected: names, ..
    }) = probe("name = \"?\"")
    else {
        panic!("no schedule names");
    };
    let mut tables: Vec<(&str, &[&str])> = vec![
        ("", Config::KEYS),
        ("data", DataConfig::KEYS),
        ("data.synthetic", SyntheticConfig::KEYS),
        ("data.text", crate::data::TextConfig::KEYS),
        ("data.mlm", crate::data::MlmConfig::KEYS),
        ("data.transforms", Transforms::KEYS),
        ("data.transforms", Normalize::KEYS),
        ("data.transforms", RandomCrop::KEYS),
        ("data.transforms", HorizontalFlip::KEYS),
        ("model", ModelConfig::KEYS),
        ("optimizer", Sgd::KEYS),
        ("optimizer", AdamW::KEYS),
        ("train", TrainConfig::KEYS),
        ("train", crate::model::ActivationCheckpointing::KEYS),
        ("checkpoint", CheckpointConfig::KEYS),
        ("logging", LoggingConfig::KEYS),
        ("logging", crate::tracking::mlflow::MlflowConfig::KEYS),
        ("distributed", DistributedConfig::KEYS),
        ("plugins", PluginsConfig::KEYS),
        ("algorithms", &["plugin", "sha256", "on_error"]),
        ("scheduler", names),
    ];
    for name in names {
        let Some(DeError::UnknownField { expected, .. }) =
            probe(&format!("name = {name:?}\n\"?\" = 1"))
        else {
            panic!("no fields for schedule {name}");
        };
        tables.push(("scheduler", expected));
    }
    for (table, keys) in tables {
        for key in keys {
            let sub = tree::join(table, key);
            assert!(
                mentions(table, key) || headers.contains(&sub.as_str()),
                "docs/trainer-reference.toml does not document `{sub}`"
            );
        }
    }
}

#[test]
fn activation_checkpointing_is_read_checked_and_recorded() {
    use crate::model::{ActivationCheckpointing, Unit};
    assert_eq!(
        ok(MINIMAL).train.activation_checkpointing,
        None,
        "off by default"
    );
    let with_key = |value: &str| {
        MINIMAL.replace(
            "\"3ep\"\n",
            &format!("\"3ep\"\nactivation_checkpointing = {value}\n"),
        )
    };
    let c = ok(&with_key("{}"));
    assert_eq!(
        c.train.activation_checkpointing,
        Some(ActivationCheckpointing::default())
    );
    let stages = ActivationCheckpointing {
        unit: Unit::Stage,
        every: 2,
    };
    let c = ok(&with_key("{ unit = \"stage\", every = 2 }"));
    assert_eq!(c.train.activation_checkpointing, Some(stages));
    let recorded = serde_json::to_value(&c).unwrap();
    assert_eq!(
        recorded["train"]["activation_checkpointing"],
        serde_json::json!({"unit": "stage", "every": 2})
    );
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.train.activation_checkpointing, Some(stages));
    let set = parse_with(MINIMAL, &["train.activation_checkpointing.every=3"]).unwrap();
    assert_eq!(set.train.activation_checkpointing.map(|a| a.every), Some(3));
    for (value, key, kind, fragment) in [
        (
            "{ unit = \"layer\" }",
            "train.activation_checkpointing.unit",
            ErrorKind::InvalidValue,
            "unknown unit \"layer\"",
        ),
        (
            "{ every = 0 }",
            "train.activation_checkpointing.every",
            ErrorKind::InvalidValue,
            "must be >= 1",
        ),
        (
            "{ every = \"2\" }",
            "train.activation_checkpointing.every",
            ErrorKind::WrongType,
            "an integer >= 1",
        ),
        (
            "{ units = \"block\" }",
            "train.activation_checkpointing.units",
            ErrorKind::UnknownKey,
            "unit",
        ),
        (
            "true",
            "train.activation_checkpointing",
            ErrorKind::WrongType,
            "expected a table",
        ),
    ] {
        let e = err(&with_key(value));
        assert_eq!((e.key.as_str(), e.kind), (key, kind), "{value}: {e}");
        assert_eq!(e.location.line(), Some(10), "{value}: {e}");
        assert!(e.message.contains(fragment), "{value}: {e}");
    }
}

#[test]
fn iteration_length_in_epochs_and_iter_durations_need_it() {
    assert_eq!(ok(MINIMAL).train.iteration_length, None);
    let two = MINIMAL.replace("\"3ep\"\n", "\"3ep\"\niteration_length = \"2ep\"\n");
    assert_eq!(
        ok(&two).train.iteration_length,
        Some(Time::new(2, TimeUnit::Epoch))
    );
    let two_iterations = two.replace("\"3ep\"", "\"2iter\"");
    assert_eq!(
        ok(&two_iterations).train.max_duration,
        Time::new(2, TimeUnit::Iteration)
    );
    use ErrorKind::InvalidValue;
    check(vec![
        case(
            "iteration in batches",
            MINIMAL.replace("\"3ep\"\n", "\"3ep\"\niteration_length = \"100ba\"\n"),
            InvalidValue,
            "train.iteration_length",
            Some(10),
            "unit \"ba\" is not allowed here; use \"ep\"",
        ),
        case(
            "iter without a length",
            MINIMAL.replace("\"3ep\"", "\"2iter\""),
            InvalidValue,
            "train.max_duration",
            Some(9),
            "train.iteration_length is set",
        ),
    ]);
}

#[test]
fn a_target_is_a_metric_a_comparison_and_a_number() {
    use crate::report::{Comparison, Metric, Target};
    let c = ok(MINIMAL);
    assert_eq!(c.train.target, None);
    assert!(c.train.stop_at_target);
    let target = |line: &str| MINIMAL.replace("\"3ep\"\n", &format!("\"3ep\"\n{line}\n"));
    let c = ok(&target(
        "target = \"accuracy >= 0.9\"\nstop_at_target = false",
    ));
    assert_eq!(
        c.train.target,
        Some(Target {
            metric: Metric::Accuracy,
            op: Comparison::AtLeast,
            value: 0.9
        })
    );
    assert!(!c.train.stop_at_target);
    // Written back as in the file, so a recorded config reads back.
    assert_eq!(
        serde_json::to_value(&c.train).unwrap()["target"],
        "accuracy >= 0.9"
    );
    let c = ok(&target("target = \"cross_entropy<0.4\""));
    assert_eq!(
        c.train.target.map(|t| (t.metric, t.op, t.value)),
        Some((Metric::CrossEntropy, Comparison::Below, 0.4))
    );
    let text = target("target = \"perplexity <= 20\"")
        .replace("\"fashion-mnist\"", "\"synthetic-text\"")
        .replace("\"cnn\"", "\"gpt2\"");
    assert_eq!(
        ok(&text).train.target.map(|t| t.metric),
        Some(Metric::Perplexity)
    );
    let c = parse_with(MINIMAL, &["train.target=accuracy > 0.5"]).unwrap();
    assert_eq!(c.train.target.map(|t| t.op), Some(Comparison::Above));

    use ErrorKind::{InvalidValue, WrongType};
    check(vec![
        case(
            "unknown metric",
            target("target = \"acc >= 0.9\""),
            InvalidValue,
            "train.target",
            Some(10),
            "train.target: unknown metric \"acc\"; use accuracy (or top1), top2, top3, ... (topK), f1, cross_entropy or perplexity",
        ),
        case(
            "unknown comparison",
            target("target = \"accuracy == 0.9\""),
            InvalidValue,
            "train.target",
            Some(10),
            "unknown comparison \"==\"; use >=, >, <= or <",
        ),
        case(
            "no comparison",
            target("target = \"accuracy 0.9\""),
            InvalidValue,
            "train.target",
            Some(10),
            "no comparison after \"accuracy\"",
        ),
        case(
            "not a number",
            target("target = \"accuracy >= ninety\""),
            InvalidValue,
            "train.target",
            Some(10),
            "\"ninety\" is not a number",
        ),
        case(
            "no number",
            target("target = \"accuracy >=\""),
            InvalidValue,
            "train.target",
            Some(10),
            "no number after \">=\"",
        ),
        case(
            "no metric",
            target("target = \">= 0.9\""),
            InvalidValue,
            "train.target",
            Some(10),
            "expected \"<metric> <comparison> <number>\", such as \"accuracy >= 0.9\"",
        ),
        case(
            "accuracy out of range",
            target("target = \"accuracy >= 90\""),
            InvalidValue,
            "train.target",
            Some(10),
            "accuracy is between 0 and 1, so a target of 90 can never be met",
        ),
        case(
            "perplexity of images",
            target("target = \"perplexity < 5\""),
            InvalidValue,
            "train.target",
            Some(10),
            "perplexity exists only for language models, and data.dataset \"fashion-mnist\" is image data; use accuracy, a top-k accuracy (top5), f1 or cross_entropy",
        ),
        case(
            "a number instead of a string",
            target("target = 0.9"),
            WrongType,
            "train.target",
            Some(10),
            "expected a string such as \"accuracy >= 0.9\", got",
        ),
        case(
            "stop_at_target not a bool",
            target("target = \"accuracy >= 0.9\"\nstop_at_target = \"yes\""),
            WrongType,
            "train.stop_at_target",
            Some(11),
            "expected true or false",
        ),
    ]);
}

#[test]
fn loss_ignore_index_and_metrics() {
    use crate::model::{Loss, LossKind};
    use crate::report::Metric;
    let c = ok(MINIMAL);
    assert_eq!(c.train.loss_fn(), Loss::default());
    assert_eq!(c.train.loss_fn().ignore_index, -100);
    assert_eq!(c.train.metrics, None);
    let train = |lines: &str| MINIMAL.replace("\"3ep\"\n", &format!("\"3ep\"\n{lines}\n"));
    let c = ok(&train(
        "loss = \"binary_cross_entropy\"\nmetrics = [\"top5\", \"f1\"]\ntarget = \"top5 >= 0.9\"",
    ));
    assert_eq!(c.train.loss, LossKind::BinaryCrossEntropy);
    assert_eq!(c.train.metrics, Some(vec![Metric::TopK(5), Metric::F1]));
    assert_eq!(c.train.target.map(|t| t.metric), Some(Metric::TopK(5)));
    // Recorded as written.
    let recorded = serde_json::to_value(&c.train).unwrap();
    assert_eq!(recorded["loss"], "binary_cross_entropy");
    assert_eq!(recorded["metrics"], serde_json::json!(["top5", "f1"]));
    let c = ok(&train(
        "ignore_index = 3\nmetrics = [\"top1\", \"top3\"]\ntarget = \"f1 >= 0.8\"",
    ));
    assert_eq!(c.train.loss_fn().ignore_index, 3);
    assert_eq!(
        c.train.metrics,
        Some(vec![Metric::Accuracy, Metric::TopK(3)])
    );
    assert_eq!(c.train.target.map(|t| t.metric), Some(Metric::F1));
    let text = |lines: &str| {
        train(lines)
            .replace("\"fashion-mnist\"", "\"synthetic-text\"")
            .replace("\"cnn\"", "\"gpt2\"")
    };
    assert_eq!(
        ok(&text("metrics = [\"top5\"]")).train.metrics,
        Some(vec![Metric::TopK(5)])
    );

    use ErrorKind::{InvalidValue, WrongType};
    check(vec![
        case(
            "unknown loss",
            train("loss = \"bce\""),
            InvalidValue,
            "train.loss",
            Some(10),
            "unknown loss \"bce\"; expected \"cross_entropy\" or \"binary_cross_entropy\"",
        ),
        case(
            "binary cross-entropy of a language model",
            text("loss = \"binary_cross_entropy\""),
            InvalidValue,
            "train.loss",
            Some(10),
            "binary_cross_entropy is for image classifiers, and data.dataset \"synthetic-text\" is text",
        ),
        case(
            "ignore_index with binary cross-entropy",
            train("loss = \"binary_cross_entropy\"\nignore_index = 0"),
            InvalidValue,
            "train.ignore_index",
            Some(11),
            "applies to loss = \"cross_entropy\" only",
        ),
        case(
            "ignore_index not an integer",
            train("ignore_index = \"none\""),
            WrongType,
            "train.ignore_index",
            Some(10),
            "expected an integer, got",
        ),
        case(
            "unknown metric in the list",
            train("metrics = [\"top5\", \"precision\"]"),
            InvalidValue,
            "train.metrics",
            Some(10),
            "unknown metric \"precision\"; use accuracy (or top1)",
        ),
        case(
            "top0",
            train("metrics = [\"top0\"]"),
            InvalidValue,
            "train.metrics",
            Some(10),
            "unknown metric \"top0\"",
        ),
        case(
            "a metric twice",
            train("metrics = [\"f1\", \"f1\"]"),
            InvalidValue,
            "train.metrics",
            Some(10),
            "f1 is listed twice",
        ),
        case(
            "metrics not a list",
            train("metrics = \"top5\""),
            WrongType,
            "train.metrics",
            Some(10),
            "expected an array of strings",
        ),
        case(
            "f1 of a language model",
            text("metrics = [\"f1\"]"),
            InvalidValue,
            "train.metrics",
            Some(10),
            "f1 is for classification, and data.dataset \"synthetic-text\" is text",
        ),
        case(
            "f1 target of a language model",
            text("target = \"f1 >= 0.5\""),
            InvalidValue,
            "train.target",
            Some(10),
            "f1 is for classification",
        ),
        case(
            "perplexity listed for images",
            train("metrics = [\"perplexity\"]"),
            InvalidValue,
            "train.metrics",
            Some(10),
            "perplexity exists only for language models",
        ),
        case(
            "top-k target out of range",
            train("target = \"top5 >= 1.5\""),
            InvalidValue,
            "train.target",
            Some(10),
            "top5 is between 0 and 1, so a target of 1.5 can never be met",
        ),
    ]);
}

#[test]
fn folder_dataset() {
    use crate::data::{FolderConfig, OnBadFile};
    let dir = crate::data::idx::tests::TempDir::new("config-folder");
    for class in ["b", "a", "c"] {
        std::fs::create_dir_all(dir.0.join("train").join(class)).unwrap();
    }
    let data_dir = format!("data_dir = {:?}\n", dir.0.display().to_string());
    let folder = |extra: &str| {
        MINIMAL.replace(
            "dataset = \"fashion-mnist\"\n",
            &format!("dataset = \"folder\"\n{data_dir}{extra}"),
        )
    };
    let c = ok(&folder("[data.folder]\nsize = 16\nchannels = 1\n"));
    assert_eq!(c.data.dataset, Dataset::Folder);
    assert_eq!(c.data.data_dir.as_deref(), Some(dir.0.as_path()));
    assert_eq!(
        c.data.folder,
        Some(FolderConfig {
            channels: 1,
            ..FolderConfig::new(16)
        })
    );
    assert_eq!((c.data.channels(), c.data.image_size()), (1, (16, 16)));
    assert_eq!((c.data.num_classes(), c.model.num_classes), (3, 3));
    let j = serde_json::to_value(&c).unwrap();
    assert_eq!(j["data"]["folder"]["on_bad_file"], "stop");
    let c = ok(&folder("[data.folder]\nsize = 8\non_bad_file = \"skip\"\n"));
    let f = c.data.folder.unwrap();
    assert_eq!((f.channels, f.on_bad_file), (3, OnBadFile::Skip));
    assert!(!f.jpeg_dct_scale && !f.train_plan().jpeg_dct_scale);
    let c = ok(&folder("[data.folder]\nsize = 8\njpeg_dct_scale = true\n"));
    let f = c.data.folder.unwrap();
    assert!(f.jpeg_dct_scale && f.train_plan().jpeg_dct_scale && !f.eval_plan().jpeg_dct_scale);

    use ErrorKind::{InvalidValue, MissingKey, UnknownKey};
    let no_train = MINIMAL.replace(
        "dataset = \"fashion-mnist\"\n",
        "dataset = \"folder\"\ndata_dir = \"/nowhere\"\n[data.folder]\nsize = 8\n",
    );
    check(vec![
        case(
            "folder without data_dir",
            MINIMAL.replace("\"fashion-mnist\"", "\"folder\""),
            MissingKey,
            "data.data_dir",
            Some(2),
            "the image folder",
        ),
        case(
            "folder without [data.folder]",
            folder(""),
            MissingKey,
            "data.folder",
            Some(2),
            "the image `size`",
        ),
        case(
            "folder without size",
            folder("[data.folder]\nchannels = 3\n"),
            MissingKey,
            "data.folder.size",
            Some(5),
            "resized (shorter side) and centre-cropped",
        ),
        case(
            "two channels",
            folder("[data.folder]\nsize = 8\nchannels = 2\n"),
            InvalidValue,
            "data.folder.channels",
            Some(7),
            "must be 1 (luma) or 3 (RGB), got 2",
        ),
        case(
            "jpeg_dct_scale not a boolean",
            folder("[data.folder]\nsize = 8\njpeg_dct_scale = \"yes\"\n"),
            ErrorKind::WrongType,
            "data.folder.jpeg_dct_scale",
            Some(7),
            "true or false",
        ),
        case(
            "unknown on_bad_file",
            folder("[data.folder]\nsize = 8\non_bad_file = \"ignore\"\n"),
            InvalidValue,
            "data.folder.on_bad_file",
            Some(7),
            "expected \"stop\" or \"skip\"",
        ),
        case(
            "no train folder",
            no_train,
            InvalidValue,
            "data.data_dir",
            Some(4),
            "/nowhere/train: no such folder",
        ),
        case(
            "folder for fashion-mnist",
            with("[data.folder]\nsize = 8\n"),
            UnknownKey,
            "data.folder",
            Some(10),
            "only applies to dataset = \"folder\"",
        ),
    ]);
}

#[test]
fn torchscript_model_misuse_names_the_key() {
    use ErrorKind::{InvalidValue, MissingKey, UnknownKey};
    let ts = |body: &str| MINIMAL.replace("name = \"cnn\"", body);
    check(vec![
        case(
            "both",
            ts("name = \"cnn\"\ntorchscript = \"model.pt\""),
            InvalidValue,
            "model.torchscript",
            Some(7),
            "give either `name` (a zoo model) or `torchscript`",
        ),
        case(
            "neither",
            ts("num_classes = 10"),
            MissingKey,
            "model.name",
            Some(5),
            "or `torchscript = \"model.pt\"`, a model made in PyTorch",
        ),
        case(
            "missing file",
            ts("torchscript = \"model.pt\""),
            InvalidValue,
            "model.torchscript",
            Some(6),
            "the TorchScript model /base/dir/model.pt does not exist",
        ),
        case(
            "name torchscript",
            ts("name = \"torchscript\""),
            InvalidValue,
            "model.name",
            Some(6),
            "write `torchscript = \"model.pt\"` instead of `name`",
        ),
        case(
            "sha256 without a file",
            ts("name = \"cnn\"\nsha256 = \"ab\""),
            UnknownKey,
            "model.sha256",
            Some(7),
            "`sha256` pins a `torchscript` model file",
        ),
        case(
            "width",
            ts("torchscript = \"model.pt\"\nwidth = 8"),
            UnknownKey,
            "model.width",
            Some(7),
            "a TorchScript model's sizes are fixed by its file",
        ),
    ]);
}

#[test]
fn torchscript_model_is_absolute_hashed_pinned_and_recorded() {
    let dir = std::env::temp_dir().join(format!("tessera-config-ts-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("models")).unwrap_or_else(|e| panic!("{e}"));
    // The config only hashes the file; loading it as TorchScript happens when the model is built.
    let file = dir.join("models/net.pt");
    std::fs::write(&file, b"abc").unwrap_or_else(|e| panic!("{e}"));
    let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    let text = MINIMAL.replace("name = \"cnn\"", "torchscript = \"models/net.pt\"");
    let c = from_str(&text, &dir, "trainer.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.model.name, ModelName::Torchscript);
    let ts = c.model.torchscript.clone().expect("a torchscript file");
    assert_eq!(
        (ts.path.as_path(), ts.sha256.as_str()),
        (file.as_path(), abc)
    );
    assert!(ts.path.is_absolute());
    assert_eq!((c.model.hidden.len(), c.model.width), (0, None));
    // Recorded as `torchscript` + `sha256` (no `name`), and read back the same.
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        recorded["model"],
        serde_json::json!({"torchscript": file, "sha256": abc, "num_classes": 10})
    );
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.model, c.model);
    // A pinned sha256 refuses a changed file, naming the key and both hashes.
    let pinned = text.replace(
        ".pt\"",
        &format!(".pt\"\nsha256 = \"{}\"", abc.to_uppercase()),
    );
    assert!(from_str(&pinned, &dir, "trainer.toml").is_ok());
    std::fs::write(&file, b"abd").unwrap_or_else(|e| panic!("{e}"));
    let e = match from_str(&pinned, &dir, "trainer.toml") {
        Ok(_) => panic!("a changed file must be refused"),
        Err(e) => e,
    };
    assert_eq!(
        (e.key.as_str(), e.location.line()),
        ("model.sha256", Some(7))
    );
    assert!(e.to_string().contains("the model file changed"), "{e}");
    assert!(recorded::from_recorded(&recorded, "again", &[]).is_err());
    // A folder is not a model file.
    let folder = MINIMAL.replace("name = \"cnn\"", "torchscript = \"models\"");
    let e = match from_str(&folder, &dir, "trainer.toml") {
        Ok(_) => panic!("a folder must be refused"),
        Err(e) => e,
    };
    assert!(e.to_string().contains("does not exist as a file"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The error of `text`: at `key`, its message holding every fragment.
fn refused(text: &str, key: &str, fragments: &[&str]) {
    let e = match parse_with(text, &[]) {
        Ok(_) => panic!("expected an error at {key}"),
        Err(e) => e,
    };
    let shown = e.to_string();
    assert_eq!(e.key, key, "{shown}");
    for f in fragments {
        assert!(shown.contains(f), "{shown:?} lacks {f:?}");
    }
}

#[test]
fn image_models_refuse_text_and_gpt2_refuses_images() {
    let text = MINIMAL.replace("\"fashion-mnist\"", "\"synthetic-text\"");
    refused(
        &text,
        "model.name",
        &["\"cnn\" takes images", "synthetic-text", "gpt2"],
    );
    let gpt2 = MINIMAL.replace("\"cnn\"", "\"gpt2\"");
    refused(
        &gpt2,
        "model.name",
        &["language model", "fashion-mnist", "text dataset"],
    );
    let transforms = format!("{text}\n[data.transforms]\nhorizontal_flip = {{ p = 0.5 }}\n")
        .replace("\"cnn\"", "\"gpt2\"");
    refused(
        &transforms,
        "data.transforms.horizontal_flip",
        &["image transforms", "text"],
    );
    let eval_tokens = text.replace("\"cnn\"", "\"gpt2\"").replace(
        "\"synthetic-text\"",
        "\"shakespeare\"\n[data.text]\neval_tokens = 9",
    );
    refused(&eval_tokens, "data.text.eval_tokens", &["synthetic-text"]);
}

#[test]
fn gpt2_sizes_default_validate_and_round_trip() {
    use crate::model::Gpt2Config;
    let gpt2 = MINIMAL.replace("\"cnn\"", "\"gpt2\"").replace(
        "\"fashion-mnist\"",
        "\"synthetic-text\"\n[data.text]\nvocab_size = 256",
    );
    let c = ok(&gpt2);
    assert_eq!(c.model.gpt2, Some(Gpt2Config::default()));
    let g = Gpt2Config::default();
    assert_eq!(
        (g.n_layer, g.n_head, g.n_embd, g.n_positions, g.vocab_size),
        (12, 12, 768, 1024, None)
    );
    assert!(g.tie_embeddings && g.layer_norm_epsilon == 1e-5);
    let sized = gpt2.replace(
        "name = \"gpt2\"",
        "name = \"gpt2\"\nn_layer = 2\nn_head = 4\nn_embd = 64\nn_positions = 128\n\
         vocab_size = 300\ntie_embeddings = false\nlayer_norm_epsilon = 1e-6\ndropout = 0.1",
    );
    let c = ok(&sized);
    let want = Gpt2Config {
        n_layer: 2,
        n_head: 4,
        n_embd: 64,
        n_positions: 128,
        vocab_size: Some(300),
        tie_embeddings: false,
        layer_norm_epsilon: 1e-6,
    };
    assert_eq!(c.model.gpt2.as_ref(), Some(&want));
    assert_eq!(c.model.dropout, 0.1);
    // Recorded with every size, and read back the same.
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["model"]["n_embd"], 64);
    assert_eq!(recorded["model"]["tie_embeddings"], false);
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.model, c.model);
    // Errors name the key and its line.
    for (from, to, key, fragment) in [
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nn_embd = 100",
            "model.n_embd",
            "multiple of `n_head`",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nn_head = 5",
            "model.n_head",
            "multiple of `n_head`",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nvocab_size = 3",
            "model.vocab_size",
            "must be >= 256",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nn_layer = 0",
            "model.n_layer",
            "",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nhidden = [4]",
            "model.hidden",
            "does not apply to model \"gpt2\"",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nlayer_norm_epsilon = 0",
            "model.layer_norm_epsilon",
            "",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\ntie_embeddings = 1",
            "model.tie_embeddings",
            "",
        ),
    ] {
        let e = err(&gpt2.replace(from, to));
        assert_eq!(e.key, key, "{e}");
        // The line after `name` (line 8, below [data.text]).
        assert_eq!(e.location.line(), Some(9), "{e}");
        assert!(e.message.contains(fragment), "{e}");
    }
    let e = err(&MINIMAL.replace("name = \"cnn\"", "name = \"cnn\"\nn_head = 2"));
    assert_eq!(e.key, "model.n_head");
    assert!(
        e.message
            .contains("only applies to models \"gpt2\" and \"bert\""),
        "{e}"
    );
}

#[test]
fn bert_sizes_default_validate_and_round_trip() {
    use crate::model::{BertConfig, BertHead};
    let bert = MINIMAL.replace("\"cnn\"", "\"bert\"").replace(
        "\"fashion-mnist\"",
        "\"synthetic-text\"\n[data.text]\nvocab_size = 256",
    );
    let c = ok(&bert);
    assert_eq!(c.model.bert, Some(BertConfig::default()));
    assert!(c.model.gpt2.is_none());
    let b = BertConfig::default();
    assert_eq!(
        (b.n_layer, b.n_head, b.n_embd, b.n_inner, b.n_positions),
        (12, 12, 768, 3072, 512)
    );
    assert_eq!((b.type_vocab_size, b.layer_norm_epsilon), (2, 1e-12));
    assert_eq!(b.head, BertHead::MaskedLm);
    let sized = bert.replace(
        "name = \"bert\"",
        "name = \"bert\"\nn_layer = 2\nn_head = 4\nn_embd = 64\nn_inner = 96\n\
         n_positions = 128\nvocab_size = 300\ntype_vocab_size = 1\nlayer_norm_epsilon = 1e-6\n\
         dropout = 0.1\nhead = \"masked_lm\"",
    );
    let c = ok(&sized);
    let want = BertConfig {
        n_layer: 2,
        n_head: 4,
        n_embd: 64,
        n_inner: 96,
        n_positions: 128,
        vocab_size: Some(300),
        type_vocab_size: 1,
        layer_norm_epsilon: 1e-6,
        head: BertHead::MaskedLm,
    };
    assert_eq!(c.model.bert.as_ref(), Some(&want));
    assert_eq!(c.model.dropout, 0.1);
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["model"]["n_inner"], 96);
    assert_eq!(recorded["model"]["head"], "masked_lm");
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.model, c.model);
    // Errors name the key and its line (the line after `name`).
    for (to, key, fragment) in [
        ("n_embd = 100", "model.n_embd", "multiple of `n_head`"),
        ("n_inner = 0", "model.n_inner", ""),
        ("head = \"pretraining\"", "model.head", "masked_lm"),
        (
            "head = \"classification\"",
            "model.head",
            "needs class labels",
        ),
        (
            "tie_embeddings = false",
            "model.tie_embeddings",
            "word embedding",
        ),
        ("vocab_size = 3", "model.vocab_size", "must be >= 256"),
        (
            "width = 4",
            "model.width",
            "does not apply to model \"bert\"",
        ),
    ] {
        let e = err(&bert.replace("name = \"bert\"", &format!("name = \"bert\"\n{to}")));
        assert_eq!(e.key, key, "{to}: {e}");
        assert_eq!(e.location.line(), Some(9), "{e}");
        assert!(e.message.contains(fragment), "{to}: {e}");
    }
    // BERT's own keys on another model, and BERT on images.
    let e = err(&MINIMAL.replace("name = \"cnn\"", "name = \"cnn\"\nn_inner = 2"));
    assert_eq!(e.key, "model.n_inner");
    assert!(e.message.contains("only applies to model \"bert\""), "{e}");
    let e = err(&MINIMAL.replace("name = \"cnn\"", "name = \"bert\""));
    assert_eq!(e.key, "model.name");
    assert!(e.message.contains("language model"), "{e}");
}

#[test]
fn text_runs_accept_an_empty_transforms_table_and_refuse_transforms() {
    let text = |transforms: &str| {
        format!(
            "[data]\ndataset = \"synthetic-text\"\n{transforms}\n[model]\nname = \"gpt2\"\n\n\
             [train]\nmax_duration = \"3ba\"\n"
        )
    };
    // What a text run's recorded config holds (run.json, checkpoints): read back by
    // `tessera eval` and `tessera export`.
    let cfg = ok(&text("[data.transforms]\n"));
    assert_eq!(cfg.data.transforms, Transforms::default());
    let e = err(&text(
        "[data.transforms]\nnormalize = { mean = [0.5], std = [0.5] }\n",
    ));
    assert!(e.to_string().contains("are image transforms"), "{e}");
}

#[test]
fn text_configs_round_trip_through_the_recorded_config() {
    // A corpus run's recorded config must read back (`tessera eval`/`export`/`predict` of its
    // checkpoints): `tokens`/`eval_tokens` are synthetic-text only and a corpus refuses them, so
    // they are recorded only when set.
    let corpus = MINIMAL
        .replace(
            "\"fashion-mnist\"",
            "\"shakespeare\"\n[data.text]\nseq_len = 64\nvocab_size = 512",
        )
        .replace("\"cnn\"", "\"gpt2\"");
    let c = ok(&corpus);
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    let text = &recorded["data"]["text"];
    assert!(
        text.get("tokens").is_none() && text.get("eval_tokens").is_none(),
        "{text}"
    );
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    // synthetic-text keeps them, set or defaulted.
    let synthetic = corpus.replace("\"shakespeare\"", "\"synthetic-text\"");
    let c = ok(&synthetic);
    let t = c.data.text.as_ref().expect("a text config");
    assert_eq!((t.tokens(), t.eval_tokens()), (262_144, 32_768));
    let sized = synthetic.replace(
        "vocab_size = 512",
        "vocab_size = 512\ntokens = 1000\neval_tokens = 300",
    );
    let c = ok(&sized);
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["data"]["text"]["tokens"], 1000);
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    let t = again.data.text.as_ref().expect("a text config");
    assert_eq!((t.tokens(), t.eval_tokens()), (1000, 300));
}

#[test]
fn own_text_keys_are_read_checked_and_round_trip() {
    let own = MINIMAL
        .replace(
            "\"fashion-mnist\"",
            "\"text\"\ndata_dir = \"my-text\"\n[data.text]\nseq_len = 64\nvocab_size = 512\n\
             eval_fraction = 0.1\ntext_field = \"body\"\ncache_dir = \"tok-cache\"",
        )
        .replace("\"cnn\"", "\"gpt2\"");
    let c = ok(&own);
    assert_eq!(c.data.dataset, Dataset::Text);
    assert!(c
        .data
        .data_dir
        .as_ref()
        .is_some_and(|p| p.ends_with("my-text")));
    let t = c.data.text.as_ref().expect("a text config");
    assert_eq!((t.eval_fraction(), t.text_field()), (0.1, "body"));
    assert!(t
        .cache_dir
        .as_ref()
        .is_some_and(|p| p.ends_with("tok-cache")));
    assert_eq!(t.eval_path, None);
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    // Defaults: 5 % held out, the "text" field.
    let plain = own.replace("eval_fraction = 0.1\ntext_field = \"body\"\n", "");
    let t = ok(&plain).data.text.expect("a text config");
    assert_eq!((t.eval_fraction(), t.text_field()), (0.05, "text"));
    // An evaluation source instead.
    let given = plain.replace(
        "vocab_size = 512",
        "vocab_size = 512\neval_path = \"val.jsonl\"",
    );
    let t = ok(&given).data.text.expect("a text config");
    assert!(t.eval_path.is_some_and(|p| p.ends_with("val.jsonl")));
    // Refused by name.
    refused(
        &own.replace("data_dir = \"my-text\"\n", ""),
        "data.data_dir",
        &["missing", ".txt", ".jsonl"],
    );
    refused(
        &own.replace(
            "eval_fraction = 0.1",
            "eval_fraction = 0.1\neval_path = \"v\"",
        ),
        "data.text.eval_fraction",
        &["either eval_path", "not both"],
    );
    refused(
        &own.replace("eval_fraction = 0.1", "eval_fraction = 1.0"),
        "data.text.eval_fraction",
        &["1"],
    );
    refused(
        &own.replace("\"text\"\ndata_dir", "\"shakespeare\"\ndata_dir"),
        "data.text.eval_fraction",
        &["only applies to dataset = \"text\"", "shakespeare"],
    );
}

#[test]
fn logging_mlflow_is_read_and_checked() {
    let c = ok(&with(
        "[logging]\nmlflow = { uri = \"http://127.0.0.1:5000/\", experiment = \"fmnist\", flush_timeout = \"2s\" }\n",
    ));
    let m = c.logging.mlflow.expect("mlflow");
    assert_eq!(m.uri, "http://127.0.0.1:5000");
    assert_eq!(m.experiment, "fmnist");
    assert_eq!(m.run_name, None);
    assert_eq!(m.flush_timeout(), std::time::Duration::from_secs(2));
    assert!(m.weights);
    assert_eq!(ok(MINIMAL).logging, LoggingConfig::default());
    // The recorded config reads back the same.
    let recorded = serde_json::to_value(ok(&with(
        "[logging]\nmlflow = { uri = \"https://h\", experiment = \"e\", run_name = \"r\", weights = false }\n",
    )))
    .unwrap();
    let back = from_recorded(&recorded, "run.json", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(serde_json::to_value(back).unwrap(), recorded);
    for (extra, key, fragment) in [
        (
            "mlflow = { uri = \"http://h\", experiment = \"e\", urll = 1 }",
            "logging.mlflow.urll",
            "did you mean `uri`?",
        ),
        (
            "mlflow = { uri = \"ftp://h\", experiment = \"e\" }",
            "logging.mlflow.uri",
            "not an http:// or https://",
        ),
        (
            "mlflow = { experiment = \"e\" }",
            "logging.mlflow.uri",
            "missing required key",
        ),
        (
            "mlflow = { uri = \"http://h\" }",
            "logging.mlflow.experiment",
            "missing required key",
        ),
        (
            "mlflow = { uri = \"http://h\", experiment = \"e\", flush_timeout = \"3ep\" }",
            "logging.mlflow.flush_timeout",
            "\"sec\"",
        ),
        (
            "mlflow = { uri = \"http://h\", experiment = \"e\", weights = 1 }",
            "logging.mlflow.weights",
            "true or false",
        ),
        (
            "tensorboard = true",
            "logging.tensorboard",
            "valid keys in `logging`: mlflow",
        ),
    ] {
        let e = err(&with(&format!("[logging]\n{extra}\n")));
        let text = e.to_string();
        assert!(
            text.contains(":11:") && text.contains(key) && text.contains(fragment),
            "{extra}: {text}"
        );
    }
}

#[test]
fn an_instance_sets_the_price_and_survives_the_recorded_config() {
    let c = parse(&format!("instance = \"aws/p4d.24xlarge\"\n{MINIMAL}")).unwrap();
    let presets = crate::cost::Instances::load().unwrap();
    assert_eq!(
        c.usd_per_hour,
        presets.get("aws/p4d.24xlarge").map(|i| i.usd_per_hour)
    );
    assert_eq!(c.instance.as_deref(), Some("aws/p4d.24xlarge"));
    let recorded = serde_json::to_value(&c).unwrap();
    let again = from_recorded(&recorded, "run.json", &[]).unwrap();
    assert_eq!(again.usd_per_hour, c.usd_per_hour);
    assert_eq!(again.instance, c.instance);
}

#[test]
fn warmup_stable_decay_scheduler_errors() {
    let wsd = "[scheduler]\nname = \"warmup_stable_decay\"\nt_warmup = \"1ba\"\n";
    check(vec![
        case(
            "unknown decay shape",
            with(&format!("{wsd}decay_shape = \"quadratic\"\n")),
            ErrorKind::InvalidValue,
            "scheduler.decay_shape",
            Some(13),
            "unknown value \"quadratic\" for schedule \"warmup_stable_decay\"; expected",
        ),
        case(
            "misspelt decay shape",
            with(&format!("{wsd}decay_shape = \"sqrtt\"\n")),
            ErrorKind::InvalidValue,
            "scheduler.decay_shape",
            Some(13),
            "did you mean \"sqrt\"",
        ),
        case(
            "decay fraction above 1",
            with(&format!("{wsd}decay_fraction = 1.5\n")),
            ErrorKind::InvalidValue,
            "scheduler.decay_fraction",
            Some(13),
            "decay_fraction must be in [0, 1], got 1.5",
        ),
        case(
            "negative floor",
            with(&format!("{wsd}alpha_f = -0.1\n")),
            ErrorKind::InvalidValue,
            "scheduler.alpha_f",
            Some(13),
            "must be a finite number",
        ),
        case(
            "no warmup given",
            with("[scheduler]\nname = \"warmup_stable_decay\"\n"),
            ErrorKind::MissingKey,
            "scheduler.t_warmup",
            Some(10),
            "missing required key",
        ),
        case(
            "bad time",
            with(&format!("{wsd}t_max = \"1 epoch\"\n")),
            ErrorKind::InvalidValue,
            "scheduler.t_max",
            Some(13),
            "1 epoch",
        ),
    ]);
    let c = ok(&with(&format!(
        "{wsd}decay_fraction = 0.6\nalpha_f = 0.15\ndecay_shape = \"sqrt\"\n"
    )));
    assert_eq!(c.scheduler.name(), "warmup_stable_decay");
}

#[test]
fn airbench_widths_default_validate_and_record() {
    let airbench =
        |extra: &str| MINIMAL.replace("name = \"cnn\"", &format!("name = \"airbench\"{extra}"));
    let c = ok(&airbench(""));
    assert_eq!(c.model.name, ModelName::Airbench);
    assert_eq!(
        (c.model.widths.clone(), c.model.width),
        (vec![64, 256, 256], None)
    );
    let c = ok(&airbench("\nwidths = [8, 16, 32]"));
    assert_eq!(c.model.widths, [8, 16, 32]);
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["model"]["widths"], serde_json::json!([8, 16, 32]));
    // A resumed run reads the recorded config back.
    let again = from_recorded(&recorded, "run.json", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.model, c.model);
    for (extra, fragment) in [
        ("\nwidths = [8, 16]", "three widths"),
        ("\nwidths = [8, 0, 16]", "model.widths.1"),
        ("\nwidth = 8", "give its three conv-group widths"),
        ("\nnorm = \"group\"", "\"batch\""),
        ("\nhidden = [4]", "only applies to model \"mlp\""),
    ] {
        let e = err(&airbench(extra)).to_string();
        assert!(e.contains(fragment), "{extra}: {e}");
    }
    let e =
        err(&MINIMAL.replace("name = \"cnn\"", "name = \"cnn\"\nwidths = [8, 8, 8]")).to_string();
    assert!(e.contains("only applies to model \"airbench\""), "{e}");
    assert!(
        !serde_json::to_value(ok(MINIMAL)).unwrap_or_default()["model"]
            .as_object()
            .is_some_and(|m| m.contains_key("widths"))
    );
}

#[test]
fn shards_keys_are_checked_by_name_and_line() {
    use ErrorKind::{InvalidValue, MissingKey, UnknownKey};
    // Line 3 `dataset`, 4 `data_dir`, then the extra lines from 5.
    let shards = |format: &str, extra: &str| {
        MINIMAL.replace(
            "dataset = \"fashion-mnist\"\n",
            &format!("dataset = \"{format}\"\ndata_dir = \"/shards\"\n{extra}"),
        )
    };
    let c = ok(&shards(
        "mds",
        "[data.shards]\nsize = 16\nclasses = 3\nimage = \"jpg\"\n",
    ));
    let s = c.data.shards.expect("[data.shards]");
    assert_eq!((s.images.size, s.classes, s.image.as_str()), (16, 3, "jpg"));
    assert_eq!(s.label, "y");
    check(vec![
        case(
            "a misspelt key",
            shards("mds", "[data.shards]\nsize = 16\nclases = 3\n"),
            UnknownKey,
            "data.shards.clases",
            Some(7),
            "classes",
        ),
        case(
            "no size",
            shards("wds", "[data.shards]\nclasses = 3\n"),
            MissingKey,
            "data.shards.size",
            Some(5),
            "the side of the square samples",
        ),
        case(
            "no classes",
            shards("mds", "[data.shards]\nsize = 16\n"),
            MissingKey,
            "data.shards.classes",
            Some(5),
            "labels lie in 0..classes",
        ),
        case(
            "no [data.shards]",
            shards("mds", ""),
            MissingKey,
            "data.shards",
            Some(2),
            "the image `size` and the number of `classes`",
        ),
        case(
            "no data_dir",
            MINIMAL.replace("\"fashion-mnist\"", "\"wds\""),
            MissingKey,
            "data.data_dir",
            Some(2),
            "split folders (train/, val/)",
        ),
        case(
            "an empty column name",
            shards(
                "mds",
                "[data.shards]\nsize = 16\nclasses = 3\nlabel = \" \"\n",
            ),
            InvalidValue,
            "data.shards.label",
            Some(8),
            "must not be empty",
        ),
        case(
            "shuffle_block 0",
            shards(
                "mds",
                "[data.shards]\nsize = 16\nclasses = 3\nshuffle_block = 0\n",
            ),
            InvalidValue,
            "data.shards.shuffle_block",
            Some(8),
            "",
        ),
        case(
            "[data.shards] for another dataset",
            with("[data.shards]\nsize = 8\nclasses = 2\n"),
            UnknownKey,
            "data.shards",
            Some(10),
            "only applies to dataset = \"mds\" or \"wds\"",
        ),
    ]);
}

#[test]
fn shard_cache_keys_and_remote_data_dir() {
    let mds = |data_dir: &str, extra: &str| {
        MINIMAL.replace(
            "dataset = \"fashion-mnist\"\n",
            &format!(
                "dataset = \"mds\"\ndata_dir = {data_dir:?}\n[data.shards]\nsize = 8\nclasses = 10\n{extra}"
            ),
        )
    };
    let c = ok(&mds(
        "s3://bucket/some/prefix",
        "cache_limit = \"1.5GB\"\nprefetch_shards = 3\ncache_dir = \"cache\"\n",
    ));
    // A remote is kept as written; a local folder is resolved against the config's folder.
    assert_eq!(
        c.data.data_dir.as_deref(),
        Some(Path::new("s3://bucket/some/prefix"))
    );
    let s = c.data.shards.unwrap();
    assert_eq!(s.cache_limit, 1_500_000_000);
    assert_eq!(s.prefetch_shards, Some(3));
    assert_eq!(s.cache_dir.as_deref(), Some(Path::new("/base/dir/cache")));
    let c = ok(&mds("shards", ""));
    assert_eq!(
        c.data.data_dir.as_deref(),
        Some(Path::new("/base/dir/shards"))
    );
    let s = c.data.shards.unwrap();
    assert_eq!((s.cache_limit, s.prefetch_shards), (10_000_000_000, None));
    let e = err(&mds("shards", "cache_limit = \"lots\"\n")).to_string();
    assert!(e.contains("cache_limit") && e.contains("`lots`"), "{e}");
    let e = err(&mds("shards", "cache_limit = \"0MB\"\n")).to_string();
    assert!(e.contains("cache_limit"), "{e}");
    // A URL without a bucket, at the config's line; WebDataset shards from S3.
    for url in ["s3://", "s3:///prefix"] {
        let e = err(&mds(url, "")).to_string();
        assert!(
            e.contains("data.data_dir") && e.contains("no bucket name"),
            "{e}"
        );
    }
    let e = err(&mds("s3://bucket/x", "").replace("\"mds\"", "\"wds\"")).to_string();
    assert!(
        e.contains("data.data_dir") && e.contains("for dataset = \"mds\" only"),
        "{e}"
    );
}

#[test]
fn chat_keys_are_read_checked_and_round_trip() {
    let chat = MINIMAL
        .replace(
            "\"fashion-mnist\"",
            "\"chat\"\ndata_dir = \"train.jsonl\"\n[data.text]\nseq_len = 64\n\
             chat_template = \"plain\"\nloss_on = \"all\"\npacking = true\neval_fraction = 0.2",
        )
        .replace("\"cnn\"", "\"gpt2\"");
    let c = ok(&chat);
    assert_eq!(c.data.dataset, Dataset::Chat);
    assert!(c.data.dataset.is_text() && !c.data.dataset.is_labelled_text());
    let t = c.data.text.as_ref().expect("a text config");
    assert_eq!(t.chat_template.as_deref(), Some("plain"));
    assert_eq!(t.loss_on, Some(crate::data::LossOn::All));
    assert_eq!((t.packing, t.eval_fraction()), (Some(true), 0.2));
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["data"]["dataset"], "chat");
    assert_eq!(recorded["data"]["text"]["loss_on"], "all");
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    refused(
        &chat.replace("data_dir = \"train.jsonl\"\n", ""),
        "data.data_dir",
        &["missing", "conversations", "prompt"],
    );
    refused(
        &chat.replace("loss_on = \"all\"", "loss_on = \"assistent\""),
        "data.text.loss_on",
        &["did you mean \"assistant\"?"],
    );
    refused(
        &chat.replace("packing = true", "text_field = \"body\""),
        "data.text.text_field",
        &["has no text_field"],
    );
    refused(
        &chat.replace("\"chat\"", "\"text\""),
        "data.text.chat_template",
        &["only applies to dataset = \"chat\"", "\"text\""],
    );
    refused(
        &chat.replace("[train]", "[train]\nignore_index = 0"),
        "train.ignore_index",
        &["dataset = \"chat\" marks the positions", "-100"],
    );
}

#[test]
fn labelled_text_keys_are_read_checked_and_round_trip() {
    let labelled = MINIMAL
        .replace(
            "\"fashion-mnist\"",
            "\"labelled-text\"\ndata_dir = \"train.jsonl\"\n[data.text]\nseq_len = 64\n\
             eval_path = \"eval.jsonl\"\nlabel_field = \"source\"\ntext_field = \"body\"",
        )
        .replace("\"cnn\"", "\"gpt2\"");
    let c = ok(&labelled);
    assert_eq!(c.data.dataset, Dataset::LabelledText);
    assert!(c.data.dataset.is_text() && c.data.dataset.is_labelled_text());
    let t = c.data.text.as_ref().expect("a text config");
    assert_eq!(
        (t.label_field(), t.text_field(), t.seq_len),
        ("source", "body", 64)
    );
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["data"]["dataset"], "labelled-text");
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    // Default field.
    let plain = labelled.replace("label_field = \"source\"\n", "");
    assert_eq!(ok(&plain).data.text.unwrap().label_field(), "label");
    refused(
        &labelled.replace("data_dir = \"train.jsonl\"\n", ""),
        "data.data_dir",
        &["missing", "labelled text", "\"label\""],
    );
    // label_field is labelled text's only.
    let own = labelled.replace("\"labelled-text\"", "\"text\"");
    refused(
        &own,
        "data.text.label_field",
        &["only applies to dataset = \"labelled-text\"", "\"text\""],
    );
    // Sentence pairs: a bert with two token types reads them; other models and datasets refuse.
    let pairs = labelled
        .replace(
            "text_field = \"body\"",
            "text_field = \"body\"\npair_field = \"text_pair\"",
        )
        .replace("\"gpt2\"", "\"bert\"");
    let c = ok(&pairs);
    assert_eq!(
        c.data.text.as_ref().unwrap().pair_field.as_deref(),
        Some("text_pair")
    );
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    refused(
        &pairs.replace("\"bert\"", "\"gpt2\""),
        "model.name",
        &["pair_field = \"text_pair\"", "only bert", "\"gpt2\""],
    );
    refused(
        &pairs.replace("name = \"bert\"", "name = \"bert\"\ntype_vocab_size = 1"),
        "model.type_vocab_size",
        &["token types 0 and 1", "1 token type"],
    );
    refused(
        &pairs
            .replace("\"labelled-text\"", "\"text\"")
            .replace("label_field = \"source\"\n", ""),
        "data.text.pair_field",
        &["only applies to dataset = \"labelled-text\""],
    );
    // Classification metrics, not a language model's.
    let f1 = labelled.replace("[train]", "[train]\nmetrics = [\"accuracy\", \"f1\"]");
    assert!(ok(&f1).train.metrics.is_some());
    refused(
        &labelled.replace("[train]", "[train]\nmetrics = [\"perplexity\"]"),
        "train.metrics",
        &[
            "perplexity exists only for language models",
            "labelled text",
        ],
    );
}

#[test]
fn mlm_keys_are_read_checked_and_round_trip() {
    let corpus = MINIMAL
        .replace(
            "\"fashion-mnist\"",
            "\"shakespeare\"\n[data.text]\nseq_len = 64\n[data.mlm]\nprobability = 0.2",
        )
        .replace("\"cnn\"", "\"gpt2\"");
    let c = ok(&corpus);
    let mlm = c.data.mlm.expect("[data.mlm]");
    assert_eq!(
        (mlm.probability, mlm.mask_fraction, mlm.random_fraction),
        (0.2, 0.8, 0.1)
    );
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    assert_eq!(
        ok(&corpus.replace("[data.mlm]\nprobability = 0.2", ""))
            .data
            .mlm,
        None
    );
    // Every default: an empty table.
    let defaults = ok(&corpus.replace("probability = 0.2", ""))
        .data
        .mlm
        .unwrap();
    assert_eq!(defaults, crate::data::MlmConfig::default());
    // Errors name the key and its line.
    let line = |text: &str, key: &str| {
        let e = parse(text).unwrap_err();
        assert_eq!(e.key, key, "{e}");
        let at = text
            .lines()
            .position(|l| l.starts_with(key.rsplit('.').next().unwrap()));
        assert_eq!(e.location.line(), at.map(|i| i + 1), "{e}");
        e.to_string()
    };
    for bad in ["0", "0.0", "1.5", "-0.1"] {
        line(
            &corpus.replace("probability = 0.2", &format!("probability = {bad}")),
            "data.mlm.probability",
        );
    }
    assert!(
        ok(&corpus.replace("probability = 0.2", "probability = 1.0"))
            .data
            .mlm
            .is_some()
    );
    let e = line(
        &corpus.replace(
            "probability = 0.2",
            "mask_fraction = 0.9\nrandom_fraction = 0.2",
        ),
        "data.mlm.random_fraction",
    );
    assert!(e.contains("more than 1"), "{e}");
    let e = line(
        &corpus.replace("probability = 0.2", "mask_fraction = 0.95"),
        "data.mlm.mask_fraction",
    );
    assert!(e.contains("0.95 + random_fraction 0.1"), "{e}");
    line(
        &corpus.replace("probability = 0.2", "mask_fraction = 1.2"),
        "data.mlm.mask_fraction",
    );
    // Not for images or labelled text.
    refused(
        &with("[data.mlm]\nprobability = 0.2\n"),
        "data.mlm",
        &["masked-LM", "fashion-mnist"],
    );
    let labelled = corpus.replace(
        "\"shakespeare\"",
        "\"labelled-text\"\ndata_dir = \"train.jsonl\"",
    );
    refused(&labelled, "data.mlm", &["labelled-text", "classification"]);
    // The targets' ignore index is fixed.
    refused(
        &corpus.replace("[train]", "[train]\nignore_index = 0"),
        "train.ignore_index",
        &["-100", "[data.mlm]"],
    );
    assert!(
        ok(&corpus.replace("[train]", "[train]\nignore_index = -100"))
            .data
            .mlm
            .is_some()
    );
}
