//! Per-sample image transforms on a C×H×W buffer of `u8` pixels or of `f32` values.
//!
//! Crop and flip only move pixels, so they run on the `u8` pixels as decoded
//! ([`Transform::apply_to_bytes`]) and give exactly what they give on the `f32` values: the loader
//! keeps batches in `u8` (a quarter of the bytes) until the device, which scales them to [0, 1]
//! (÷255, like torchvision's `ToTensor`) and normalizes them. Transforms that compute new values
//! (methods' transforms, a normalize that is not last) run on `f32` values in [0, 1]
//! ([`Sample::from_u8`], [`Transform::apply`]). Transforms run in the order given; each random
//! transform draws only from the generator it is handed, so the loader can make the draws a pure
//! function of (seed, epoch, position).

use std::sync::Arc;

use rand::{Rng, RngCore};
use serde::Serialize;

/// One image being transformed: channel-major pixels (`f32` values in [0, 1], or `u8` as
/// decoded) and their shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<T = f32> {
    /// C×H×W values.
    pub data: Vec<T>,
    /// Channels (C).
    pub channels: usize,
    /// Rows (H).
    pub height: usize,
    /// Columns (W).
    pub width: usize,
}

impl Sample {
    /// Converts C×H×W `u8` pixels to `f32` in [0, 1].
    pub fn from_u8(pixels: &[u8], channels: usize, height: usize, width: usize) -> Sample {
        Sample {
            data: pixels.iter().map(|&p| f32::from(p) / 255.0).collect(),
            channels,
            height,
            width,
        }
    }
}

impl<T> Sample<T> {
    /// The shape as (C, H, W).
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.channels, self.height, self.width)
    }
}

/// Per-channel `(x - mean) / std`; a single mean or std value applies to every channel.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Normalize {
    /// Mean per channel, or one value for all.
    pub mean: Vec<f32>,
    /// Standard deviation per channel, or one value for all; each must be positive.
    pub std: Vec<f32>,
}

/// A random `size`×`size` crop after zero padding of `padding` pixels on every side, like
/// torchvision's `RandomCrop(size, padding)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RandomCrop {
    /// Side of the square output (default: the image side, for square images).
    pub size: usize,
    /// Zero padding added on each side before cropping (default 0).
    pub padding: usize,
}

impl RandomCrop {
    /// A `size`×`size` crop without padding.
    pub fn new(size: usize) -> RandomCrop {
        RandomCrop { size, padding: 0 }
    }
}

/// Mirrors the image left–right with probability `p`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HorizontalFlip {
    /// Probability of flipping, in [0, 1] (default 0.5).
    pub p: f64,
}

impl Default for HorizontalFlip {
    fn default() -> Self {
        HorizontalFlip { p: 0.5 }
    }
}

/// The train-time transforms of a run (`[data.transforms]`), each at most once. They run
/// `random_crop`, then `horizontal_flip`, then `normalize`; evaluation uses only `normalize`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Transforms {
    /// Per-channel normalization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalize: Option<Normalize>,
    /// Pad then crop at a random position.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_crop: Option<RandomCrop>,
    /// Mirror left-right at random.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub horizontal_flip: Option<HorizontalFlip>,
}

impl Transforms {
    /// The transforms to run, in order: for training (`train`) or for evaluation.
    pub fn pipeline(&self, train: bool) -> Vec<Transform> {
        let mut out = Vec::new();
        if train {
            out.extend(self.random_crop.clone().map(Transform::RandomCrop));
            out.extend(self.horizontal_flip.clone().map(Transform::HorizontalFlip));
        }
        out.extend(self.normalize.clone().map(Transform::Normalize));
        out
    }
}

/// A per-sample transform.
#[derive(Debug, Clone, PartialEq)]
pub enum Transform {
    /// See [`Normalize`].
    Normalize(Normalize),
    /// See [`RandomCrop`].
    RandomCrop(RandomCrop),
    /// See [`HorizontalFlip`].
    HorizontalFlip(HorizontalFlip),
    /// A transform a method provides (a plugin's `sample_transform`).
    Method(MethodTransform),
}

/// A per-sample transform implemented outside the host (a plugin's), run on the loader's
/// worker threads.
pub trait SampleFn: Send + Sync {
    /// The (C, H, W) it makes of an input of `shape`, or why it cannot run on it.
    fn output_shape(&self, shape: (usize, usize, usize)) -> Result<(usize, usize, usize), String>;
    /// Transforms `sample` (the sample `at.index` of the training set in epoch `at.epoch`),
    /// drawing randomness from `rng`.
    fn apply(
        &self,
        sample: &mut Sample,
        rng: &mut dyn RngCore,
        at: tessera_plugin_api::SamplePlace,
    ) -> Result<(), String>;
}

/// A method's per-sample transform, with the method's name for messages.
#[derive(Clone)]
pub struct MethodTransform {
    /// The method that provides it.
    pub method: String,
    /// The transform.
    pub transform: Arc<dyn SampleFn>,
}

impl std::fmt::Debug for MethodTransform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MethodTransform({})", self.method)
    }
}

