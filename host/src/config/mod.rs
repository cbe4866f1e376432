//! `trainer.toml`: the trainer's configuration file.
//!
//! [`load`] reads the file, applies `--set key=value` overrides, checks it
//! against the schema (every table rejects unknown keys), resolves relative
//! paths against the file's folder, fills defaults and validates ranges.
//! Every [`ConfigError`] names the file, the dotted key and the line and
//! column (or the `--set` argument) of the offending text, and says what is
//! allowed:
//!
//! ```text
//! trainer.toml:12:6: optimizer.lr: must be > 0, got -0.1
//! trainer.toml: --set train.max_duration=3dur: train.max_duration: unit "dur" is not allowed here; use "ep", "ba", "sp", "tok" or "iter"
//! ```
//!
//! `docs/trainer-reference.toml` documents every key.

mod error;
mod reader;
mod tree;

#[cfg(test)]
mod tests;

pub use error::{ConfigError, ErrorKind, Location};

use crate::optim::schedule::Schedule;
use crate::time::Time;
use reader::{quote_list, Bounds, Tbl};
use serde::{Serialize, Serializer};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use tree::{Node, SourceMap, Val};

/// The resolved configuration of one training run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    /// Name of the run; the run folder is `output_dir/run_name`. Defaults to the file stem.
    pub run_name: String,
    /// Global random seed (default 42).
    pub seed: u64,
    /// Folder holding run folders, resolved against the file's folder (default `runs`).
    pub output_dir: PathBuf,
    /// Price of the machine in USD per hour, for the cost estimate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usd_per_hour: Option<f64>,
    /// `[data]`
    pub data: DataConfig,
    /// `[model]`
    pub model: ModelConfig,
    /// `[optimizer]`
    pub optimizer: OptimizerConfig,
    /// `[scheduler]` (default `{ name = "constant" }`).
    pub scheduler: Schedule,
    /// `[train]`
    pub train: TrainConfig,
    /// `[plugins]`
    pub plugins: PluginsConfig,
    /// `[[algorithms]]`, in file order.
    pub algorithms: Vec<AlgorithmConfig>,
    /// `[checkpoint]`
    pub checkpoint: CheckpointConfig,
}

impl Config {
    /// The run folder: `output_dir/run_name`.
    pub fn run_dir(&self) -> PathBuf {
        self.output_dir.join(&self.run_name)
    }
}

/// A dataset the trainer knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Dataset {
    /// Fashion-MNIST (28x28 grey, 10 classes).
    #[serde(rename = "fashion-mnist")]
    FashionMnist,
    /// MNIST digits (28x28 grey, 10 classes).
    #[serde(rename = "mnist")]
    Mnist,
    /// Random images generated in memory, shaped by `[data.synthetic]`.
    #[serde(rename = "synthetic")]
    Synthetic,
}

impl Dataset {
    const CHOICES: [(&'static str, Dataset); 3] = [
        ("fashion-mnist", Dataset::FashionMnist),
        ("mnist", Dataset::Mnist),
        ("synthetic", Dataset::Synthetic),
    ];

    /// The name used in `trainer.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dataset::FashionMnist => "fashion-mnist",
            Dataset::Mnist => "mnist",
            Dataset::Synthetic => "synthetic",
        }
    }

    /// Whether the dataset is downloaded from a registry (not generated).
    pub fn is_registry(self) -> bool {
        !matches!(self, Dataset::Synthetic)
    }
}

impl fmt::Display for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[data]`
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataConfig {
    /// Which dataset.
    pub dataset: Dataset,
    /// Dataset cache root, resolved against the file's folder; `None` = the loader's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Fetch a missing registry dataset (default true).
    pub fetch: bool,
    /// Training batch size (default 128, >= 1).
    pub batch_size: usize,
    /// Evaluation batch size (default 512, >= 1).
    pub eval_batch_size: usize,
    /// Loader threads; 0 loads in the training thread (default 2).
    pub workers: usize,
    /// Batches queued per worker (default 4, >= 1).
    pub prefetch: usize,
    /// Drop the last incomplete training batch (default true).
    pub drop_last: bool,
    /// Shuffle the training set each epoch (default true).
    pub shuffle: bool,
    /// Shape of the synthetic dataset; `Some` exactly when `dataset` is `synthetic`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<SyntheticConfig>,
    /// Train-time transforms.
    pub transforms: TransformsConfig,
}

impl DataConfig {
    /// Image channels of the dataset.
    pub fn channels(&self) -> usize {
        self.synthetic.as_ref().map_or(1, |s| s.channels)
    }

    /// Image `(height, width)` of the dataset.
    pub fn image_size(&self) -> (usize, usize) {
        self.synthetic
            .as_ref()
            .map_or((28, 28), |s| (s.height, s.width))
    }

    /// Number of classes of the dataset.
    pub fn num_classes(&self) -> usize {
        self.synthetic.as_ref().map_or(10, |s| s.classes)
    }
}

/// `[data.synthetic]`: shape of the generated dataset (every value >= 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SyntheticConfig {
    /// Training samples (default 1024).
    pub samples: usize,
    /// Evaluation samples (default 256).
    pub eval_samples: usize,
    /// Image channels (default 1).
    pub channels: usize,
    /// Image height (default 28).
    pub height: usize,
    /// Image width (default 28).
    pub width: usize,
    /// Classes (default 10).
    pub classes: usize,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            samples: 1024,
            eval_samples: 256,
            channels: 1,
            height: 28,
            width: 28,
            classes: 10,
        }
    }
}

/// `[data.transforms]`: train-time transforms. The trainer applies
/// `random_crop`, then `horizontal_flip`, then `normalize`, whatever their
/// order in the file; evaluation uses only `normalize`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TransformsConfig {
    /// Per-channel normalization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalize: Option<Normalize>,
    /// Pad then crop at a random position.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_crop: Option<RandomCrop>,
    /// Mirror left-right at random.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub horizontal_flip: Option<HorizontalFlip>,
}

/// `normalize = { mean = [..], std = [..] }`: `(x - mean) / std`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Normalize {
    /// 1 value (all channels) or one per channel.
    pub mean: Vec<f64>,
    /// 1 value (all channels) or one per channel; each > 0.
    pub std: Vec<f64>,
}

/// `random_crop = { size = 28, padding = 2 }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RandomCrop {
    /// Side of the square crop (default: the image side, for square images).
    pub size: usize,
    /// Zero padding added on each side first (default 0).
    pub padding: usize,
}

