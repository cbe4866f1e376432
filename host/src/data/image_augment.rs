//! The random parts of decoding an image, as torchvision draws them: the crop of
//! `RandomResizedCrop` and the colour jitter of `ColorJitter` (drawn per sample), and the
//! jitter applied to pixels.

use rand::seq::SliceRandom;
use rand::Rng;
use serde::Serialize;

/// The ranges of torchvision's `RandomResizedCrop`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RandomResizedCrop {
    /// The crop's area as a share of the image's, drawn uniformly in `[scale[0], scale[1]]`
    /// (default 0.08 to 1).
    pub scale: [f64; 2],
    /// The crop's width / height, drawn log-uniformly in `[ratio[0], ratio[1]]` (default 3/4 to
    /// 4/3).
    pub ratio: [f64; 2],
}

impl Default for RandomResizedCrop {
    fn default() -> Self {
        RandomResizedCrop {
            scale: [0.08, 1.0],
            ratio: [3.0 / 4.0, 4.0 / 3.0],
        }
    }
}

/// torchvision's `ColorJitter(brightness, contrast, saturation, hue)`: brightness, contrast and
/// saturation factors drawn uniformly in `[max(0, 1 - x), 1 + x]`, the hue shift in
/// `[-hue, hue]`; 0 leaves that adjustment out.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ColorJitter {
    /// >= 0.
    pub brightness: f64,
    /// >= 0.
    pub contrast: f64,
    /// >= 0.
    pub saturation: f64,
    /// In [0, 0.5].
    pub hue: f64,
}

impl ColorJitter {
    /// Why these settings cannot be used, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        for (name, v) in [
            ("brightness", self.brightness),
            ("contrast", self.contrast),
            ("saturation", self.saturation),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("`{name}` must be a number >= 0, got {v}"));
            }
        }
        if !(0.0..=0.5).contains(&self.hue) {
            return Err(format!("`hue` must be in [0, 0.5], got {}", self.hue));
        }
        Ok(())
    }

    /// Draws the order and the factors as torchvision's `ColorJitter.get_params` does: a
    /// permutation of the four, then each factor (`None` for one left out).
    pub fn draw(&self, rng: &mut impl Rng) -> JitterDraw {
        let mut order = [0usize, 1, 2, 3];
        order.shuffle(rng);
        let factor = |x: f64, rng: &mut dyn rand::RngCore| {
            (x > 0.0).then(|| uniform(rng, (1.0 - x).max(0.0), 1.0 + x))
        };
        let brightness = factor(self.brightness, rng);
        let contrast = factor(self.contrast, rng);
        let saturation = factor(self.saturation, rng);
        let hue = (self.hue > 0.0).then(|| uniform(rng, -self.hue, self.hue));
        JitterDraw {
            order,
            brightness,
            contrast,
            saturation,
            hue,
        }
    }
}

/// One sample's colour-jitter draw: the order of the adjustments (0 brightness, 1 contrast,
/// 2 saturation, 3 hue) and their factors.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct JitterDraw {
    /// The order the four adjustments run in.
    pub order: [usize; 4],
    /// Brightness factor.
    pub brightness: Option<f64>,
    /// Contrast factor.
    pub contrast: Option<f64>,
    /// Saturation factor.
    pub saturation: Option<f64>,
    /// Hue shift, in turns.
    pub hue: Option<f64>,
}

/// A crop box in the image's pixels: rows `top..top + height`, columns `left..left + width`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CropBox {
    /// First row.
    pub top: usize,
    /// First column.
    pub left: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
}

/// What one decode drew and did (what [`decode_image_drawn`] reports, for checks against a
/// reference).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Drawn {
    /// The image's width and height.
    pub image: (usize, usize),
    /// The random crop (`None` for a centre crop).
    pub crop: Option<CropBox>,
    /// The colour jitter drawn.
    pub jitter: Option<JitterDraw>,
    /// The JPEG's DCT scale denominator (1: decoded at full size; 2, 4 or 8 with
    /// [`DecodePlan::jpeg_dct_scale`]).
    pub dct_scale: usize,
}

