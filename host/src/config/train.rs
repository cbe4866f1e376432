//! `[train]`: how long and how to train.

use serde::Serialize;

use super::data::DataConfig;
use super::error::{ConfigError, ErrorKind};
use super::reader::{quote_list, Bounds, Tbl, COUNT_UNITS, INTERVAL_UNITS};
use super::required_table;
use super::section::{section, Section};
use crate::data::{Dataset, IGNORE_TARGET};
use crate::device::{Device, MatmulPrecision};
use crate::model::{
    ActivationCheckpointing, Loss, LossKind, NonFiniteLoss, Unit, DEFAULT_IGNORE_INDEX,
};
use crate::precision::Precision;
use crate::report::{Metric, Target};
use crate::time::{Time, TimeUnit};

/// `[train]`
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainConfig {
    /// How long to train, in a count unit (ep, ba, sp, tok, iter).
    pub max_duration: Time,
    /// Samples per forward/backward pass (default: `data.batch_size`); <= batch size, or
    /// `"auto"`: start at the batch size and halve on out-of-memory errors.
    pub microbatch_size: MicrobatchSize,
    /// Numeric precision (default fp32).
    pub precision: Precision,
    /// Device (default auto).
    pub device: Device,
    /// Multiplies `max_duration` and the schedule's times, > 0 (default 1).
    pub scale_schedule_ratio: f64,
    /// How often to evaluate, in a count unit or `dur` (default `1ep`); also at the end.
    pub eval_interval: Time,
    /// Evaluate on a fixed sample of this many batches (`eval_subset_batches` ×
    /// `data.eval_batch_size` samples of the whole evaluation set, stratified by class where the
    /// labels are known, the same at every evaluation and on any number of ranks); 0 = all
    /// (default 0).
    pub eval_subset_batches: usize,
    /// Seed of the evaluation subset's draw (default 0): independent of the run's `seed`, so
    /// the runs of a sweep over seeds score the same samples.
    pub eval_subset_seed: u64,
    /// libtorch intra-op threads; 0 = all cores (default 0).
    pub threads: usize,
    /// How often a metrics line is written, in a count unit or `dur` (default `50ba`).
    pub log_interval: Time,
    /// Progress bar when stderr is a terminal (default true).
    pub progress: bool,
    /// What to do when the loss is NaN or infinite (default stop).
    pub nonfinite_loss: NonFiniteLoss,
    /// The training loss (default `cross_entropy`; `binary_cross_entropy` for classifiers).
    pub loss: LossKind,
    /// The index target the cross-entropy ignores (PyTorch's `ignore_index`); `None`
    /// (default): -100, as PyTorch. Evaluation leaves such targets out of every metric.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignore_index: Option<i64>,
    /// The evaluation metrics beyond accuracy and cross-entropy (`top5`, `f1`); `None`
    /// (default): top-5 for an image model of at least 100 classes. The target's metric is
    /// always computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Vec<Metric>>,
    /// Epochs per iteration (Composer's `iteration_length`); `None` (default): the run is one
    /// iteration, so `iteration_end`/`iteration_checkpoint` never fire.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iteration_length: Option<Time>,
    /// The evaluation result that counts as done, such as `accuracy >= 0.9`; when first met,
    /// the run records when (`target_reached` in run.json). `None` (default): no target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// Whether the run stops once `target` is met (default true); false trains on to
    /// `max_duration`, still recording the first time.
    pub stop_at_target: bool,
    /// Deterministic algorithms (`torch.use_deterministic_algorithms(True)`, deterministic
    /// cuDNN, `CUBLAS_WORKSPACE_CONFIG=:4096:8`); false (default): cuDNN benchmarks its
    /// algorithms on CUDA and keeps the fastest.
    pub deterministic: bool,
    /// Float32 matmul precision, as `torch.set_float32_matmul_precision` (default `high`:
    /// TF32 on GPUs that have it).
    pub matmul_precision: MatmulPrecision,
    /// Capture the training step in a CUDA graph and replay it per batch (default false; CUDA
    /// only; see docs/gpu.md for what it refuses).
    pub cuda_graphs: bool,
    /// Units of the model whose activations are recomputed in backward instead of kept
    /// (`{ unit = "block", every = 1 }`); `None` (default): every activation is kept. See
    /// docs/memory.md.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activation_checkpointing: Option<ActivationCheckpointing>,
}