/// `horizontal_flip = { p = 0.5 }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HorizontalFlip {
    /// Probability of a flip, in [0, 1] (default 0.5).
    pub p: f64,
}

/// A model architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelName {
    /// Multi-layer perceptron.
    Mlp,
    /// Small convolutional network.
    Cnn,
    /// ResNet-20 (CIFAR style).
    Resnet20,
    /// ResNet-56 (CIFAR style).
    Resnet56,
}

impl ModelName {
    const CHOICES: [(&'static str, ModelName); 4] = [
        ("mlp", ModelName::Mlp),
        ("cnn", ModelName::Cnn),
        ("resnet20", ModelName::Resnet20),
        ("resnet56", ModelName::Resnet56),
    ];

    /// The name used in `trainer.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelName::Mlp => "mlp",
            ModelName::Cnn => "cnn",
            ModelName::Resnet20 => "resnet20",
            ModelName::Resnet56 => "resnet56",
        }
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[model]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelConfig {
    /// Architecture.
    pub name: ModelName,
    /// Hidden layer widths; mlp only (default `[256, 128]`), empty for other models.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<usize>,
    /// Base width: `Some` for cnn (default 32) and resnets (default 16), `None` for mlp.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<usize>,
    /// Output classes (default: the dataset's).
    pub num_classes: usize,
}

/// `[optimizer]`, tagged by `name`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "name")]
pub enum OptimizerConfig {
    /// `name = "sgd"`
    #[serde(rename = "sgd")]
    Sgd(SgdConfig),
    /// `name = "adamw"`
    #[serde(rename = "adamw")]
    AdamW(AdamWConfig),
}

impl OptimizerConfig {
    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            OptimizerConfig::Sgd(c) => c.lr,
            OptimizerConfig::AdamW(c) => c.lr,
        }
    }

    /// The weight decay.
    pub fn weight_decay(&self) -> f64 {
        match self {
            OptimizerConfig::Sgd(c) => c.weight_decay,
            OptimizerConfig::AdamW(c) => c.weight_decay,
        }
    }
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig::Sgd(SgdConfig::default())
    }
}

/// SGD settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SgdConfig {
    /// Learning rate, > 0 (default 0.1).
    pub lr: f64,
    /// Momentum, in [0, 1) (default 0.9).
    pub momentum: f64,
    /// Nesterov momentum (default false); needs momentum > 0 and dampening 0.
    pub nesterov: bool,
    /// Dampening, in [0, 1] (default 0).
    pub dampening: f64,
    /// Weight decay, >= 0 (default 0).
    pub weight_decay: f64,
    /// Apply weight decay to the weights directly, not through the gradient (default false).
    pub decoupled_weight_decay: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            nesterov: false,
            dampening: 0.0,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
        }
    }
}

/// AdamW settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdamWConfig {
    /// Learning rate, > 0 (default 0.001).
    pub lr: f64,
    /// `[beta1, beta2]`, each in [0, 1) (default `[0.9, 0.999]`).
    pub betas: [f64; 2],
    /// Denominator term, > 0 (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay, >= 0 (default 0.01).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// Numeric precision of training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Plain 32-bit floats.
    Fp32,
    /// Automatic mixed precision with bfloat16.
    AmpBf16,
}

impl Precision {
    /// The name used in `trainer.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::AmpBf16 => "amp_bf16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where to train. Written `"auto"`, `"cpu"`, `"cuda"` (= `"cuda:0"`) or `"cuda:N"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// CUDA device 0 when available, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// The CUDA device with this index.
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let expected = "expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"";
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Ok(Device::Cuda(i)),
                _ => Err(format!("unknown device {s:?}; {expected}")),
            },
        }
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// `[train]`
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainConfig {
    /// How long to train, in a count unit (ep, ba, sp, tok, iter).
    pub max_duration: Time,
    /// Samples per forward/backward pass (default: `data.batch_size`); <= batch size.
    pub microbatch_size: usize,
    /// Numeric precision (default fp32).
    pub precision: Precision,
    /// Device (default auto).
    pub device: Device,
    /// Multiplies `max_duration` and the schedule's times, > 0 (default 1).
    pub scale_schedule_ratio: f64,
    /// How often to evaluate, in a count unit or `dur` (default `1ep`); also at the end.
    pub eval_interval: Time,
    /// Evaluate on at most this many batches; 0 = all (default 0).
    pub eval_subset_batches: usize,
    /// libtorch intra-op threads; 0 = all cores (default 0).
    pub threads: usize,
    /// How often a metrics line is written, in a count unit or `dur` (default `50ba`).
    pub log_interval: Time,
    /// Progress bar when stderr is a terminal (default true).
    pub progress: bool,
    /// What to do when the loss is NaN or infinite (default stop).
    pub nonfinite_loss: NonFiniteLoss,
}

