//! A point of the frontier: the runs of one recipe and config that differ only by seed, their
//! values over the seeds, and when they reached the baseline's quality.

use super::load::Run;
use super::quality::QualityMetric;
use super::Pricing;

/// Values over the seeds of a point.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// One value per run, in the point's run order.
    pub values: Vec<f64>,
}

impl Stats {
    /// The mean.
    pub fn mean(&self) -> f64 {
        self.values.iter().sum::<f64>() / self.values.len().max(1) as f64
    }

    /// Half the range (max - min) / 2: the `±` shown after the mean (0 for one seed).
    pub fn spread(&self) -> f64 {
        let max = self
            .values
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let min = self.values.iter().copied().fold(f64::INFINITY, f64::min);
        if self.values.len() < 2 {
            0.0
        } else {
            (max - min) / 2.0
        }
    }

    /// The smallest and largest value.
    pub fn min_max(&self) -> (f64, f64) {
        self.values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(*v), hi.max(*v))
            })
    }

    /// `mean ± spread` with `decimals` places; the mean alone for one value.
    pub fn describe(&self, decimals: usize) -> String {
        if self.values.len() > 1 {
            format!("{:.decimals$} ± {:.decimals$}", self.mean(), self.spread())
        } else {
            format!("{:.decimals$}", self.mean())
        }
    }
}

/// Runs of one recipe and config that differ only by seed: one point of the frontier.
#[derive(Debug, Clone)]
pub struct Point {
    /// The recipe's label.
    pub recipe: String,
    /// The recipe, and the settings that tell this point from the group's other points of the
    /// same recipe: `mild (ssr 0.5)`, `baseline (optimizer.lr 0.05)`.
    pub label: String,
    /// Its runs (one per seed), sorted by seed.
    pub runs: Vec<Run>,
    /// Final quality of each run.
    pub quality: Stats,
    /// Wall seconds of each run.
    pub wall_seconds: Stats,
    /// Cost of each run, when every run has one.
    pub cost_usd: Option<Stats>,
    /// On the frontier of wall time against quality.
    pub on_time_frontier: bool,
    /// On the frontier of cost against quality (false without costs).
    pub on_cost_frontier: bool,
    /// When it reached the baseline's quality, and the speed-up that gives.
    pub time_to_baseline: TimeToBaseline,
}

/// When a point first reached the baseline's final quality, and what that makes its speed-up.
#[derive(Debug, Clone, PartialEq)]
pub enum TimeToBaseline {
    /// The group has no baseline point.
    NoBaseline,
    /// This is the baseline: its time is its mean wall time, its speed-up 1.
    Reference {
        /// The baseline's mean wall seconds.
        baseline_seconds: f64,
    },
    /// Every seed reached the baseline's quality.
    Reached {
        /// Mean over seeds of the wall seconds at the first evaluation that met it.
        seconds: f64,
        /// Baseline wall seconds / `seconds`.
        speedup: f64,
    },
    /// Some seed never reached it.
    NotReached,
    /// Some run's record has no `eval_times` (written before they were recorded).
    NoEvalTimes,
}

impl TimeToBaseline {
    /// Seconds to the baseline's quality, when known.
    pub fn seconds(&self) -> Option<f64> {
        match self {
            TimeToBaseline::Reference { baseline_seconds } => Some(*baseline_seconds),
            TimeToBaseline::Reached { seconds, .. } => Some(*seconds),
            _ => None,
        }
    }

    /// The speed-up over the baseline, when known.
    pub fn speedup(&self) -> Option<f64> {
        match self {
            TimeToBaseline::Reference { .. } => Some(1.0),
            TimeToBaseline::Reached { speedup, .. } => Some(*speedup),
            _ => None,
        }
    }
}

impl Point {
    pub(super) fn new(mut runs: Vec<Run>, metric: QualityMetric, pricing: &Pricing) -> Point {
        runs.sort_by_key(|r| (r.seed(), r.run_name.clone()));
        let stats = |f: &dyn Fn(&Run) -> f64| Stats {
            values: runs.iter().map(f).collect(),
        };
        let cost_usd: Option<Vec<f64>> = runs.iter().map(|r| pricing.cost_of(r)).collect();
        let recipe = runs.first().map(|r| r.recipe.clone()).unwrap_or_default();
        Point {
            label: recipe.clone(),
            recipe,
            quality: stats(&|r| metric.final_of(r).unwrap_or(f64::NAN)),
            wall_seconds: stats(&|r| r.wall_seconds),
            cost_usd: cost_usd.map(|values| Stats { values }),
            runs,
            on_time_frontier: false,
            on_cost_frontier: false,
            time_to_baseline: TimeToBaseline::NoBaseline,
        }
    }
}
