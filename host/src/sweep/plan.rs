//! A sweep's runs: every combination of the axes' values, each a resolved configuration with
//! its own run folder, and what its folder says about it (done, to resume, new).

use std::path::{Path, PathBuf};

use super::error::{io, SweepError};
use crate::report::RunRecord;
use serde_json::Value;

use crate::config::{self, AxisValue, Config, Recipe, SweepSpec};

/// One run of a sweep.
#[derive(Debug, Clone)]
pub struct PlannedRun {
    /// The run's name and folder name: the axes' values (`mild-seed1`).
    pub id: String,
    /// Each axis's key and this run's value label, in axis order.
    pub axes: Vec<(String, String)>,
    /// The resolved configuration.
    pub config: Config,
    /// The configuration as the `trainer.toml` written into the run folder.
    pub toml: String,
}

impl PlannedRun {
    /// The run folder.
    pub fn dir(&self) -> PathBuf {
        self.config.run_dir()
    }

    /// The run's own `trainer.toml`, which its process trains from.
    pub fn config_path(&self) -> PathBuf {
        self.dir().join("trainer.toml")
    }

    /// The file the run's process writes its output to.
    pub fn log_path(&self) -> PathBuf {
        self.dir().join("train.log")
    }

    /// What the run folder holds.
    pub fn state(&self) -> Result<FolderState, SweepError> {
        let dir = self.dir();
        if !dir.exists() {
            return Ok(FolderState::New);
        }
        if !self.same_settings_as_before() {
            return Err(SweepError::SettingsChanged {
                id: self.id.clone(),
                config: self.config_path(),
                dir,
            });
        }
        let path = dir.join("run.json");
        if path.is_file() {
            let record = RunRecord::read(&path)?;
            if record.is_finished() {
                return Ok(FolderState::Done(Box::new(record)));
            }
        }
        let has_checkpoints = std::fs::read_dir(&self.config.checkpoint.folder)
            .map(|entries| {
                entries
                    .flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "ckpt"))
            })
            .unwrap_or(false);
        Ok(if has_checkpoints {
            FolderState::Resume
        } else {
            FolderState::New
        })
    }
}

impl PlannedRun {
    /// Whether the `trainer.toml` in the run folder (if any) gives this run's configuration:
    /// the same text, or text that reads as the same configuration (written by another
    /// version, which may spell it differently).
    fn same_settings_as_before(&self) -> bool {
        let path = self.config_path();
        let Ok(existing) = std::fs::read_to_string(&path) else {
            return true;
        };
        if existing == self.toml {
            return true;
        }
        // Compared without where each method's entry was written (its line differs between a
        // recipe file and the run's trainer.toml).
        let as_json = |c: &Config| {
            let mut value = serde_json::to_value(c).ok().map(plain_paths)?;
            if let Some(entries) = value["algorithms"].as_array_mut() {
                for entry in entries {
                    if let Some(map) = entry.as_object_mut() {
                        map.remove("line");
                    }
                }
            }
            Some(value)
        };
        match config::load(&path, &[]) {
            Ok(before) => as_json(&before) == as_json(&self.config),
            Err(_) => false,
        }
    }
}

/// `value` with every absolute path in it written plainly (`/a/b/../c` as `/a/c`): earlier
/// versions wrote the runs' paths without resolving `..`.
fn plain_paths(value: Value) -> Value {
    match value {
        Value::String(s) if s.starts_with('/') => {
            Value::String(absolute(Path::new(&s)).map_or(s, |p| p.display().to_string()))
        }
        Value::Array(items) => Value::Array(items.into_iter().map(plain_paths).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, plain_paths(v))).collect())
        }
        other => other,
    }
}

/// What a run's folder says about it.
#[derive(Debug, Clone)]
pub enum FolderState {
    /// Finished (completed, or stopped early by a method or the target): its `run.json`.
    Done(Box<RunRecord>),
    /// Started before and stopped: it continues from its newest checkpoint.
    Resume,
    /// Not started (or stopped before its first checkpoint): it starts from the beginning.
    New,
}

/// A sweep's runs and the folder that holds them.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The sweep folder (absolute): one folder per run, `sweep.json`.
    pub dir: PathBuf,
    /// The runs, in order.
    pub runs: Vec<PlannedRun>,
}

