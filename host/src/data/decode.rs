//! Decoding an encoded image (JPEG or PNG bytes) into a C×H×W `u8` sample by a [`DecodePlan`]:
//! the crop is decided from the image's size before its pixels are touched, then the crop is
//! resized to the sample size and, for training, colour-jittered.
//!
//! Every source whose samples are encoded images (an image folder, image columns of shards)
//! returns them as [`SampleData::Encoded`](super::source::SampleData) and the loader calls
//! [`decode_image`] with the sample's random generator, so the random crop of a sample is a pure
//! function of (seed, epoch, position) like every other transform.
//!
//! What matches torchvision (the PIL path: `torchvision.transforms.functional` on a PIL image):
//! - [`CropPlan::Centre`] is `Resize(resize)` + `CenterCrop(size)`: the shorter side becomes
//!   `resize`, the longer `floor(resize × long / short)`, bilinear with antialiasing (Pillow's
//!   convolution resampling with a triangle filter widened by the scale when shrinking), then the
//!   centre `size`×`size` square at `round((length - size) / 2)`.
//! - [`CropPlan::RandomResized`] is `RandomResizedCrop(size, scale, ratio)`: torchvision's
//!   `get_params` (ten tries of an area drawn uniformly in `scale` × the image area and a log-ratio
//!   drawn uniformly in `log(ratio)`, then the centre-crop fallback clamping the ratio), the crop
//!   then resized to `size`×`size` as `F.resized_crop` does on a PIL image (crop, then resize of
//!   the crop alone).
//! - [`ColorJitter`] is `ColorJitter(brightness, contrast, saturation, hue)` on a PIL image: the
//!   four factors drawn as torchvision draws them, applied in a random order, each as Pillow's
//!   `ImageEnhance` blend (brightness, contrast, saturation) or torchvision's HSV hue shift,
//!   computed as Pillow computes them (`f32` blend truncated to `u8`, Pillow's RGB↔HSV).
//!
//! The resampling is `fast_image_resize`'s, which is Pillow's algorithm (same filter, same
//! support and clipping) with its own fixed-point rounding: pixels agree with torchvision's PIL
//! path within 1/255. JPEGs are decoded by libjpeg-turbo when the build found it
//! (`cfg(tessera_libjpeg)`, `decode_jpeg.rs`): only the random crop's region, at full size (the
//! same pixels as cutting the whole decode, which is Pillow's decode) or, with
//! [`DecodePlan::jpeg_dct_scale`], at 1/2, 1/4 or 1/8 when the crop is at least twice the sample.
//! Other images (and CMYK JPEGs, and every JPEG without libjpeg-turbo) are decoded whole by the
//! `image` crate (zune-jpeg for JPEG, SIMD); 16-bit images
//! are scaled to 8 bits, alpha is dropped, grey is kept for 1 channel and colour converted with
//! PIL's `convert("L")` weights.

use std::io::Cursor;

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::{DynamicImage, ImageReader};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::Serialize;

use super::DataError;

#[cfg(tessera_libjpeg)]
#[path = "decode_jpeg.rs"]
mod jpeg;

/// How an encoded image becomes a `channels`×`size`×`size` sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodePlan {
    /// 1 (luma) or 3 (RGB).
    pub channels: usize,
    /// The side of the square sample.
    pub size: usize,
    /// Which part of the image becomes the sample.
    pub crop: CropPlan,
    /// Colour jitter after the crop (training), if any.
    pub color_jitter: Option<ColorJitter>,
    /// Decode a JPEG at a reduced DCT scale (1/2, 1/4 or 1/8, the largest that leaves the random
    /// crop at least `size` on both sides) when the random crop is at least twice the sample
    /// size: faster, but the pixels are no longer torchvision's (see docs/data.md).
    pub jpeg_dct_scale: bool,
}

/// Which part of an image becomes the sample, and how it is resized.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CropPlan {
    /// `Resize(resize)` (the shorter side) then `CenterCrop(size)`; `resize` >= `size`.
    Centre {
        /// The shorter side after resizing.
        resize: usize,
    },
    /// torchvision's `RandomResizedCrop(size, scale, ratio)`.
    RandomResized(RandomResizedCrop),
}

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