impl PartialEq for MethodTransform {
    fn eq(&self, other: &Self) -> bool {
        self.method == other.method && Arc::ptr_eq(&self.transform, &other.transform)
    }
}

impl Transforms {
    /// The training pipeline with the methods' transforms inserted where Composer puts
    /// RandAugment and AugMix: after the crop and flip, before the normalization.
    pub fn train_pipeline_with(&self, methods: &[MethodTransform]) -> Vec<Transform> {
        let mut out = self.pipeline(true);
        let at = out
            .iter()
            .position(|t| matches!(t, Transform::Normalize(_)))
            .unwrap_or(out.len());
        out.splice(at..at, methods.iter().cloned().map(Transform::Method));
        out
    }
}

/// A transform whose settings are invalid or do not fit the image; the message names the
/// transform and the setting.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct TransformError(pub String);

impl Transform {
    /// Checks the settings on their own (no image shape needed).
    pub fn validate(&self) -> Result<(), TransformError> {
        match self {
            Transform::Normalize(n) => {
                if n.mean.is_empty() || n.std.is_empty() {
                    return Err(TransformError(
                        "normalize: `mean` and `std` need at least one value each".into(),
                    ));
                }
                if let Some(m) = n.mean.iter().find(|m| !m.is_finite()) {
                    return Err(TransformError(format!(
                        "normalize: `mean` value {m} is not finite"
                    )));
                }
                if let Some(s) = n.std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
                    return Err(TransformError(format!(
                        "normalize: `std` value {s} must be finite and positive"
                    )));
                }
                Ok(())
            }
            Transform::RandomCrop(c) => {
                if c.size == 0 {
                    return Err(TransformError(
                        "random_crop: `size` must be at least 1".into(),
                    ));
                }
                Ok(())
            }
            Transform::HorizontalFlip(f) => {
                if !(0.0..=1.0).contains(&f.p) {
                    return Err(TransformError(format!(
                        "horizontal_flip: `p` = {} must be in [0, 1]",
                        f.p
                    )));
                }
                Ok(())
            }
            Transform::Method(_) => Ok(()),
        }
    }

    /// The (C, H, W) this transform produces from an input of `shape`, or why it cannot run on it.
    pub fn output_shape(
        &self,
        shape: (usize, usize, usize),
    ) -> Result<(usize, usize, usize), TransformError> {
        self.validate()?;
        let (channels, height, width) = shape;
        match self {
            Transform::Normalize(n) => {
                for (name, values) in [("mean", &n.mean), ("std", &n.std)] {
                    if values.len() != 1 && values.len() != channels {
                        return Err(TransformError(format!(
                            "normalize: `{name}` has {} values but the image has {channels} channel(s); give 1 or {channels}",
                            values.len()
                        )));
                    }
                }
                Ok(shape)
            }
            Transform::RandomCrop(c) => {
                let padded_h = height.saturating_add(c.padding.saturating_mul(2));
                let padded_w = width.saturating_add(c.padding.saturating_mul(2));
                if c.size > padded_h || c.size > padded_w {
                    return Err(TransformError(format!(
                        "random_crop: `size` {} is larger than the padded image {padded_h}×{padded_w} ({height}×{width} plus `padding` {} per side)",
                        c.size, c.padding
                    )));
                }
                Ok((channels, c.size, c.size))
            }
            Transform::HorizontalFlip(_) => Ok(shape),
            Transform::Method(m) => m
                .transform
                .output_shape(shape)
                .map_err(|e| TransformError(format!("{}: {e}", m.method))),
        }
    }

    /// Whether the transform only moves pixels (crop, flip): it then runs on `u8` pixels
    /// ([`Transform::apply_to_bytes`]) with exactly the result it has on their `f32` values.
    pub fn works_on_bytes(&self) -> bool {
        matches!(
            self,
            Transform::RandomCrop(_) | Transform::HorizontalFlip(_)
        )
    }

    /// Applies the transform to `sample` in place, drawing any randomness from `rng`.
    ///
    /// Fails (without touching the sample) when the settings are invalid or do not fit its shape.
    pub fn apply(&self, sample: &mut Sample, rng: &mut impl Rng) -> Result<(), TransformError> {
        self.apply_at(sample, rng, tessera_plugin_api::SamplePlace::default())
    }

    /// [`Transform::apply`] to the sample `at.index` of epoch `at.epoch`, which a method's
    /// transform may depend on (an alternating flip).
    pub fn apply_at(
        &self,
        sample: &mut Sample,
        rng: &mut impl Rng,
        at: tessera_plugin_api::SamplePlace,
    ) -> Result<(), TransformError> {
        if let Transform::Method(m) = self {
            // The loader checked the shapes once; the method checks its own input.
            return m
                .transform
                .apply(sample, rng, at)
                .map_err(|e| TransformError(format!("{}: {e}", m.method)));
        }
        self.check(sample)?;
        match self {
            Transform::Normalize(n) => normalize(n, sample),
            _ => self.move_pixels(sample, rng),
        }
        Ok(())
    }

    /// Applies a transform that [works on bytes](Transform::works_on_bytes) to `u8` pixels:
    /// the same pixels in the same places, from the same draws, as [`Transform::apply`] makes of
    /// their `f32` values.
    ///
    /// Fails (without touching the sample) for a transform that computes new values, or when the
    /// settings do not fit the sample.
    pub fn apply_to_bytes(
        &self,
        sample: &mut Sample<u8>,
        rng: &mut impl Rng,
    ) -> Result<(), TransformError> {
        let name = match self {
            Transform::Normalize(_) => "normalize",
            Transform::Method(m) => &m.method,
            _ => "",
        };
        if !self.works_on_bytes() {
            return Err(TransformError(format!(
                "{name}: computes new pixel values, so it runs on f32 values, not on u8 pixels"
            )));
        }
        self.check(sample)?;
        self.move_pixels(sample, rng);
        Ok(())
    }

    /// Checks the settings against the sample's shape and the buffer against the shape.
    fn check<T>(&self, sample: &Sample<T>) -> Result<(), TransformError> {
        self.output_shape(sample.shape())?;
        if sample.data.len() != sample.channels * sample.height * sample.width {
            return Err(TransformError(format!(
                "sample buffer holds {} values but its shape is {}×{}×{}",
                sample.data.len(),
                sample.channels,
                sample.height,
                sample.width
            )));
        }
        Ok(())
    }

    /// Runs a crop or a flip (nothing for the other transforms).
    fn move_pixels<T: Copy + Default>(&self, sample: &mut Sample<T>, rng: &mut impl Rng) {
        match self {
            Transform::RandomCrop(c) => random_crop(c, sample, rng),
            Transform::HorizontalFlip(f) => {
                if rng.gen_bool(f.p) {
                    flip(sample);
                }
            }
            Transform::Normalize(_) | Transform::Method(_) => {}
        }
    }
}

