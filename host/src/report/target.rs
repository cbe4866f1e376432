//! Time-to-target: `train.target` (`"accuracy >= 0.90"`), a condition on an evaluation's
//! results, and [`TargetReached`], the record of the first evaluation that met it (in
//! `run.json` and in checkpoints).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize, Serializer};

use super::EvalRecord;

/// An evaluation metric: what `train.metrics` asks to compute and what `train.target` (and the
/// explorer) can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// Top-1 accuracy, in [0, 1] (`accuracy` or `top1`; always computed).
    Accuracy,
    /// Mean cross-entropy, >= 0 (always computed).
    CrossEntropy,
    /// `exp(cross_entropy)`, >= 1 (language models only; always computed for them).
    Perplexity,
    /// Top-k accuracy for k >= 2 (`top5`), in [0, 1]: the share of targets among the k largest
    /// logits (ties ranked as `torch.topk` ranks them).
    TopK(u32),
    /// Macro-averaged F1 of the top-1 predictions (`f1`), in [0, 1]: the mean over the classes
    /// that occur among the targets or the predictions of `2·tp / (2·tp + fp + fn)`, as
    /// scikit-learn's `f1_score(average="macro", zero_division=0)`.
    F1,
}

/// The metric names `train.metrics` and `train.target` accept, for messages.
pub const METRIC_NAMES: &str =
    "accuracy (or top1), top2, top3, ... (topK), f1, cross_entropy or perplexity";

impl Metric {
    /// The name in `trainer.toml` and in the evaluation record (`top5`, `f1`).
    pub fn as_str(self) -> String {
        match self {
            Metric::Accuracy => "accuracy".to_owned(),
            Metric::CrossEntropy => "cross_entropy".to_owned(),
            Metric::Perplexity => "perplexity".to_owned(),
            Metric::TopK(k) => format!("top{k}"),
            Metric::F1 => "f1".to_owned(),
        }
    }

    /// The metric named `name` (`top1` is `accuracy`); `None` for an unknown name.
    pub fn from_name(name: &str) -> Option<Metric> {
        match name {
            "accuracy" | "top1" => Some(Metric::Accuracy),
            "cross_entropy" => Some(Metric::CrossEntropy),
            "perplexity" => Some(Metric::Perplexity),
            "f1" => Some(Metric::F1),
            _ => {
                let digits = name.strip_prefix("top")?;
                // Digits only ("top+5" and "top05" are not names).
                if digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                match digits.parse::<u32>().ok()? {
                    1 => Some(Metric::Accuracy),
                    k => Some(Metric::TopK(k)),
                }
            }
        }
    }

    /// The metric's value in `eval`; `None` when that evaluation did not compute it
    /// (perplexity on an image model, a top-k or F1 the run did not ask for).
    pub fn value_in(self, eval: &EvalRecord) -> Option<f64> {
        match self {
            Metric::Accuracy => Some(eval.accuracy),
            Metric::CrossEntropy => Some(eval.cross_entropy),
            Metric::Perplexity => eval.perplexity,
            Metric::TopK(_) | Metric::F1 => eval.extra.get(&self.as_str()),
        }
    }

    /// Whether larger values are better (accuracies and F1) or smaller ones (losses).
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::Accuracy | Metric::TopK(_) | Metric::F1)
    }

    /// The values the metric can take, as `(lowest, highest, description)`.
    fn range(self) -> (f64, f64, &'static str) {
        match self {
            Metric::Accuracy | Metric::TopK(_) | Metric::F1 => (0.0, 1.0, "between 0 and 1"),
            Metric::CrossEntropy => (0.0, f64::INFINITY, ">= 0"),
            Metric::Perplexity => (1.0, f64::INFINITY, ">= 1"),
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str())
    }
}

impl FromStr for Metric {
    type Err = String;

    fn from_str(s: &str) -> Result<Metric, String> {
        Metric::from_name(s).ok_or_else(|| format!("unknown metric {s:?}; use {METRIC_NAMES}"))
    }
}

