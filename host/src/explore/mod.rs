//! `tessera explore`: which recipes are worth it. Reads run records, groups them by dataset
//! and model, makes one point per recipe and config (the mean over seeds), finds the Pareto
//! frontier of wall time (and cost) against quality and the speed-up over the baseline at equal
//! quality, and writes plots and a self-contained HTML report. See `docs/explore.md`.
//!
//! The pieces: [`load`] (run records from folders, or from already-parsed JSON for other
//! sources), [`quality`] (accuracy or perplexity), [`group`] (groups and points), [`frontier`]
//! (domination and speed-ups), [`table`], [`plot`] and [`report`].

pub mod frontier;
pub mod group;
pub mod load;
pub mod plot;
pub mod point;
pub mod quality;
pub mod report;
pub mod table;

use std::path::{Path, PathBuf};

pub use group::{group_runs, group_runs_by, Group, GroupBy};
pub use load::{load_dirs, Loaded, Run, Skipped, UnusableRecord};
pub use point::{Point, Stats, TimeToBaseline};
pub use quality::QualityMetric;

use crate::cost::{cost_usd, Instance};

/// Where run costs come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Pricing {
    /// Each run's `estimated_cost_usd` (from the `usd_per_hour` it trained with).
    Recorded,
    /// Every run re-priced by its wall time on its nodes at this many USD per hour per node.
    PerHour(f64),
    /// Every run re-priced by its wall time on its nodes at this instance's price per node.
    Instance(Instance),
}

impl Pricing {
    /// The cost of `run`, when known.
    pub fn cost_of(&self, run: &Run) -> Option<f64> {
        match self {
            Pricing::Recorded => run.estimated_cost_usd,
            Pricing::PerHour(usd) => Some(cost_usd(*usd, run.wall_seconds, run.nodes)),
            Pricing::Instance(i) => Some(cost_usd(i.usd_per_hour, run.wall_seconds, run.nodes)),
        }
    }

    /// A sentence for the report.
    pub fn describe(&self) -> String {
        match self {
            Pricing::Recorded => "as each run recorded it (estimated_cost_usd, from its \
                                  usd_per_hour per node); runs without a price have none"
                .to_owned(),
            Pricing::PerHour(usd) => {
                format!("every run's wall time x its nodes at ${usd}/hour per node")
            }
            Pricing::Instance(i) => format!(
                "every run's wall time x its nodes at {} (${}/hour per node on demand, {}; \
                 read {}; prices change)",
                i.id(),
                i.usd_per_hour,
                i.accelerator,
                i.read
            ),
        }
    }
}

/// What `tessera explore` does.
#[derive(Debug, Clone)]
pub struct ExploreOptions {
    /// Folders searched for `run.json` records.
    pub runs_dirs: Vec<PathBuf>,
    /// Where plots and the report go (default: `RUNS_DIR/explore` for one folder, else
    /// `./explore`).
    pub out: Option<PathBuf>,
    /// How runs are priced.
    pub pricing: Pricing,
    /// The quality measure (default: per group, perplexity for language models, else
    /// accuracy).
    pub metric: Option<QualityMetric>,
    /// MLflow experiments whose runs are read too: `(tracking URI, experiment name)`.
    pub mlflow: Vec<(String, String)>,
    /// What makes runs comparable (default: dataset and model).
    pub group_by: GroupBy,
}

impl ExploreOptions {
    /// The output folder.
    pub fn out_dir(&self) -> PathBuf {
        match (&self.out, self.runs_dirs.as_slice()) {
            (Some(out), _) => out.clone(),
            (None, [one]) => one.join("explore"),
            (None, _) => PathBuf::from("explore"),
        }
    }
}

/// Why exploring failed.
#[derive(Debug, thiserror::Error)]
pub enum ExploreError {
    /// No `run.json` anywhere.
    #[error("no run records (run.json) found under {}", list(.0))]
    NoRecords(Vec<PathBuf>),
    /// Records were found but none could be used.
    #[error("none of the {} run records found could be used:{}", .0.len(), skipped_lines(.0))]
    NoUsableRuns(Vec<Skipped>),
    /// A plot could not be drawn.
    #[error("{0}")]
    Plot(String),
    /// An MLflow server's runs could not be read.
    #[error("{0}")]
    Mlflow(String),
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The reason.
        source: std::io::Error,
    },
}

fn skipped_lines(skipped: &[Skipped]) -> String {
    skipped
        .iter()
        .map(|s| format!("\n  {}: {}", s.source, s.reason))
        .collect()
}

