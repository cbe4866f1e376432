//! The training loss (`train.loss`): cross-entropy against class indices or class
//! probabilities (Composer's `soft_cross_entropy`), or binary cross-entropy over one-hot or
//! probability targets (Composer's `binary_cross_entropy_with_logits`), reduced as Composer
//! reduces them or kept per sample.

use tch::{Kind, Reduction, TchError, Tensor};

/// What to do when the training loss is NaN or infinite (`train.nonfinite_loss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NonFiniteLoss {
    /// Stop the run with an error before the update; checkpoints already written stay as they
    /// are (default).
    #[default]
    Stop,
    /// Skip the update (the weights do not change), warn, and go on with the next batch.
    Skip,
}

impl NonFiniteLoss {
    /// Every policy with the name used in `trainer.toml`.
    pub const CHOICES: [(&'static str, NonFiniteLoss); 2] =
        [("stop", NonFiniteLoss::Stop), ("skip", NonFiniteLoss::Skip)];
}

/// `train.loss`: which function of the logits and targets is trained on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// Softmax cross-entropy, [`cross_entropy_with`] (default).
    #[default]
    CrossEntropy,
    /// Per-class sigmoid binary cross-entropy, [`binary_cross_entropy_with`].
    BinaryCrossEntropy,
}

impl LossKind {
    /// Every loss with its name in `trainer.toml`.
    pub const CHOICES: [(&'static str, LossKind); 2] = [
        ("cross_entropy", LossKind::CrossEntropy),
        ("binary_cross_entropy", LossKind::BinaryCrossEntropy),
    ];
}

/// The index target value that cross-entropy ignores unless `train.ignore_index` says
/// otherwise (PyTorch's default).
pub const DEFAULT_IGNORE_INDEX: i64 = -100;

/// The training loss of a run: `train.loss` and `train.ignore_index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loss {
    /// The function.
    pub kind: LossKind,
    /// Index targets equal to it count in neither the cross-entropy nor its mean (PyTorch's
    /// `ignore_index`).
    pub ignore_index: i64,
}

impl Default for Loss {
    fn default() -> Self {
        Loss {
            kind: LossKind::CrossEntropy,
            ignore_index: DEFAULT_IGNORE_INDEX,
        }
    }
}

impl Loss {
    /// The loss of `logits` against `target` (indices or probabilities): the reduced value the
    /// step trains on, or one value per sample when `per_sample` is set (their mean is the
    /// reduced value for both losses, as long as no index target is ignored).
    pub fn compute(
        &self,
        logits: &Tensor,
        target: &Tensor,
        per_sample: bool,
    ) -> Result<Tensor, TchError> {
        match self.kind {
            LossKind::CrossEntropy => {
                cross_entropy_ignoring(logits, target, per_sample, self.ignore_index)
            }
            LossKind::BinaryCrossEntropy => binary_cross_entropy_with(logits, target, per_sample),
        }
    }
}

/// Binary cross-entropy of `logits` (N, C, ...) against index targets (N, ...), turned into
/// one-hot vectors over the C classes, or probability targets of the logits' shape (label
/// smoothing, MixUp, CutMix): Composer's `binary_cross_entropy_with_logits` with its defaults
/// (as its ResNet recipes use it), `Σ bce(x, t) / N` — the element-wise
/// `max(x,0) − x·t + log(1 + e^{−|x|})` summed over every class (and position), divided by the
/// batch size N, not averaged over the classes (which would make the loss ~1/C as large and
/// call for a C× larger learning rate). Per sample (`per_sample`): the sum over that sample's
/// classes (and positions), so the per-sample values average to the reduced loss.
pub fn binary_cross_entropy_with(
    logits: &Tensor,
    target: &Tensor,
    per_sample: bool,
) -> Result<Tensor, TchError> {
    let dense = if target.is_floating_point() {
        target.shallow_clone()
    } else {
        let classes = logits.size().get(1).copied().unwrap_or(0);
        // (N, ...) → (N, ..., C) → (N, C, ...), as Composer's `ensure_targets_one_hot`.
        let one_hot = target.f_one_hot(classes)?;
        let last = one_hot.dim() as i64 - 1;
        one_hot.f_movedim([last], [1])?.f_to_kind(logits.kind())?
    };
    let each =
        logits.f_binary_cross_entropy_with_logits::<Tensor>(&dense, None, None, Reduction::None)?;
    let n = logits.size().first().copied().unwrap_or(0);
    if per_sample {
        return each
            .f_reshape([n, -1])?
            .f_sum_dim_intlist(1, false, Kind::Float);
    }
    each.f_sum(Kind::Float)?.f_div_scalar(n.max(1))
}

/// Cross-entropy of `logits` (N, C, ...) against index targets (N, ...) or probability targets
/// (same shape as `logits`): the mean, or one value per sample (shape (N, ...)) when
/// `per_sample` is set.
///
/// For probability targets the mean is Composer's `soft_cross_entropy`: the per-sample losses
/// `−Σ_c t·log_softmax(x)` averaged and re-weighted by `numel / Σ t`, i.e. their sum divided by
/// the total target probability, so targets whose rows do not sum to one (a zero row for an
/// ignored sample, scaled targets) weigh as Composer weighs them. Per-sample losses are not
/// re-weighted (Composer's `reduction = "none"`).
///
/// Sequence outputs (a language model's `[B, T, V]` logits against `[B, T]` next-token ids or
/// `[B, T, V]` probabilities) are scored per token: the mean is over all B×T tokens (as Hugging
/// Face's language-model loss), and a sample's loss is the mean over its T tokens.
pub fn cross_entropy_with(
    logits: &Tensor,
    target: &Tensor,
    per_sample: bool,
) -> Result<Tensor, TchError> {
    cross_entropy_ignoring(logits, target, per_sample, DEFAULT_IGNORE_INDEX)
}

/// [`cross_entropy_with`], with index targets equal to `ignore_index` left out of the loss
/// and of its mean (as PyTorch's `ignore_index`; an ignored sample's per-sample loss is 0).
/// Probability targets have no index to ignore: a sample whose row sums to 0 is left out by
/// the re-weighting instead.
pub fn cross_entropy_ignoring(
    logits: &Tensor,
    target: &Tensor,
    per_sample: bool,
    ignore_index: i64,
) -> Result<Tensor, TchError> {
    if logits.dim() == 3 {
        let size = logits.size();
        let (b, t, v) = (size[0], size[1], size[2]);
        let flat_target = if target.is_floating_point() {
            target.f_reshape([b * t, v])?
        } else {
            target.f_reshape([b * t])?
        };
        let flat = cross_entropy_ignoring(
            &logits.f_reshape([b * t, v])?,
            &flat_target,
            per_sample,
            ignore_index,
        )?;
        return if per_sample {
            flat.f_view([b, t])?.f_mean_dim(1, false, flat.kind())
        } else {
            Ok(flat)
        };
    }
    if !target.is_floating_point() {
        let reduction = if per_sample {
            Reduction::None
        } else {
            Reduction::Mean
        };
        return logits.f_cross_entropy_loss::<Tensor>(target, None, reduction, ignore_index, 0.0);
    }
    let losses = logits
        .f_log_softmax(1, Kind::Float)?
        .f_mul(target)?
        .f_sum_dim_intlist(1, false, Kind::Float)?
        .f_neg()?;
    if per_sample {
        return Ok(losses);
    }
    losses
        .f_sum(Kind::Float)?
        .f_div(&target.f_sum(Kind::Float)?)
}

/// The mean cross-entropy (see [`cross_entropy_with`]).
pub fn cross_entropy(logits: &Tensor, target: &Tensor) -> Result<Tensor, TchError> {
    cross_entropy_with(logits, target, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_sample_losses_average_to_the_mean_for_both_target_kinds() {
        let logits = Tensor::from_slice(&[2.0f32, 0.5, -1.0, 0.0, 1.0, 3.0]).view([2, 3]);
        let index = Tensor::from_slice(&[0i64, 2]);
        let dense = index.one_hot(3).to_kind(Kind::Float);
        for target in [&index, &dense] {
            let each = cross_entropy_with(&logits, target, true).unwrap();
            assert_eq!(each.size(), vec![2]);
            let mean = cross_entropy(&logits, target).unwrap().double_value(&[]);
            assert!((each.mean(Kind::Float).double_value(&[]) - mean).abs() < 1e-6);
        }
    }

    #[test]
    fn sequence_losses_are_per_token() {
        tch::manual_seed(3);
        let logits = Tensor::randn([2, 5, 7], (Kind::Float, tch::Device::Cpu));
        let target = Tensor::randint(7, [2, 5], (Kind::Int64, tch::Device::Cpu));
        let mean = cross_entropy(&logits, &target).unwrap().double_value(&[]);
        let flat = cross_entropy(&logits.reshape([10, 7]), &target.reshape([10]))
            .unwrap()
            .double_value(&[]);
        assert!((mean - flat).abs() < 1e-6);
        let each = cross_entropy_with(&logits, &target, true).unwrap();
        assert_eq!(each.size(), vec![2]);
        let first = cross_entropy(&logits.get(0), &target.get(0))
            .unwrap()
            .double_value(&[]);
        assert!((each.double_value(&[0]) - first).abs() < 1e-6);
        let dense = target.one_hot(7).to_kind(Kind::Float);
        let soft = cross_entropy(&logits, &dense).unwrap().double_value(&[]);
        assert!((soft - mean).abs() < 1e-5, "{soft} vs {mean}");
    }

    /// Three samples of four classes with probability targets (the second row all zero).
    fn soft_case() -> (Tensor, Tensor) {
        let logits = Tensor::from_slice(&[
            2.0f32, 0.5, -1.0, 0.0, //
            0.3, 1.0, 3.0, -2.0, //
            -0.5, 0.0, 0.25, 1.5,
        ])
        .view([3, 4]);
        let target = Tensor::from_slice(&[
            0.7f32, 0.1, 0.1, 0.1, //
            0.0, 0.0, 0.0, 0.0, //
            0.05, 0.05, 0.1, 0.8,
        ])
        .view([3, 4]);
        (logits, target)
    }

    #[test]
    fn soft_targets_are_reweighted_by_their_total_probability_as_composer_does() {
        // Composer's soft_cross_entropy: mean(per-sample) · numel / Σt. Scaling every target
        // leaves the mean unchanged (the per-sample losses scale with it) ...
        let (logits, target) = soft_case();
        let mean = cross_entropy(&logits, &target).unwrap().double_value(&[]);
        let scaled = cross_entropy(&logits, &(&target * 0.5))
            .unwrap()
            .double_value(&[]);
        assert!((scaled - mean).abs() < 1e-6 * mean, "{scaled} vs {mean}");
        let each = cross_entropy_with(&logits, &(&target * 0.5), true).unwrap();
        let whole = cross_entropy_with(&logits, &target, true).unwrap();
        assert!(each.allclose(&(&whole * 0.5), 1e-6, 1e-7, false));
        // ... and a sample without probability (an all-zero row) does not count in the mean:
        // it equals the mean over the other samples alone.
        let rows = Tensor::from_slice(&[0i64, 2]);
        let others = cross_entropy(
            &logits.index_select(0, &rows),
            &target.index_select(0, &rows),
        )
        .unwrap()
        .double_value(&[]);
        assert!((others - mean).abs() < 1e-6 * mean, "{others} vs {mean}");
        // The plain mean of the per-sample losses (no re-weighting) is different here.
        let plain = whole.mean(Kind::Float).double_value(&[]);
        assert!((plain - mean).abs() > 0.1 * mean, "{plain} vs {mean}");
    }

    /// `max(x, 0) − x·t + log(1 + e^{−|x|})`, the element-wise BCE with logits, in f64.
    fn bce(x: f64, t: f64) -> f64 {
        x.max(0.0) - x * t + (-x.abs()).exp().ln_1p()
    }

    #[test]
    fn binary_cross_entropy_sums_over_classes_and_divides_by_the_batch() {
        let (logits, soft) = soft_case();
        let x: Vec<f32> = Vec::try_from(logits.reshape([-1])).unwrap();
        let t: Vec<f32> = Vec::try_from(soft.reshape([-1])).unwrap();
        let rows: Vec<f64> = (0..3)
            .map(|r| {
                (0..4)
                    .map(|c| bce(f64::from(x[r * 4 + c]), f64::from(t[r * 4 + c])))
                    .sum()
            })
            .collect();
        let expected = rows.iter().sum::<f64>() / 3.0;
        let ours = binary_cross_entropy_with(&logits, &soft, false)
            .unwrap()
            .double_value(&[]);
        assert!((ours - expected).abs() < 1e-5, "{ours} vs {expected}");
        let each = binary_cross_entropy_with(&logits, &soft, true).unwrap();
        assert_eq!(each.size(), vec![3]);
        for (r, want) in rows.iter().enumerate() {
            let got = each.double_value(&[r as i64]);
            assert!((got - want).abs() < 1e-5, "row {r}: {got} vs {want}");
        }
    }

    #[test]
    fn binary_cross_entropy_of_indices_is_that_of_their_one_hot() {
        let (logits, _) = soft_case();
        let index = Tensor::from_slice(&[0i64, 2, 3]);
        let dense = index.one_hot(4).to_kind(Kind::Float);
        let a = binary_cross_entropy_with(&logits, &index, false).unwrap();
        let b = binary_cross_entropy_with(&logits, &dense, false).unwrap();
        assert!((a.double_value(&[]) - b.double_value(&[])).abs() < 1e-6);
        // (N, C, H, W) logits against (N, H, W) indices: one-hot along the class dimension.
        tch::manual_seed(5);
        let maps = Tensor::randn([2, 3, 2, 2], (Kind::Float, tch::Device::Cpu));
        let labels = Tensor::randint(3, [2, 2, 2], (Kind::Int64, tch::Device::Cpu));
        let one_hot = labels.one_hot(3).permute([0, 3, 1, 2]).to_kind(Kind::Float);
        let a = binary_cross_entropy_with(&maps, &labels, false).unwrap();
        let b = binary_cross_entropy_with(&maps, &one_hot, false).unwrap();
        assert!((a.double_value(&[]) - b.double_value(&[])).abs() < 1e-6);
        // An index outside the classes is an error, not a panic.
        assert!(
            binary_cross_entropy_with(&logits, &Tensor::from_slice(&[0i64, 9, 1]), false).is_err()
        );
    }

    #[test]
    fn ignored_index_targets_leave_the_cross_entropy_mean() {
        let (logits, _) = soft_case();
        let target = Tensor::from_slice(&[0i64, 7, 3]);
        let loss = Loss {
            kind: LossKind::CrossEntropy,
            ignore_index: 7,
        };
        let mean = loss
            .compute(&logits, &target, false)
            .unwrap()
            .double_value(&[]);
        let rows = Tensor::from_slice(&[0i64, 2]);
        let kept = cross_entropy(
            &logits.index_select(0, &rows),
            &target.index_select(0, &rows),
        )
        .unwrap()
        .double_value(&[]);
        assert!((mean - kept).abs() < 1e-6, "{mean} vs {kept}");
        let each = loss.compute(&logits, &target, true).unwrap();
        assert_eq!(each.double_value(&[1]), 0.0);
    }
}
