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

// MINIMAL's lines: 1 empty, 2 [data], 3 dataset, 4 empty, 5 [model], 6 name,
// 7 empty, 8 [train], 9 max_duration; `with` appends from line 10.

pub(super) const FULL: &str = r#"run_name = "fmnist-cnn"
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

pub(super) fn parse_with(text: &str, overrides: &[&str]) -> Result<Config, ConfigError> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    from_str_with_overrides(text, Path::new("/base/dir"), "trainer.toml", &overrides)
}

pub(super) fn ok(text: &str) -> Config {
    match parse(text) {
        Ok(c) => c,
        Err(e) => panic!("expected a valid config, got: {e}"),
    }
}

pub(super) fn err(text: &str) -> ConfigError {
    match parse(text) {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => e,
    }
}

/// The minimal file with `extra` appended (tables after the minimal ones).
pub(super) fn with(extra: &str) -> String {
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
pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) text: String,
    pub(super) set: &'static [&'static str],
    pub(super) kind: ErrorKind,
    pub(super) key: &'static str,
    pub(super) line: Option<usize>,
    pub(super) needle: &'static str,
}

pub(super) fn case(
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

pub(super) fn check(cases: Vec<Case>) {
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

/// The error of `text`: at `key`, its message holding every fragment.
pub(super) fn refused(text: &str, key: &str, fragments: &[&str]) {
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