/// What to do when the training loss is NaN or infinite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NonFiniteLoss {
    /// Stop the run with an error before the update; checkpoints already written stay as they
    /// are (default).
    #[default]
    Stop,
    /// Skip the update (the weights do not change), warn, and go on with the next batch.
    Skip,
}

/// `[checkpoint]`
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointConfig {
    /// Write checkpoints (default true).
    pub save: bool,
    /// How often, in a count unit or `dur` (default `1ep`); also at the end of training.
    pub interval: Time,
    /// Keep only the newest N checkpoints; 0 keeps all (default 0).
    pub keep: usize,
    /// Folder of the checkpoints (default `<run folder>/checkpoints`); relative paths resolve
    /// against the file's folder.
    pub folder: PathBuf,
    /// Continue from the newest good checkpoint in `folder` when there is one (default false).
    pub autoresume: bool,
    /// Start over when `folder` already holds checkpoints and the run does not resume: delete
    /// them (default false: refuse, so an earlier run's checkpoints are never lost by mistake).
    pub overwrite: bool,
    /// Start from this checkpoint file (weights, optimizer, clock, method states).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<PathBuf>,
}

/// `[plugins]`
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PluginsConfig {
    /// Folders searched for plugin libraries, resolved against the file's folder.
    pub dirs: Vec<PathBuf>,
}

/// What to do when a plugin fails during training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop training with the error (default).
    #[default]
    Stop,
    /// Disable the algorithm and keep training.
    Disable,
}

/// One `[[algorithms]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlgorithmConfig {
    /// The plugin's name.
    pub plugin: String,
    /// Expected SHA-256 of the plugin file, 64 lower-case hex digits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// What to do when the plugin fails.
    pub on_error: OnError,
    /// Every other key of the entry: the plugin's own settings, types intact.
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// Line of the entry's `[[algorithms]]` header; 0 when it came from `--set`.
    pub line: usize,
}

impl AlgorithmConfig {
    /// The plugin settings as one JSON object text.
    pub fn settings_json(&self) -> String {
        serde_json::Value::Object(self.settings.clone()).to_string()
    }
}

/// Reads `path`, applies `--set key=value` overrides in order and returns the
/// validated configuration. Relative paths resolve against the file's folder;
/// `run_name` defaults to the file stem.
pub fn load(path: &Path, overrides: &[String]) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            &file,
            Location::Unknown,
            "",
            ErrorKind::Io,
            format!("cannot read the configuration file: {e}"),
        )
    })?;
    let base = path.parent().unwrap_or_else(|| Path::new(""));
    from_str_with_overrides(&text, base, &file, overrides)
}

/// Parses configuration text as if read from `source_name` in `base_dir`.
pub fn from_str(text: &str, base_dir: &Path, source_name: &str) -> Result<Config, ConfigError> {
    from_str_with_overrides(text, base_dir, source_name, &[])
}

/// [`from_str`] with `--set key=value` overrides applied in order.
pub fn from_str_with_overrides(
    text: &str,
    base_dir: &Path,
    source_name: &str,
    overrides: &[String],
) -> Result<Config, ConfigError> {
    let map = SourceMap::new(text);
    let doc =
        toml_edit::ImDocument::parse(text).map_err(|e| syntax_error(&e, &map, source_name))?;
    let mut root = tree::from_document(&doc, &map);
    for arg in overrides {
        tree::apply_override(&mut root, arg, source_name)?;
    }
    let stem = Path::new(source_name)
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("run");
    build(&root, base_dir, source_name, stem)
}

/// Turns a TOML syntax error into a located [`ConfigError`].
fn syntax_error(e: &toml_edit::TomlError, map: &SourceMap<'_>, file: &str) -> ConfigError {
    let loc = map.loc(e.span(), &Location::Unknown);
    let key = loc.line().map(|l| key_on_line(map, l)).unwrap_or_default();
    let message: Vec<&str> = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    ConfigError::new(
        file,
        loc,
        key,
        ErrorKind::Syntax,
        format!("invalid TOML: {}", message.join("; ")),
    )
}

/// Best-effort dotted key written on `line` (for syntax errors, where no tree
/// exists): the last table header above it plus the key before `=`.
fn key_on_line(map: &SourceMap<'_>, line: usize) -> String {
    let clean = |s: &str| -> String {
        s.split('.')
            .map(|p| p.trim().trim_matches(['"', '\'']))
            .collect::<Vec<_>>()
            .join(".")
    };
    let is_key = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_alphanumeric() || "_-.\"' ".contains(c))
    };
    let mut header = String::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for l in 1..line {
        let t = map.line_text(l).trim();
        if let Some(h) = t.strip_prefix("[[") {
            let name = clean(h.split("]]").next().unwrap_or(""));
            let n = counts.entry(name.clone()).or_insert(0);
            header = format!("{name}.{n}");
            *n += 1;
        } else if let Some(h) = t.strip_prefix('[') {
            header = clean(h.split(']').next().unwrap_or(""));
        }
    }
    let current = map.line_text(line).trim();
    if current.starts_with('[') {
        let h = current.trim_start_matches('[');
        let h = h.split(']').next().unwrap_or("");
        return if is_key(h) { clean(h) } else { String::new() };
    }
    match current.split_once('=') {
        Some((k, _)) if is_key(k) => tree::join(&header, &clean(k)),
        _ => String::new(),
    }
}