/// Written by name (`"top5"`), as in `trainer.toml`.
impl Serialize for Metric {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Metric {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Metric, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// How a metric is compared with the target value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Comparison {
    /// `>=`
    #[serde(rename = ">=")]
    AtLeast,
    /// `>`
    #[serde(rename = ">")]
    Above,
    /// `<=`
    #[serde(rename = "<=")]
    AtMost,
    /// `<`
    #[serde(rename = "<")]
    Below,
}

impl Comparison {
    /// Every comparison, two-character ones first so that `>=` is not read as `>`.
    const ALL: [Comparison; 4] = [
        Comparison::AtLeast,
        Comparison::AtMost,
        Comparison::Above,
        Comparison::Below,
    ];

    /// The operator as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Comparison::AtLeast => ">=",
            Comparison::Above => ">",
            Comparison::AtMost => "<=",
            Comparison::Below => "<",
        }
    }

    /// Whether `value` compares so with `target` (never for NaN).
    pub fn holds(self, value: f64, target: f64) -> bool {
        match self {
            Comparison::AtLeast => value >= target,
            Comparison::Above => value > target,
            Comparison::AtMost => value <= target,
            Comparison::Below => value < target,
        }
    }

    /// Whether larger values are better under this comparison.
    pub fn higher_is_better(self) -> bool {
        matches!(self, Comparison::AtLeast | Comparison::Above)
    }
}

/// `train.target`: a metric, a comparison and a value, such as `accuracy >= 0.9`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// The evaluation result compared.
    pub metric: Metric,
    /// How it is compared.
    pub op: Comparison,
    /// The value it is compared with.
    pub value: f64,
}

const FORM: &str = "\"<metric> <comparison> <number>\", such as \"accuracy >= 0.9\"";

impl FromStr for Target {
    type Err = String;

    /// Parses `<metric> <op> <number>`; spaces around the operator are optional.
    fn from_str(s: &str) -> Result<Target, String> {
        let text = s.trim();
        let name_end = text
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(text.len());
        let (name, rest) = text.split_at(name_end);
        if name.is_empty() {
            return Err(format!("expected {FORM}, got {s:?}"));
        }
        let metric: Metric = name.parse()?;
        let rest = rest.trim_start();
        let op = Comparison::ALL
            .into_iter()
            .find(|op| rest.starts_with(op.as_str()))
            .ok_or_else(|| {
                let shown: String = rest
                    .chars()
                    .take_while(|c| !c.is_ascii_digit() && !c.is_whitespace() && *c != '.')
                    .collect();
                if shown.is_empty() {
                    format!("no comparison after {name:?}; use >=, >, <= or <, as in {FORM}")
                } else {
                    format!("unknown comparison {shown:?}; use >=, >, <= or <")
                }
            })?;
        let number = rest[op.as_str().len()..].trim();
        if number.is_empty() {
            return Err(format!(
                "no number after {:?}; expected {FORM}",
                op.as_str()
            ));
        }
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{number:?} is not a number; expected {FORM}"))?;
        let (lo, hi, range) = metric.range();
        if !value.is_finite() || value < lo || value > hi {
            return Err(format!(
                "{metric} is {range}, so a target of {number} can never be met"
            ));
        }
        Ok(Target { metric, op, value })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.metric, self.op.as_str(), self.value)
    }
}

/// Written as in `trainer.toml`, so a recorded config reads back.
impl Serialize for Target {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Target {
    /// The metric's value in `eval` when it meets the target.
    pub fn met_by(&self, eval: &EvalRecord) -> Option<f64> {
        self.metric
            .value_in(eval)
            .filter(|&v| self.op.holds(v, self.value))
    }

    /// The best value of the metric over `evals` (the highest for `>=`/`>`, the lowest for
    /// `<=`/`<`) with the batch it came at; `None` when no evaluation has the metric.
    pub fn best_in(&self, evals: &[EvalRecord]) -> Option<(f64, u64)> {
        let better = |a: f64, b: f64| {
            if self.op.higher_is_better() {
                a > b
            } else {
                a < b
            }
        };
        evals
            .iter()
            .filter_map(|e| Some((self.metric.value_in(e)?, e.batch)))
            .filter(|(v, _)| !v.is_nan())
            .fold(None, |best, (v, b)| match best {
                Some((bv, _)) if !better(v, bv) => best,
                _ => Some((v, b)),
            })
    }

