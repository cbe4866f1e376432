//! Reading runs: `run.json` records found under folders, or records already parsed elsewhere
//! (an MLflow server, say) handed over as JSON values.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::report::{EvalRecord, EvalTime, RecordError, RunRecord};

/// One finished run, as the explorer needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Where it came from (a `run.json` path, or whatever the caller names it by).
    pub source: String,
    /// `run_name`.
    pub run_name: String,
    /// The recipe's label (`recipe`; for records without it, the methods' names joined by `+`,
    /// or `baseline`).
    pub recipe: String,
    /// The resolved configuration (`config`).
    pub config: Value,
    /// Every evaluation, in order.
    pub evals: Vec<EvalRecord>,
    /// When each evaluation ran (empty for records written before `eval_times` existed).
    pub eval_times: Vec<EvalTime>,
    /// Wall-clock seconds of the whole run.
    pub wall_seconds: f64,
    /// Seconds spent training.
    pub train_seconds: Option<f64>,
    /// Machines (nodes) the run used (`nodes`; 1 for records written before it existed).
    pub nodes: usize,
    /// The cost the run recorded (from its `usd_per_hour`, per node).
    pub estimated_cost_usd: Option<f64>,
    /// Training loss by batch, from `metrics.jsonl` (empty when absent).
    pub train_loss: Vec<(u64, f64)>,
}

/// Why a run record cannot be explored.
#[derive(Debug, thiserror::Error)]
pub enum UnusableRecord {
    /// The file cannot be read.
    #[error("{0}")]
    Unreadable(std::io::Error),
    /// The text is not JSON, or not a run record.
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    /// The record's `wall_seconds` is not a duration.
    #[error("wall_seconds is {0}")]
    WallSeconds(f64),
    /// A run without any evaluation has no quality to place.
    #[error("it has no evaluation")]
    NoEvaluation,
}

/// A record that could not be used, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    /// The record (path or name).
    pub source: String,
    /// Why it was skipped.
    pub reason: String,
}

/// Runs read from folders, and the records skipped.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Usable runs, in path order.
    pub runs: Vec<Run>,
    /// Records that could not be read or used.
    pub skipped: Vec<Skipped>,
}

impl Run {
    /// A run from an already-parsed `run.json` value and, optionally, the lines of its
    /// `metrics.jsonl` (for the training-loss curve); `source` names it in messages.
    pub fn from_value(
        source: &str,
        record: Value,
        metrics_lines: Option<&str>,
    ) -> Result<Run, UnusableRecord> {
        let record: RunRecord = serde_json::from_value(record).map_err(UnusableRecord::NotJson)?;
        Run::from_record(source, record, metrics_lines)
    }

    /// A run from its record, read through the one typed [`RunRecord`].
    fn from_record(
        source: &str,
        record: RunRecord,
        metrics_lines: Option<&str>,
    ) -> Result<Run, UnusableRecord> {
        if !record.wall_seconds.is_finite() || record.wall_seconds < 0.0 {
            return Err(UnusableRecord::WallSeconds(record.wall_seconds));
        }
        if record.evals.is_empty() {
            return Err(UnusableRecord::NoEvaluation);
        }
        let recipe = if record.recipe.is_empty() {
            recipe_from_config(&record.config)
        } else {
            record.recipe
        };
        let eval_times = if record.eval_times.len() == record.evals.len() {
            record.eval_times
        } else {
            Vec::new()
        };
        Ok(Run {
            source: source.to_owned(),
            run_name: record.run_name,
            recipe,
            config: record.config,
            evals: record.evals,
            eval_times,
            wall_seconds: record.wall_seconds,
            // Records written before it existed read as 0: not measured.
            train_seconds: (record.train_seconds > 0.0).then_some(record.train_seconds),
            nodes: record.nodes.max(1),
            estimated_cost_usd: record.estimated_cost_usd,
            train_loss: metrics_lines.map(train_loss).unwrap_or_default(),
        })
    }

