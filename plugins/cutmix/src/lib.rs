#![doc = include_str!("../README.md")]

use tessera_plugin_api::device::upload;
use tessera_plugin_api::targets::{mix, mix_one_hot};
use tessera_plugin_api::tch::{TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Settings,
};

/// A box in Composer's `(x1, y1, x2, y2)` convention: **`x` indexes dim 2 (H) and `y` dim 3
/// (W)** of an `(N, C, H, W)` batch; the box is `[x1, x2) × [y1, y2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BBox {
    /// First row (dim 2).
    pub x1: i64,
    /// First column (dim 3).
    pub y1: i64,
    /// One past the last row.
    pub x2: i64,
    /// One past the last column.
    pub y2: i64,
}

impl BBox {
    /// Its area in pixels.
    pub fn area(&self) -> i64 {
        (self.x2 - self.x1) * (self.y2 - self.y1)
    }
}

/// Python's `//` (floor division).
fn floor_div(a: i64, b: i64) -> i64 {
    a.div_euclid(b)
}

/// The box sides `(cut_w, cut_h)` `_rand_bbox` derives from `lambda` for sizes `w` (dim 2) and
/// `h` (dim 3): `int(w·√(1 − λ))`, `int(h·√(1 − λ))`.
pub fn box_sides(w: i64, h: i64, lambda: f64) -> (i64, i64) {
    let ratio = (1.0 - lambda).sqrt();
    ((w as f64 * ratio) as i64, (h as f64 * ratio) as i64)
}

/// The half-open range `[lo, hi)` a box centre is drawn from along a side of `size` pixels for
/// a box side `cut`: `[0, size)`, or with `uniform_sampling` `[−cut // 2, size + cut // 2)`
/// (Python's floor division).
pub fn centre_range(size: i64, cut: i64, uniform_sampling: bool) -> (i64, i64) {
    if uniform_sampling {
        (floor_div(-cut, 2), size + floor_div(cut, 2))
    } else {
        (0, size)
    }
}

/// Composer's `_rand_bbox(W, H, lambda, cx, cy)` with the centre given: `W` is the size of
/// dim 2 and `H` of dim 3 (Composer passes `input.shape[2], input.shape[3]`), `cx` indexes
/// dim 2 and `cy` dim 3. The box `[cx − cut_w//2, cx + cut_w//2)` × `[cy − cut_h//2,
/// cy + cut_h//2)` is clipped to the image, so an odd side loses a pixel.
pub fn rand_bbox(w: i64, h: i64, lambda: f64, cx: i64, cy: i64) -> BBox {
    let (cut_w, cut_h) = box_sides(w, h, lambda);
    BBox {
        x1: (cx - cut_w / 2).clamp(0, w),
        y1: (cy - cut_h / 2).clamp(0, h),
        x2: (cx + cut_w / 2).clamp(0, w),
        y2: (cy + cut_h / 2).clamp(0, h),
    }
}

/// Composer's `_adjust_lambda`: the share of each image that stays its own,
/// `1 − area / (H·W)` for images of `height × width`.
pub fn adjusted_lambda(height: i64, width: i64, bbox: BBox) -> f64 {
    1.0 - bbox.area() as f64 / (width * height) as f64
}

/// The `lambda` Composer's `cutmix_batch(length = L)` passes to `_rand_bbox`:
/// `int(L·W)·int(L·H) / (H·W)`, the box's share of the image. `_rand_bbox` reads it as the
/// share kept, so the box side is `int(W·√(1 − λ))`, not `L·W` (Composer's quirk, kept).
pub fn length_lambda(height: i64, width: i64, length: f64) -> f64 {
    let cut_w = (length * width as f64) as i64;
    let cut_h = (length * height as f64) as i64;
    (cut_w * cut_h) as f64 / (height * width) as f64
}