/// A uniform draw in `[low, high)` from one `f64` in [0, 1) (torchvision's `uniform_(low, high)`
/// is `low + (high - low) × u`).
fn uniform(rng: &mut (impl rand::RngCore + ?Sized), low: f64, high: f64) -> f64 {
    let u: f64 = rand::Rng::gen(&mut RngRef(rng));
    low + (high - low) * u
}

/// `&mut dyn RngCore` as a sized `Rng`.
struct RngRef<'a, R: rand::RngCore + ?Sized>(&'a mut R);

impl<R: rand::RngCore + ?Sized> rand::RngCore for RngRef<'_, R> {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.fill_bytes(dest)
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.0.try_fill_bytes(dest)
    }
}

/// torchvision's `RandomResizedCrop.get_params` for a `width`×`height` image, drawing each
/// uniform number in [0, 1) from `next`: the area share is `scale[0] + (scale[1] - scale[0]) × u`
/// and the log-ratio likewise (both rounded to `f32` as torch's `uniform_` on a float tensor
/// gives them), an integer in `0..n` is `floor(u × n)`. Exposed so that a check can feed the same
/// numbers to torchvision's own `get_params`.
pub fn random_resized_crop_params(
    width: usize,
    height: usize,
    crop: &RandomResizedCrop,
    next: &mut dyn FnMut() -> f64,
) -> CropBox {
    let area = (width * height) as f64;
    let log_ratio = [(crop.ratio[0] as f32).ln(), (crop.ratio[1] as f32).ln()];
    let randint = |n: usize, u: f64| ((u * n as f64) as usize).min(n.saturating_sub(1));
    for _ in 0..10 {
        let u = next();
        let share = (crop.scale[0] as f32
            + (crop.scale[1] as f32 - crop.scale[0] as f32) * u as f32) as f64;
        let target_area = area * share;
        let u = next();
        let log = log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u as f32;
        let aspect = f64::from(log.exp());
        let w = (target_area * aspect).sqrt().round_ties_even() as usize;
        let h = (target_area / aspect).sqrt().round_ties_even() as usize;
        if 0 < w && w <= width && 0 < h && h <= height {
            let top = randint(height - h + 1, next());
            let left = randint(width - w + 1, next());
            return CropBox {
                top,
                left,
                height: h,
                width: w,
            };
        }
    }
    // The centre-crop fallback.
    let in_ratio = width as f64 / height as f64;
    let (min, max) = (
        crop.ratio[0].min(crop.ratio[1]),
        crop.ratio[0].max(crop.ratio[1]),
    );
    let (w, h) = if in_ratio < min {
        (width, (width as f64 / min).round_ties_even() as usize)
    } else if in_ratio > max {
        ((height as f64 * max).round_ties_even() as usize, height)
    } else {
        (width, height)
    };
    CropBox {
        top: (height - h) / 2,
        left: (width - w) / 2,
        height: h,
        width: w,
    }
}

/// Pillow's `Image.blend(degenerate, image, factor)` of one value: `f32` arithmetic, clipped to
/// [0, 255] and truncated.
fn blend(degenerate: u8, value: u8, factor: f32) -> u8 {
    let v = f32::from(degenerate) + factor * (f32::from(value) - f32::from(degenerate));
    if v <= 0.0 {
        0
    } else if v >= 255.0 {
        255
    } else {
        v as u8
    }
}

