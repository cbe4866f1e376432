//! `tessera recipe search`: which recipe, trained how long, reaches the target fastest? Short
//! runs of a few recipes at growing `scale_schedule_ratio`s (1/8, 1/4, 1/2, 1 of the
//! configuration's length), as long as the time budget allows, each a run of a sweep (so the
//! search resumes like a sweep); then the fastest (recipe, length) whose final evaluation meets
//! the target, with the runs behind the choice.

pub mod catalog;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::config::{self, Axis, AxisValue, Config, Location, Recipe, SweepSpec};
use crate::report::{Comparison, Metric, RunRecord, Target};
use crate::sweep::{self, RunOutcome, SweepError, SweepOptions};

/// Why a recipe search could not be run or its result written.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The trainer.toml or a recipe file does not load.
    #[error(transparent)]
    Config(Box<config::ConfigError>),
    /// A round's sweep could not be planned or run.
    #[error(transparent)]
    Sweep(Box<SweepError>),
    /// Only the baseline to try.
    #[error(
        "nothing to compare: no recipe besides the baseline (install plugins, or give recipe \
         files with --recipe)"
    )]
    NothingToCompare,
    /// The recommended recipe or the recommendation could not be encoded.
    #[error("{what}: {message}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoder's message.
        message: String,
    },
    /// A result file could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, SearchError>;

impl From<config::ConfigError> for SearchError {
    fn from(e: config::ConfigError) -> Self {
        SearchError::Config(Box::new(e))
    }
}

impl From<SweepError> for SearchError {
    fn from(e: SweepError) -> Self {
        SearchError::Sweep(Box::new(e))
    }
}

fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> SearchError + '_ {
    move |source| SearchError::Write {
        path: path.to_owned(),
        source,
    }
}

/// The lengths tried, as fractions of the configuration's `max_duration`, shortest first.
pub const LADDER: [f64; 4] = [0.125, 0.25, 0.5, 1.0];

/// What to search.
pub struct SearchOptions {
    /// The user's `trainer.toml`: model, data, optimizer, full length.
    pub config: PathBuf,
    /// `--set` overrides for every run.
    pub overrides: Vec<String>,
    /// Wall-clock seconds this invocation of the search may take (its runs, start-up
    /// included).
    pub budget_seconds: f64,
    /// What the recommended recipe must reach; default: `train.target`, else the baseline's
    /// final quality at the longest length tried.
    pub target: Option<Target>,
    /// Recipe files to try (besides the baseline); default: the built-in ones for the model.
    pub recipes: Vec<PathBuf>,
    /// Seeds per recipe and length (the configuration's seed, +1, ...).
    pub seeds: u64,
    /// The search folder.
    pub out: PathBuf,
}

/// One (recipe, length) of the search, over its seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    /// The recipe's name.
    pub recipe: String,
    /// `scale_schedule_ratio` of its runs.
    pub scale_schedule_ratio: f64,
    /// Runs (seeds) finished.
    pub runs: usize,
    /// Mean final value of the target's metric.
    pub quality: f64,
    /// Mean wall seconds of a run.
    pub wall_seconds: f64,
    /// Mean estimated cost of a run, when the configuration has a price.
    pub cost_usd: Option<f64>,
    /// Whether `quality` meets the target.
    pub meets_target: bool,
}

/// The search's answer.
#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    /// The target the choice meets, as `train.target` writes it.
    pub target: String,
    /// Where the target came from (`--target`, `train.target`, the baseline).
    pub target_source: String,
    /// The fastest point meeting the target, if any did.
    pub recommended: Option<Trial>,
    /// The baseline's fastest point meeting the target, if any did.
    pub baseline: Option<Trial>,
    /// Baseline wall time / recommended wall time, when both met the target.
    pub speedup: Option<f64>,
    /// Every point measured.
    pub points: Vec<Trial>,
    /// Wall-clock seconds this invocation of the search took (runs finished by an earlier
    /// invocation are not counted again).
    pub spent_seconds: f64,
    /// Why the search stopped adding lengths.
    pub stopped_because: String,
    /// The recommended recipe's file (written into the search folder).
    pub recipe_file: Option<PathBuf>,
    /// The command that trains the recommendation.
    pub command: Option<String>,
    /// The Explorer's report over the search's runs (frontier plot, table, learning curves).
    pub report: Option<PathBuf>,
}

