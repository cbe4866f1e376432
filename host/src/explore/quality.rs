//! What "better" means: accuracy (higher is better) for image data, perplexity (lower is
//! better) for language models, unless `--metric` names another evaluation metric the runs
//! computed (`top5`, `f1`; higher is better).

use std::fmt;
use std::str::FromStr;

use crate::report::{EvalRecord, Metric};

use super::load::Run;

/// The quality measure runs are compared by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QualityMetric {
    /// Top-1 accuracy; higher is better.
    Accuracy,
    /// Perplexity; lower is better.
    Perplexity,
    /// Top-k accuracy (k >= 2, `top5`), for runs that computed it; higher is better.
    TopK(u32),
    /// Macro-F1 (`f1`), for runs that computed it; higher is better.
    F1,
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

    /// The evaluation metric it reads.
    fn metric(self) -> Metric {
        match self {
            QualityMetric::Accuracy => Metric::Accuracy,
            QualityMetric::Perplexity => Metric::Perplexity,
            QualityMetric::TopK(k) => Metric::TopK(k),
            QualityMetric::F1 => Metric::F1,
        }
    }

    /// The value of one evaluation (`None` when the evaluation lacks it: perplexity of an
    /// image model, a top-k or F1 the run did not compute).
    pub fn of(self, eval: &EvalRecord) -> Option<f64> {
        self.metric().value_in(eval)
    }

    /// The value of a run's last evaluation.
    pub fn final_of(self, run: &Run) -> Option<f64> {
        run.evals.last().and_then(|e| self.of(e))
    }

    /// Whether higher values are better.
    pub fn higher_is_better(self) -> bool {
        self.metric().higher_is_better()
    }

    /// Whether `a` is strictly better than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        if self.higher_is_better() {
            a > b
        } else {
            a < b
        }
    }

    /// Whether `value` is at least as good as `target`, within rounding (a mean over seeds
    /// that equals a run's value must count as met).
    pub fn meets(self, value: f64, target: f64) -> bool {
        let tolerance = 1e-9 * target.abs().max(1.0);
        if self.higher_is_better() {
            value >= target - tolerance
        } else {
            value <= target + tolerance
        }
    }

    /// The name, as `--metric` spells it.
    pub fn name(self) -> String {
        self.metric().as_str()
    }

    /// Decimal places shown.
    pub fn decimals(self) -> usize {
        match self {
            QualityMetric::Perplexity => 3,
            _ => 4,
        }
    }
}

impl fmt::Display for QualityMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for QualityMetric {
    type Err = String;

    fn from_str(s: &str) -> Result<QualityMetric, String> {
        match Metric::from_name(s) {
            Some(Metric::Accuracy) => Ok(QualityMetric::Accuracy),
            Some(Metric::Perplexity) => Ok(QualityMetric::Perplexity),
            Some(Metric::TopK(k)) => Ok(QualityMetric::TopK(k)),
            Some(Metric::F1) => Ok(QualityMetric::F1),
            _ => Err(format!(
                "unknown metric {s:?}; use accuracy, perplexity, a top-k accuracy the runs \
                 computed (top5) or f1"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_and_f1_read_from_the_evaluation_and_rank_higher_as_better() {
        let mut eval = EvalRecord {
            epoch: 1,
            batch: 10,
            accuracy: 0.5,
            cross_entropy: 1.0,
            samples: 8,
            tokens: None,
            perplexity: None,
            extra: Default::default(),
        };
        eval.extra.0.insert("top5".to_owned(), 0.875);
        let top5: QualityMetric = "top5".parse().expect("a metric");
        assert_eq!(top5, QualityMetric::TopK(5));
        assert_eq!(top5.of(&eval), Some(0.875));
        assert!(top5.better(0.9, 0.8));
        assert_eq!(top5.name(), "top5");
        let f1: QualityMetric = "f1".parse().expect("a metric");
        assert_eq!(f1.of(&eval), None);
        assert!(f1.meets(0.8, 0.8) && !f1.meets(0.7, 0.8));
        assert_eq!("top1".parse::<QualityMetric>(), Ok(QualityMetric::Accuracy));
        assert!("cross_entropy".parse::<QualityMetric>().is_err());
        assert!(!QualityMetric::Perplexity.better(5.0, 4.0));
    }
}
