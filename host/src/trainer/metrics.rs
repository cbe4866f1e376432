//! The evaluation metrics beyond top-1 accuracy and cross-entropy (`train.metrics`): top-k
//! accuracies and macro-F1. Each batch adds counts on the device ([`Tally`]); the totals are
//! summed over the ranks and turned into values once, at the end of the evaluation.

use tch::{Device, Kind, TchError, Tensor};

use crate::report::{ExtraMetrics, Metric};

/// Models with at least this many classes report top-5 accuracy unless `train.metrics` says
/// otherwise (as ImageNet results do).
pub const TOP5_DEFAULT_CLASSES: i64 = 100;

/// What an evaluation computes beyond accuracy, cross-entropy and perplexity.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetricSet {
    /// The k of each top-k accuracy (k >= 2), ascending.
    pub top_k: Vec<u32>,
    /// Macro-F1.
    pub f1: bool,
}

impl MetricSet {
    /// The metrics of a run: `asked` (`train.metrics`; `None`: the default, top-5 for an
    /// image model of at least [`TOP5_DEFAULT_CLASSES`] classes) and the metrics the run
    /// watches (`watched`: the target's, the plateau schedule's, `keep_best`'s), for
    /// a model of `classes` outputs (`language`: next-token logits of a language model). An
    /// error names what cannot be computed: a k above the class count, F1 of a language model.
    pub fn resolve(
        asked: Option<&[Metric]>,
        watched: &[Metric],
        classes: i64,
        language: bool,
    ) -> Result<MetricSet, String> {
        let default = [Metric::TopK(5)];
        let asked = match asked {
            Some(list) => list,
            None if !language && classes >= TOP5_DEFAULT_CLASSES => &default[..],
            None => &[],
        };
        let mut set = MetricSet::default();
        for metric in asked.iter().chain(watched).copied() {
            match metric {
                Metric::TopK(k) => {
                    if i64::from(k) > classes {
                        return Err(format!(
                            "{metric} needs at least {k} classes, but the model has {classes} outputs"
                        ));
                    }
                    if !set.top_k.contains(&k) {
                        set.top_k.push(k);
                    }
                }
                Metric::F1 if language => {
                    return Err("f1 is for classification; a language model's evaluation \
                                reports accuracy, top-k, cross_entropy and perplexity"
                        .to_owned())
                }
                Metric::F1 => set.f1 = true,
                Metric::Accuracy | Metric::CrossEntropy | Metric::Perplexity => {}
            }
        }
        set.top_k.sort_unstable();
        Ok(set)
    }

    /// Whether there is anything to compute.
    pub fn is_empty(&self) -> bool {
        self.top_k.is_empty() && !self.f1
    }
}

/// Per-evaluation counts, on the device: top-k hits (one per k) and, for F1, per class the
/// true positives, the predictions and the targets.
pub struct Tally {
    set: MetricSet,
    classes: i64,
    hits: Tensor,
    counts: Option<Tensor>,
}

impl Tally {
    /// Zero counts of `set` for `classes` classes on `device`.
    pub fn new(set: MetricSet, classes: i64, device: Device) -> Result<Tally, TchError> {
        let hits = Tensor::f_zeros([set.top_k.len() as i64], (Kind::Int64, device))?;
        let counts = if set.f1 {
            Some(Tensor::f_zeros([3, classes], (Kind::Int64, device))?)
        } else {
            None
        };
        Ok(Tally {
            set,
            classes,
            hits,
            counts,
        })
    }

    /// Adds a batch of `logits` (N, C) and index targets (N,); targets equal to
    /// `ignore_index` count nowhere.
    pub fn add(
        &mut self,
        logits: &Tensor,
        target: &Tensor,
        ignore_index: i64,
    ) -> Result<(), TchError> {
        let valid = target.f_ne(ignore_index)?;
        if !self.set.top_k.is_empty() {
            let hits = top_k_correct(logits, target, &self.set.top_k, &valid)?;
            self.hits = self.hits.f_add(&hits)?;
        }
        if let Some(counts) = &mut self.counts {
            let batch = class_counts(logits, target, self.classes, &valid)?;
            *counts = counts.f_add(&batch)?;
        }
        Ok(())
    }

    /// The counts as one float64 vector on the device, to be read with the evaluation's other
    /// totals and summed over the ranks: the hits, then the three rows of class counts.
    pub fn totals(&self) -> Result<Tensor, TchError> {
        let mut parts = vec![self.hits.f_to_kind(Kind::Double)?];
        if let Some(counts) = &self.counts {
            parts.push(counts.f_reshape([-1])?.f_to_kind(Kind::Double)?);
        }
        Tensor::f_cat(&parts, 0)
    }