fn list(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What [`explore`] found and wrote.
#[derive(Debug)]
pub struct Explored {
    /// The groups, analysed.
    pub groups: Vec<Group>,
    /// Records skipped, with the reason.
    pub skipped: Vec<Skipped>,
    /// Files written.
    pub written: Vec<PathBuf>,
}

/// Reads the runs under `options.runs_dirs`, analyses them and writes the plots and report.
pub fn explore(options: &ExploreOptions) -> Result<Explored, ExploreError> {
    let Loaded {
        mut runs,
        mut skipped,
    } = load_dirs(&options.runs_dirs);
    for (uri, experiment) in &options.mlflow {
        let fetched = crate::tracking::mlflow::fetch_runs(uri, experiment)
            .map_err(|e| ExploreError::Mlflow(e.to_string()))?;
        for run in fetched {
            let metrics: Vec<String> = run.metrics.iter().map(|l| l.to_string()).collect();
            match Run::from_value(&run.source, run.record, Some(&metrics.join("\n"))) {
                Ok(r) => runs.push(r),
                Err(reason) => skipped.push(Skipped {
                    source: run.source,
                    reason: reason.to_string(),
                }),
            }
        }
    }
    if runs.is_empty() {
        return Err(if skipped.is_empty() {
            ExploreError::NoRecords(options.runs_dirs.clone())
        } else {
            ExploreError::NoUsableRuns(skipped)
        });
    }
    let (groups, unusable) =
        group_runs_by(runs, options.metric, &options.pricing, options.group_by);
    skipped.extend(unusable);
    if groups.is_empty() {
        return Err(ExploreError::NoUsableRuns(skipped));
    }
    let written = write_outputs(&groups, &options.pricing, &options.out_dir())?;
    Ok(Explored {
        groups,
        skipped,
        written,
    })
}

/// Writes `frontier-<group>.svg` and `.png` per group and `report.html` into `out`
/// (atomically); returns their paths.
pub fn write_outputs(
    groups: &[Group],
    pricing: &Pricing,
    out: &Path,
) -> Result<Vec<PathBuf>, ExploreError> {
    let text = plot::text_available();
    let mut files: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    for g in groups {
        let svg = plot::frontier_svg(g);
        let png = plot::frontier_png(g, text).map_err(ExploreError::Plot)?;
        files.push((
            out.join(format!("frontier-{}.svg", g.slug)),
            svg.into_bytes(),
        ));
        files.push((out.join(format!("frontier-{}.png", g.slug)), png));
    }
    let html = report::render(groups, &pricing.describe());
    files.push((out.join("report.html"), html.into_bytes()));
    for (path, bytes) in &files {
        crate::files::write_atomic(path, bytes).map_err(|source| ExploreError::Write {
            path: path.clone(),
            source,
        })?;
    }
    Ok(files.into_iter().map(|(p, _)| p).collect())
}

/// Hand-built runs for the unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use serde_json::json;

    use super::Run;
    use crate::report::{EvalRecord, EvalTime};

    /// A Fashion-MNIST CNN run of `recipe` and `seed`, evaluated at `(wall seconds, accuracy)`
    /// (one batch apart), lasting `wall_seconds`.
    pub fn run(name: &str, recipe: &str, seed: u64, evals: &[(f64, f64)], wall: f64) -> Run {
        let config = json!({
            "run_name": name, "seed": seed, "output_dir": "/runs",
            "data": {"dataset": "fashion-mnist"},
            "model": {"name": "cnn", "width": 8},
            "checkpoint": {"folder": format!("/runs/{name}/checkpoints")},
        });
        Run {
            source: format!("{name}/run.json"),
            run_name: name.to_owned(),
            recipe: recipe.to_owned(),
            config,
            evals: evals
                .iter()
                .enumerate()
                .map(|(i, (_, accuracy))| EvalRecord {
                    epoch: 0,
                    batch: i as u64 + 1,
                    accuracy: *accuracy,
                    cross_entropy: 1.0,
                    samples: 100,
                    tokens: None,
                    perplexity: None,
                    extra: Default::default(),
                })
                .collect(),
            eval_times: evals
                .iter()
                .enumerate()
                .map(|(i, (wall_seconds, _))| EvalTime {
                    batch: i as u64 + 1,
                    train_seconds: *wall_seconds,
                    wall_seconds: *wall_seconds,
                })
                .collect(),
            wall_seconds: wall,
            train_seconds: Some(wall),
            nodes: 1,
            estimated_cost_usd: None,
            train_loss: Vec::new(),
        }
    }
}