section!(TrainConfig {
    max_duration,
    microbatch_size: microbatch_size(),
    precision: choice("precision", &Precision::CHOICES),
    device: parse::<Device>("\"auto\", \"cpu\", \"cuda\" or \"cuda:N\""),
    scale_schedule_ratio: float(Bounds::POSITIVE),
    eval_interval: time(INTERVAL_UNITS),
    eval_subset_batches: uint(0),
    eval_subset_seed: u64(),
    threads: uint(0),
    log_interval: time(INTERVAL_UNITS),
    progress: bool(),
    nonfinite_loss: choice("nonfinite_loss", &NonFiniteLoss::CHOICES),
    loss: choice("loss", &LossKind::CHOICES),
    ignore_index: int(),
    metrics: metric_list(),
    iteration_length: time(&["ep"]),
    target: parse::<Target>("a string such as \"accuracy >= 0.9\""),
    stop_at_target: bool(),
    deterministic: bool(),
    matmul_precision: choice("matmul_precision", &MatmulPrecision::CHOICES),
    cuda_graphs: bool(),
    activation_checkpointing,
});

section!(ActivationCheckpointing {
    unit: choice("unit", &Unit::CHOICES),
    every: uint(1),
});

pub(super) fn read(top: &Tbl<'_>, data: &DataConfig) -> Result<TrainConfig, ConfigError> {
    let t = required_table(top, "train", TrainConfig::KEYS, "`max_duration`")?;
    let max_duration = t.time("max_duration", COUNT_UNITS)?.ok_or_else(|| {
        t.missing(
            "max_duration",
            &format!("a duration such as \"3ep\", in {}", quote_list(COUNT_UNITS)),
        )
    })?;
    let train = TrainConfig {
        max_duration,
        microbatch_size: MicrobatchSize::Fixed(data.batch_size),
        precision: Precision::default(),
        device: Device::default(),
        scale_schedule_ratio: 1.0,
        eval_interval: Time::new(1, TimeUnit::Epoch),
        eval_subset_batches: 0,
        eval_subset_seed: 0,
        threads: 0,
        log_interval: Time::new(50, TimeUnit::Batch),
        progress: true,
        nonfinite_loss: NonFiniteLoss::default(),
        loss: LossKind::default(),
        ignore_index: None,
        metrics: None,
        iteration_length: None,
        target: None,
        stop_at_target: true,
        deterministic: false,
        matmul_precision: MatmulPrecision::default(),
        cuda_graphs: false,
        activation_checkpointing: None,
    }
    .read_keys(&t)?;
    let train = TrainConfig {
        activation_checkpointing: t
            .section("activation_checkpointing", ActivationCheckpointing::default)?,
        ..train
    };
    check_metrics(&t, &train, data)?;
    if train.max_duration.unit() == TimeUnit::Iteration && train.iteration_length.is_none() {
        return Err(t.err(
            "max_duration",
            ErrorKind::InvalidValue,
            format!(
                "{:?} counts iterations, but a run is one endless iteration unless \
                 train.iteration_length is set (e.g. iteration_length = \"2ep\")",
                train.max_duration.to_string()
            ),
        ));
    }
    if let MicrobatchSize::Fixed(size) = train.microbatch_size {
        if size > data.batch_size {
            return Err(t.err(
                "microbatch_size",
                ErrorKind::InvalidValue,
                format!(
                    "must be <= data.batch_size ({}), got {size}",
                    data.batch_size
                ),
            ));
        }
    }
    Ok(train)
}

/// The loss, `ignore_index`, `metrics` and `target` against the data: what a language model
/// cannot train on or report.
fn check_metrics(t: &Tbl<'_>, train: &TrainConfig, data: &DataConfig) -> Result<(), ConfigError> {
    // Labelled text is classification: its metrics are an image classifier's.
    let text = data.is_text() && !data.dataset.is_labelled_text();
    let dataset = data.dataset.as_str();
    if let Some(index) = train
        .ignore_index
        .filter(|&i| (data.mlm.is_some() || data.dataset == Dataset::Chat) && i != IGNORE_TARGET)
    {
        let marker = if data.mlm.is_some() {
            "[data.mlm]"
        } else {
            "dataset = \"chat\""
        };
        return Err(t.err(
            "ignore_index",
            ErrorKind::InvalidValue,
            format!(
                "is {index}, but {marker} marks the positions it does not score with \
                 {IGNORE_TARGET} (the default): leave ignore_index out"
            ),
        ));
    }
    if train.loss == LossKind::BinaryCrossEntropy {
        if text {
            return Err(t.err(
                "loss",
                ErrorKind::InvalidValue,
                format!(
                    "binary_cross_entropy is for image classifiers, and data.dataset \
                     {dataset:?} is text for a language model; use \"cross_entropy\""
                ),
            ));
        }
        if train.ignore_index.is_some() {
            return Err(t.err_key(
                "ignore_index",
                ErrorKind::InvalidValue,
                "applies to loss = \"cross_entropy\" only; binary_cross_entropy turns every \
                 index target into a one-hot vector (as Composer does) and ignores none",
            ));
        }
    }
    let target = train.target.map(|target| ("target", target.metric));
    let listed = train.metrics.iter().flatten().map(|m| ("metrics", *m));
    for (key, metric) in listed.chain(target) {
        check_metric(t, key, metric, data)?;
    }
    Ok(())
}

