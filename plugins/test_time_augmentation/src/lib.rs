#![doc = include_str!("../README.md")]

mod views;

pub use views::{averaged_logits, selective_logits, Level};

use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Settings,
};

/// The metric logged at `eval_end` in selective mode: the share of the evaluated samples that
/// were augmented.
pub const AUGMENTED_FRACTION: &str = "test_time_augmentation/augmented_fraction";

/// The test-time augmentation method.
pub struct TestTimeAugmentation {
    level: Level,
    /// Selective mode: augment only samples whose top softmax probability is below this.
    confidence: Option<f64>,
    /// Samples augmented and seen in this evaluation (selective mode).
    augmented: i64,
    seen: i64,
}

impl TestTimeAugmentation {
    /// Replaces `output` by the augmented average (at `eval_after_forward` or
    /// `predict_after_forward`).
    fn augment(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
        let output = ctx
            .tensor(keys::OUTPUT)
            .ok_or("no model output after the forward")?;
        check_image(&input, "the evaluation batch's `input`")?;
        if output.dim() != 2 {
            return Err(format!(
                "test_time_augmentation averages class logits (N, classes); the model's output \
                 has shape {:?}",
                output.size()
            )
            .into());
        }
        let mut forward = |x: &Tensor| ctx.forward_eval(x);
        let averaged = match self.confidence {
            None => averaged_logits(&mut forward, &input, &output, self.level)?,
            Some(confidence) => {
                let (logits, n) =
                    selective_logits(&mut forward, &input, &output, self.level, confidence)?;
                self.augmented += n;
                self.seen += output.size()[0];
                logits
            }
        };
        ctx.set_tensor(keys::OUTPUT, averaged)
    }
}

/// Fails unless `input` is a batch of images `(N, C, H, W)` with `H, W ≥ 2` (reflect padding
/// by one pixel needs two).
fn check_image(input: &Tensor, what: &str) -> Result<(), Error> {
    let size = input.size();
    if size.len() != 4 || size[2] < 2 || size[3] < 2 {
        return Err(format!(
            "test_time_augmentation works on image batches (N, C, H, W) of at least 2x2 \
             pixels; {what} has shape {size:?} (a language model's tokens cannot be flipped)"
        )
        .into());
    }
    Ok(())
}

impl Method for TestTimeAugmentation {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        match event {
            Event::INIT => {
                // Refuse a run on text before it trains, not at its first evaluation.
                let sample = ctx.training_sample(1)?;
                let input = sample
                    .iter()
                    .find(|(name, _)| name == keys::INPUT)
                    .map(|(_, t)| t)
                    .ok_or(
                        "test_time_augmentation works on image batches; the training batches \
                         have no `input`",
                    )?;
                check_image(input, "a training batch's `input`")
            }
            Event::EVAL_START => {
                self.augmented = 0;
                self.seen = 0;
                Ok(())
            }
            Event::EVAL_AFTER_FORWARD | Event::PREDICT_AFTER_FORWARD => {
                if self.level == Level::None {
                    return Ok(());
                }
                self.augment(ctx)
            }
            Event::EVAL_END => {
                if self.confidence.is_some() && self.seen > 0 {
                    let fraction = self.augmented as f64 / self.seen as f64;
                    ctx.log_metric(AUGMENTED_FRACTION, fraction);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

impl Plugin for TestTimeAugmentation {
    const NAME: &'static str = "test_time_augmentation";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "averages the evaluation logits over mirrored and \
         1-pixel-shifted views of each test image (airbench's multi-crop TTA)";
    const DEFAULT_SETTINGS: &'static str = "level = 2";

    fn hooks() -> Vec<Hook> {
        vec![
            Hook::at(Event::INIT),
            Hook::at(Event::EVAL_START),
            Hook::at(Event::EVAL_AFTER_FORWARD),
            Hook::at(Event::EVAL_END),
            Hook::at(Event::PREDICT_AFTER_FORWARD),
        ]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let number = settings.u64("level")?;
        let level = Level::from_number(number).ok_or_else(|| {
            Error::config(format!(
                "`level` must be 0 (none), 1 (mirror) or 2 (mirror and 1-pixel translations), \
                 got {number}"
            ))
        })?;
        let confidence: Option<f64> = settings.get_or("confidence", None)?;
        if let Some(c) = confidence {
            if !(c > 0.0 && c <= 1.0) {
                return Err(Error::config(format!(
                    "`confidence` (selective TTA: augment samples whose top softmax \
                     probability is below it) must be in (0, 1], got {c}"
                )));
            }
            if level == Level::None {
                return Err(Error::config(
                    "`confidence` selects the samples to augment, but `level = 0` augments none",
                ));
            }
        }
        Ok(TestTimeAugmentation {
            level,
            confidence,
            augmented: 0,
            seen: 0,
        })
    }
}

export_plugin!(TestTimeAugmentation);
