//! What a run tells its user: a progress bar, log lines, a metrics JSONL file and the run record.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::tracking::mlflow::Tracker;

mod target;

pub use target::{Comparison, Metric, Target, TargetReached, METRIC_NAMES};

/// One evaluation's results.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EvalRecord {
    /// Epochs completed when it ran.
    pub epoch: u64,
    /// Batches completed when it ran.
    pub batch: u64,
    /// Top-1 accuracy (of the next token, for a language model).
    pub accuracy: f64,
    /// Mean cross-entropy (per token, for a language model).
    pub cross_entropy: f64,
    /// Samples evaluated (sequences, for a language model).
    pub samples: u64,
    /// Tokens evaluated (language models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// `exp(cross_entropy)` (language models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
    /// The run's other metrics (`train.metrics`, the target's): top-k accuracies for k >= 2
    /// and macro-F1, by name (`top5`, `f1`), written as fields of the record itself.
    #[serde(flatten)]
    pub extra: ExtraMetrics,
}

/// Metrics of an evaluation beyond the fixed ones, by name (`top5`, `f1`). Read back from any
/// fields of a record that are not its own, keeping the numbers only, so a record with fields
/// of a later version still reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct ExtraMetrics(pub std::collections::BTreeMap<String, f64>);

impl ExtraMetrics {
    /// The value of metric `name`, when it was computed.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    /// Every metric with its value, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }
}

impl<'de> Deserialize<'de> for ExtraMetrics {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ExtraMetrics, D::Error> {
        let fields = std::collections::BTreeMap::<String, Value>::deserialize(d)?;
        Ok(ExtraMetrics(
            fields
                .into_iter()
                .filter_map(|(k, v)| Some((k, v.as_f64()?)))
                .collect(),
        ))
    }
}

/// When an evaluation ran, in the run's own time: what time-to-quality curves are drawn from.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct EvalTime {
    /// Batches completed when it ran (as in the [`EvalRecord`] it belongs to).
    pub batch: u64,
    /// Seconds of training until then (without evaluations), summed over resumes.
    pub train_seconds: f64,
    /// Wall-clock seconds of the run at the end of that evaluation, summed over resumes.
    pub wall_seconds: f64,
}

/// A loaded plugin, as recorded in the run record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PluginRecord {
    /// Method name.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// File it came from.
    pub path: PathBuf,
    /// sha256 of the file.
    pub sha256: String,
    /// The settings it was given.
    pub settings: Value,
}