const ROOT_KEYS: &[&str] = &[
    "run_name",
    "seed",
    "output_dir",
    "usd_per_hour",
    "data",
    "model",
    "optimizer",
    "scheduler",
    "train",
    "plugins",
    "algorithms",
    "checkpoint",
];
const CHECKPOINT_KEYS: &[&str] = &[
    "save",
    "interval",
    "keep",
    "folder",
    "autoresume",
    "overwrite",
    "load",
];
const DATA_KEYS: &[&str] = &[
    "dataset",
    "data_dir",
    "fetch",
    "batch_size",
    "eval_batch_size",
    "workers",
    "prefetch",
    "drop_last",
    "shuffle",
    "synthetic",
    "transforms",
];
const SYNTHETIC_KEYS: &[&str] = &[
    "samples",
    "eval_samples",
    "channels",
    "height",
    "width",
    "classes",
];
const TRANSFORM_KEYS: &[&str] = &["normalize", "random_crop", "horizontal_flip"];
const MODEL_KEYS: &[&str] = &["name", "hidden", "width", "num_classes"];
const SGD_KEYS: &[&str] = &[
    "momentum",
    "nesterov",
    "dampening",
    "decoupled_weight_decay",
];
const ADAMW_KEYS: &[&str] = &["betas", "eps"];
const OPTIMIZER_KEYS: &[&str] = &[
    "name",
    "lr",
    "weight_decay",
    "momentum",
    "nesterov",
    "dampening",
    "decoupled_weight_decay",
    "betas",
    "eps",
];
const TRAIN_KEYS: &[&str] = &[
    "max_duration",
    "microbatch_size",
    "precision",
    "device",
    "scale_schedule_ratio",
    "eval_interval",
    "eval_subset_batches",
    "threads",
    "log_interval",
    "progress",
    "nonfinite_loss",
];
const PLUGINS_KEYS: &[&str] = &["dirs"];

fn build(root: &Node, base: &Path, file: &str, stem: &str) -> Result<Config, ConfigError> {
    let top = Tbl::open(file, "", root, Some(ROOT_KEYS))?;

    let run_name = match top.string("run_name")? {
        Some(name) => {
            if name.is_empty()
                || name == "."
                || name == ".."
                || name.contains(['/', '\\'])
                || name.chars().any(char::is_control)
            {
                return Err(top.err(
                    "run_name",
                    ErrorKind::InvalidValue,
                    format!("{name:?} is not a folder name; use a non-empty name without / or \\"),
                ));
            }
            name
        }
        None => stem.to_string(),
    };
    let seed = top.u64("seed")?.unwrap_or(42);
    let output_dir = base.join(top.string("output_dir")?.unwrap_or_else(|| "runs".into()));
    let usd_per_hour = top.float("usd_per_hour", Bounds::NON_NEGATIVE)?;

    let data = read_data(&top, base)?;
    let model = read_model(&top, &data)?;
    let optimizer = read_optimizer(&top)?;
    let scheduler = read_scheduler(&top)?;
    let train = read_train(&top, &data)?;
    let plugins = match top.sub("plugins", Some(PLUGINS_KEYS))? {
        Some(p) => PluginsConfig {
            dirs: p
                .string_list("dirs")?
                .unwrap_or_default()
                .into_iter()
                .map(|d| base.join(d))
                .collect(),
        },
        None => PluginsConfig::default(),
    };
    let algorithms = read_algorithms(&top)?;
    let checkpoint = read_checkpoint(&top, base, &output_dir.join(&run_name))?;

    Ok(Config {
        run_name,
        seed,
        output_dir,
        usd_per_hour,
        data,
        model,
        optimizer,
        scheduler,
        train,
        plugins,
        algorithms,
        checkpoint,
    })
}

fn read_checkpoint(
    top: &Tbl<'_>,
    base: &Path,
    run_dir: &Path,
) -> Result<CheckpointConfig, ConfigError> {
    let default_folder = run_dir.join("checkpoints");
    let Some(c) = top.sub("checkpoint", Some(CHECKPOINT_KEYS))? else {
        return Ok(CheckpointConfig {
            save: true,
            interval: parse_default_time("1ep")?,
            keep: 0,
            folder: default_folder,
            autoresume: false,
            overwrite: false,
            load: None,
        });
    };
    Ok(CheckpointConfig {
        save: c.bool("save")?.unwrap_or(true),
        interval: match read_time(&c, "interval", INTERVAL_UNITS)? {
            Some(v) => v,
            None => parse_default_time("1ep")?,
        },
        keep: c.uint("keep", 0)?.unwrap_or(0),
        folder: match c.string("folder")? {
            Some(f) => base.join(f),
            None => default_folder,
        },
        autoresume: c.bool("autoresume")?.unwrap_or(false),
        overwrite: c.bool("overwrite")?.unwrap_or(false),
        load: c.string("load")?.map(|p| base.join(p)),
    })
}