/// The width and height of an encoded image, from its header alone.
pub fn image_size(bytes: &[u8], name: &str) -> Result<(usize, usize), DataError> {
    let (w, h) = reader(bytes, name)?
        .into_dimensions()
        .map_err(|e| bad(name, e.to_string()))?;
    Ok((w as usize, h as usize))
}

fn reader<'a>(bytes: &'a [u8], name: &str) -> Result<ImageReader<Cursor<&'a [u8]>>, DataError> {
    ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| bad(name, e.to_string()))
}

fn bad(name: &str, reason: String) -> DataError {
    DataError::format(
        name,
        format!(
            "cannot decode the image: {reason}; replace or delete the file, or set \
             [data.folder] on_bad_file = \"skip\""
        ),
    )
}

/// Decodes `bytes` (the image called `name` in errors) into a `plan.channels`×`plan.size`×
/// `plan.size` sample, drawing the random crop and colour jitter from `rng` (see the module
/// doc). An error names the image and the reason.
pub fn decode_image(
    bytes: &[u8],
    name: &str,
    plan: &DecodePlan,
    rng: &mut impl Rng,
) -> Result<Vec<u8>, DataError> {
    decode_image_drawn(bytes, name, plan, rng).map(|(pixels, _)| pixels)
}

/// [`decode_image`], also saying what it drew.
pub fn decode_image_drawn(
    bytes: &[u8],
    name: &str,
    plan: &DecodePlan,
    rng: &mut impl Rng,
) -> Result<(Vec<u8>, Drawn), DataError> {
    if plan.channels != 1 && plan.channels != 3 {
        return Err(DataError::Invalid(format!(
            "{name}: channels must be 1 or 3, got {}",
            plan.channels
        )));
    }
    let size = u32::try_from(plan.size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| DataError::Invalid(format!("{name}: bad sample size {}", plan.size)))?;
    let source = decoded_source(bytes, name, plan, size, rng)?;
    let (width, height) = source.image;
    let pixel_type = match plan.channels {
        1 => PixelType::U8,
        _ => PixelType::U8x3,
    };
    let region = ImageRef::new(source.width, source.height, &source.pixels, pixel_type)
        .map_err(|e| bad(name, e.to_string()))?;
    let mut out = Image::new(size, size, pixel_type);
    let mut resizer = Resizer::new();
    let bilinear = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    let crop = match source.cut {
        Cut::Centre => {
            // Resize the whole image to (new_width, new_height) then crop the centre: the same
            // as resizing the matching box of the original (Pillow's coefficients depend only on
            // each output pixel's centre and the scale, clipped to the whole image).
            let resize = match &plan.crop {
                CropPlan::Centre { resize } => *resize,
                CropPlan::RandomResized(_) => plan.size,
            };
            let resize = u32::try_from(resize).unwrap_or(u32::MAX).max(size);
            let (new_width, new_height) = resized_size(width, height, resize);
            let (left, top) = (
                centre_offset(new_width, size),
                centre_offset(new_height, size),
            );
            let (sx, sy) = (
                f64::from(width) / f64::from(new_width),
                f64::from(height) / f64::from(new_height),
            );
            let options = bilinear.crop(
                f64::from(left) * sx,
                f64::from(top) * sy,
                f64::from(size) * sx,
                f64::from(size) * sy,
            );
            resizer
                .resize(&region, &mut out, &options)
                .map_err(|e| bad(name, e.to_string()))?;
            None
        }
        Cut::View(b) => {
            // F.resized_crop on a PIL image: the crop alone is resized (its borders clip there).
            let view = CroppedImage::new(
                &region,
                b.left as u32,
                b.top as u32,
                b.width as u32,
                b.height as u32,
            )
            .map_err(|e| bad(name, e.to_string()))?;
            resizer
                .resize(&view, &mut out, &bilinear)
                .map_err(|e| bad(name, e.to_string()))?;
            Some(b)
        }
        Cut::Region(b, denom) => {
            // The decoded region is the crop at its exact place, the whole crop when `denom` is
            // 1; scaled, it is the scaled pixels that cover the crop, resized from the crop's
            // fractional place in them.
            if denom == 1 {
                resizer.resize(&region, &mut out, &bilinear)
            } else {
                let d = denom as f64;
                let (x, y) = (b.left / denom, b.top / denom);
                let options = bilinear.crop(
                    b.left as f64 / d - x as f64,
                    b.top as f64 / d - y as f64,
                    b.width as f64 / d,
                    b.height as f64 / d,
                );
                resizer.resize(&region, &mut out, &options)
            }
            .map_err(|e| bad(name, e.to_string()))?;
            Some(b)
        }
    };
    let mut interleaved = out.into_vec();
    let jitter = plan.color_jitter.as_ref().map(|j| {
        let draw = j.draw(rng);
        jitter_interleaved(&mut interleaved, plan.channels, &draw);
        draw
    });
    let pixels = match plan.channels {
        1 => interleaved,
        _ => planar(&interleaved),
    };
    Ok((
        pixels,
        Drawn {
            image: (width as usize, height as usize),
            crop,
            dct_scale: source.denom,
            jitter,
        },
    ))
}