/// The summary written to `run.json` when a run ends, and read back through
/// [`RunRecord::read`] by everything that looks at finished runs (sweeps, the recipe search,
/// the explorer). Fields a record of an earlier version lacks read as their defaults; a record
/// without `run_name` or `wall_seconds` is no run record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// Run name.
    pub run_name: String,
    /// The recipe's label: `recipe`, else the methods' names joined by `+`, else `baseline`.
    #[serde(default)]
    pub recipe: String,
    /// `tessera` version.
    #[serde(default)]
    pub tessera_version: String,
    /// libtorch version.
    #[serde(default)]
    pub libtorch_version: String,
    /// Device trained on.
    #[serde(default)]
    pub device: String,
    /// The resolved configuration.
    #[serde(default)]
    pub config: Value,
    /// Plugins used.
    #[serde(default)]
    pub plugins: Vec<PluginRecord>,
    /// Every evaluation, in order.
    #[serde(default)]
    pub evals: Vec<EvalRecord>,
    /// When each evaluation of `evals` ran (same order; empty for runs resumed from a
    /// checkpoint of an earlier version).
    #[serde(default)]
    pub eval_times: Vec<EvalTime>,
    /// Epochs completed.
    #[serde(default)]
    pub epochs: u64,
    /// Batches completed.
    #[serde(default)]
    pub batches: u64,
    /// Samples trained on.
    #[serde(default)]
    pub samples: u64,
    /// Tokens trained on (language models; as the loader gave them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Wall-clock seconds of the whole run, from start to the record; a resumed run adds the
    /// wall time its checkpoint had recorded (the work lost after that checkpoint is counted
    /// once, when it is redone).
    pub wall_seconds: f64,
    /// Seconds spent training (excluding evaluation).
    #[serde(default)]
    pub train_seconds: f64,
    /// Training throughput.
    #[serde(default)]
    pub samples_per_second: f64,
    /// Training throughput in tokens (language models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    /// Machines (nodes) the run used, each rented for `wall_seconds`: ranks / ranks per node
    /// (`LOCAL_WORLD_SIZE`) for a data-parallel run, else 1.
    #[serde(default = "one_node")]
    pub nodes: usize,
    /// Cost estimate: `wall_seconds` x `nodes` at `usd_per_hour` (per node), when given.
    #[serde(default)]
    pub estimated_cost_usd: Option<f64>,
    /// Accuracy of the last evaluation.
    #[serde(default)]
    pub final_accuracy: Option<f64>,
    /// Perplexity of the last evaluation (language models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_perplexity: Option<f64>,
    /// When an evaluation first met `train.target`; `null` when it never did (or no target
    /// was set).
    #[serde(default)]
    pub target_reached: Option<TargetReached>,
    /// `completed`, `interrupted by SIGINT`/`SIGTERM` (a checkpoint was written), or
    /// `stopped early: <reason>` when a method asked the run to stop (`request_stop`).
    #[serde(default)]
    pub status: String,
    /// The checkpoint this run continued from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<PathBuf>,
    /// What `[model] init_weights` loaded: the file, its sha256, and the tensors loaded,
    /// ignored, left fresh (a classifier head of another class count) or, without
    /// `init_strict`, missing, unexpected or mis-shaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_weights: Option<crate::model::InitReport>,
    /// The checkpoint whose weights started this run (`checkpoint.load` with `weights_only`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_from: Option<PathBuf>,
    /// The newest checkpoint written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<PathBuf>,
    /// Training steps skipped because the loss was NaN or infinite (`nonfinite_loss = "skip"`).
    #[serde(default)]
    pub skipped_steps: u64,
    /// Samples the model trained on; fewer than `samples` (which counts every sample loaded,
    /// as Composer's clock does) when a method such as selective backprop drops some.
    #[serde(default)]
    pub trained_samples: u64,
    /// How a data-parallel run was split and what its gradient all-reduce cost (absent for a
    /// single process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<DataParallelRecord>,
    /// The most memory the run's tensors held at once after set-up, in bytes (see
    /// `crate::memory::peak`): on CUDA always, on the CPU when `TESSERA_MEMORY_PEAK=1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
    /// The memory the run's tensors held right after its last optimizer step, in bytes:
    /// parameters, gradients and optimizer state (counted as `memory_peak_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_after_step_bytes: Option<u64>,
    /// The trainer's device→host reads: inside steps (0 in the default configuration) and in
    /// all (absent in records of Tessera before 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_reads: Option<crate::sync::HostReads>,
    /// Samples per forward/backward pass at the end of the run (what
    /// `train.microbatch_size = "auto"` found); absent in records before Tessera 0.2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microbatch_size: Option<usize>,
    /// The samples the evaluations scored when `train.eval_subset_batches` is set: their
    /// indices into the evaluation set, its size, the seed and whether the draw was stratified
    /// by class; absent when every evaluation scored the whole set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_subset: Option<crate::data::SubsetChoice>,
    /// A text dataset's facts: the vocabulary the model was built for, the classes of labelled
    /// text (with their names when the labels are strings) and the special token ids; absent
    /// for images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_data: Option<crate::data::TextFacts>,
}

/// A data-parallel run in its record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DataParallelRecord {
    /// Ranks (processes).
    pub world_size: usize,
    /// Samples per batch on each rank (`data.batch_size`).
    pub per_rank_batch_size: usize,
    /// Samples per optimizer step over all ranks: per-rank batch x world size.
    pub global_batch_size: usize,
    /// The collective backend.
    pub backend: String,
    /// Rank 0's step timings as PyTorch DDP's logger measures them (averages over the sampled
    /// steps, seconds): forward, backward computation, gradient communication (first bucket's
    /// all-reduce to the last one's end), and how much of that ran during the backward pass.
    pub timing: Option<AllReduceTiming>,
    /// `[distributed] sharding` (`none` in records of earlier versions).
    #[serde(default = "no_sharding")]
    pub sharding: String,
    /// Under sharding: the elements of the sharded parameters, and how many of them rank 0
    /// steps and keeps the optimizer state of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharded_elements: Option<i64>,
    /// See [`DataParallelRecord::sharded_elements`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharded_elements_rank0: Option<i64>,
    /// `sharding = "full"` on rank 0: units gathered ahead of their use (`[distributed]
    /// prefetch`), and how many of those a pass then used (the rest were freed unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetched_units: Option<u64>,
    /// See [`DataParallelRecord::prefetched_units`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetched_units_used: Option<u64>,
}