    /// Whether `reached` records this target (a resumed run may have been given another). The
    /// value went through a checkpoint's JSON, which need not give back its last bit.
    pub fn is_recorded_by(&self, reached: &TargetReached) -> bool {
        reached.metric == self.metric
            && reached.op == self.op
            && (reached.value - self.value).abs() <= 1e-12 * self.value.abs().max(1.0)
    }
}

/// When a run first met `train.target`: the evaluation's position and what it had cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetReached {
    /// The metric of the target.
    pub metric: Metric,
    /// Its comparison.
    pub op: Comparison,
    /// The target value.
    pub value: f64,
    /// The metric's value at that evaluation.
    pub reached_value: f64,
    /// Epochs completed then.
    pub epoch: u64,
    /// Batches completed then.
    pub batch: u64,
    /// Samples trained on then (as the clock counts them).
    pub samples: u64,
    /// Tokens trained on then (language models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Seconds spent training until then (excluding evaluation; summed over resumes).
    pub train_seconds: f64,
    /// Wall-clock seconds from the start of the run (of the process that reached it, for a
    /// resumed run) to the end of that evaluation.
    pub wall_seconds: f64,
    /// Cost of `wall_seconds` at `usd_per_hour`, when given.
    pub estimated_cost_usd: Option<f64>,
}