/// The decoded pixels a sample is resized from: the whole image, or with libjpeg-turbo only the
/// random crop's region (possibly at a reduced DCT scale), in `plan.channels` interleaved.
struct Source {
    pixels: Vec<u8>,
    width: u32,
    height: u32,
    /// The whole image's size.
    image: (u32, u32),
    cut: Cut,
    denom: usize,
}

/// Where the sample is in a [`Source`].
#[cfg_attr(not(tessera_libjpeg), allow(dead_code))]
enum Cut {
    /// The source is the whole image; the sample is its resized centre.
    Centre,
    /// The source is the whole image; the sample is this crop of it.
    View(CropBox),
    /// The source is this crop's region, decoded at 1 / the DCT scale.
    Region(CropBox, usize),
}

/// The DCT scale denominator for a crop: the largest of 8, 4, 2 that leaves the crop at least
/// `size` on both sides, else 1.
pub fn dct_scale_for(crop: &CropBox, size: usize) -> usize {
    [8, 4, 2]
        .into_iter()
        .find(|&d| crop.width >= size * d && crop.height >= size * d)
        .unwrap_or(1)
}

#[cfg_attr(not(tessera_libjpeg), allow(unused_variables))]
fn decoded_source(
    bytes: &[u8],
    name: &str,
    plan: &DecodePlan,
    size: u32,
    rng: &mut impl Rng,
) -> Result<Source, DataError> {
    #[cfg(tessera_libjpeg)]
    if jpeg::is_jpeg(bytes) {
        if let Some(source) = jpeg_source(bytes, name, plan, size, rng)? {
            return Ok(source);
        }
    }
    let image = reader(bytes, name)?
        .decode()
        .map_err(|e| bad(name, e.to_string()))?;
    let (width, height) = (image.width(), image.height());
    if width == 0 || height == 0 {
        return Err(bad(name, format!("it is {width}x{height}")));
    }
    let pixels = match plan.channels {
        1 => luma(image),
        _ => image.into_rgb8().into_raw(),
    };
    let cut = match &plan.crop {
        CropPlan::Centre { .. } => Cut::Centre,
        CropPlan::RandomResized(rrc) => Cut::View(random_resized_crop_params(
            width as usize,
            height as usize,
            rrc,
            &mut || rng.gen::<f64>(),
        )),
    };
    Ok(Source {
        pixels,
        width,
        height,
        image: (width, height),
        cut,
        denom: 1,
    })
}