    /// The metrics from `totals` (as [`Tally::totals`] gave them, summed over the ranks) over
    /// `scored` targets.
    pub fn values(&self, totals: &[f64], scored: f64) -> ExtraMetrics {
        let mut out = ExtraMetrics::default();
        let (hits, counts) = totals.split_at(self.set.top_k.len().min(totals.len()));
        for (k, h) in self.set.top_k.iter().zip(hits) {
            let value = if scored > 0.0 { h / scored } else { 0.0 };
            out.0.insert(Metric::TopK(*k).as_str(), value);
        }
        if self.set.f1 {
            out.0.insert(Metric::F1.as_str(), macro_f1(counts));
        }
        out
    }
}

/// How many of the targets are among the k largest logits of their row, for each k of `ks`
/// (ascending, each <= C): an Int64 tensor of `ks.len()` counts. Only rows where `valid` is
/// set count. The ranking is `torch.topk`'s (sorted, largest first), so ties fall as there.
pub fn top_k_correct(
    logits: &Tensor,
    target: &Tensor,
    ks: &[u32],
    valid: &Tensor,
) -> Result<Tensor, TchError> {
    let k_max = ks.iter().copied().max().unwrap_or(1) as i64;
    let (_, indices) = logits.f_topk(k_max, 1, true, true)?;
    // found[n, j]: the target of row n is the j-th largest logit.
    let found = indices
        .f_eq_tensor(&target.f_unsqueeze(1)?)?
        .f_logical_and(&valid.f_unsqueeze(1)?)?
        .f_to_kind(Kind::Int64)?;
    // Hits within the first j+1 ranks, then the entries at k−1.
    let within = found
        .f_cumsum(1, Kind::Int64)?
        .f_sum_dim_intlist(0, false, Kind::Int64)?;
    let at: Vec<i64> = ks.iter().map(|&k| i64::from(k) - 1).collect();
    within.f_index_select(0, &Tensor::from_slice(&at).f_to(logits.device())?)
}

/// Per class, over the rows where `valid` is set: `[true positives, predictions, targets]`
/// of the top-1 predictions (argmax, ties to the lowest index), a (3, `classes`) Int64 tensor.
pub fn class_counts(
    logits: &Tensor,
    target: &Tensor,
    classes: i64,
    valid: &Tensor,
) -> Result<Tensor, TchError> {
    let predicted = logits.f_argmax(1, false)?.f_masked_select(valid)?;
    let actual = target.f_masked_select(valid)?;
    let right = actual.f_masked_select(&predicted.f_eq_tensor(&actual)?)?;
    let count = |t: &Tensor| t.f_bincount::<Tensor>(None, classes);
    Tensor::f_stack(&[count(&right)?, count(&predicted)?, count(&actual)?], 0)?
        .f_to_kind(Kind::Int64)
}