/// Every run of `spec`: the axes' combinations, the first axis varying slowest. `extra` are
/// `--set` overrides for every run (after the sweep's own `set`); `threads`, when given, is
/// each run's share of the cores for runs whose configuration leaves `train.threads` at 0.
/// Every configuration is built and checked here, before anything runs.
pub fn plan(
    spec: &SweepSpec,
    extra: &[String],
    threads: Option<usize>,
) -> Result<Plan, SweepError> {
    // Absolute paths: the runs' files then name the same places from any working folder.
    let output_dir = absolute(&spec.output_dir)?;
    let base = absolute(&spec.base)?;
    let mut runs: Vec<PlannedRun> = Vec::new();
    for combination in combinations(spec) {
        let recipe: Option<&Recipe> = combination.iter().find_map(|v| match v {
            AxisValue::Recipe(r) => Some(r),
            AxisValue::Set { .. } => None,
        });
        let axes: Vec<(String, String)> = spec
            .axes
            .iter()
            .zip(&combination)
            .map(|(axis, value)| (axis.key.clone(), value.label()))
            .collect();
        let id = unique(run_id(&axes), &runs);
        let mut overrides: Vec<String> = spec.set.iter().chain(extra).cloned().collect();
        overrides.extend(combination.iter().filter_map(|v| v.override_arg()));
        let describe = || {
            let values: Vec<String> = axes.iter().map(|(k, v)| format!("{k} {v}")).collect();
            format!(
                "run `{id}` ({}) of {}",
                values.join(", "),
                spec.file.display()
            )
        };
        let mut config = config::load_with_recipe(&base, &overrides, recipe).map_err(|source| {
            SweepError::Config {
                run: describe(),
                source: Box::new(source),
            }
        })?;
        config.run_name = id.clone();
        config.output_dir = output_dir.clone();
        config.checkpoint.folder = output_dir.join(&id).join("checkpoints");
        config.checkpoint.autoresume = true;
        config.checkpoint.save = true;
        config.checkpoint.load = None;
        if let Some(threads) = threads.filter(|_| config.train.threads == 0) {
            config.train.threads = threads;
        }
        let record_error = |message: String| SweepError::Encode {
            run: describe(),
            message,
        };
        let recorded = serde_json::to_value(&config).map_err(|e| record_error(e.to_string()))?;
        let toml = config::recorded_toml(&recorded).map_err(|e| record_error(e.to_string()))?;
        // The file the run trains from must read back as this configuration.
        config::from_recorded(&recorded, &id, &[]).map_err(|source| SweepError::Config {
            run: describe(),
            source: Box::new(source),
        })?;
        runs.push(PlannedRun {
            id,
            axes,
            config,
            toml: format!(
                "# Written by `tessera sweep {}`: this run's settings, resolved.\n{toml}",
                spec.file.display()
            ),
        });
    }
    Ok(Plan {
        dir: output_dir,
        runs,
    })
}

/// Every combination of the axes' values, the first axis varying slowest; one empty
/// combination without axes.
fn combinations(spec: &SweepSpec) -> Vec<Vec<AxisValue>> {
    let mut out: Vec<Vec<AxisValue>> = vec![Vec::new()];
    for axis in &spec.axes {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                axis.values.iter().map(move |v| {
                    let mut next = prefix.clone();
                    next.push(v.clone());
                    next
                })
            })
            .collect();
    }
    out
}

/// A run's name from its axes' values: `mild-seed1-ssr0.5-lr0.05` (`run` without axes).
fn run_id(axes: &[(String, String)]) -> String {
    let parts: Vec<String> = axes
        .iter()
        .map(|(key, value)| {
            let prefix = match key.as_str() {
                "recipe" => "",
                "scale_schedule_ratio" => "ssr",
                other => other.rsplit('.').next().unwrap_or(other),
            };
            format!("{prefix}{value}")
        })
        .collect();
    let id = if parts.is_empty() {
        "run".to_owned()
    } else {
        parts.join("-")
    };
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `id`, or `id-2`, `id-3`, ... when an earlier run already has that name.
fn unique(id: String, runs: &[PlannedRun]) -> String {
    let taken = |name: &str| runs.iter().any(|r| r.id == name);
    if !taken(&id) {
        return id;
    }
    (2..)
        .map(|n| format!("{id}-{n}"))
        .find(|name| !taken(name))
        .unwrap_or(id)
}

/// `path` made absolute against the current folder, with `.` and `..` resolved lexically
/// (`/a/b/../c` is `/a/c`), so that messages and files name it plainly.
fn absolute(path: &Path) -> Result<PathBuf, SweepError> {
    use std::path::Component;
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(io("reading the current folder", Path::new(".")))?
            .join(path)
    };
    let mut out = PathBuf::new();
    for part in joined.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_absolute_and_plain() {
        assert_eq!(
            absolute(Path::new("/a/b/./../c/../../d")).expect("a path"),
            PathBuf::from("/d")
        );
        let here = std::env::current_dir().expect("cwd");
        assert_eq!(
            absolute(Path::new("x/../y")).expect("a path"),
            here.join("y")
        );
    }

    #[test]
    fn run_names_come_from_the_axes_values() {
        let axes = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(run_id(&axes(&[])), "run");
        assert_eq!(
            run_id(&axes(&[
                ("recipe", "mild"),
                ("seed", "1"),
                ("scale_schedule_ratio", "0.5"),
                ("optimizer.lr", "0.05"),
                ("model.name", "a b/c"),
            ])),
            "mild-seed1-ssr0.5-lr0.05-namea_b_c"
        );
    }
}