/// A JPEG through libjpeg-turbo: the whole image for a centre crop, only the random crop's
/// region for a random one (at the DCT scale [`dct_scale_for`] gives, with
/// `plan.jpeg_dct_scale`); `None` for a colour space left to the `image` crate (CMYK).
#[cfg(tessera_libjpeg)]
fn jpeg_source(
    bytes: &[u8],
    name: &str,
    plan: &DecodePlan,
    size: u32,
    rng: &mut impl Rng,
) -> Result<Option<Source>, DataError> {
    let Some((width, height)) = jpeg::info(bytes).map_err(|e| bad(name, e))? else {
        return Ok(None);
    };
    let (w32, h32) = (
        u32::try_from(width).map_err(|_| bad(name, format!("it is {width} wide")))?,
        u32::try_from(height).map_err(|_| bad(name, format!("it is {height} high")))?,
    );
    let (cut, denom, region) = match &plan.crop {
        CropPlan::Centre { .. } => (Cut::Centre, 1, (0, 0, width, height)),
        CropPlan::RandomResized(rrc) => {
            let b = random_resized_crop_params(width, height, rrc, &mut || rng.gen::<f64>());
            let denom = if plan.jpeg_dct_scale {
                dct_scale_for(&b, size as usize)
            } else {
                1
            };
            let (x, y) = (b.left / denom, b.top / denom);
            let right = jpeg::scaled(b.left + b.width, denom).min(jpeg::scaled(width, denom));
            let bottom = jpeg::scaled(b.top + b.height, denom).min(jpeg::scaled(height, denom));
            (Cut::Region(b, denom), denom, (x, y, right - x, bottom - y))
        }
    };
    let Some(rgb) = jpeg::decode_region(bytes, jpeg::scaled(width, denom), denom, region)
        .map_err(|e| bad(name, e))?
    else {
        return Ok(None);
    };
    let pixels = match plan.channels {
        1 => rgb
            .chunks_exact(3)
            .map(|p| luma_of(p[0], p[1], p[2]))
            .collect(),
        _ => rgb,
    };
    Ok(Some(Source {
        pixels,
        width: region.2 as u32,
        height: region.3 as u32,
        image: (w32, h32),
        cut,
        denom,
    }))
}

/// Grey images keep their values; colour ones are converted with PIL's `convert("L")`
/// fixed-point weights (0.299, 0.587, 0.114).
fn luma(image: DynamicImage) -> Vec<u8> {
    if !image.color().has_color() {
        return image.into_luma8().into_raw();
    }
    image
        .into_rgb8()
        .into_raw()
        .chunks_exact(3)
        .map(|p| luma_of(p[0], p[1], p[2]))
        .collect()
}

fn luma_of(r: u8, g: u8, b: u8) -> u8 {
    let [r, g, b] = [r, g, b].map(u32::from);
    ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) as u8
}

/// torchvision's `Resize(size)` output size for a `width`×`height` image: the shorter side
/// becomes `size`, the longer one `floor(size × long / short)`.
pub(crate) fn resized_size(width: u32, height: u32, size: u32) -> (u32, u32) {
    let scaled = |long: u32, short: u32| u64::from(size) * u64::from(long) / u64::from(short);
    if width <= height {
        (size, scaled(height, width).min(u64::from(u32::MAX)) as u32)
    } else {
        (scaled(width, height).min(u64::from(u32::MAX)) as u32, size)
    }
}

/// torchvision's `CenterCrop` offset: `round((length - size) / 2)`, ties to even as Python's
/// `round` does.
pub(crate) fn centre_offset(length: u32, size: u32) -> u32 {
    (f64::from(length - size) / 2.0).round_ties_even() as u32
}

/// H×W×3 interleaved RGB as C×H×W planes.
fn planar(rgb: &[u8]) -> Vec<u8> {
    let plane = rgb.len() / 3;
    let mut out = vec![0u8; 3 * plane];
    let (r, rest) = out.split_at_mut(plane);
    let (g, b) = rest.split_at_mut(plane);
    for (i, p) in rgb.chunks_exact(3).enumerate() {
        r[i] = p[0];
        g[i] = p[1];
        b[i] = p[2];
    }
    out
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
fn rgb_to_hsv(r: u8, g: u8, b: u8) -> [u8; 3] {
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
fn hsv_to_rgb(h: u8, s: u8, v: u8) -> [u8; 3] {
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

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
