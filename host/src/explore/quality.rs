//! What "better" means: accuracy (higher is better) for image data, perplexity (lower is
//! better) for language models.

use std::fmt;
use std::str::FromStr;

use crate::report::EvalRecord;

use super::load::Run;

/// The quality measure runs are compared by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QualityMetric {
    /// Top-1 accuracy; higher is better.
    Accuracy,
    /// Perplexity; lower is better.
    Perplexity,
}

impl QualityMetric {
    /// Perplexity when every evaluation of `runs` carries one (language models), else accuracy.
    pub fn for_runs<'a>(runs: impl IntoIterator<Item = &'a Run>) -> QualityMetric {
        let mut runs = runs.into_iter().peekable();
        let all_perplexity =
            runs.peek().is_some() && runs.all(|r| r.evals.iter().all(|e| e.perplexity.is_some()));
        if all_perplexity {
            QualityMetric::Perplexity
        } else {
            QualityMetric::Accuracy
        }
    }

    /// The value of one evaluation (`None`: perplexity of an image model's evaluation).
    pub fn of(self, eval: &EvalRecord) -> Option<f64> {
        match self {
            QualityMetric::Accuracy => Some(eval.accuracy),
            QualityMetric::Perplexity => eval.perplexity,
        }
    }

    /// The value of a run's last evaluation.
    pub fn final_of(self, run: &Run) -> Option<f64> {
        run.evals.last().and_then(|e| self.of(e))
    }

    /// Whether `a` is strictly better than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            QualityMetric::Accuracy => a > b,
            QualityMetric::Perplexity => a < b,
        }
    }

    /// Whether `value` is at least as good as `target`, within rounding (a mean over seeds
    /// that equals a run's value must count as met).
    pub fn meets(self, value: f64, target: f64) -> bool {
        let tolerance = 1e-9 * target.abs().max(1.0);
        match self {
            QualityMetric::Accuracy => value >= target - tolerance,
            QualityMetric::Perplexity => value <= target + tolerance,
        }
    }

    /// The name, as `--metric` spells it.
    pub fn name(self) -> &'static str {
        match self {
            QualityMetric::Accuracy => "accuracy",
            QualityMetric::Perplexity => "perplexity",
        }
    }

    /// Decimal places shown.
    pub fn decimals(self) -> usize {
        match self {
            QualityMetric::Accuracy => 4,
            QualityMetric::Perplexity => 3,
        }
    }
}

impl fmt::Display for QualityMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for QualityMetric {
    type Err = String;

    fn from_str(s: &str) -> Result<QualityMetric, String> {
        match s {
            "accuracy" => Ok(QualityMetric::Accuracy),
            "perplexity" => Ok(QualityMetric::Perplexity),
            other => Err(format!(
                "unknown metric {other:?}; use accuracy or perplexity"
            )),
        }
    }
}
