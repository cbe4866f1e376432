//! `[checkpoint]` and `[plugins]`.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::data::DataConfig;
use super::error::{ConfigError, ErrorKind};
use super::reader::{Tbl, INTERVAL_UNITS};
use super::section::section;
use crate::plugin::PluginsConfig;
use crate::report::{Metric, METRIC_NAMES};
use crate::time::{Time, TimeUnit};

/// `[checkpoint]`
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointConfig {
    /// Write checkpoints (default true).
    pub save: bool,
    /// How often, in a count unit or `dur` (default `1ep`); also at the end of training.
    pub interval: Time,
    /// Keep only the newest N checkpoints; 0 keeps all (default 0). `keep_last` in
    /// `trainer.toml` (`keep`, its older name, is read too).
    pub keep: usize,
    /// Keep also the `k` checkpoints with the best evaluation of `metric` (and point
    /// `best.ckpt` at the best); `None` (default): no checkpoint is kept for its evaluation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_best: Option<KeepBest>,
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
    /// With `load`: take only the model's weights (and the states of methods this run also
    /// has, such as EMA's average) and start a new run: a fresh clock, optimizer, schedule and
    /// data order (default false). With `autoresume`, a checkpoint of this run's own folder
    /// still wins, so a restarted fine-tuning run goes on where it stopped.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub weights_only: bool,
    /// Under `[distributed] sharding`: each rank writes its own slices of the sharded tensors
    /// (a checkpoint is then a folder) instead of gathering them into rank 0's file (default
    /// true). Either reads back whole and resumes on any number of ranks.
    #[serde(skip_serializing_if = "is_true")]
    pub sharded: bool,
}

/// `[checkpoint] keep_best = { metric = "accuracy", k = 2 }`: the checkpoints kept for their
/// evaluation. A checkpoint's evaluation is the one at its own batch; one taken where no
/// evaluation ran is kept only by `keep_last`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KeepBest {
    /// The evaluation metric that ranks them (larger accuracies and F1, smaller losses).
    pub metric: Metric,
    /// How many (at least 1).
    pub k: usize,
}

fn is_true(b: &bool) -> bool {
    *b
}

section!(CheckpointConfig {
    save: bool(),
    interval: time(INTERVAL_UNITS),
    keep: uint(0),
    keep_last,
    keep_best,
    folder: path(),
    autoresume: bool(),
    overwrite: bool(),
    load: path(),
    weights_only: bool(),
    sharded: bool(),
});

impl CheckpointConfig {
    /// Every setting at its default, for the run folder `run_dir`.
    fn new(run_dir: &Path) -> CheckpointConfig {
        CheckpointConfig {
            save: true,
            interval: Time::new(1, TimeUnit::Epoch),
            keep: 0,
            keep_best: None,
            folder: run_dir.join("checkpoints"),
            autoresume: false,
            overwrite: false,
            load: None,
            weights_only: false,
            sharded: true,
        }
    }
}

pub(super) fn read(
    top: &Tbl<'_>,
    run_dir: &Path,
    data: &DataConfig,
) -> Result<CheckpointConfig, ConfigError> {
    let mut config = top
        .section("checkpoint", || CheckpointConfig::new(run_dir))?
        .unwrap_or_else(|| CheckpointConfig::new(run_dir));
    let table = top.sub("checkpoint", None)?;
    if let Some(t) = &table {
        if let Some(keep) = t.uint("keep_last", 0)? {
            if t.entry("keep").is_some() {
                return Err(t.err_key(
                    "keep_last",
                    ErrorKind::InvalidValue,
                    "give `keep_last` or `keep` (its older name), not both",
                ));
            }
            config.keep = keep;
        }
        config.keep_best = keep_best(t, data)?;
    }
    if config.weights_only && config.load.is_none() {
        if let Some(t) = &table {
            return Err(t.err_key(
                "weights_only",
                ErrorKind::InvalidValue,
                "`weights_only` applies to `load` (the checkpoint whose weights start the run), \
                 which is not given"
                    .to_owned(),
            ));
        }
    }
    Ok(config)
}

/// `keep_best = { metric = "...", k = N }`, its metric one the run's evaluation reports.
fn keep_best(t: &Tbl<'_>, data: &DataConfig) -> Result<Option<KeepBest>, ConfigError> {
    let Some(b) = t.sub("keep_best", Some(&["metric", "k"]))? else {
        return Ok(None);
    };
    let Some(name) = b.string("metric")? else {
        return Err(b.missing(
            "metric",
            &format!("the metric that ranks them ({METRIC_NAMES})"),
        ));
    };
    let metric: Metric = name
        .parse()
        .map_err(|m: String| b.err("metric", ErrorKind::InvalidValue, m))?;
    super::train::check_metric(&b, "metric", metric, data)?;
    let k = b.uint("k", 1)?.unwrap_or(1);
    Ok(Some(KeepBest { metric, k }))
}

section!(PluginsConfig { dirs: path_list() });
