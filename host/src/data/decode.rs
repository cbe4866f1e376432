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
use rand::{Rng, RngCore};
use serde::Serialize;

use super::image_augment::luma_of;
pub use super::image_augment::{
    jitter_interleaved, random_resized_crop_params, ColorJitter, CropBox, Drawn, JitterDraw,
    RandomResizedCrop,
};
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
    rng: &mut dyn RngCore,
) -> Result<Vec<u8>, DataError> {
    decode_image_drawn(bytes, name, plan, rng).map(|(pixels, _)| pixels)
}

/// [`decode_image`], also saying what it drew.
pub fn decode_image_drawn(
    bytes: &[u8],
    name: &str,
    plan: &DecodePlan,
    rng: &mut dyn RngCore,
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
        let draw = j.draw(&mut &mut *rng);
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
    rng: &mut dyn RngCore,
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
    rng: &mut dyn RngCore,
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

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