/// Runs the search; `run` options are those of the sweeps it runs.
pub fn search(
    options: &SearchOptions,
    run: &SweepOptions,
) -> Result<(Recommendation, Option<i32>)> {
    let base = config::load(&options.config, &options.overrides)?;
    let recipes = candidates(options, &base)?;
    let names: Vec<&str> = recipes.iter().map(|r| r.name.as_str()).collect();
    tracing::info!(
        "recipe search over {}: {} with a budget of {:.0} s; lengths {:?} x max_duration ({})",
        options.config.display(),
        names.join(", "),
        options.budget_seconds,
        LADDER,
        base.train.max_duration
    );
    let mut done: Vec<(Config, RunRecord)> = Vec::new();
    let mut stopped_because = "every length was tried".to_owned();
    let mut last_round_seconds: Option<f64> = None;
    let started = Instant::now();
    for &ssr in &LADDER {
        let so_far = started.elapsed().as_secs_f64();
        if let Some(previous) = last_round_seconds {
            // Twice as long as the last round: each run is twice as long.
            let predicted = 2.0 * previous;
            if so_far + predicted > options.budget_seconds {
                stopped_because = format!(
                    "the next length ({ssr} x max_duration) would take about {predicted:.0} s, \
                     beyond the budget ({so_far:.0} of {:.0} s spent)",
                    options.budget_seconds
                );
                break;
            }
        }
        let spec = round_spec(options, &recipes, &base, ssr);
        let plan = sweep::plan(&spec, &[], None)?;
        let round_started = Instant::now();
        let outcome = sweep::run_sweep(plan, &options.config, run)?;
        let round = round_started.elapsed().as_secs_f64();
        for (planned, result) in outcome.runs {
            match result {
                RunOutcome::Done(record) => done.push((planned.config, *record)),
                RunOutcome::Failed(why) => {
                    tracing::warn!("run `{}` failed, left out: {why}", planned.id)
                }
                RunOutcome::Interrupted | RunOutcome::NotStarted => {}
            }
        }
        if let Some(signal) = outcome.stopped_by {
            let rec = recommend(
                options,
                &base,
                &recipes,
                &done,
                (
                    "the search was stopped".into(),
                    started.elapsed().as_secs_f64(),
                ),
            )?;
            return Ok((rec, Some(signal)));
        }
        last_round_seconds = Some(round);
        if started.elapsed().as_secs_f64() >= options.budget_seconds {
            stopped_because = format!(
                "the budget ({:.0} s) was spent after {ssr} x max_duration",
                options.budget_seconds
            );
            break;
        }
    }
    let mut rec = recommend(
        options,
        &base,
        &recipes,
        &done,
        (stopped_because, started.elapsed().as_secs_f64()),
    )?;
    rec.report = evidence(&options.out);
    Ok((rec, None))
}

/// Runs the Explorer over the search's runs (into `<search>/explore`); its report is the
/// evidence behind the recommendation. A failure is a warning: the table stands without it.
fn evidence(dir: &Path) -> Option<PathBuf> {
    let options = crate::explore::ExploreOptions {
        runs_dirs: vec![dir.to_path_buf()],
        out: Some(dir.join("explore")),
        pricing: crate::explore::Pricing::Recorded,
        metric: None,
        mlflow: Vec::new(),
        group_by: crate::explore::GroupBy::Model,
    };
    match crate::explore::explore(&options) {
        Ok(explored) => explored
            .written
            .into_iter()
            .find(|p| p.file_name().is_some_and(|n| n == "report.html")),
        Err(e) => {
            tracing::warn!("no frontier plot for the search: {e}");
            None
        }
    }
}

/// The recipes to try: the user's files (with a baseline added) or the built-in ones.
fn candidates(options: &SearchOptions, base: &Config) -> Result<Vec<Recipe>> {
    let mut recipes = Vec::new();
    if options.recipes.is_empty() {
        let (builtin, skipped) = catalog::builtin(base)?;
        for s in skipped {
            tracing::warn!("built-in recipe `{}` not tried: {}", s.name, s.why);
        }
        recipes = builtin;
    } else {
        for path in &options.recipes {
            recipes.push(config::load_recipe(path)?);
        }
    }
    if !recipes.iter().any(|r| r.algorithms.is_empty()) {
        let baseline = config::recipe_from_str("", "the baseline (no methods)", "baseline")?;
        recipes.insert(0, baseline);
    }
    if recipes.len() < 2 {
        return Err(SearchError::NothingToCompare);
    }
    Ok(recipes)
}

