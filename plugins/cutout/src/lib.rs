#![doc = include_str!("../README.md")]

use tessera_plugin_api::device::upload;
use tessera_plugin_api::tch::{TchError, Tensor};
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Settings,
};

/// Hole side in pixels for a `height × width` image: `int(min(H, W) · length)`.
pub fn hole_length(height: i64, width: i64, length: f64) -> i64 {
    (height.min(width) as f64 * length) as i64
}

/// Python's `//` (floor division).
fn floor_div(a: i64, b: i64) -> i64 {
    a.div_euclid(b)
}

/// The half-open range `[lo, hi)` centres are drawn from for a side of `size` pixels.
pub fn centre_range(size: i64, length: i64, uniform_sampling: bool) -> (i64, i64) {
    if uniform_sampling {
        (floor_div(-length, 2), size + floor_div(length, 2))
    } else {
        (0, size)
    }
}

/// Zeroes in `mask` (a `height × width` slice, row-major) the hole centred at column `x`,
/// row `y` — Composer's `_generate_mask`.
pub fn zero_hole(mask: &mut [f32], width: i64, height: i64, x: i64, y: i64, length: i64) {
    let half = floor_div(length, 2);
    let y1 = (y - half).clamp(0, height);
    let y2 = (y + half).clamp(0, height);
    let x1 = (x - half).clamp(0, width);
    let x2 = (x + half).clamp(0, width);
    for row in y1..y2 {
        for col in x1..x2 {
            mask[(row * width + col) as usize] = 0.0;
        }
    }
}

/// The `height × width` mask (1 kept, 0 cut) for holes at `centres` (`(x, y)` pairs).
pub fn cutout_mask(height: i64, width: i64, centres: &[(i64, i64)], length: i64) -> Vec<f32> {
    let mut mask = vec![1.0f32; (height * width) as usize];
    for &(x, y) in centres {
        zero_hole(&mut mask, width, height, x, y, length);
    }
    mask
}

/// Multiplies every image of `input` (`(..., H, W)`) by the mask of holes at `centres`.
pub fn cutout_batch(
    input: &Tensor,
    centres: &[(i64, i64)],
    length: i64,
) -> Result<Tensor, TchError> {
    let size = input.size();
    if size.len() < 2 {
        return Err(TchError::Shape(format!(
            "cutout needs images (..., H, W), got shape {size:?}"
        )));
    }
    let (height, width) = (size[size.len() - 2], size[size.len() - 1]);
    let mask = cutout_mask(height, width, centres, length);
    // Host-made, uploaded without a blocking copy.
    let mask = upload(
        &Tensor::f_from_slice(&mask)?.f_view([height, width])?,
        input.device(),
    )?
    .f_to_kind(input.kind())?;
    input.f_mul(&mask)
}

/// The CutOut method.
pub struct CutOut {
    num_holes: u64,
    length: f64,
    uniform_sampling: bool,
}

impl CutOut {
    fn draw_centres(
        &self,
        ctx: &mut Context<'_>,
        height: i64,
        width: i64,
        length: i64,
    ) -> Vec<(i64, i64)> {
        let (ylo, yhi) = centre_range(height, length, self.uniform_sampling);
        let (xlo, xhi) = centre_range(width, length, self.uniform_sampling);
        (0..self.num_holes)
            .map(|_| {
                // Row before column, as Composer draws them.
                let y = ylo + ctx.rng_below((yhi - ylo).max(1) as u64) as i64;
                let x = xlo + ctx.rng_below((xhi - xlo).max(1) as u64) as i64;
                (x, y)
            })
            .collect()
    }
}

impl Method for CutOut {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
        let size = input.size();
        if size.len() < 3 {
            return Err(
                format!("cutout needs image batches (N, C, H, W), got shape {size:?}").into(),
            );
        }
        let (height, width) = (size[size.len() - 2], size[size.len() - 1]);
        let length = hole_length(height, width, self.length);
        let centres = self.draw_centres(ctx, height, width, length);
        let out = cutout_batch(&input, &centres, length)?;
        ctx.set_tensor(keys::INPUT, out)
    }
}

impl Plugin for CutOut {
    const NAME: &'static str = "cutout";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "zeroes square holes in training images, the same holes for the whole batch";
    const DEFAULT_SETTINGS: &'static str = "num_holes = 1\nlength = 0.5\nuniform_sampling = false";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::AFTER_DATALOADER)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let num_holes = settings.u64("num_holes")?;
        let length = settings.f64("length")?;
        let uniform_sampling = settings.bool("uniform_sampling")?;
        if !(length > 0.0 && length < 1.0) {
            return Err(Error::config(format!(
                "`length` must be in (0, 1), got {length}"
            )));
        }
        Ok(CutOut {
            num_holes,
            length,
            uniform_sampling,
        })
    }
}

export_plugin!(CutOut);
