#![doc = include_str!("../README.md")]

use tessera_plugin_api::targets::ensure_one_hot;
use tessera_plugin_api::tch::{TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Settings,
};

/// Composer's `smooth_labels` (`composer/algorithms/label_smoothing/label_smoothing.py`).
///
/// `logits` has shape `(N, C, d_1, ..., d_K)`; only its shape is used (`C = logits.size()[1]`).
/// `targets` is either
/// - class indices of shape `(N, d_1, ..., d_K)` (any integer kind), turned one-hot with the
///   class dimension inserted at dim 1, as Composer's `ensure_targets_one_hot`; as there, a
///   negative index (e.g. an `ignore_index` of −100) gives an all-zero one-hot row, and an index
///   `>= C` is an error; or
/// - probabilities of the same shape as `logits`, used as they are.
///
/// The result is float32 `t·(1 − smoothing) + smoothing / C`: each one-hot row sums to 1, with
/// values `smoothing / C` and `1 − smoothing + smoothing / C`.
pub fn smooth_labels(
    logits: &Tensor,
    targets: &Tensor,
    smoothing: f64,
) -> Result<Tensor, TchError> {
    let dense = ensure_one_hot(logits, targets)?;
    let num_classes = logits.size()[1];
    dense
        .f_mul_scalar(1.0 - smoothing)?
        .f_add_scalar(smoothing / num_classes as f64)
}

/// The label-smoothing method.
pub struct LabelSmoothing {
    smoothing: f64,
    original_target: Option<Tensor>,
}

impl Method for LabelSmoothing {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        match event {
            Event::BEFORE_LOSS => {
                let output = ctx
                    .tensor(keys::OUTPUT)
                    .ok_or("no model output at before_loss")?;
                let target = ctx
                    .tensor(keys::TARGET)
                    .ok_or("the batch has no `target`")?;
                let smoothed = smooth_labels(&output, &target, self.smoothing)?;
                self.original_target = Some(target);
                ctx.set_tensor(keys::TARGET, smoothed)
            }
            Event::AFTER_LOSS => match self.original_target.take() {
                Some(target) => ctx.set_tensor(keys::TARGET, target),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

impl Plugin for LabelSmoothing {
    const NAME: &'static str = "label_smoothing";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "softens one-hot targets to (1-smoothing)·onehot + smoothing/K before the loss";
    const DEFAULT_SETTINGS: &'static str = "smoothing = 0.1";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::BEFORE_LOSS), Hook::at(Event::AFTER_LOSS)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let smoothing = settings.f64("smoothing")?;
        if !(0.0..=1.0).contains(&smoothing) {
            return Err(Error::config(format!(
                "`smoothing` must be in [0, 1], got {smoothing}"
            )));
        }
        Ok(LabelSmoothing {
            smoothing,
            original_target: None,
        })
    }
}

export_plugin!(LabelSmoothing);