/// One length of the search as a sweep: every recipe (and seed) at `ssr`.
fn round_spec(options: &SearchOptions, recipes: &[Recipe], base: &Config, ssr: f64) -> SweepSpec {
    let set = |key: &str, literal: String| AxisValue::Set {
        key: key.to_owned(),
        literal,
        location: Location::Unknown,
    };
    let mut axes = vec![Axis {
        key: "recipe".into(),
        values: recipes.iter().cloned().map(AxisValue::Recipe).collect(),
    }];
    if options.seeds > 1 {
        axes.push(Axis {
            key: "seed".into(),
            values: (0..options.seeds)
                .map(|i| set("seed", (base.seed + i).to_string()))
                .collect(),
        });
    }
    axes.push(Axis {
        key: "scale_schedule_ratio".into(),
        values: vec![set("train.scale_schedule_ratio", ssr.to_string())],
    });
    SweepSpec {
        file: options.config.clone(),
        base: options.config.clone(),
        output_dir: options.out.clone(),
        parallel: 1,
        set: options.overrides.clone(),
        axes,
    }
}

/// The metric a search compares by: perplexity for a language model, accuracy otherwise.
fn default_metric(records: &[(Config, RunRecord)]) -> Metric {
    let language = records.iter().any(|(_, r)| r.final_perplexity.is_some());
    if language {
        Metric::Perplexity
    } else {
        Metric::Accuracy
    }
}

/// A run's final value of `metric`.
fn final_value(record: &RunRecord, metric: Metric) -> Option<f64> {
    metric.value_in(record.evals.last()?)
}

/// Groups the runs into points, settles the target and picks the fastest point meeting it.
fn recommend(
    options: &SearchOptions,
    base: &Config,
    recipes: &[Recipe],
    done: &[(Config, RunRecord)],
    (stopped_because, spent_seconds): (String, f64),
) -> Result<Recommendation> {
    let metric = options
        .target
        .or(base.train.target)
        .map_or_else(|| default_metric(done), |t| t.metric);
    let mut points = points(done, metric);
    let (target, source) = match (options.target, base.train.target) {
        (Some(t), _) => (Some(t), "--target".to_owned()),
        (None, Some(t)) => (
            Some(t),
            format!("train.target of {}", options.config.display()),
        ),
        (None, None) => {
            // The baseline's quality at its longest length.
            let longest = points
                .iter()
                .filter(|p| p.recipe == "baseline")
                .max_by(|a, b| a.scale_schedule_ratio.total_cmp(&b.scale_schedule_ratio));
            let op = if metric.higher_is_better() {
                Comparison::AtLeast
            } else {
                Comparison::AtMost
            };
            let target = longest.map(|p| Target {
                metric,
                op,
                value: p.quality,
            });
            let source = longest.map_or_else(String::new, |p| {
                format!(
                    "the baseline's final {} at {} x max_duration",
                    metric.as_str(),
                    p.scale_schedule_ratio
                )
            });
            (target, source)
        }
    };
    for p in &mut points {
        p.meets_target = target.is_some_and(|t| t.op.holds(p.quality, t.value));
    }
    let fastest = |baseline: bool| {
        points
            .iter()
            .filter(|p| p.meets_target && (!baseline || p.recipe == "baseline"))
            .min_by(|a, b| a.wall_seconds.total_cmp(&b.wall_seconds))
            .cloned()
    };
    let (recommended, baseline) = (fastest(false), fastest(true));
    let speedup = match (&recommended, &baseline) {
        (Some(r), Some(b)) if r.wall_seconds > 0.0 => Some(b.wall_seconds / r.wall_seconds),
        _ => None,
    };
    let (recipe_file, command) = match &recommended {
        Some(point) => {
            let recipe = recipes.iter().find(|r| r.name == point.recipe);
            match recipe {
                Some(recipe) => {
                    let file = options.out.join("recommended-recipe.toml");
                    let text = recipe.to_toml().map_err(|e| SearchError::Encode {
                        what: "writing the recommended recipe",
                        message: e.to_string(),
                    })?;
                    crate::files::write_atomic(&file, text.as_bytes())
                        .map_err(write_error(&file))?;
                    let command = format!(
                        "tessera train {} --recipe {} --set train.scale_schedule_ratio={}",
                        options.config.display(),
                        file.display(),
                        point.scale_schedule_ratio
                    );
                    (Some(file), Some(command))
                }
                None => (None, None),
            }
        }
        None => (None, None),
    };
    Ok(Recommendation {
        target: target.map_or_else(|| "none".to_owned(), |t| t.to_string()),
        target_source: source,
        recommended,
        baseline,
        speedup,
        points,
        spent_seconds,
        stopped_because,
        recipe_file,
        command,
        report: None,
    })
}

