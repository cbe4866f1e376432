//! Per-sample transforms (plugin-api 1.3): a method can hand the host a transform of single
//! training images — RandAugment, AugMix, ColOut's sample-wise mode — which the host runs on
//! its loader's worker threads, off the training thread, with a random stream that is a pure
//! function of (seed, epoch, position). So batches stay the same for any number of workers and a
//! resumed run starts mid-epoch without replaying anything.
//!
//! The host runs plugin transforms after its own crop and flip and before its normalization,
//! where Composer inserts RandAugment and AugMix (on the PIL image, before `ToTensor`'s
//! normalization). Values are in `[0, 1]` (pixel / 255); a transform that emulates an 8-bit
//! image library rounds to the `k / 255` grid itself. Methods from several plugins run in the
//! order the plugins are listed.

use abi_stable::std_types::{RResult, RVec};

use crate::abi::{
    PluginError, SampleBuf, SamplePlace, SampleRng, SampleShape, SampleTransformBox,
    SampleTransformObject, SampleTransformObject_TO,
};
use crate::{guard, Error, ErrorKind};

/// One training image: channel-major values in `[0, 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Channels (C).
    pub channels: usize,
    /// Rows (H).
    pub height: usize,
    /// Columns (W).
    pub width: usize,
    /// C×H×W values.
    pub data: Vec<f32>,
}

impl Sample {
    /// The shape as (C, H, W).
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.channels, self.height, self.width)
    }

    /// The value at channel `c`, row `y`, column `x` (panics outside the image).
    pub fn at(&self, c: usize, y: usize, x: usize) -> f32 {
        self.data[(c * self.height + y) * self.width + x]
    }
}

/// The random stream of one sample, handed to [`SampleTransform::apply`].
pub struct SampleRandom<'a> {
    rng: SampleRng,
    _call: std::marker::PhantomData<&'a mut ()>,
}

impl SampleRandom<'_> {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        (self.rng.next_u64)(self.rng.state)
    }

    /// A uniform integer in `0..n` (`n > 0`), without modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        uniform_below(n, || self.next_u64())
    }

    /// A uniform float in `[0, 1)`.
    pub fn f64(&mut self) -> f64 {
        unit_f64(self.next_u64())
    }
}

/// A uniform integer in `0..n` from a stream of 64-bit values, rejecting the biased zone.
pub(crate) fn uniform_below(n: u64, mut next: impl FnMut() -> u64) -> u64 {
    if n <= 1 {
        return 0;
    }
    let zone = u64::MAX - (u64::MAX % n);
    loop {
        let v = next();
        if v < zone {
            return v % n;
        }
    }
}

/// The top 53 bits of `bits` as a float in `[0, 1)`.
pub(crate) fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A transform of single training images, run by the host on its loader's worker threads.
/// Return one from [`crate::Method::sample_transform`].
pub trait SampleTransform: Send + Sync + 'static {
    /// The (C, H, W) this transform makes of an input of `shape`; the same for every sample.
    /// Default: the shape is kept.
    fn output_shape(&self, shape: (usize, usize, usize)) -> Result<(usize, usize, usize), Error> {
        Ok(shape)
    }

    /// Transforms `sample` in place, drawing any randomness from `rng`.
    fn apply(&self, sample: &mut Sample, rng: &mut SampleRandom<'_>) -> Result<(), Error>;

    /// Transforms `sample`, knowing which sample of which epoch it is (plugin-api 1.6): a
    /// transform that depends on the sample's identity (a flip that alternates per image and
    /// epoch) overrides this. A 1.6 host calls it; an older host calls [`SampleTransform::apply`].
    /// By default it calls `apply`.
    fn apply_at(
        &self,
        sample: &mut Sample,
        rng: &mut SampleRandom<'_>,
        at: SamplePlace,
    ) -> Result<(), Error> {
        let _ = at;
        self.apply(sample, rng)
    }
}

/// Adapts a [`SampleTransform`] to the ABI, guarding every call.
struct SampleAdapter(Box<dyn SampleTransform>);

fn abi_shape(shape: (usize, usize, usize)) -> Result<SampleShape, Error> {
    SampleShape::new(shape).map_err(|e| Error::new(ErrorKind::OTHER, e))
}

impl SampleTransformObject for SampleAdapter {
    fn output_shape(&self, shape: SampleShape) -> RResult<SampleShape, PluginError> {
        guard(|| abi_shape(self.0.output_shape(shape.dims())?))
            .map_err(PluginError::from)
            .into()
    }

    fn apply(&self, sample: SampleBuf, rng: SampleRng) -> RResult<SampleBuf, PluginError> {
        self.run(sample, rng, None)
    }

    fn apply_at(
        &self,
        sample: SampleBuf,
        rng: SampleRng,
        at: SamplePlace,
    ) -> RResult<SampleBuf, PluginError> {
        self.run(sample, rng, Some(at))
    }
}