    /// The run recorded in `run.json` at `path`, with the `metrics.jsonl` beside it when there
    /// is one.
    pub fn from_file(path: &Path) -> Result<Run, UnusableRecord> {
        let record = RunRecord::read(path).map_err(|e| match e {
            RecordError::Io { source, .. } => UnusableRecord::Unreadable(source),
            RecordError::Parse { source, .. } => UnusableRecord::NotJson(source),
        })?;
        let metrics = path
            .parent()
            .map(|dir| dir.join("metrics.jsonl"))
            .and_then(|m| std::fs::read_to_string(m).ok());
        Run::from_record(&path.display().to_string(), record, metrics.as_deref())
    }

    /// `config.<dotted path>`, when present.
    pub fn config_at(&self, path: &str) -> Option<&Value> {
        path.split('.').try_fold(&self.config, |v, key| v.get(key))
    }

    /// `config.seed`.
    pub fn seed(&self) -> Option<u64> {
        self.config_at("seed").and_then(Value::as_u64)
    }
}

/// The label `Config::recipe_label` gives a config without `recipe`: the methods' names joined
/// by `+`, or `baseline`.
fn recipe_from_config(config: &Value) -> String {
    let names: Vec<&str> = config
        .get("algorithms")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|a| a.get("plugin").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        "baseline".to_owned()
    } else {
        names.join("+")
    }
}

/// `(batch, loss)` of each `train` line of a metrics file; lines that are not such are skipped.
fn train_loss(lines: &str) -> Vec<(u64, f64)> {
    lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["kind"] == "train")
        .filter_map(|l| Some((l["data"]["batch"].as_u64()?, l["data"]["loss"].as_f64()?)))
        .collect()
}

/// Every `run.json` under each of `dirs` (recursively, in sorted order), read; the unusable
/// ones are listed in [`Loaded::skipped`] with the reason.
pub fn load_dirs(dirs: &[PathBuf]) -> Loaded {
    let mut loaded = Loaded::default();
    for dir in dirs {
        for path in find_records(dir, &mut loaded.skipped) {
            match Run::from_file(&path) {
                Ok(run) => loaded.runs.push(run),
                Err(reason) => loaded.skipped.push(Skipped {
                    source: path.display().to_string(),
                    reason: reason.to_string(),
                }),
            }
        }
    }
    loaded
}

/// The `run.json` files under `dir`, sorted; folders that cannot be listed are reported in
/// `skipped`.
fn find_records(dir: &Path, skipped: &mut Vec<Skipped>) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(folder) = pending.pop() {
        let entries = match std::fs::read_dir(&folder) {
            Ok(entries) => entries,
            Err(e) => {
                skipped.push(Skipped {
                    source: folder.display().to_string(),
                    reason: format!("cannot list the folder: {e}"),
                });
                continue;
            }
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                pending.push(path);
            } else if entry.file_name() == "run.json" {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_record_without_optional_fields_is_read() {
        let record = json!({
            "run_name": "a", "wall_seconds": 2.0,
            "config": {"algorithms": [{"plugin": "cutout"}, {"plugin": "mixup"}]},
            "evals": [{"epoch": 1, "batch": 3, "accuracy": 0.5, "cross_entropy": 1.0, "samples": 10}],
        });
        let metrics = "{\"kind\":\"train\",\"data\":{\"batch\":1,\"loss\":2.5}}\nnot json\n";
        let run = Run::from_value("mem", record, Some(metrics)).unwrap();
        assert_eq!(run.recipe, "cutout+mixup");
        assert!(run.eval_times.is_empty());
        assert_eq!(run.train_loss, vec![(1, 2.5)]);
        assert_eq!(run.estimated_cost_usd, None);
        assert_eq!(run.nodes, 1, "records before `nodes` ran on one machine");
    }

    #[test]
    fn unusable_records_say_why() {
        let err = Run::from_value("mem", json!({"run_name": "a"}), None).unwrap_err();
        assert!(err.to_string().contains("wall_seconds"), "{err}");
        let record =
            json!({"run_name": "a", "wall_seconds": 1.0, "evals": [], "status": "completed"});
        let err = Run::from_value("mem", record, None).unwrap_err();
        assert!(err.to_string().contains("no evaluation"), "{err}");
    }
}
