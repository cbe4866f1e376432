#![doc = include_str!("../README.md")]

use tessera_plugin_api::device::upload;
use tessera_plugin_api::targets::{mix, mix_one_hot};
use tessera_plugin_api::tch::{TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Settings,
};

/// Composer's `_gen_mixing_coef`: `m = min(z, 1 − z)` with `z ~ Beta(alpha, alpha)` drawn by
/// `beta`, so `m ≤ 0.5` and the original sample always weighs at least half; `alpha = 0` gives
/// `m = 0` without a draw.
pub fn mixing_coefficient(alpha: f64, beta: impl FnOnce(f64, f64) -> f64) -> f64 {
    if alpha == 0.0 {
        return 0.0;
    }
    let z = beta(alpha, alpha);
    z.min(1.0 - z)
}

/// Composer's `mixup_batch(input, target, mixing, indices)`: returns
/// `((1 − m)·input + m·input[indices], target[indices])`.
pub fn mixup_batch(
    input: &Tensor,
    target: &Tensor,
    mixing: f64,
    indices: &Tensor,
) -> Result<(Tensor, Tensor), TchError> {
    let permuted = input.f_index_select(0, indices)?;
    let mixed = mix(input, 1.0 - mixing, &permuted, mixing)?;
    Ok((mixed, target.f_index_select(0, indices)?))
}

/// The mixed target of MixUp's `before_loss`:
/// `(1 − m)·onehot(target) + m·onehot(permuted_target)`, one-hot sized by the model `output`
/// (Composer's `ensure_targets_one_hot`; probability targets are mixed as they are).
pub fn mix_targets(
    output: &Tensor,
    target: &Tensor,
    permuted_target: &Tensor,
    mixing: f64,
) -> Result<Tensor, TchError> {
    mix_one_hot(output, target, 1.0 - mixing, permuted_target, mixing)
}

/// The interpolated loss of MixUp's `before_backward`: `(1 − m)·loss + m·permuted_loss`.
pub fn mix_losses(loss: &Tensor, permuted_loss: &Tensor, mixing: f64) -> Result<Tensor, TchError> {
    mix(loss, 1.0 - mixing, permuted_loss, mixing)
}

/// What `before_forward` drew for the current microbatch.
struct Draw {
    mixing: f64,
    permuted_target: Tensor,
}

/// The MixUp method.
pub struct MixUp {
    alpha: f64,
    interpolate_loss: bool,
    draw: Option<Draw>,
}

impl MixUp {
    fn before_forward(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
        let target = ctx
            .tensor(keys::TARGET)
            .ok_or("the batch has no `target`")?;
        let n = *input
            .size()
            .first()
            .ok_or("the batch `input` is a scalar")?;
        // Composer draws the coefficient, then the permutation.
        let mixing = mixing_coefficient(self.alpha, |a, b| ctx.rng_beta(a, b));
        let perm = ctx.rng_permutation(n as usize);
        // Through pinned memory, without a blocking copy (which would drain a GPU's queue).
        let indices = upload(&Tensor::f_from_slice(&perm)?, input.device())?;
        let (mixed, permuted_target) = mixup_batch(&input, &target, mixing, &indices)?;
        ctx.set_tensor(keys::INPUT, mixed)?;
        ctx.log_metric("mixup/mixing", mixing);
        self.draw = Some(Draw {
            mixing,
            permuted_target,
        });
        Ok(())
    }

    fn draw(&mut self, event: Event) -> Result<Draw, Error> {
        self.draw.take().ok_or_else(|| {
            Error::from(format!(
                "mixup reached `{}` without a draw from `before_forward`",
                event.name()
            ))
        })
    }
}

impl Method for MixUp {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        match event {
            Event::BEFORE_FORWARD => self.before_forward(ctx),
            Event::BEFORE_LOSS if !self.interpolate_loss => {
                let draw = self.draw(event)?;
                let output = ctx
                    .tensor(keys::OUTPUT)
                    .ok_or("no model output at before_loss")?;
                let target = ctx
                    .tensor(keys::TARGET)
                    .ok_or("the batch has no `target`")?;
                let mixed = mix_targets(&output, &target, &draw.permuted_target, draw.mixing)?;
                ctx.set_tensor(keys::TARGET, mixed)
            }
            Event::BEFORE_BACKWARD if self.interpolate_loss => {
                let draw = self.draw(event)?;
                let output = ctx
                    .tensor(keys::OUTPUT)
                    .ok_or("no model output at before_backward")?;
                let loss = ctx.tensor(keys::LOSS).ok_or("no loss at before_backward")?;
                let permuted_loss = ctx.loss(&output, &draw.permuted_target, false)?;
                ctx.set_tensor(keys::LOSS, mix_losses(&loss, &permuted_loss, draw.mixing)?)
            }
            _ => Ok(()),
        }
    }
}

impl Plugin for MixUp {
    const NAME: &'static str = "mixup";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "trains on convex mixes (1-m)·x + m·x[perm] of batch pairs, with mixed targets or loss";
    const DEFAULT_SETTINGS: &'static str = "alpha = 0.2\ninterpolate_loss = false";

    fn hooks() -> Vec<Hook> {
        vec![
            Hook::at(Event::BEFORE_FORWARD),
            Hook::at(Event::BEFORE_LOSS),
            Hook::at(Event::BEFORE_BACKWARD),
        ]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let alpha = settings.f64("alpha")?;
        let interpolate_loss = settings.bool("interpolate_loss")?;
        if !(alpha >= 0.0 && alpha.is_finite()) {
            return Err(Error::config(format!(
                "`alpha` must be a finite number >= 0, got {alpha}"
            )));
        }
        Ok(MixUp {
            alpha,
            interpolate_loss,
            draw: None,
        })
    }
}

export_plugin!(MixUp);