/// A required sub-table of the top level.
fn required_table<'a>(
    top: &Tbl<'a>,
    key: &str,
    allowed: &[&str],
    what: &str,
) -> Result<Tbl<'a>, ConfigError> {
    top.sub(key, Some(allowed))?.ok_or_else(|| {
        ConfigError::new(
            top.file,
            Location::Unknown,
            key,
            ErrorKind::MissingKey,
            format!("missing required table [{key}]; it needs at least {what}"),
        )
    })
}

fn read_data(top: &Tbl<'_>, base: &Path) -> Result<DataConfig, ConfigError> {
    let d = required_table(top, "data", DATA_KEYS, "`dataset`")?;
    let names: Vec<&str> = Dataset::CHOICES.iter().map(|(n, _)| *n).collect();
    let dataset = d
        .choice("dataset", "dataset", &Dataset::CHOICES)?
        .ok_or_else(|| d.missing("dataset", &quote_list(&names)))?;

    let synthetic = match (dataset, d.sub("synthetic", Some(SYNTHETIC_KEYS))?) {
        (Dataset::Synthetic, None) => Some(SyntheticConfig::default()),
        (Dataset::Synthetic, Some(s)) => {
            let def = SyntheticConfig::default();
            Some(SyntheticConfig {
                samples: s.uint("samples", 1)?.unwrap_or(def.samples),
                eval_samples: s.uint("eval_samples", 1)?.unwrap_or(def.eval_samples),
                channels: s.uint("channels", 1)?.unwrap_or(def.channels),
                height: s.uint("height", 1)?.unwrap_or(def.height),
                width: s.uint("width", 1)?.unwrap_or(def.width),
                classes: s.uint("classes", 1)?.unwrap_or(def.classes),
            })
        }
        (_, Some(_)) => {
            return Err(d.err_key(
                "synthetic",
                ErrorKind::UnknownKey,
                format!(
                    "[data.synthetic] only applies to dataset = \"synthetic\", not {:?}",
                    dataset.as_str()
                ),
            ))
        }
        (_, None) => None,
    };

    let mut data = DataConfig {
        dataset,
        data_dir: d.string("data_dir")?.map(|p| base.join(p)),
        fetch: d.bool("fetch")?.unwrap_or(true),
        batch_size: d.uint("batch_size", 1)?.unwrap_or(128),
        eval_batch_size: d.uint("eval_batch_size", 1)?.unwrap_or(512),
        workers: d.uint("workers", 0)?.unwrap_or(2),
        prefetch: d.uint("prefetch", 1)?.unwrap_or(4),
        drop_last: d.bool("drop_last")?.unwrap_or(true),
        shuffle: d.bool("shuffle")?.unwrap_or(true),
        synthetic,
        transforms: TransformsConfig::default(),
    };
    if let Some(t) = d.sub("transforms", Some(TRANSFORM_KEYS))? {
        data.transforms = read_transforms(&t, &data)?;
    }
    Ok(data)
}

fn read_transforms(t: &Tbl<'_>, data: &DataConfig) -> Result<TransformsConfig, ConfigError> {
    let channels = data.channels();
    let mut out = TransformsConfig::default();
    if let Some(n) = t.sub("normalize", Some(&["mean", "std"]))? {
        let mean = n
            .float_list("mean", Bounds::ANY)?
            .ok_or_else(|| n.missing("mean", "a number or a list of 1 or C numbers"))?;
        let std = n
            .float_list("std", Bounds::POSITIVE)?
            .ok_or_else(|| n.missing("std", "a number or a list of 1 or C numbers, each > 0"))?;
        for (key, list) in [("mean", &mean), ("std", &std)] {
            if list.len() != 1 && list.len() != channels {
                return Err(n.err(
                    key,
                    ErrorKind::InvalidValue,
                    format!(
                        "must have 1 value or one per channel ({channels} for {}), got {}",
                        data.dataset,
                        list.len()
                    ),
                ));
            }
        }
        out.normalize = Some(Normalize { mean, std });
    }
    if let Some(c) = t.sub("random_crop", Some(&["size", "padding"]))? {
        let (h, w) = data.image_size();
        let padding = c.uint("padding", 0)?.unwrap_or(0);
        let size = match c.uint("size", 1)? {
            Some(s) => s,
            None if h == w => h,
            None => return Err(c.missing("size", "the crop side (the images are not square)")),
        };
        let limit = h.min(w).saturating_add(padding.saturating_mul(2));
        if size > limit {
            return Err(c.err(
                "size",
                ErrorKind::InvalidValue,
                format!(
                    "must be <= {limit} (the {h}x{w} image plus 2 x padding {padding}), got {size}"
                ),
            ));
        }
        out.random_crop = Some(RandomCrop { size, padding });
    }
    if let Some(f) = t.sub("horizontal_flip", Some(&["p"]))? {
        out.horizontal_flip = Some(HorizontalFlip {
            p: f.float("p", Bounds::UNIT)?.unwrap_or(0.5),
        });
    }
    Ok(out)
}