fn no_sharding() -> String {
    "none".to_owned()
}

/// See [`DataParallelRecord::timing`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct AllReduceTiming {
    /// Forward pass.
    pub forward_seconds: f64,
    /// Backward computation.
    pub backward_compute_seconds: f64,
    /// Gradient all-reduce, from its first bucket to its last.
    pub backward_comm_seconds: f64,
    /// Communication that overlapped the backward computation.
    pub overlap_seconds: f64,
}

/// A record written before `nodes` existed ran on one machine.
fn one_node() -> usize {
    1
}

/// Why a run record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file could not be read.
    #[error("reading {}", path.display())]
    Io {
        /// The `run.json`.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a run record.
    #[error("{}: not a run record", path.display())]
    Parse {
        /// The `run.json`.
        path: PathBuf,
        /// The parser's message.
        #[source]
        source: serde_json::Error,
    },
}

impl RunRecord {
    /// Reads the run record at `path` (a `run.json`).
    pub fn read(path: &Path) -> Result<RunRecord, RecordError> {
        let text = std::fs::read_to_string(path).map_err(|source| RecordError::Io {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| RecordError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// Whether the run is over for good: completed, or stopped early by a method or its
    /// target (an interrupted run continues from its checkpoint).
    pub fn is_finished(&self) -> bool {
        self.status == "completed" || self.status.starts_with("stopped early")
    }

    /// The final quality in words: perplexity for a language model, else accuracy.
    pub fn quality_text(&self) -> String {
        match (self.final_perplexity, self.final_accuracy) {
            (Some(ppl), _) => format!("perplexity {ppl:.3}"),
            (None, Some(acc)) => format!("accuracy {acc:.4}"),
            _ => "no evaluation".to_owned(),
        }
    }
}

/// Progress bar, log lines and the metrics file of one run; each metrics line also goes to the
/// run's tracker, when it has one.
pub struct Reporter {
    metrics: BufWriter<Box<dyn Write + Send>>,
    /// Declared after `metrics`, so a failed run's file is flushed before the tracker (dropped
    /// unended) uploads it.
    tracker: Option<Tracker>,
    bar: Option<ProgressBar>,
    metrics_path: PathBuf,
    last_loss: Option<f64>,
    last_accuracy: Option<f64>,
    written: u64,
}

impl Reporter {
    /// Opens `metrics.jsonl` in `run_dir`; shows a progress bar when `progress` is set and
    /// stderr is a terminal.
    pub fn new(run_dir: &Path, progress: bool) -> std::io::Result<Reporter> {
        Reporter::resume(run_dir, progress, None)
    }

    /// [`Reporter::new`] for a run resumed from a checkpoint written when `metrics.jsonl` was
    /// `resume_at` bytes long: the file is cut there and continued, so it ends up as if the
    /// run had never stopped. A missing or shorter file starts afresh (with a warning).
    pub fn resume(
        run_dir: &Path,
        progress: bool,
        resume_at: Option<u64>,
    ) -> std::io::Result<Reporter> {
        std::fs::create_dir_all(run_dir)?;
        let metrics_path = run_dir.join("metrics.jsonl");
        let existing = std::fs::metadata(&metrics_path).map(|m| m.len()).ok();
        let (file, written) = match (resume_at, existing) {
            (Some(at), Some(len)) if len >= at => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&metrics_path)?;
                file.set_len(at)?;
                let mut file = file;
                std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0))?;
                (file, at)
            }
            (Some(at), _) => {
                tracing::warn!(
                    "{} is missing or shorter than when the checkpoint was written ({at} bytes); starting it afresh",
                    metrics_path.display()
                );
                (File::create(&metrics_path)?, 0)
            }
            (None, _) => (File::create(&metrics_path)?, 0),
        };
        let metrics = BufWriter::new(Box::new(file) as Box<dyn Write + Send>);
        let bar = (progress && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template("{prefix} {bar:30.cyan/blue} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        Ok(Reporter {
            metrics,
            tracker: None,
            bar,
            metrics_path,
            last_loss: None,
            last_accuracy: None,
            written,
        })
    }

    /// A reporter that writes no file and shows no bar (for `tessera eval` and `tessera
    /// predict`, which must leave the run folder as it is): method metrics are dropped,
    /// evaluations only logged.
    pub fn discard() -> Reporter {
        Reporter {
            metrics: BufWriter::new(Box::new(std::io::sink())),
            tracker: None,
            bar: None,
            metrics_path: PathBuf::new(),
            last_loss: None,
            last_accuracy: None,
            written: 0,
        }
    }

    /// Flushes the metrics file and returns its length (recorded in checkpoints).
    pub fn flush(&mut self) -> std::io::Result<u64> {
        self.metrics.flush()?;
        Ok(self.written)
    }

    /// Sends every metrics line from now on to `tracker` as well.
    pub fn track(&mut self, tracker: Tracker) {
        self.tracker = Some(tracker);
    }

    /// The tracker, to end the run's tracking.
    pub fn take_tracker(&mut self) -> Option<Tracker> {
        self.tracker.take()
    }

    /// Where the metrics go.
    pub fn metrics_path(&self) -> &Path {
        &self.metrics_path
    }

    /// Starts the bar of an epoch.
    pub fn start_epoch(&mut self, epoch: u64, max_epochs: Option<u64>, batches: u64, start: u64) {
        if let Some(bar) = &self.bar {
            bar.reset();
            bar.set_length(batches);
            bar.set_position(start);
            bar.set_prefix(match max_epochs {
                Some(n) => format!("epoch {}/{n}", epoch + 1),
                None => format!("epoch {}", epoch + 1),
            });
        }
    }

    /// Advances the bar by one batch; shows throughput (`unit`/s: `img`, `tok`), the last
    /// logged loss and accuracy.
    pub fn batch_done(&mut self, per_second: f64, unit: &str) {
        if let Some(bar) = &self.bar {
            let mut msg = format!("{per_second:.0} {unit}/s");
            if let Some(loss) = self.last_loss {
                msg.push_str(&format!(" loss {loss:.4}"));
            }
            if let Some(acc) = self.last_accuracy {
                msg.push_str(&format!(" | eval acc {acc:.4}"));
            }
            bar.set_message(msg);
            bar.inc(1);
        }
    }

    /// Records a training metrics line (and shows the loss on the bar).
    pub fn train_line(&mut self, line: Value) {
        self.last_loss = line.get("loss").and_then(Value::as_f64);
        if self.bar.is_none() {
            tracing::info!("{line}");
        }
        self.write(json!({"kind": "train", "data": line}));
    }

    /// Records an evaluation and when it ran.
    pub fn eval(&mut self, record: &EvalRecord, time: &EvalTime) {
        let mut text = format!(
            "eval at epoch {} batch {}: accuracy {:.4}, cross-entropy {:.4}",
            record.epoch, record.batch, record.accuracy, record.cross_entropy
        );
        if let Some(ppl) = record.perplexity {
            text.push_str(&format!(", perplexity {ppl:.3}"));
        }
        for (name, value) in record.extra.iter() {
            text.push_str(&format!(", {name} {value:.4}"));
        }
        self.last_accuracy = Some(record.accuracy);
        match &self.bar {
            Some(bar) => bar.println(text),
            None => tracing::info!("{text}"),
        }
        self.write(json!({
            "kind": "eval",
            "data": record,
            "train_seconds": time.train_seconds,
            "wall_seconds": time.wall_seconds,
        }));
    }

    /// Records metrics logged by methods.
    pub fn method_metrics(&mut self, batch: u64, metrics: &[(String, f64)]) {
        for (name, value) in metrics {
            self.write(json!({"kind": "method", "batch": batch, "name": name, "value": value}));
        }
    }

    fn write(&mut self, value: Value) {
        if let Some(tracker) = &self.tracker {
            tracker.log_line(&value);
        }
        let mut line = match serde_json::to_vec(&value) {
            Ok(line) => line,
            Err(e) => {
                tracing::warn!("cannot encode a metrics line: {e}");
                return;
            }
        };
        line.push(b'\n');
        let result = self.metrics.write_all(&line);
        if result.is_ok() {
            self.written += line.len() as u64;
        }
        if let Err(e) = result {
            tracing::warn!("cannot write {}: {e}", self.metrics_path.display());
        }
    }

    /// Flushes the metrics file and clears the bar.
    pub fn finish(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Err(e) = self.metrics.flush() {
            tracing::warn!("cannot write {}: {e}", self.metrics_path.display());
        }
    }
}