/// Whether the evaluation of a run on `data` reports `metric` (at `key` of table `t`): no
/// perplexity but for language models, no F1 for them.
pub(super) fn check_metric(
    t: &Tbl<'_>,
    key: &str,
    metric: Metric,
    data: &DataConfig,
) -> Result<(), ConfigError> {
    // Labelled text is classification: its metrics are an image classifier's.
    let text = data.is_text() && !data.dataset.is_labelled_text();
    let dataset = data.dataset.as_str();
    if metric == Metric::Perplexity && !text {
        return Err(t.err(
            key,
            ErrorKind::InvalidValue,
            format!(
                "perplexity exists only for language models, and data.dataset {dataset:?} \
                 is {}; use accuracy, a top-k accuracy (top5), f1 or cross_entropy",
                if data.is_text() {
                    "labelled text for a classifier"
                } else {
                    "image data"
                }
            ),
        ));
    }
    if metric == Metric::F1 && text {
        return Err(t.err(
            key,
            ErrorKind::InvalidValue,
            format!(
                "f1 is for classification, and data.dataset {dataset:?} is text for a \
                 language model; use accuracy, a top-k accuracy (top5), cross_entropy or \
                 perplexity"
            ),
        ));
    }
    Ok(())
}

impl TrainConfig {
    /// The training loss of the run (`loss`, `ignore_index`).
    pub fn loss_fn(&self) -> Loss {
        Loss {
            kind: self.loss,
            ignore_index: self.ignore_index.unwrap_or(DEFAULT_IGNORE_INDEX),
        }
    }
}

/// `train.microbatch_size`: samples per forward/backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicrobatchSize {
    /// This many samples (the last microbatch of a batch may have fewer).
    Fixed(usize),
    /// Composer's `device_train_microbatch_size = "auto"`: start with the whole batch and, when
    /// a pass runs out of device memory, halve the microbatch and train the batch again. The size
    /// found is logged, and kept in checkpoints and run.json.
    Auto,
}

impl MicrobatchSize {
    /// The size a run starts with, for batches of `batch_size`.
    pub fn initial(self, batch_size: usize) -> usize {
        match self {
            MicrobatchSize::Fixed(n) => n,
            MicrobatchSize::Auto => batch_size,
        }
    }
}

impl PartialEq<usize> for MicrobatchSize {
    fn eq(&self, other: &usize) -> bool {
        *self == MicrobatchSize::Fixed(*other)
    }
}

impl Serialize for MicrobatchSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MicrobatchSize::Fixed(n) => s.serialize_u64(*n as u64),
            MicrobatchSize::Auto => s.serialize_str("auto"),
        }
    }
}

impl Tbl<'_> {
    /// `metrics`: an array of metric names (`"top5"`, `"f1"`), each at most once.
    fn metric_list(&self, key: &str) -> Result<Option<Vec<Metric>>, ConfigError> {
        let Some(names) = self.string_list(key)? else {
            return Ok(None);
        };
        let mut metrics = Vec::with_capacity(names.len());
        for name in names {
            let metric: Metric = name
                .parse()
                .map_err(|m: String| self.err(key, ErrorKind::InvalidValue, m))?;
            if metrics.contains(&metric) {
                return Err(self.err(
                    key,
                    ErrorKind::InvalidValue,
                    format!("{metric} is listed twice"),
                ));
            }
            metrics.push(metric);
        }
        Ok(Some(metrics))
    }

    /// `microbatch_size`: an integer >= 1 or `"auto"`.
    fn microbatch_size(&self, key: &str) -> Result<Option<MicrobatchSize>, ConfigError> {
        let Some(e) = self.entry(key) else {
            return Ok(None);
        };
        match &e.node.val {
            super::tree::Val::Str(s) if s == "auto" => Ok(Some(MicrobatchSize::Auto)),
            super::tree::Val::Str(s) => Err(self.err(
                key,
                ErrorKind::InvalidValue,
                format!("expected an integer >= 1 or \"auto\", got {s:?}"),
            )),
            super::tree::Val::Int(_) => self
                .uint_of(key, &e.node, 1)
                .map(|n| Some(MicrobatchSize::Fixed(n))),
            _ => Err(self.wrong_type(key, &e.node, "an integer >= 1 or \"auto\"")),
        }
    }
}
