#![doc = include_str!("../README.md")]

use tessera_plugin_api::tch::{Kind, TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Settings,
};

/// How a batch is made smaller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Nearest-neighbour interpolation of the whole image.
    Resize,
    /// One random crop for the whole batch.
    Crop,
}

/// The scale schedule: Composer's `ProgressiveResizing` settings that decide the image size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    /// Scale at the start of training, in `(0, 1]`.
    pub initial_scale: f64,
    /// Fraction of training, at the end, on full-size images.
    pub finetune_fraction: f64,
    /// Fraction of training, at the start, at `initial_scale` before the ramp.
    pub delay_fraction: f64,
    /// The output width is a multiple of this many pixels.
    pub size_increment: i64,
}

impl Schedule {
    /// The (unpinned) scale at `elapsed` (the fraction of training done):
    /// `initial + (1 − initial)·f` with `f = 0` before `delay`, then
    /// `min((elapsed − delay) / (1 − finetune − delay), 1)`.
    pub fn scale(&self, elapsed: f64) -> f64 {
        let ramp = if elapsed >= self.delay_fraction {
            ((elapsed - self.delay_fraction) / (1.0 - self.finetune_fraction - self.delay_fraction))
                .min(1.0)
        } else {
            0.0
        };
        self.initial_scale + (1.0 - self.initial_scale) * ramp
    }

    /// The output width for an input `width` pixels wide at `scale`: the nearest multiple of
    /// `size_increment`, ties to even as Python's `round`.
    pub fn pinned_width(&self, width: i64, scale: f64) -> i64 {
        (width as f64 * scale / self.size_increment as f64).round_ties_even() as i64
            * self.size_increment
    }

    /// The scale actually applied for an input `width` pixels wide at `elapsed`: the pinned
    /// width over the width (Composer's `scale_factor_pinned`).
    pub fn pinned_scale(&self, width: i64, elapsed: f64) -> f64 {
        self.pinned_width(width, self.scale(elapsed)) as f64 / width as f64
    }
}

/// Nearest-neighbour resize of the last two dimensions of `images` (`(N, C, H, W)`) by
/// `scale`, exactly as PyTorch's `F.interpolate(mode="nearest", scale_factor=scale,
/// recompute_scale_factor=False)`: the output is `floor(H·scale) × floor(W·scale)` and pixel
/// `i` reads `min(floor(i / scale), H − 1)`.
pub fn resize_nearest(images: &Tensor, scale: f64) -> Result<Tensor, TchError> {
    let (height, width) = spatial(images, 4)?;
    let out = [
        (height as f64 * scale).floor() as i64,
        (width as f64 * scale).floor() as i64,
    ];
    images.f_upsample_nearest2d(out, scale, scale)
}

/// The crop of `images` (`(..., H, W)`) of `crop_h × crop_w` pixels whose top-left corner is
/// `(top, left)`.
pub fn crop(
    images: &Tensor,
    top: i64,
    left: i64,
    crop_h: i64,
    crop_w: i64,
) -> Result<Tensor, TchError> {
    let dims = images.dim() as i64;
    images
        .f_narrow(dims - 2, top, crop_h)?
        .f_narrow(dims - 1, left, crop_w)
}

/// The crop size for `size` pixels at `scale`: `int(scale·size)`.
pub fn crop_size(size: i64, scale: f64) -> i64 {
    (scale * size as f64) as i64
}

/// `(H, W)` of a tensor with at least `min_dims` dimensions.
fn spatial(t: &Tensor, min_dims: usize) -> Result<(i64, i64), TchError> {
    let size = t.size();
    if size.len() < min_dims {
        return Err(TchError::Shape(format!(
            "progressive resizing needs a tensor with at least {min_dims} dimensions \
             (N, ..., H, W), got shape {size:?}"
        )));
    }
    Ok((size[size.len() - 2], size[size.len() - 1]))
}

/// Whether `t` holds class indices (an integer dtype), as Composer's `check_for_index_targets`.
fn is_index(t: &Tensor) -> bool {
    matches!(t.kind(), Kind::Int8 | Kind::Int16 | Kind::Int | Kind::Int64)
}

/// Composer's `resize_batch` in resize mode: the input nearest-resized by `scale`, and the
/// target too when `resize_targets` (an index target `(N, H, W)` goes through float and back,
/// as in Composer). `scale ≥ 1` returns both unchanged.
pub fn resize_batch(
    input: &Tensor,
    target: &Tensor,
    scale: f64,
    resize_targets: bool,
) -> Result<(Tensor, Tensor), TchError> {
    spatial(input, 3)?;
    if resize_targets {
        spatial(target, 3)?;
    }
    if scale >= 1.0 {
        return Ok((input.shallow_clone(), target.shallow_clone()));
    }
    let out = resize_nearest(input, scale)?;
    let target = if !resize_targets {
        target.shallow_clone()
    } else if is_index(target) {
        resize_nearest(&target.f_to_kind(Kind::Float)?.f_unsqueeze(1)?, scale)?
            .f_squeeze_dim(1)?
            .f_to_kind(target.kind())?
    } else {
        resize_nearest(target, scale)?
    };
    Ok((out, target))
}