impl TargetReached {
    /// The target it records, as written in `trainer.toml`.
    pub fn target(&self) -> Target {
        Target {
            metric: self.metric,
            op: self.op,
            value: self.value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(batch: u64, accuracy: f64, cross_entropy: f64) -> EvalRecord {
        EvalRecord {
            epoch: 0,
            batch,
            accuracy,
            cross_entropy,
            samples: 10,
            tokens: None,
            perplexity: None,
            extra: Default::default(),
        }
    }

    #[test]
    fn targets_parse_with_or_without_spaces_and_print_back() {
        let t: Target = "accuracy >= 0.9".parse().expect("a target");
        assert_eq!(
            t,
            Target {
                metric: Metric::Accuracy,
                op: Comparison::AtLeast,
                value: 0.9
            }
        );
        assert_eq!(t.to_string(), "accuracy >= 0.9");
        let t: Target = "  cross_entropy<0.35 ".parse().expect("a target");
        assert_eq!(
            (t.metric, t.op, t.value),
            (Metric::CrossEntropy, Comparison::Below, 0.35)
        );
        let t: Target = "perplexity <= 20".parse().expect("a target");
        assert_eq!((t.op, t.value), (Comparison::AtMost, 20.0));
        let t: Target = "accuracy>1e-1".parse().expect("a target");
        assert_eq!((t.op, t.value), (Comparison::Above, 0.1));
    }

    #[test]
    fn bad_targets_say_what_is_wrong() {
        let err = |s: &str| s.parse::<Target>().expect_err(s);
        assert_eq!(
            err("acc >= 0.9"),
            "unknown metric \"acc\"; use accuracy (or top1), top2, top3, ... (topK), f1, \
             cross_entropy or perplexity"
        );
        for bad in ["top0", "top05", "top+5", "top", "topfive"] {
            assert!(
                err(&format!("{bad} >= 0.5")).starts_with("unknown metric"),
                "{bad}"
            );
        }
        assert_eq!(
            err("accuracy == 0.9"),
            "unknown comparison \"==\"; use >=, >, <= or <"
        );
        assert!(err("accuracy 0.9").starts_with("no comparison after \"accuracy\""));
        assert!(err("accuracy >=").starts_with("no number after \">=\""));
        assert!(err("accuracy >= high").starts_with("\"high\" is not a number"));
        assert!(err(">= 0.9").starts_with("expected \"<metric> <comparison> <number>\""));
        assert!(err("").starts_with("expected"));
        assert_eq!(
            err("accuracy >= 1.5"),
            "accuracy is between 0 and 1, so a target of 1.5 can never be met"
        );
        assert!(err("cross_entropy < -1").starts_with("cross_entropy is >= 0"));
        assert!(err("perplexity < 0.5").starts_with("perplexity is >= 1"));
        assert!(err("accuracy >= nan").contains("can never be met"));
    }

    #[test]
    fn a_target_is_met_by_the_evaluations_on_its_side() {
        let t: Target = "accuracy >= 0.5".parse().expect("a target");
        assert_eq!(t.met_by(&eval(1, 0.5, 1.0)), Some(0.5));
        assert_eq!(t.met_by(&eval(1, 0.49, 1.0)), None);
        let t: Target = "cross_entropy < 0.5".parse().expect("a target");
        assert_eq!(t.met_by(&eval(1, 0.9, 0.5)), None);
        assert_eq!(t.met_by(&eval(1, 0.9, 0.4)), Some(0.4));
        assert_eq!(t.met_by(&eval(1, 0.9, f64::NAN)), None);
        // Perplexity exists only for language models.
        let t: Target = "perplexity < 100".parse().expect("a target");
        assert_eq!(t.met_by(&eval(1, 0.9, 0.4)), None);
    }

    #[test]
    fn the_best_value_follows_the_direction_of_the_comparison() {
        let evals = [eval(2, 0.3, 2.0), eval(4, 0.6, 1.5), eval(6, 0.5, 1.2)];
        let up: Target = "accuracy > 0.9".parse().expect("a target");
        assert_eq!(up.best_in(&evals), Some((0.6, 4)));
        let down: Target = "cross_entropy <= 0.1".parse().expect("a target");
        assert_eq!(down.best_in(&evals), Some((1.2, 6)));
        assert_eq!(up.best_in(&[]), None);
    }

    #[test]
    fn a_record_belongs_to_the_same_target_only() {
        let t: Target = "accuracy >= 0.7".parse().expect("a target");
        let reached = TargetReached {
            metric: t.metric,
            op: t.op,
            value: 0.7 + f64::EPSILON,
            reached_value: 0.72,
            epoch: 0,
            batch: 25,
            samples: 1600,
            tokens: None,
            train_seconds: 1.0,
            wall_seconds: 2.0,
            estimated_cost_usd: None,
        };
        assert!(t.is_recorded_by(&reached));
        assert_eq!(
            reached.target().to_string(),
            "accuracy >= 0.7000000000000002"
        );
        for other in ["accuracy >= 0.8", "accuracy > 0.7", "cross_entropy >= 0.7"] {
            let other: Target = other.parse().expect("a target");
            assert!(!other.is_recorded_by(&reached), "{other}");
        }
    }

    #[test]
    fn top_k_and_f1_targets_read_the_evaluations_extra_metrics() {
        let t: Target = "top5 >= 0.9".parse().expect("a target");
        assert_eq!(
            (t.metric, t.op, t.value),
            (Metric::TopK(5), Comparison::AtLeast, 0.9)
        );
        assert_eq!(t.to_string(), "top5 >= 0.9");
        let t1: Target = "top1 > 0.5".parse().expect("a target");
        assert_eq!(t1.metric, Metric::Accuracy);
        let mut e = eval(3, 0.5, 1.0);
        // Not computed by this evaluation: never met.
        assert_eq!(t.met_by(&e), None);
        e.extra.0.insert("top5".to_owned(), 0.95);
        assert_eq!(t.met_by(&e), Some(0.95));
        let f1: Target = "f1 >= 0.8".parse().expect("a target");
        e.extra.0.insert("f1".to_owned(), 0.75);
        assert_eq!(f1.met_by(&e), None);
        assert_eq!(f1.best_in(&[e.clone()]), Some((0.75, 3)));
        // Recorded by name, and read back.
        let json = serde_json::to_value(Metric::TopK(5)).expect("json");
        assert_eq!(json, serde_json::json!("top5"));
        let back: Metric = serde_json::from_value(json).expect("a metric");
        assert_eq!(back, Metric::TopK(5));
        let record: EvalRecord = serde_json::from_value(serde_json::json!({
            "epoch": 0, "batch": 3, "accuracy": 0.5, "cross_entropy": 1.0, "samples": 10,
            "top5": 0.95, "f1": 0.75, "note": "a later field"
        }))
        .expect("a record");
        assert_eq!(record, e);
        let written = serde_json::to_value(&record).expect("json");
        assert_eq!(written["top5"], 0.95);
        assert!(written.get("note").is_none());
    }

    #[test]
    fn a_target_serializes_as_written() {
        let t: Target = "accuracy >= 0.9".parse().expect("a target");
        assert_eq!(
            serde_json::to_value(t).expect("json"),
            serde_json::json!("accuracy >= 0.9")
        );
    }
}