impl SampleAdapter {
    /// One guarded call of the transform (`apply_at` when the host says which sample it is).
    fn run(
        &self,
        sample: SampleBuf,
        rng: SampleRng,
        at: Option<SamplePlace>,
    ) -> RResult<SampleBuf, PluginError> {
        let mut s = Sample {
            channels: sample.channels as usize,
            height: sample.height as usize,
            width: sample.width as usize,
            data: sample.data.into_vec(),
        };
        let mut random = SampleRandom {
            rng,
            _call: std::marker::PhantomData,
        };
        guard(|| {
            match at {
                Some(at) => self.0.apply_at(&mut s, &mut random, at)?,
                None => self.0.apply(&mut s, &mut random)?,
            }
            let shape = abi_shape(s.shape())?;
            if s.data.len() != s.channels * s.height * s.width {
                return Err(Error::new(
                    ErrorKind::OTHER,
                    format!(
                        "the transformed sample holds {} values for a {}x{}x{} shape",
                        s.data.len(),
                        s.channels,
                        s.height,
                        s.width
                    ),
                ));
            }
            Ok(SampleBuf {
                channels: shape.channels,
                height: shape.height,
                width: shape.width,
                data: RVec::from(std::mem::take(&mut s.data)),
            })
        })
        .map_err(PluginError::from)
        .into()
    }
}

/// The ABI object of a [`SampleTransform`].
pub(crate) fn sample_box(transform: Box<dyn SampleTransform>) -> SampleTransformBox {
    SampleTransformObject_TO::from_value(
        SampleAdapter(transform),
        abi_stable::sabi_trait::TD_Opaque,
    )
}

#[cfg(test)]
mod tests {
    use std::ffi::c_void;

    use super::*;
    use crate::abi::SampleRngState;

    /// Drops every other column and adds the first draw (as a fraction) to each value.
    struct HalveWidth;

    impl SampleTransform for HalveWidth {
        fn output_shape(
            &self,
            (c, h, w): (usize, usize, usize),
        ) -> Result<(usize, usize, usize), Error> {
            if w < 2 {
                return Err("too narrow".into());
            }
            Ok((c, h, w / 2))
        }

        fn apply(&self, s: &mut Sample, rng: &mut SampleRandom<'_>) -> Result<(), Error> {
            let add = rng.below(4) as f32 / 4.0;
            let (c, h, w) = s.shape();
            let mut out = Vec::with_capacity(c * h * (w / 2));
            for ch in 0..c {
                for y in 0..h {
                    for x in (0..w / 2 * 2).step_by(2) {
                        out.push(s.at(ch, y, x) + add);
                    }
                }
            }
            if s.data.iter().any(|v| v.is_nan()) {
                panic!("NaN pixel");
            }
            *s = Sample {
                channels: c,
                height: h,
                width: w / 2,
                data: out,
            };
            Ok(())
        }
    }

    extern "C" fn counter(state: SampleRngState) -> u64 {
        // SAFETY: the tests pass a pointer to a live u64.
        let n = unsafe { &mut *(state.0 as *mut u64) };
        *n += 1;
        *n
    }

    fn run(data: Vec<f32>, w: u32) -> Result<SampleBuf, String> {
        let object = sample_box(Box::new(HalveWidth));
        let mut n = 0u64;
        let rng = SampleRng {
            next_u64: counter,
            state: SampleRngState(&mut n as *mut u64 as *mut c_void),
        };
        let buf = SampleBuf {
            channels: 1,
            height: 1,
            width: w,
            data: RVec::from(data),
        };
        object
            .apply(buf, rng)
            .into_result()
            .map_err(|e| format!("{}: {}", e.kind.name(), e.message))
    }

    #[test]
    fn a_transform_crosses_the_abi_with_its_shape_and_the_hosts_random_stream() {
        let out = run(vec![0.0, 0.1, 0.2, 0.3], 4).unwrap();
        assert_eq!((out.channels, out.height, out.width), (1, 1, 2));
        // The first draw of the counter stream is 1: `below(4)` = 1, so 0.25 is added.
        assert_eq!(out.data.as_slice(), &[0.25, 0.45]);
        let object = sample_box(Box::new(HalveWidth));
        let shape = |w| SampleShape {
            channels: 3,
            height: 8,
            width: w,
        };
        assert_eq!(object.output_shape(shape(8)).unwrap(), shape(4));
        let err = object.output_shape(shape(1)).into_result().unwrap_err();
        assert_eq!(err.message.as_str(), "too narrow");
    }

    #[test]
    fn a_panic_in_a_transform_is_an_error() {
        let err = run(vec![f32::NAN, 0.0], 2).unwrap_err();
        assert_eq!(err, "panic: NaN pixel");
    }

    #[test]
    fn uniform_below_rejects_the_biased_zone() {
        let mut values = vec![u64::MAX, 7].into_iter();
        // u64::MAX is in the zone that would bias `% 10`, so 7 is used.
        assert_eq!(uniform_below(10, || values.next().unwrap_or(0)), 7);
        assert_eq!(uniform_below(1, || unreachable!()), 0);
        assert_eq!(unit_f64(0), 0.0);
        assert!(unit_f64(u64::MAX) < 1.0);
    }
}
