//! Composer's augmentation primitives (`composer.algorithms.utils.augmentation_primitives`) on
//! 8-bit images, with Pillow 11.3's arithmetic ([`pillow`]), shared by the `randaugment` and
//! `augmix` plugins: which primitives each augmentation set holds, the numpy draws each makes
//! ([`Draws`], [`draw_op`]) and the Pillow calls it then makes ([`apply_op`]). The tests are in
//! `plugins/randaugment/tests/golden.rs` (every primitive against Composer's bytes).

pub mod pillow;
#[cfg(feature = "replay")]
pub mod replay;

use pillow::Image;
use tessera_plugin_api::{random, Error, Sample, SampleRandom};

/// Composer's augmentation primitives (`composer.algorithms.utils.augmentation_primitives`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Primitive {
    AutoContrast,
    Equalize,
    Posterize,
    Rotate,
    Solarize,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Color,
    Contrast,
    Brightness,
    Sharpness,
    ColorOriginal,
    ContrastOriginal,
    BrightnessOriginal,
    SharpnessOriginal,
}

impl Primitive {
    /// Every primitive, in Composer's order.
    pub const ALL: [Primitive; 17] = [
        Primitive::AutoContrast,
        Primitive::Equalize,
        Primitive::Posterize,
        Primitive::Rotate,
        Primitive::Solarize,
        Primitive::ShearX,
        Primitive::ShearY,
        Primitive::TranslateX,
        Primitive::TranslateY,
        Primitive::Color,
        Primitive::Contrast,
        Primitive::Brightness,
        Primitive::Sharpness,
        Primitive::ColorOriginal,
        Primitive::ContrastOriginal,
        Primitive::BrightnessOriginal,
        Primitive::SharpnessOriginal,
    ];

    /// Composer's name of the primitive.
    pub fn name(self) -> &'static str {
        match self {
            Primitive::AutoContrast => "autocontrast",
            Primitive::Equalize => "equalize",
            Primitive::Posterize => "posterize",
            Primitive::Rotate => "rotate",
            Primitive::Solarize => "solarize",
            Primitive::ShearX => "shear_x",
            Primitive::ShearY => "shear_y",
            Primitive::TranslateX => "translate_x",
            Primitive::TranslateY => "translate_y",
            Primitive::Color => "color",
            Primitive::Contrast => "contrast",
            Primitive::Brightness => "brightness",
            Primitive::Sharpness => "sharpness",
            Primitive::ColorOriginal => "color_original",
            Primitive::ContrastOriginal => "contrast_original",
            Primitive::BrightnessOriginal => "brightness_original",
            Primitive::SharpnessOriginal => "sharpness_original",
        }
    }

    /// The primitive Composer calls `name`.
    pub fn from_name(name: &str) -> Option<Primitive> {
        Primitive::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Composer's `augmentation_sets`: `"all"`, `"safe"` (no colour changes) and `"original"`
/// (the `*_original` enhancements instead of the symmetric ones).
pub fn augmentation_set(name: &str) -> Option<Vec<Primitive>> {
    use Primitive::*;
    let safe = vec![
        AutoContrast,
        Equalize,
        Posterize,
        Rotate,
        Solarize,
        ShearX,
        ShearY,
        TranslateX,
        TranslateY,
    ];
    let with = |extra: [Primitive; 4]| safe.iter().copied().chain(extra).collect();
    match name {
        "all" => Some(with([Color, Contrast, Brightness, Sharpness])),
        "safe" => Some(safe.clone()),
        "original" => Some(with([
            ColorOriginal,
            ContrastOriginal,
            BrightnessOriginal,
            SharpnessOriginal,
        ])),
        _ => None,
    }
}

/// The random draws Composer's primitives make from numpy, one method per numpy call, so a
/// recorded trace can be replayed and Tessera's own stream plugged in.
pub trait Draws {
    /// `np.random.choice(set)`: an index in `0..n`.
    fn choice(&mut self, n: usize) -> usize;
    /// `np.random.uniform(low, high)`.
    fn uniform(&mut self, low: f64, high: f64) -> f64;
    /// `np.random.uniform()`: in `[0, 1)`.
    fn uniform_unit(&mut self) -> f64;
    /// `np.random.random()`: in `[0, 1)`.
    fn random(&mut self) -> f64;
    /// `np.random.dirichlet(alpha)` (AugMix's chain weights).
    fn dirichlet(&mut self, alpha: &[f64]) -> Vec<f64>;
    /// `np.random.beta(a, b)` (AugMix's mixing weight).
    fn beta(&mut self, a: f64, b: f64) -> f64;
    /// `np.random.randint(low, high)`: in `low..high` (AugMix's chain depths).
    fn randint(&mut self, low: i64, high: i64) -> i64;
}

/// A `Dirichlet(alpha)` draw from uniforms in `[0, 1)`: Gamma draws (plugin-api's
/// Marsaglia–Tsang) normalized to sum 1, from their logarithms, so that a small `alpha` cannot
/// underflow every Gamma to 0 and divide 0 by 0.
pub fn dirichlet(alpha: &[f64], uniform: &mut dyn FnMut() -> f64) -> Vec<f64> {
    let logs: Vec<f64> = alpha
        .iter()
        .map(|&a| random::gamma_ln(a, uniform))
        .collect();
    let max = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logs.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

/// Tessera's draws: the host's per-sample stream, `choice` and `randint` uniform without bias,
/// `uniform` as numpy computes it from a unit draw (`low + (high − low)·u`), Beta and Dirichlet
/// from plugin-api's Gamma draws.
impl Draws for SampleRandom<'_> {
    fn choice(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.f64()
    }

    fn uniform_unit(&mut self) -> f64 {
        self.f64()
    }

    fn random(&mut self) -> f64 {
        self.f64()
    }

    fn dirichlet(&mut self, alpha: &[f64]) -> Vec<f64> {
        dirichlet(alpha, &mut || self.f64())
    }

    fn beta(&mut self, a: f64, b: f64) -> f64 {
        random::beta(a, b, &mut || self.f64())
    }

    fn randint(&mut self, low: i64, high: i64) -> i64 {
        low + self.below(high.saturating_sub(low).max(1) as u64) as i64
    }
}

/// A primitive with its drawn parameters: what is handed to Pillow.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    AutoContrast,
    Equalize,
    Posterize {
        bits: u32,
    },
    Rotate {
        degrees: i64,
    },
    Solarize {
        threshold: i64,
    },
    /// `Image.transform(AFFINE, data, BILINEAR)` (shears and translations).
    Affine([f64; 6]),
    Color(f64),
    Contrast(f64),
    Brightness(f64),
    Sharpness(f64),
}