/// Runs the drawn colour jitter on H×W×C interleaved pixels (C = 1 or 3), as torchvision's
/// functional adjustments on a PIL image of mode `L` or `RGB`.
pub fn jitter_interleaved(pixels: &mut [u8], channels: usize, draw: &JitterDraw) {
    for &step in &draw.order {
        match step {
            0 => {
                if let Some(f) = draw.brightness {
                    let f = f as f32;
                    pixels.iter_mut().for_each(|p| *p = blend(0, *p, f));
                }
            }
            1 => {
                if let Some(f) = draw.contrast {
                    // ImageEnhance.Contrast: the mean of the L image, rounded, as the degenerate.
                    let (sum, n) = if channels == 3 {
                        let sum: u64 = pixels
                            .chunks_exact(3)
                            .map(|p| u64::from(luma_of(p[0], p[1], p[2])))
                            .sum();
                        (sum, pixels.len() / 3)
                    } else {
                        (pixels.iter().map(|&p| u64::from(p)).sum(), pixels.len())
                    };
                    let mean = (sum as f64 / n.max(1) as f64 + 0.5) as u8;
                    let f = f as f32;
                    pixels.iter_mut().for_each(|p| *p = blend(mean, *p, f));
                }
            }
            2 => {
                if let (Some(f), 3) = (draw.saturation, channels) {
                    let f = f as f32;
                    for p in pixels.chunks_exact_mut(3) {
                        let l = luma_of(p[0], p[1], p[2]);
                        p.iter_mut().for_each(|v| *v = blend(l, *v, f));
                    }
                }
            }
            _ => {
                if let (Some(h), 3) = (draw.hue, channels) {
                    // torchvision: np_h += np.int32(hue_factor * 255).astype(np.uint8).
                    let shift = (h * 255.0) as i32 as u8;
                    for p in pixels.chunks_exact_mut(3) {
                        let [hh, s, v] = rgb_to_hsv(p[0], p[1], p[2]);
                        let rgb = hsv_to_rgb(hh.wrapping_add(shift), s, v);
                        p.copy_from_slice(&rgb);
                    }
                }
            }
        }
    }
}

/// Pillow's `convert("HSV")` of one pixel (its `rgb2hsv_row`).
pub(super) fn rgb_to_hsv(r: u8, g: u8, b: u8) -> [u8; 3] {
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    if minc == maxc {
        return [0, 0, maxc];
    }
    let cr = f32::from(maxc - minc);
    let s = cr / f32::from(maxc);
    let rc = f32::from(maxc - r) / cr;
    let gc = f32::from(maxc - g) / cr;
    let bc = f32::from(maxc - b) / cr;
    let h: f32 = if r == maxc {
        bc - gc
    } else if g == maxc {
        (2.0 + f64::from(rc) - f64::from(bc)) as f32
    } else {
        (4.0 + f64::from(gc) - f64::from(rc)) as f32
    };
    let h = ((f64::from(h) / 6.0 + 1.0) % 1.0) as f32;
    let clip = |v: f64| (v as i32).clamp(0, 255) as u8;
    [clip(f64::from(h) * 255.0), clip(f64::from(s) * 255.0), maxc]
}

/// Pillow's `convert("RGB")` of one HSV pixel (its `hsv2rgb`).
pub(super) fn hsv_to_rgb(h: u8, s: u8, v: u8) -> [u8; 3] {
    if s == 0 {
        return [v, v, v];
    }
    let hh = f64::from(h) * 6.0 / 255.0;
    let i = hh.floor() as i32;
    let f = (hh - f64::from(i)) as f32;
    let fs = f32::from(s) / 255.0;
    let vf = f64::from(v);
    let clip = |x: f64| (x.round() as i32).clamp(0, 255) as u8;
    let p = clip(vf * (1.0 - f64::from(fs)));
    // `fs * f` is a float product in Pillow's C; the rest is double.
    let q = clip(vf * (1.0 - f64::from(fs * f)));
    let t = clip(vf * (1.0 - f64::from(fs) * (1.0 - f64::from(f))));
    match i % 6 {
        0 => [v, t, p],
        1 => [q, v, p],
        2 => [p, v, t],
        3 => [p, q, v],
        4 => [t, p, v],
        _ => [v, p, q],
    }
}

pub(super) fn luma_of(r: u8, g: u8, b: u8) -> u8 {
    let [r, g, b] = [r, g, b].map(u32::from);
    ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) as u8
}
