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

/// Cross-entropy of `logits` (N, C) against index targets (N) or probability targets (N, C):
/// the mean over samples, or one value per sample (shape (N,)) when `per_sample` is set.
pub fn cross_entropy_with(
    logits: &Tensor,
    target: &Tensor,
    per_sample: bool,
) -> Result<Tensor, TchError> {
    let losses = if target.is_floating_point() {
        let log_probs = logits.f_log_softmax(1, Kind::Float)?;
        log_probs
            .f_mul(target)?
            .f_sum_dim_intlist(1, false, Kind::Float)?
            .f_neg()?
    } else {
        let reduction = if per_sample {
            Reduction::None
        } else {
            Reduction::Mean
        };
        let loss = logits.f_cross_entropy_loss::<Tensor>(target, None, reduction, -100, 0.0)?;
        if !per_sample {
            return Ok(loss);
        }
        loss
    };
    if per_sample {
        Ok(losses)
    } else {
        losses.f_mean(Kind::Float)
    }
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
}
