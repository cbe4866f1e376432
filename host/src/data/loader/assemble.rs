//! Making one batch: its samples read, transformed where each transform runs (`Stages`) with the
//! random stream of each sample (`TransformKey`), and stacked; or its token rows.

use super::batch::{HostBatch, HostInput, Pixels};
use std::borrow::Cow;
use std::sync::Arc;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::data::decode::decode_image;
use crate::data::source::{SampleData, TokenSource};
use crate::data::transforms::{Normalize, Sample, Transform};
use crate::data::{DataError, SampleSource};

use crate::data::TokenRows;
use crate::data::TokenTargets;

/// Where a loader runs each of its image transforms: `transforms[..bytes]` (crops and flips) on
/// the `u8` pixels, `transforms[bytes..host]` on `f32` values (from the first transform that
/// computes new values), and a final `normalize` on the device.
#[derive(Debug, Clone)]
pub(super) struct Stages {
    pub(super) bytes: usize,
    pub(super) host: usize,
    pub(super) device_normalize: Option<Arc<Normalize>>,
}

impl Stages {
    pub(super) fn of(transforms: &[Transform]) -> Stages {
        let (host, device_normalize) = match transforms.last() {
            Some(Transform::Normalize(n)) => (transforms.len() - 1, Some(Arc::new(n.clone()))),
            _ => (transforms.len(), None),
        };
        let bytes = transforms[..host]
            .iter()
            .position(|t| !t.works_on_bytes())
            .unwrap_or(host);
        Stages {
            bytes,
            host,
            device_normalize,
        }
    }

    /// Whether batches stay `u8` to the device.
    pub(super) fn bytes_to_device(&self) -> bool {
        self.bytes == self.host
    }
}

/// The random stream of a sample's transforms: keyed by (seed, epoch), numbered by the sample's
/// position in the whole epoch's order, so it is the same for any number of ranks.
#[derive(Debug, Clone, Copy)]
pub(super) struct TransformKey {
    pub(super) key: [u8; 32],
    pub(super) rank: u64,
    pub(super) world: u64,
    /// The epoch, told to methods' transforms with the sample's index.
    pub(super) epoch: u64,
}