fn read_model(top: &Tbl<'_>, data: &DataConfig) -> Result<ModelConfig, ConfigError> {
    let m = required_table(top, "model", MODEL_KEYS, "`name`")?;
    let names: Vec<&str> = ModelName::CHOICES.iter().map(|(n, _)| *n).collect();
    let name = m
        .choice("name", "model", &ModelName::CHOICES)?
        .ok_or_else(|| m.missing("name", &quote_list(&names)))?;
    let hidden = if name == ModelName::Mlp {
        m.uint_list("hidden", 1)?.unwrap_or_else(|| vec![256, 128])
    } else {
        m.reject(
            "hidden",
            &format!(
                "`hidden` only applies to model \"mlp\", not {:?}",
                name.as_str()
            ),
        )?;
        Vec::new()
    };
    let width = match name {
        ModelName::Mlp => {
            m.reject(
                "width",
                "`width` applies to models \"cnn\", \"resnet20\" and \"resnet56\", not \"mlp\" (use `hidden`)",
            )?;
            None
        }
        ModelName::Cnn => Some(m.uint("width", 1)?.unwrap_or(32)),
        ModelName::Resnet20 | ModelName::Resnet56 => Some(m.uint("width", 1)?.unwrap_or(16)),
    };
    let classes = data.num_classes();
    let num_classes = match m.uint("num_classes", 1)? {
        Some(n) if n < classes => {
            return Err(m.err(
                "num_classes",
                ErrorKind::InvalidValue,
                format!(
                    "must be >= {classes} (the classes of {}), got {n}",
                    data.dataset
                ),
            ))
        }
        Some(n) => n,
        None => classes,
    };
    Ok(ModelConfig {
        name,
        hidden,
        width,
        num_classes,
    })
}

#[derive(Clone, Copy, PartialEq)]
enum OptName {
    Sgd,
    AdamW,
}

fn read_optimizer(top: &Tbl<'_>) -> Result<OptimizerConfig, ConfigError> {
    let Some(o) = top.sub("optimizer", Some(OPTIMIZER_KEYS))? else {
        return Ok(OptimizerConfig::default());
    };
    let name = o
        .choice(
            "name",
            "optimizer",
            &[("sgd", OptName::Sgd), ("adamw", OptName::AdamW)],
        )?
        .unwrap_or(OptName::Sgd);
    let (own, other, label, other_label) = match name {
        OptName::Sgd => (SGD_KEYS, ADAMW_KEYS, "sgd", "adamw"),
        OptName::AdamW => (ADAMW_KEYS, SGD_KEYS, "adamw", "sgd"),
    };
    for key in other {
        let mut valid: Vec<&str> = vec!["name", "lr", "weight_decay"];
        valid.extend_from_slice(own);
        o.reject(
            key,
            &format!(
                "`{key}` is a setting of optimizer {other_label:?}, not {label:?}; valid keys for {label:?}: {}",
                valid.join(", ")
            ),
        )?;
    }
    Ok(match name {
        OptName::Sgd => {
            let def = SgdConfig::default();
            let c = SgdConfig {
                lr: o.float("lr", Bounds::POSITIVE)?.unwrap_or(def.lr),
                momentum: o
                    .float("momentum", Bounds::UNIT_OPEN)?
                    .unwrap_or(def.momentum),
                nesterov: o.bool("nesterov")?.unwrap_or(def.nesterov),
                dampening: o.float("dampening", Bounds::UNIT)?.unwrap_or(def.dampening),
                weight_decay: o
                    .float("weight_decay", Bounds::NON_NEGATIVE)?
                    .unwrap_or(def.weight_decay),
                decoupled_weight_decay: o
                    .bool("decoupled_weight_decay")?
                    .unwrap_or(def.decoupled_weight_decay),
            };
            if c.nesterov && (c.momentum <= 0.0 || c.dampening != 0.0) {
                return Err(o.err(
                    "nesterov",
                    ErrorKind::InvalidValue,
                    format!(
                        "nesterov = true needs momentum > 0 and dampening = 0, got momentum {} and dampening {}",
                        c.momentum, c.dampening
                    ),
                ));
            }
            OptimizerConfig::Sgd(c)
        }
        OptName::AdamW => {
            let def = AdamWConfig::default();
            let betas = match o.float_list("betas", Bounds::UNIT_OPEN)? {
                None => def.betas,
                Some(b) => match b.as_slice() {
                    [b1, b2]
                        if o.entry("betas")
                            .is_some_and(|e| matches!(e.node.val, Val::Array(_))) =>
                    {
                        [*b1, *b2]
                    }
                    _ => {
                        return Err(o.err(
                            "betas",
                            ErrorKind::InvalidValue,
                            format!(
                                "must be a list of 2 numbers [beta1, beta2], got {} value(s)",
                                b.len()
                            ),
                        ))
                    }
                },
            };
            OptimizerConfig::AdamW(AdamWConfig {
                lr: o.float("lr", Bounds::POSITIVE)?.unwrap_or(def.lr),
                betas,
                eps: o.float("eps", Bounds::POSITIVE)?.unwrap_or(def.eps),
                weight_decay: o
                    .float("weight_decay", Bounds::NON_NEGATIVE)?
                    .unwrap_or(def.weight_decay),
            })
        }
    })
}

/// The first `` `word` `` quoted in a serde message after `marker`.
fn quoted_after<'m>(message: &'m str, marker: &str) -> Option<&'m str> {
    let rest = &message[message.find(marker)? + marker.len()..];
    let rest = rest.strip_prefix('`')?;
    rest.split('`').next()
}