/// Composer's `cutmix_batch(input, target, bbox, indices)`: a copy of `input` `(N, C, H, W)`
/// whose box holds `input[indices]`'s, `target[indices]`, and the adjusted lambda.
pub fn cutmix_batch(
    input: &Tensor,
    target: &Tensor,
    bbox: BBox,
    indices: &Tensor,
) -> Result<(Tensor, Tensor, f64), TchError> {
    let size = input.size();
    if size.len() != 4 {
        return Err(TchError::Shape(format!(
            "cutmix needs image batches (N, C, H, W), got shape {size:?}"
        )));
    }
    let (rows, cols) = (bbox.x2 - bbox.x1, bbox.y2 - bbox.y1);
    let mut out = input.f_empty_like()?;
    out.f_copy_(input)?;
    if rows > 0 && cols > 0 {
        let pasted = input
            .f_index_select(0, indices)?
            .f_narrow(2, bbox.x1, rows)?
            .f_narrow(3, bbox.y1, cols)?;
        let mut region = out.f_narrow(2, bbox.x1, rows)?.f_narrow(3, bbox.y1, cols)?;
        region.f_copy_(&pasted)?;
    }
    let lambda = adjusted_lambda(size[2], size[3], bbox);
    Ok((out, target.f_index_select(0, indices)?, lambda))
}

/// Whether a target is per pixel: more than 2 dimensions, the last two the input's `(H, W)`
/// (Composer's test at `before_loss`); such targets get the box pasted, not mixed.
pub fn is_pixel_target(target: &Tensor, input: &Tensor) -> bool {
    let (t, i) = (target.size(), input.size());
    t.len() > 2 && i.len() >= 2 && t[t.len() - 2..] == i[i.len() - 2..]
}

/// The target of CutMix's `before_loss` for class targets:
/// `λ·onehot(target) + (1 − λ)·onehot(permuted_target)`, one-hot sized by the model `output`.
pub fn mix_targets(
    output: &Tensor,
    target: &Tensor,
    permuted_target: &Tensor,
    lambda: f64,
) -> Result<Tensor, TchError> {
    mix_one_hot(output, target, lambda, permuted_target, 1.0 - lambda)
}

/// The target of CutMix's `before_loss` for per-pixel targets: `target` with the box
/// `[..., x1:x2, y1:y2]` taken from `permuted_target`.
pub fn paste_target_box(
    target: &Tensor,
    permuted_target: &Tensor,
    bbox: BBox,
) -> Result<Tensor, TchError> {
    let mut out = target.f_empty_like()?;
    out.f_copy_(target)?;
    let (rows, cols) = (bbox.x2 - bbox.x1, bbox.y2 - bbox.y1);
    if rows > 0 && cols > 0 {
        let d = out.dim() as i64;
        let pasted =
            permuted_target
                .f_narrow(d - 2, bbox.x1, rows)?
                .f_narrow(d - 1, bbox.y1, cols)?;
        let mut region = out
            .f_narrow(d - 2, bbox.x1, rows)?
            .f_narrow(d - 1, bbox.y1, cols)?;
        region.f_copy_(&pasted)?;
    }
    Ok(out)
}

/// The interpolated loss of CutMix's `before_backward`: `λ·loss + (1 − λ)·permuted_loss`.
pub fn mix_losses(loss: &Tensor, permuted_loss: &Tensor, lambda: f64) -> Result<Tensor, TchError> {
    mix(loss, lambda, permuted_loss, 1.0 - lambda)
}

/// What `before_forward` drew for the current microbatch.
struct Draw {
    bbox: BBox,
    lambda: f64,
    permuted_target: Tensor,
}

/// The CutMix method.
pub struct CutMix {
    alpha: f64,
    interpolate_loss: bool,
    uniform_sampling: bool,
    draw: Option<Draw>,
}