/// The runs grouped by (recipe, length), means over their seeds, in run order.
fn points(done: &[(Config, RunRecord)], metric: Metric) -> Vec<Trial> {
    let mut points: Vec<(Trial, usize)> = Vec::new();
    for (config, record) in done {
        let Some(quality) = final_value(record, metric) else {
            continue;
        };
        let recipe = config.recipe_label();
        let ssr = config.train.scale_schedule_ratio;
        let wall = record.wall_seconds;
        let cost = record.estimated_cost_usd;
        match points
            .iter_mut()
            .find(|(p, _)| p.recipe == recipe && p.scale_schedule_ratio == ssr)
        {
            Some((p, n)) => {
                let k = *n as f64;
                p.quality = (p.quality * k + quality) / (k + 1.0);
                p.wall_seconds = (p.wall_seconds * k + wall) / (k + 1.0);
                p.cost_usd = p.cost_usd.zip(cost).map(|(a, c)| (a * k + c) / (k + 1.0));
                p.runs += 1;
                *n += 1;
            }
            None => points.push((
                Trial {
                    recipe,
                    scale_schedule_ratio: ssr,
                    runs: 1,
                    quality,
                    wall_seconds: wall,
                    cost_usd: cost,
                    meets_target: false,
                },
                1,
            )),
        }
    }
    points.into_iter().map(|(p, _)| p).collect()
}

/// Writes the recommendation as `recommendation.json` in the search folder.
pub fn write_recommendation(dir: &Path, rec: &Recommendation) -> Result<PathBuf> {
    let path = dir.join("recommendation.json");
    let mut text = serde_json::to_vec_pretty(rec).map_err(|e| SearchError::Encode {
        what: "encoding the recommendation",
        message: e.to_string(),
    })?;
    text.push(b'\n');
    crate::files::write_atomic(&path, &text).map_err(write_error(&path))?;
    Ok(path)
}

/// The recommendation in words, for the terminal.
pub fn describe(rec: &Recommendation) -> String {
    let mut out = format!(
        "{:<28} {:>6} {:>5} {:>10} {:>9} {:>9}  target\n",
        "recipe", "length", "runs", "quality", "wall s", "cost $"
    );
    for p in &rec.points {
        out.push_str(&format!(
            "{:<28} {:>6} {:>5} {:>10.4} {:>9.1} {:>9}  {}\n",
            p.recipe,
            p.scale_schedule_ratio,
            p.runs,
            p.quality,
            p.wall_seconds,
            p.cost_usd.map_or("-".to_owned(), |c| format!("{c:.4}")),
            if p.meets_target { "met" } else { "-" }
        ));
    }
    out.push_str(&format!(
        "target: {} ({}); searched for {:.0} s; {}\n",
        rec.target, rec.target_source, rec.spent_seconds, rec.stopped_because
    ));
    match &rec.recommended {
        Some(p) => {
            out.push_str(&format!(
                "recommended: recipe `{}` at scale_schedule_ratio {} — {:.4} in {:.1} s",
                p.recipe, p.scale_schedule_ratio, p.quality, p.wall_seconds
            ));
            if p.recipe == "baseline" {
                out.push_str(", the baseline itself: no recipe tried reached the target sooner");
            } else if let (Some(b), Some(s)) = (&rec.baseline, rec.speedup) {
                out.push_str(&format!(
                    ", {s:.2}x faster than the baseline's fastest run meeting the target ({:.1} s at {})",
                    b.wall_seconds, b.scale_schedule_ratio
                ));
            }
            out.push('\n');
            if let Some(c) = &rec.command {
                out.push_str(&format!("train it: {c}\n"));
            }
            if let Some(r) = &rec.report {
                out.push_str(&format!(
                    "frontier plot and learning curves: {}\n",
                    r.display()
                ));
            }
        }
        None => out.push_str(
            "no recipe met the target within the budget: give a larger --budget, or a target \
             the short runs can reach\n",
        ),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladder_doubles_so_each_round_predicts_the_next() {
        for pair in LADDER.windows(2) {
            assert_eq!(pair[1], 2.0 * pair[0]);
        }
        assert_eq!(LADDER.last(), Some(&1.0));
    }
}