/// Whether a serde message quotes a value of `node` (or of its items).
fn mentions(node: &Node, msg: &str) -> bool {
    let forms = match &node.val {
        Val::Str(v) | Val::Datetime(v) => vec![format!("{v:?}")],
        Val::Int(i) => vec![format!("`{i}`"), format!("number {i}")],
        Val::Float(f) => vec![format!("`{f}`"), format!("number {f}")],
        Val::Bool(b) => vec![format!("`{b}`")],
        Val::Array(items) => return items.iter().any(|n| mentions(n, msg)),
        Val::Table(t) => return t.entries.iter().any(|e| mentions(&e.node, msg)),
    };
    forms.iter().any(|f| msg.contains(f.as_str()))
}

fn read_scheduler(top: &Tbl<'_>) -> Result<Schedule, ConfigError> {
    use serde::Deserialize;
    let Some(entry) = top.entry("scheduler") else {
        let mut t = toml::map::Map::new();
        t.insert("name".into(), toml::Value::String("constant".into()));
        return Schedule::deserialize(toml::Value::Table(t)).map_err(|e| {
            ConfigError::new(
                top.file,
                Location::Unknown,
                "scheduler",
                ErrorKind::InvalidValue,
                format!("the default schedule is rejected: {}", e.message()),
            )
        });
    };
    let s = Tbl::open(top.file, "scheduler", &entry.node, None)?;
    let one_line = |m: &str| m.lines().map(str::trim).collect::<Vec<_>>().join(" ");
    let schedule = Schedule::deserialize(tree::to_toml(&entry.node)).map_err(|e| {
        let msg = one_line(e.message());
        if let Some(k) = quoted_after(&msg, "unknown field ") {
            s.err_key(
                k,
                ErrorKind::UnknownKey,
                format!("unknown key for this schedule: {msg}"),
            )
        } else if let Some(k) = quoted_after(&msg, "missing field ") {
            if k == "name" {
                s.missing(k, "the schedule's name")
            } else {
                let name = match s.entry("name").map(|e| &e.node.val) {
                    Some(Val::Str(n)) => format!("schedule {n:?}"),
                    _ => "this schedule".to_string(),
                };
                ConfigError::new(
                    top.file,
                    s.loc.clone(),
                    s.key(k),
                    ErrorKind::MissingKey,
                    format!("missing required key in `scheduler`; {name} needs it"),
                )
            }
        } else if let Some(v) = quoted_after(&msg, "unknown variant ") {
            let names: Vec<&str> = msg
                .split_once("expected")
                .map(|(_, rest)| rest.split('`').skip(1).step_by(2).collect())
                .unwrap_or_default();
            let hint = reader::suggest(v, &names)
                .map(|h| format!(" (did you mean {h:?}?)"))
                .unwrap_or_default();
            s.err(
                "name",
                ErrorKind::InvalidValue,
                format!(
                    "unknown schedule {v:?}{hint}; expected {}",
                    quote_list(&names)
                ),
            )
        } else {
            // Point at the first key the message quotes, else at the first
            // value it quotes, else at the table.
            let key = msg
                .split('`')
                .skip(1)
                .step_by(2)
                .find(|k| s.entry(k).is_some())
                .map(str::to_string)
                .or_else(|| {
                    s.table
                        .entries
                        .iter()
                        .find(|e| e.key != "name" && mentions(&e.node, &msg))
                        .map(|e| e.key.clone())
                });
            match key {
                Some(k) => s.err(&k, ErrorKind::InvalidValue, msg.clone()),
                None => ConfigError::new(
                    top.file,
                    s.loc.clone(),
                    "scheduler",
                    ErrorKind::InvalidValue,
                    msg.clone(),
                ),
            }
        }
    })?;
    schedule.validate().map_err(|msg| {
        let key = msg
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .find(|k| !k.is_empty() && k != &"name" && s.entry(k).is_some());
        match key {
            Some(k) => s.err(k, ErrorKind::InvalidValue, msg.clone()),
            None => ConfigError::new(
                top.file,
                s.loc.clone(),
                "scheduler",
                ErrorKind::InvalidValue,
                msg.clone(),
            ),
        }
    })?;
    Ok(schedule)
}

/// Units that count training progress.
const COUNT_UNITS: &[&str] = &["ep", "ba", "sp", "tok", "iter"];
/// Count units plus `dur`, a fraction of `max_duration`.
const INTERVAL_UNITS: &[&str] = &["ep", "ba", "sp", "tok", "iter", "dur"];

fn read_time(t: &Tbl<'_>, key: &str, units: &[&str]) -> Result<Option<Time>, ConfigError> {
    let Some(entry) = t.entry(key) else {
        return Ok(None);
    };
    let examples = "such as \"3ep\", \"500ba\" or \"0.5dur\"";
    let Val::Str(s) = &entry.node.val else {
        return Err(t.err(
            key,
            ErrorKind::WrongType,
            format!(
                "expected a duration string {examples}, got {}",
                entry.node.val.describe()
            ),
        ));
    };
    let time = s
        .parse::<Time>()
        .map_err(|e| t.err(key, ErrorKind::InvalidValue, e.to_string()))?;
    let unit = time.unit().suffix();
    if !units.contains(&unit) {
        return Err(t.err(
            key,
            ErrorKind::InvalidValue,
            format!(
                "unit {unit:?} is not allowed here; use {}",
                quote_list(units)
            ),
        ));
    }
    if time.value_f64() <= 0.0 {
        return Err(t.err(
            key,
            ErrorKind::InvalidValue,
            format!("must be greater than zero, got {s:?}"),
        ));
    }
    Ok(Some(time))
}