/// `_sample_level(n)`: `uniform(0.1, n)`.
fn sample_level(severity: f64, draws: &mut dyn Draws) -> f64 {
    draws.uniform(0.1, severity)
}

/// `_int_parameter(level, maxval)`: `int(level·maxval / 10)`.
pub fn int_parameter(level: f64, maxval: f64) -> i64 {
    (level * maxval / 10.0) as i64
}

/// `_float_parameter(level, maxval)`: `level·maxval / 10`.
pub fn float_parameter(level: f64, maxval: f64) -> f64 {
    level * maxval / 10.0
}

/// `_symmetric_sample(level)`: `uniform(1, level)` if `uniform() > 0.5`, else
/// `uniform(1 − 0.09·level, 1)`.
fn symmetric_sample(level: f64, draws: &mut dyn Draws) -> f64 {
    if draws.uniform_unit() > 0.5 {
        draws.uniform(1.0, level)
    } else {
        draws.uniform(1.0 - 0.09 * level, 1.0)
    }
}

/// Draws the parameters of `primitive` at `severity` for a `width`×`height` image, in
/// Composer's order of numpy calls.
pub fn draw_op(
    primitive: Primitive,
    severity: f64,
    width: usize,
    height: usize,
    draws: &mut dyn Draws,
) -> Op {
    use Primitive as P;
    let original =
        |draws: &mut dyn Draws| float_parameter(sample_level(severity, draws), 1.8) + 0.1;
    match primitive {
        P::AutoContrast => Op::AutoContrast,
        P::Equalize => Op::Equalize,
        P::Posterize => Op::Posterize {
            bits: (4 - int_parameter(sample_level(severity, draws), 4.0)) as u32,
        },
        P::Rotate => {
            let degrees = int_parameter(sample_level(severity, draws), 30.0);
            let negate = draws.uniform_unit() > 0.5;
            Op::Rotate {
                degrees: if negate { -degrees } else { degrees },
            }
        }
        P::Solarize => Op::Solarize {
            threshold: 256 - int_parameter(sample_level(severity, draws), 256.0),
        },
        P::ShearX | P::ShearY => {
            let v = float_parameter(sample_level(severity, draws), 0.3);
            let v = if draws.uniform_unit() > 0.5 { -v } else { v };
            Op::Affine(if primitive == P::ShearX {
                [1.0, v, 0.0, 0.0, 1.0, 0.0]
            } else {
                [1.0, 0.0, 0.0, v, 1.0, 0.0]
            })
        }
        P::TranslateX | P::TranslateY => {
            let size = if primitive == P::TranslateX {
                width
            } else {
                height
            };
            let pixels = int_parameter(sample_level(severity, draws), size as f64 / 3.0);
            let v = if draws.random() > 0.5 {
                -pixels
            } else {
                pixels
            } as f64;
            Op::Affine(if primitive == P::TranslateX {
                [1.0, 0.0, v, 0.0, 1.0, 0.0]
            } else {
                [1.0, 0.0, 0.0, 0.0, 1.0, v]
            })
        }
        P::Color => Op::Color(symmetric_sample(severity, draws)),
        P::Contrast => Op::Contrast(symmetric_sample(severity, draws)),
        P::Brightness => {
            let f = symmetric_sample(severity, draws);
            Op::Brightness(if f > 1.0 { f * 0.75 } else { f })
        }
        P::Sharpness => Op::Sharpness(symmetric_sample(severity, draws)),
        P::ColorOriginal => Op::Color(original(draws)),
        P::ContrastOriginal => Op::Contrast(original(draws)),
        P::BrightnessOriginal => Op::Brightness(original(draws)),
        P::SharpnessOriginal => Op::Sharpness(original(draws)),
    }
}

