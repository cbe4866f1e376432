//! What a loader serves: a batch on the host (`HostBatch`), its input as pixels or values
//! (`HostInput`, `Pixels`).

use std::sync::Arc;

use crate::data::transforms::Normalize;
use crate::data::TokenTargets;

/// One batch in host memory, ready to become tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBatch {
    /// The images or token sequences.
    pub input: HostInput,
    /// B class indices (images, labelled text), or B×T target ids (token sequences).
    pub target: Vec<i64>,
    /// The batch's index within its epoch.
    pub index: u64,
}

/// The input half of a [`HostBatch`].
#[derive(Debug, Clone, PartialEq)]
pub enum HostInput {
    /// B×C×H×W pixels after the host's transforms, with their shape `[B, C, H, W]`; B is smaller
    /// than the batch size only for the last batch when `drop_last` is off, or when the source
    /// left samples out (skipped bad files). What the model sees is [`HostBatch::input_f32`]:
    /// the device computes it from `data` and `normalize`.
    Pixels {
        /// The pixels, sample after sample.
        data: Pixels,
        /// `[B, C, H, W]`.
        shape: [usize; 4],
        /// The normalization still to run (on the device), after the scaling of `u8` pixels.
        normalize: Option<Arc<Normalize>>,
    },
    /// B×T token ids with their shape `[B, T]`.
    Tokens {
        /// The ids, sequence after sequence.
        ids: Vec<i64>,
        /// `[B, T]`.
        shape: [usize; 2],
        /// What the batch's targets are: B×T token ids or B class indices.
        targets: TokenTargets,
        /// B×T: 1 on a token, 0 on padding; only for padded sequences (labelled text).
        attention_mask: Option<Vec<i64>>,
        /// B×T: 0 on a pair's first text, 1 on its second; only for sentence pairs.
        token_type_ids: Option<Vec<i64>>,
    },
}

/// The pixels of an image batch, sample after sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Pixels {
    /// `u8` pixels, as decoded and moved by crops and flips: the device scales them to [0, 1]
    /// (÷255).
    Bytes(Vec<u8>),
    /// `f32` values in [0, 1]: a transform that computes new values (a method's) ran.
    Floats(Vec<f32>),
}

impl Pixels {
    /// Values in the batch.
    pub fn len(&self) -> usize {
        match self {
            Pixels::Bytes(v) => v.len(),
            Pixels::Floats(v) => v.len(),
        }
    }

    /// Whether the batch holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The size of the buffer in bytes: what crosses to the device.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            Pixels::Bytes(v) => v.len(),
            Pixels::Floats(v) => std::mem::size_of_val(v.as_slice()),
        }
    }
}

impl HostBatch {
    /// Samples (images or sequences) in the batch.
    pub fn len(&self) -> usize {
        match &self.input {
            HostInput::Pixels { shape, .. } => shape[0],
            HostInput::Tokens { shape, .. } => shape[0],
        }
    }

    /// Whether the batch holds no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The input's shape: `[B, C, H, W]` or `[B, T]`.
    pub fn input_shape(&self) -> Vec<usize> {
        match &self.input {
            HostInput::Pixels { shape, .. } => shape.to_vec(),
            HostInput::Tokens { shape, .. } => shape.to_vec(),
        }
    }

    /// The pixels of an image batch (`None` for token sequences).
    pub fn pixels(&self) -> Option<&Pixels> {
        match &self.input {
            HostInput::Pixels { data, .. } => Some(data),
            HostInput::Tokens { .. } => None,
        }
    }

    /// The input of an image batch as the model sees it, computed on the host: `u8` pixels
    /// scaled to [0, 1] (÷255), then normalized, `(x - mean) * (1 / std)` per channel, in `f32`.
    /// The device computes the same from [`HostInput::Pixels`]; this is its reference, and what
    /// the loader served before it left those steps to the device. `None` for token sequences.
    pub fn input_f32(&self) -> Option<Vec<f32>> {
        let HostInput::Pixels {
            data,
            shape,
            normalize,
        } = &self.input
        else {
            return None;
        };
        let mut values = match data {
            Pixels::Bytes(bytes) => bytes.iter().map(|&p| f32::from(p) / 255.0).collect(),
            Pixels::Floats(values) => values.clone(),
        };
        if let Some(n) = normalize {
            n.normalize_planes(&mut values, shape[1], shape[2] * shape[3]);
        }
        Some(values)
    }

    /// Bytes of the input buffer: what crosses to the device.
    pub fn input_size_in_bytes(&self) -> usize {
        match &self.input {
            HostInput::Pixels { data, .. } => data.size_in_bytes(),
            HostInput::Tokens { ids, .. } => std::mem::size_of_val(ids.as_slice()),
        }
    }

    /// Tokens in the batch's input (B×T; 0 for images).
    pub fn tokens(&self) -> u64 {
        match &self.input {
            HostInput::Pixels { .. } => 0,
            HostInput::Tokens { ids, .. } => ids.len() as u64,
        }
    }
}