fn parse_default_time(s: &str) -> Result<Time, ConfigError> {
    s.parse::<Time>().map_err(|e| {
        ConfigError::new(
            "<built-in>",
            Location::Unknown,
            "",
            ErrorKind::InvalidValue,
            format!("built-in default duration {s:?} is rejected: {e}"),
        )
    })
}

fn read_train(top: &Tbl<'_>, data: &DataConfig) -> Result<TrainConfig, ConfigError> {
    let t = required_table(top, "train", TRAIN_KEYS, "`max_duration`")?;
    let max_duration = read_time(&t, "max_duration", COUNT_UNITS)?.ok_or_else(|| {
        t.missing(
            "max_duration",
            &format!("a duration such as \"3ep\", in {}", quote_list(COUNT_UNITS)),
        )
    })?;
    let microbatch_size = match t.uint("microbatch_size", 1)? {
        Some(m) if m > data.batch_size => {
            return Err(t.err(
                "microbatch_size",
                ErrorKind::InvalidValue,
                format!("must be <= data.batch_size ({}), got {m}", data.batch_size),
            ))
        }
        Some(m) => m,
        None => data.batch_size,
    };
    let precision = t
        .choice(
            "precision",
            "precision",
            &[("fp32", Precision::Fp32), ("amp_bf16", Precision::AmpBf16)],
        )?
        .unwrap_or(Precision::Fp32);
    let device = match t.entry("device") {
        None => Device::Auto,
        Some(e) => match &e.node.val {
            Val::Str(s) => s
                .parse::<Device>()
                .map_err(|m| t.err("device", ErrorKind::InvalidValue, m))?,
            other => {
                return Err(t.err(
                    "device",
                    ErrorKind::WrongType,
                    format!(
                        "expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", got {}",
                        other.describe()
                    ),
                ))
            }
        },
    };
    Ok(TrainConfig {
        max_duration,
        microbatch_size,
        precision,
        device,
        scale_schedule_ratio: t
            .float("scale_schedule_ratio", Bounds::POSITIVE)?
            .unwrap_or(1.0),
        eval_interval: match read_time(&t, "eval_interval", INTERVAL_UNITS)? {
            Some(v) => v,
            None => parse_default_time("1ep")?,
        },
        eval_subset_batches: t.uint("eval_subset_batches", 0)?.unwrap_or(0),
        threads: t.uint("threads", 0)?.unwrap_or(0),
        log_interval: match read_time(&t, "log_interval", INTERVAL_UNITS)? {
            Some(v) => v,
            None => parse_default_time("50ba")?,
        },
        progress: t.bool("progress")?.unwrap_or(true),
        nonfinite_loss: t
            .choice(
                "nonfinite_loss",
                "nonfinite_loss",
                &[("stop", NonFiniteLoss::Stop), ("skip", NonFiniteLoss::Skip)],
            )?
            .unwrap_or_default(),
    })
}

fn read_algorithms(top: &Tbl<'_>) -> Result<Vec<AlgorithmConfig>, ConfigError> {
    let Some(entry) = top.entry("algorithms") else {
        return Ok(Vec::new());
    };
    let Val::Array(items) = &entry.node.val else {
        return Err(top.err(
            "algorithms",
            ErrorKind::WrongType,
            format!(
                "expected [[algorithms]] tables, got {}",
                entry.node.val.describe()
            ),
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, node) in items.iter().enumerate() {
        let a = Tbl::open(top.file, &format!("algorithms.{i}"), node, None)?;
        let plugin = a
            .string("plugin")?
            .ok_or_else(|| a.missing("plugin", "the plugin's name, such as \"label_smoothing\""))?;
        if plugin.is_empty()
            || !plugin
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(a.err(
                "plugin",
                ErrorKind::InvalidValue,
                format!("{plugin:?} is not a plugin name; use letters, digits, _ and -"),
            ));
        }
        let sha256 = match a.string("sha256")? {
            Some(h) if h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()) => {
                Some(h.to_ascii_lowercase())
            }
            Some(h) => {
                return Err(a.err(
                    "sha256",
                    ErrorKind::InvalidValue,
                    format!(
                        "must be 64 hexadecimal digits, got {} character(s) {h:?}",
                        h.chars().count()
                    ),
                ))
            }
            None => None,
        };
        let on_error = a
            .choice(
                "on_error",
                "on_error policy",
                &[("stop", OnError::Stop), ("disable", OnError::Disable)],
            )?
            .unwrap_or_default();
        let mut settings = serde_json::Map::new();
        for e in &a.table.entries {
            if matches!(e.key.as_str(), "plugin" | "sha256" | "on_error") {
                continue;
            }
            let value = tree::to_json(&e.node).map_err(|(sub, loc, msg)| {
                ConfigError::new(
                    top.file,
                    loc,
                    tree::join(&a.key(&e.key), &sub),
                    ErrorKind::InvalidValue,
                    msg,
                )
            })?;
            settings.insert(e.key.clone(), value);
        }
        out.push(AlgorithmConfig {
            plugin,
            sha256,
            on_error,
            settings,
            line: node.loc.line().unwrap_or(0),
        });
    }
    Ok(out)
}