fn normalize(n: &Normalize, sample: &mut Sample) {
    n.normalize_planes(
        &mut sample.data,
        sample.channels,
        sample.height * sample.width,
    );
}

impl Normalize {
    /// The mean and the reciprocal of the std of each of `channels` channels (one value given
    /// applies to every channel): `(x - mean) * inv_std` is the normalization, on the host and
    /// on the device alike. (An empty list, which [`Transform::validate`] rejects, counts as
    /// mean 0 or std 1.)
    pub fn per_channel(&self, channels: usize) -> (Vec<f32>, Vec<f32>) {
        let pick = |values: &[f32], channel: usize, empty: f32| {
            let last = values.len().saturating_sub(1);
            values.get(channel.min(last)).copied().unwrap_or(empty)
        };
        (0..channels)
            .map(|c| (pick(&self.mean, c, 0.0), 1.0 / pick(&self.std, c, 1.0)))
            .unzip()
    }

    /// Normalizes channel-major values in place: images one after the other, each of `channels`
    /// planes of `plane` values. Needs 1 or `channels` values of mean and std (see
    /// [`Transform::output_shape`]).
    pub fn normalize_planes(&self, values: &mut [f32], channels: usize, plane: usize) {
        if plane == 0 || channels == 0 {
            return;
        }
        let (mean, inv_std) = self.per_channel(channels);
        for (i, values) in values.chunks_exact_mut(plane).enumerate() {
            let (mean, inv_std) = (mean[i % channels], inv_std[i % channels]);
            values.iter_mut().for_each(|v| *v = (*v - mean) * inv_std);
        }
    }
}

/// Crops a window whose top-left corner, in padded coordinates, is drawn uniformly; pixels that
/// fall in the padding are zero. Same-size crops without padding draw nothing (as torchvision).
fn random_crop<T: Copy + Default>(c: &RandomCrop, sample: &mut Sample<T>, rng: &mut impl Rng) {
    let (channels, height, width) = sample.shape();
    let (padded_h, padded_w) = (height + 2 * c.padding, width + 2 * c.padding);
    if c.size == padded_h && c.size == padded_w && c.padding == 0 {
        return;
    }
    let top = rng.gen_range(0..=padded_h - c.size);
    let left = rng.gen_range(0..=padded_w - c.size);
    let mut out = vec![T::default(); channels * c.size * c.size];
    for channel in 0..channels {
        for y in 0..c.size {
            // Row in the unpadded image; skip rows that lie in the padding.
            let Some(source_y) = (top + y).checked_sub(c.padding).filter(|&r| r < height) else {
                continue;
            };
            for x in 0..c.size {
                if let Some(source_x) = (left + x).checked_sub(c.padding).filter(|&s| s < width) {
                    out[(channel * c.size + y) * c.size + x] =
                        sample.data[(channel * height + source_y) * width + source_x];
                }
            }
        }
    }
    sample.data = out;
    sample.height = c.size;
    sample.width = c.size;
}

fn flip<T>(sample: &mut Sample<T>) {
    if sample.width == 0 {
        return;
    }
    sample
        .data
        .chunks_exact_mut(sample.width)
        .for_each(|row| row.reverse());
}

#[cfg(test)]
#[path = "transforms_tests.rs"]
mod tests;