/// Applies `op` to `img` with Pillow's arithmetic.
pub fn apply_op(img: &mut Image, op: &Op) -> Result<(), Error> {
    match *op {
        Op::AutoContrast => pillow::autocontrast(img),
        Op::Equalize => pillow::equalize(img),
        Op::Posterize { bits } => pillow::posterize(img, bits),
        Op::Rotate { degrees } => pillow::rotate(img, degrees as f64)?,
        Op::Solarize { threshold } => pillow::solarize(img, threshold),
        Op::Affine(m) => pillow::affine(img, &m),
        Op::Color(f) => pillow::color(img, f),
        Op::Contrast(f) => pillow::contrast(img, f),
        Op::Brightness(f) => pillow::brightness(img, f),
        Op::Sharpness(f) => pillow::sharpness(img, f),
    }
    Ok(())
}

/// A host sample (values `k / 255`) as 8-bit: `round(255·v)`, clamped.
pub fn to_image(sample: &Sample) -> Image {
    Image {
        channels: sample.channels,
        height: sample.height,
        width: sample.width,
        data: sample
            .data
            .iter()
            .map(|&v| (v * 255.0).round().clamp(0.0, 255.0) as u8)
            .collect(),
    }
}

/// An 8-bit image as a host sample: `k / 255`.
pub fn to_sample(img: &Image) -> Sample {
    Sample {
        channels: img.channels,
        height: img.height,
        width: img.width,
        data: img.data.iter().map(|&k| k as f32 / 255.0).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_plugin_api::testing::splitmix64;

    fn uniforms(seed: u64) -> impl FnMut() -> f64 {
        let mut state = seed;
        move || (splitmix64(&mut state) >> 11) as f64 / (1u64 << 53) as f64
    }

    #[test]
    fn dirichlet_draws_have_the_dirichlet_moments() {
        // Dir(α·1_k): each weight has mean 1/k and variance (k − 1)/(k²(kα + 1)). Composer's
        // AugMix defaults (α = 1, k = 3) and the golden case's second setting (α = 0.5, k = 2).
        let n = 4000;
        for (alpha, k) in [(1.0, 3usize), (0.5, 2), (0.1, 4)] {
            let mut u = uniforms(k as u64);
            let draws: Vec<Vec<f64>> = (0..n).map(|_| dirichlet(&vec![alpha; k], &mut u)).collect();
            let kf = k as f64;
            let var = (kf - 1.0) / (kf * kf * (kf * alpha + 1.0));
            let se = (var / n as f64).sqrt();
            for i in 0..k {
                let mean = draws.iter().map(|d| d[i]).sum::<f64>() / n as f64;
                assert!(
                    (mean - 1.0 / kf).abs() < 5.0 * se,
                    "Dir({alpha}) weight {i}: mean {mean}, want {} ± {}",
                    1.0 / kf,
                    5.0 * se
                );
            }
            for d in &draws {
                assert!(d.iter().all(|w| (0.0..=1.0).contains(w)), "{d:?}");
                assert!((d.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{d:?}");
            }
        }
    }
}