impl TransformKey {
    /// The stream of the sample at `position` in this rank's share.
    pub(super) fn rng(&self, position: usize) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::from_seed(self.key);
        rng.set_stream(position as u64 * self.world + self.rank);
        rng
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn make_batch(
    dataset: &dyn SampleSource,
    transforms: &[Transform],
    stages: &Stages,
    order: &[u32],
    batch_size: usize,
    shape: (usize, usize, usize),
    transform_key: TransformKey,
    batch: u64,
) -> Result<HostBatch, DataError> {
    let start = (batch as usize).saturating_mul(batch_size).min(order.len());
    let end = start.saturating_add(batch_size).min(order.len());
    let (channels, height, width) = shape;
    let per = channels * height * width;
    let capacity = (end - start) * per;
    let mut input = if stages.bytes_to_device() {
        Pixels::Bytes(Vec::with_capacity(capacity))
    } else {
        Pixels::Floats(Vec::with_capacity(capacity))
    };
    let mut target = Vec::with_capacity(end - start);
    let failed = |i: usize, index: usize, e: crate::data::transforms::TransformError| {
        DataError::Invalid(format!("transform {i} on sample {index}: {e}"))
    };
    for (position, &index) in order.iter().enumerate().take(end).skip(start) {
        let index = index as usize;
        // A sample the source leaves out (a skipped bad file) makes the batch shorter.
        let Some((data, label)) = dataset.read(index)? else {
            continue;
        };
        let (c, h, w) = dataset.shape();
        let mut rng = transform_key.rng(position);
        // An encoded image is decoded here, its random crop drawn first from the sample's
        // generator.
        let pixels: Cow<'_, [u8]> = match data {
            SampleData::Pixels(pixels) => pixels,
            SampleData::Encoded { bytes, name, plan } => {
                if (plan.channels, plan.size, plan.size) != (c, h, w) {
                    return Err(DataError::Invalid(format!(
                        "loader: {name} is decoded to {}×{}×{} but the source's samples are \
                         {c}×{h}×{w}",
                        plan.channels, plan.size, plan.size
                    )));
                }
                match decode_image(&bytes, &name, plan, &mut rng) {
                    Ok(pixels) => Cow::Owned(pixels),
                    Err(e) => {
                        dataset.undecodable(index, e)?;
                        continue;
                    }
                }
            }
        };
        // Crops and flips on the u8 pixels (a copy only when there are some).
        let moved;
        let (bytes, bytes_shape): (&[u8], _) = if stages.bytes == 0 {
            (&pixels, (c, h, w))
        } else {
            let mut sample = Sample {
                data: pixels.into_owned(),
                channels: c,
                height: h,
                width: w,
            };
            for (i, transform) in transforms[..stages.bytes].iter().enumerate() {
                transform
                    .apply_to_bytes(&mut sample, &mut rng)
                    .map_err(|e| failed(i, index, e))?;
            }
            moved = sample;
            (&moved.data, moved.shape())
        };
        let out_shape = match &mut input {
            Pixels::Bytes(out) => {
                if bytes.len() == per {
                    out.extend_from_slice(bytes);
                }
                (bytes_shape, bytes.len())
            }
            Pixels::Floats(out) => {
                let (c, h, w) = bytes_shape;
                let mut sample = Sample::from_u8(bytes, c, h, w);
                for (i, transform) in transforms[stages.bytes..stages.host].iter().enumerate() {
                    let at = tessera_plugin_api::SamplePlace {
                        epoch: transform_key.epoch,
                        index: index as u64,
                    };
                    transform
                        .apply_at(&mut sample, &mut rng, at)
                        .map_err(|e| failed(stages.bytes + i, index, e))?;
                }
                if sample.data.len() == per {
                    out.extend_from_slice(&sample.data);
                }
                (sample.shape(), sample.data.len())
            }
        };
        if out_shape != (shape, per) {
            return Err(DataError::Invalid(format!(
                "loader: sample {index} came out as {:?}, expected {shape:?}",
                out_shape.0
            )));
        }
        target.push(label);
    }
    if target.is_empty() && end > start {
        return Err(DataError::Invalid(format!(
            "loader: every sample of batch {batch} was left out (see the warnings above)"
        )));
    }
    Ok(HostBatch {
        input: HostInput::Pixels {
            data: input,
            shape: [target.len(), channels, height, width],
            normalize: stages.device_normalize.clone(),
        },
        target,
        index: batch,
    })
}

pub(super) fn make_token_batch(
    tokens: &dyn TokenSource,
    order: &[u32],
    batch_size: usize,
    epoch: u64,
    batch: u64,
) -> Result<HostBatch, DataError> {
    let start = (batch as usize).saturating_mul(batch_size).min(order.len());
    let end = start.saturating_add(batch_size).min(order.len());
    let (b, t) = (end - start, tokens.seq_len());
    let targets = tokens.targets();
    let per_target = match targets {
        TokenTargets::PerToken => t,
        TokenTargets::PerSequence => 1,
    };
    let mask_len = if tokens.padded() { b * t } else { 0 };
    let types_len = if tokens.paired() { b * t } else { 0 };
    let mut rows = TokenRows {
        input: Vec::with_capacity(b * t),
        target: Vec::with_capacity(b * per_target),
        attention_mask: Vec::with_capacity(mask_len),
        token_type_ids: Vec::with_capacity(types_len),
    };
    for &index in &order[start..end] {
        tokens.read(index as usize, epoch, &mut rows)?;
    }
    if rows.input.len() != b * t
        || rows.target.len() != b * per_target
        || rows.attention_mask.len() != mask_len
        || rows.token_type_ids.len() != types_len
    {
        return Err(DataError::Invalid(format!(
            "loader: batch {batch} of {b} sequences of {t} tokens came out as {} input, {} \
             target, {} attention-mask and {} token-type values",
            rows.input.len(),
            rows.target.len(),
            rows.attention_mask.len(),
            rows.token_type_ids.len()
        )));
    }
    Ok(HostBatch {
        input: HostInput::Tokens {
            ids: rows.input,
            shape: [b, t],
            targets,
            attention_mask: tokens.padded().then_some(rows.attention_mask),
            token_type_ids: tokens.paired().then_some(rows.token_type_ids),
        },
        target: rows.target,
        index: batch,
    })
}
