//! The training loss: cross-entropy against class indices or class probabilities (Composer's
//! `soft_cross_entropy`), reduced to a mean or kept per sample.

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
    if logits.dim() == 3 {
        let size = logits.size();
        let (b, t, v) = (size[0], size[1], size[2]);
        let flat_target = if target.is_floating_point() {
            target.f_reshape([b * t, v])?
        } else {
            target.f_reshape([b * t])?
        };
        let flat = cross_entropy_with(&logits.f_reshape([b * t, v])?, &flat_target, per_sample)?;
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
        return logits.f_cross_entropy_loss::<Tensor>(target, None, reduction, -100, 0.0);
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
}