/// Macro-F1 from the class counts `[tp…, predicted…, actual…]` (three rows of C, as
/// [`class_counts`] gives them, flattened): the mean over the classes that were predicted or
/// are targets of `2·tp / (predicted + actual)` (= `2·tp / (2·tp + fp + fn)`); a class with no
/// true positive scores 0 (scikit-learn's `zero_division=0`); 0 when no class occurs.
pub fn macro_f1(counts: &[f64]) -> f64 {
    let c = counts.len() / 3;
    let (tp, rest) = counts.split_at(c);
    let (predicted, actual) = rest.split_at(c);
    let scores: Vec<f64> = (0..c)
        .filter(|&i| predicted[i] + actual[i] > 0.0)
        .map(|i| 2.0 * tp[i] / (predicted[i] + actual[i]))
        .collect();
    if scores.is_empty() {
        0.0
    } else {
        scores.iter().sum::<f64>() / scores.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four samples of five classes; the ranks of each row's logits are spelled out.
    fn case() -> (Tensor, Tensor) {
        let logits = Tensor::from_slice(&[
            // ranks: c2 > c0 > c4 > c1 > c3
            0.5f32, -1.0, 2.0, -3.0, 0.1, //
            // ranks: c1 > c3 > c0 > c2 > c4
            0.0, 4.0, -0.5, 1.0, -2.0, //
            // ranks: c4 > c3 > c2 > c1 > c0
            -4.0, -3.0, -2.0, -1.0, 0.0, //
            // ranks: c0 > c1 > c2 > c3 > c4
            3.0, 2.0, 1.0, 0.0, -1.0,
        ])
        .view([4, 5]);
        // Targets at ranks 2, 1, 5 and 1.
        let target = Tensor::from_slice(&[0i64, 1, 0, 0]);
        (logits, target)
    }

    fn counts_of(t: &Tensor) -> Vec<i64> {
        Vec::try_from(t).expect("an Int64 vector")
    }

    #[test]
    fn top_k_counts_targets_within_the_k_largest_logits() {
        let (logits, target) = case();
        let all = Tensor::ones([4], (Kind::Bool, Device::Cpu));
        let hits = top_k_correct(&logits, &target, &[1, 2, 4, 5], &all).unwrap();
        // Ranks 2, 1, 5, 1: top-1 has 2, top-2 has 3, top-4 has 3, top-5 all 4.
        assert_eq!(counts_of(&hits), vec![2, 3, 3, 4]);
        // An ignored row counts in no k.
        let valid = Tensor::from_slice(&[true, false, true, true]);
        let hits = top_k_correct(&logits, &target, &[1, 2, 5], &valid).unwrap();
        assert_eq!(counts_of(&hits), vec![1, 2, 3]);
    }

    #[test]
    fn top_k_follows_torch_topk_on_ties() {
        // Equal logits: torch.topk's order decides, whatever it is; top-1 by topk agrees with
        // the rank topk gives, and top-2 of two equal maxima always holds both.
        let logits = Tensor::from_slice(&[1.0f32, 1.0, 0.0]).view([1, 3]);
        let (_, order) = logits.topk(2, 1, true, true);
        let first = order.int64_value(&[0, 0]);
        let all = Tensor::ones([1], (Kind::Bool, Device::Cpu));
        for t in 0..2i64 {
            let hits = top_k_correct(&logits, &Tensor::from_slice(&[t]), &[1, 2], &all).unwrap();
            assert_eq!(counts_of(&hits), vec![i64::from(t == first), 1]);
        }
    }

    #[test]
    fn macro_f1_averages_the_classes_that_occur() {
        let (logits, target) = case();
        // Predictions (argmax): 2, 1, 4, 0; targets 0, 1, 0, 0.
        let all = Tensor::ones([4], (Kind::Bool, Device::Cpu));
        let counts = class_counts(&logits, &target, 5, &all).unwrap();
        assert_eq!(
            counts_of(&counts.reshape([-1])),
            vec![
                1, 1, 0, 0, 0, // true positives
                1, 1, 1, 0, 1, // predictions
                3, 1, 0, 0, 0, // targets
            ]
        );
        let values: Vec<f64> = counts_of(&counts.reshape([-1]))
            .into_iter()
            .map(|v| v as f64)
            .collect();
        // Class 0: P = 1, R = 1/3, F1 = 0.5; class 1: 1; classes 2 and 4 (predicted, never
        // right): 0; class 3 occurs nowhere and is skipped.
        let f1 = macro_f1(&values);
        assert!((f1 - (0.5 + 1.0 + 0.0 + 0.0) / 4.0).abs() < 1e-12, "{f1}");
        assert_eq!(macro_f1(&[0.0; 6]), 0.0);
    }

    #[test]
    fn the_default_set_adds_top5_for_a_hundred_classes_and_the_target_metric() {
        let resolve = MetricSet::resolve;
        assert!(resolve(None, &[], 10, false).unwrap().is_empty());
        assert_eq!(resolve(None, &[], 100, false).unwrap().top_k, vec![5]);
        assert!(resolve(None, &[], 50257, true).unwrap().is_empty());
        let set = resolve(
            Some(&[Metric::F1, Metric::TopK(3)]),
            &[Metric::TopK(2)],
            10,
            false,
        )
        .unwrap();
        assert_eq!(
            set,
            MetricSet {
                top_k: vec![2, 3],
                f1: true
            }
        );
        assert_eq!(
            resolve(Some(&[Metric::TopK(20)]), &[], 10, false).unwrap_err(),
            "top20 needs at least 20 classes, but the model has 10 outputs"
        );
        assert!(resolve(None, &[Metric::F1], 50257, true)
            .unwrap_err()
            .starts_with("f1 is for classification"));
        // An empty list turns the default off.
        assert!(resolve(Some(&[]), &[], 1000, false).unwrap().is_empty());
    }

    #[test]
    fn a_tally_sums_batches_into_values() {
        let (logits, target) = case();
        let set = MetricSet {
            top_k: vec![2],
            f1: true,
        };
        let mut tally = Tally::new(set, 5, Device::Cpu).unwrap();
        // The same batch twice: counts double, the values stay.
        tally.add(&logits, &target, -100).unwrap();
        tally.add(&logits, &target, -100).unwrap();
        let totals = crate::sync::read(&tally.totals().unwrap()).unwrap();
        assert_eq!(totals.len(), 1 + 15);
        assert_eq!(totals[0], 6.0);
        let values = tally.values(&totals, 8.0);
        assert_eq!(values.get("top2"), Some(0.75));
        assert!((values.get("f1").unwrap() - 0.375).abs() < 1e-12);
    }
}