/// Composer's `resize_batch` in crop mode with the corner given: the `int(scale·H) ×
/// int(scale·W)` crop of the input at `(top, left)`, and when `resize_targets` the matching
/// crop of the target (its corner scaled by the target's size over the input's, truncated, as
/// Composer's `_make_crop_pair`). `scale ≥ 1` returns both unchanged.
pub fn crop_batch(
    input: &Tensor,
    target: &Tensor,
    scale: f64,
    (top, left): (i64, i64),
    resize_targets: bool,
) -> Result<(Tensor, Tensor), TchError> {
    let (height, width) = spatial(input, 3)?;
    if resize_targets {
        spatial(target, 3)?;
    }
    if scale >= 1.0 {
        return Ok((input.shallow_clone(), target.shallow_clone()));
    }
    let out = crop(
        input,
        top,
        left,
        crop_size(height, scale),
        crop_size(width, scale),
    )?;
    let target = if resize_targets {
        let (th, tw) = spatial(target, 3)?;
        let top_t = (th as f64 / height as f64 * top as f64) as i64;
        let left_t = (tw as f64 / width as f64 * left as f64) as i64;
        crop(
            target,
            top_t,
            left_t,
            crop_size(th, scale),
            crop_size(tw, scale),
        )?
    } else {
        target.shallow_clone()
    };
    Ok((out, target))
}

/// The ProgressiveResizing method.
pub struct ProgressiveResizing {
    mode: Mode,
    schedule: Schedule,
    resize_targets: bool,
}

impl Method for ProgressiveResizing {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
        let target = ctx
            .tensor(keys::TARGET)
            .ok_or("the batch has no `target`")?;
        let size = input.size();
        if size.len() != 4 {
            return Err(format!(
                "progressive_resizing needs image batches (N, C, H, W), got shape {size:?}"
            )
            .into());
        }
        let (height, width) = (size[2], size[3]);
        let elapsed = ctx.time().elapsed_fraction;
        let scale = self.schedule.scale(elapsed);
        let pinned = self.schedule.pinned_width(width, scale);
        if pinned == 0 {
            return Err(format!(
                "progressive_resizing would shrink {height}×{width} images to width 0 (scale \
                 {scale} rounded to a multiple of size_increment = {}): raise initial_scale or \
                 lower size_increment",
                self.schedule.size_increment
            )
            .into());
        }
        let pinned_scale = pinned as f64 / width as f64;
        let (out, new_target) = match self.mode {
            Mode::Resize => resize_batch(&input, &target, pinned_scale, self.resize_targets)?,
            Mode::Crop => {
                let corner = if pinned_scale >= 1.0 {
                    (0, 0)
                } else {
                    // Composer: top = randint(H − Hc), then left = randint(W − Wc).
                    let top =
                        ctx.rng_below((height - crop_size(height, pinned_scale)) as u64) as i64;
                    let left =
                        ctx.rng_below((width - crop_size(width, pinned_scale)) as u64) as i64;
                    (top, left)
                };
                crop_batch(&input, &target, pinned_scale, corner, self.resize_targets)?
            }
        };
        let (out_h, out_w) = (out.size()[2], out.size()[3]);
        ctx.set_tensor(keys::INPUT, out)?;
        if self.resize_targets && pinned_scale < 1.0 {
            ctx.set_tensor(keys::TARGET, new_target)?;
        }
        ctx.log_metric("progressive_resizing/height", out_h as f64);
        ctx.log_metric("progressive_resizing/width", out_w as f64);
        ctx.log_metric("progressive_resizing/scale_factor", scale);
        Ok(())
    }
}

impl Plugin for ProgressiveResizing {
    const NAME: &'static str = "progressive_resizing";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "trains on smaller images early on, growing them to full size on a schedule";
    const DEFAULT_SETTINGS: &'static str = "mode = \"resize\"\ninitial_scale = 0.5\n\
         finetune_fraction = 0.2\ndelay_fraction = 0.5\nsize_increment = 4\nresize_targets = false";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::AFTER_DATALOADER)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let mode = match settings.str("mode")?.as_str() {
            "resize" => Mode::Resize,
            "crop" => Mode::Crop,
            other => {
                return Err(Error::config(format!(
                    "`mode` must be \"resize\" or \"crop\", got \"{other}\""
                )))
            }
        };
        let initial_scale = settings.f64("initial_scale")?;
        let finetune_fraction = settings.f64("finetune_fraction")?;
        let delay_fraction = settings.f64("delay_fraction")?;
        let size_increment = settings.u64("size_increment")?;
        let resize_targets = settings.bool("resize_targets")?;
        if !(initial_scale > 0.0 && initial_scale <= 1.0) {
            return Err(Error::config(format!(
                "`initial_scale` must be in (0, 1], got {initial_scale}"
            )));
        }
        for (key, value) in [
            ("finetune_fraction", finetune_fraction),
            ("delay_fraction", delay_fraction),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(Error::config(format!(
                    "`{key}` must be in [0, 1], got {value}"
                )));
            }
        }
        if delay_fraction + finetune_fraction >= 1.0 {
            return Err(Error::config(format!(
                "`delay_fraction` + `finetune_fraction` must be below 1 (the ramp between them \
                 needs some of the run), got {delay_fraction} + {finetune_fraction}"
            )));
        }
        if size_increment == 0 || size_increment > i64::MAX as u64 {
            return Err(Error::config(format!(
                "`size_increment` must be a positive number of pixels, got {size_increment}"
            )));
        }
        Ok(ProgressiveResizing {
            mode,
            schedule: Schedule {
                initial_scale,
                finetune_fraction,
                delay_fraction,
                size_increment: size_increment as i64,
            },
            resize_targets,
        })
    }
}

export_plugin!(ProgressiveResizing);