impl CutMix {
    /// Composer's draws, in its order: the permutation, `λ ~ Beta(α, α)` (0 when `α = 0`),
    /// then the centre along dim 2 and along dim 3.
    fn draw_box(&self, ctx: &mut Context<'_>, size: &[i64]) -> (Vec<i64>, BBox) {
        let perm = ctx.rng_permutation(size[0] as usize);
        let lambda = if self.alpha == 0.0 {
            0.0
        } else {
            ctx.rng_beta(self.alpha, self.alpha)
        };
        let (w, h) = (size[2], size[3]);
        let (cut_w, cut_h) = box_sides(w, h, lambda);
        let mut centre = |size: i64, cut: i64| {
            let (lo, hi) = centre_range(size, cut, self.uniform_sampling);
            lo + ctx.rng_below((hi - lo).max(1) as u64) as i64
        };
        let cx = centre(w, cut_w);
        let cy = centre(h, cut_h);
        (perm, rand_bbox(w, h, lambda, cx, cy))
    }

    fn before_forward(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
        let target = ctx
            .tensor(keys::TARGET)
            .ok_or("the batch has no `target`")?;
        let size = input.size();
        if size.len() != 4 {
            return Err(
                format!("cutmix needs image batches (N, C, H, W), got shape {size:?}").into(),
            );
        }
        let (perm, bbox) = self.draw_box(ctx, &size);
        // Through pinned memory, without a blocking copy (which would drain a GPU's queue).
        let indices = upload(&Tensor::f_from_slice(&perm)?, input.device())?;
        let (mixed, permuted_target, lambda) = cutmix_batch(&input, &target, bbox, &indices)?;
        ctx.set_tensor(keys::INPUT, mixed)?;
        ctx.log_metric("cutmix/lambda", lambda);
        self.draw = Some(Draw {
            bbox,
            lambda,
            permuted_target,
        });
        Ok(())
    }

    fn draw(&mut self, event: Event) -> Result<Draw, Error> {
        self.draw.take().ok_or_else(|| {
            Error::from(format!(
                "cutmix reached `{}` without a draw from `before_forward`",
                event.name()
            ))
        })
    }
}

impl Method for CutMix {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        match event {
            Event::BEFORE_FORWARD => self.before_forward(ctx),
            Event::BEFORE_LOSS if !self.interpolate_loss => {
                let draw = self.draw(event)?;
                let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
                let target = ctx
                    .tensor(keys::TARGET)
                    .ok_or("the batch has no `target`")?;
                let mixed = if is_pixel_target(&draw.permuted_target, &input) {
                    paste_target_box(&target, &draw.permuted_target, draw.bbox)?
                } else {
                    let output = ctx
                        .tensor(keys::OUTPUT)
                        .ok_or("no model output at before_loss")?;
                    mix_targets(&output, &target, &draw.permuted_target, draw.lambda)?
                };
                ctx.set_tensor(keys::TARGET, mixed)
            }
            Event::BEFORE_BACKWARD if self.interpolate_loss => {
                let draw = self.draw(event)?;
                let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
                if is_pixel_target(&draw.permuted_target, &input) {
                    return Err(Error::config(
                        "interpolate_loss cannot mix per-pixel targets (the target has the \
                         input's height and width): set interpolate_loss = false",
                    ));
                }
                let output = ctx
                    .tensor(keys::OUTPUT)
                    .ok_or("no model output at before_backward")?;
                let loss = ctx.tensor(keys::LOSS).ok_or("no loss at before_backward")?;
                let permuted_loss = ctx.loss(&output, &draw.permuted_target, false)?;
                ctx.set_tensor(keys::LOSS, mix_losses(&loss, &permuted_loss, draw.lambda)?)
            }
            _ => Ok(()),
        }
    }
}

impl Plugin for CutMix {
    const NAME: &'static str = "cutmix";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "pastes one box from a shuffled copy of the batch into each image, mixing targets by area";
    const DEFAULT_SETTINGS: &'static str =
        "alpha = 1.0\ninterpolate_loss = false\nuniform_sampling = false";

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
        let uniform_sampling = settings.bool("uniform_sampling")?;
        if !(alpha >= 0.0 && alpha.is_finite()) {
            return Err(Error::config(format!(
                "`alpha` must be a finite number >= 0, got {alpha}"
            )));
        }
        Ok(CutMix {
            alpha,
            interpolate_loss,
            uniform_sampling,
            draw: None,
        })
    }
}

export_plugin!(CutMix);
