//! The file format: safetensors with a JSON metadata entry and a checksum, written atomically.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, View};
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor};

use super::{Checkpoint, CheckpointError, Meta, FORMAT_VERSION};
use crate::files::{hex, write_atomic};

const META_KEY: &str = "tessera.checkpoint";
pub(super) const CHECKSUM_KEY: &str = "tessera.sha256";

/// A tensor as little-endian bytes on the CPU, ready for safetensors (also used by
/// `tessera export`).
pub(crate) struct Blob {
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    pub(super) bytes: Vec<u8>,
}

impl View for &Blob {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn dtype_of(kind: Kind) -> Result<Dtype, CheckpointError> {
    Ok(match kind {
        Kind::Bool => Dtype::BOOL,
        Kind::Uint8 => Dtype::U8,
        Kind::Int8 => Dtype::I8,
        Kind::Int16 => Dtype::I16,
        Kind::Int => Dtype::I32,
        Kind::Int64 => Dtype::I64,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Half => Dtype::F16,
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        other => {
            return Err(CheckpointError::Tensor(format!(
                "tensors of kind {other:?} cannot be saved"
            )))
        }
    })
}

pub(crate) fn kind_of(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::BOOL => Kind::Bool,
        Dtype::U8 => Kind::Uint8,
        Dtype::I8 => Kind::Int8,
        Dtype::I16 => Kind::Int16,
        Dtype::I32 => Kind::Int,
        Dtype::I64 => Kind::Int64,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F16 => Kind::Half,
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        _ => return None,
    })
}

/// Copies `t` (any device, any layout) into a [`Blob`]; fails for kinds safetensors lacks.
pub(crate) fn blob_of(name: &str, t: &Tensor) -> Result<Blob, CheckpointError> {
    let err = |e: tch::TchError| CheckpointError::Tensor(format!("saving `{name}`: {e}"));
    let dtype = dtype_of(t.kind())?;
    let cpu = t
        .f_detach()
        .and_then(|t| t.f_to_device(Device::Cpu))
        .and_then(|t| t.f_contiguous())
        .map_err(err)?;
    let numel = cpu.numel();
    let mut bytes = vec![0u8; numel * cpu.kind().elt_size_in_bytes()];
    cpu.f_copy_data_u8(&mut bytes, numel).map_err(err)?;
    Ok(Blob {
        dtype,
        shape: cpu.size().iter().map(|&d| d as usize).collect(),
        bytes,
    })
}

pub(super) fn hash_tensor(h: &mut Sha256, name: &str, dtype: Dtype, shape: &[usize], bytes: &[u8]) {
    h.update((name.len() as u64).to_le_bytes());
    h.update(name.as_bytes());
    h.update(format!("{dtype:?}").as_bytes());
    h.update((shape.len() as u64).to_le_bytes());
    for d in shape {
        h.update((*d as u64).to_le_bytes());
    }
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The tensor of safetensors view `v` named `name` (copied out of the file's bytes); `Err`
/// names it when its dtype has no libtorch kind or libtorch refuses it.
pub(super) fn tensor_of(
    name: &str,
    v: &safetensors::tensor::TensorView<'_>,
) -> Result<Tensor, String> {
    let kind = kind_of(v.dtype()).ok_or_else(|| {
        format!(
            "`{name}` has dtype {:?}, which Tessera cannot hold",
            v.dtype()
        )
    })?;
    let shape: Vec<i64> = v.shape().iter().map(|&d| d as i64).collect();
    Tensor::f_from_data_size(v.data(), &shape, kind).map_err(|e| format!("`{name}`: {e}"))
}

/// Every tensor of a plain safetensors file (no Tessera metadata needed: an export, a
/// `save_pretrained` or `safetensors.torch.save_file` file), sorted by name.
pub(crate) fn read_plain_tensors(bytes: &[u8]) -> Result<Vec<(String, Tensor)>, String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let mut views = st.tensors();
    views.sort_by(|a, b| a.0.cmp(&b.0));
    views
        .into_iter()
        .map(|(name, v)| tensor_of(&name, &v).map(|t| (name, t)))
        .collect()
}

impl Checkpoint {
    /// The tensors whose names start with `prefix`, with the prefix removed.
    pub fn with_prefix<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a Tensor)> {
        self.tensors
            .iter()
            .filter_map(move |(n, t)| n.strip_prefix(prefix).map(|rest| (rest, t)))
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// The checkpoint as safetensors bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        let meta = serde_json::to_string(&self.meta)
            .map_err(|e| CheckpointError::Tensor(format!("serializing the metadata: {e}")))?;
        let mut blobs: Vec<(String, Blob)> = Vec::with_capacity(self.tensors.len());
        for (name, t) in &self.tensors {
            if blobs.iter().any(|(n, _)| n == name) {
                return Err(CheckpointError::Tensor(format!(
                    "two tensors are named `{name}`"
                )));
            }
            blobs.push((name.clone(), blob_of(name, t)?));
        }
        blobs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut h = Sha256::new();
        h.update(meta.as_bytes());
        for (name, b) in &blobs {
            hash_tensor(&mut h, name, b.dtype, &b.shape, &b.bytes);
        }
        let info = HashMap::from([
            (META_KEY.to_owned(), meta),
            (CHECKSUM_KEY.to_owned(), hex(&h.finalize())),
        ]);
        safetensors::tensor::serialize(blobs.iter().map(|(n, b)| (n.as_str(), b)), &Some(info))
            .map_err(|e| CheckpointError::Tensor(format!("serializing: {e}")))
    }

    /// Parses and verifies checkpoint bytes read from `path` (used in messages).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Checkpoint, CheckpointError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| {
            CheckpointError::corrupt(path, format!("not a valid safetensors file ({e})"))
        })?;
        let (_, header) = SafeTensors::read_metadata(bytes)
            .map_err(|e| CheckpointError::corrupt(path, format!("bad header ({e})")))?;
        let info = header.metadata().as_ref().ok_or_else(|| {
            CheckpointError::corrupt(path, "no Tessera metadata (is it a plain weights file?)")
        })?;
        let meta_text = info.get(META_KEY).ok_or_else(|| {
            CheckpointError::corrupt(path, "no Tessera metadata (is it a plain weights file?)")
        })?;
        let expected = info
            .get(CHECKSUM_KEY)
            .ok_or_else(|| CheckpointError::corrupt(path, "no checksum"))?;
        let mut views = st.tensors();
        views.sort_by(|a, b| a.0.cmp(&b.0));
        let mut h = Sha256::new();
        h.update(meta_text.as_bytes());
        for (name, v) in &views {
            hash_tensor(&mut h, name, v.dtype(), v.shape(), v.data());
        }
        let actual = hex(&h.finalize());
        if &actual != expected {
            return Err(CheckpointError::corrupt(
                path,
                format!("checksum mismatch (stored {expected}, computed {actual})"),
            ));
        }
        let meta: Meta = serde_json::from_str(meta_text)
            .map_err(|e| CheckpointError::corrupt(path, format!("bad metadata: {e}")))?;
        if meta.format != FORMAT_VERSION {
            return Err(CheckpointError::corrupt(
                path,
                format!(
                    "checkpoint format {} (written by Tessera {}); this Tessera reads format {FORMAT_VERSION}",
                    meta.format, meta.tessera_version
                ),
            ));
        }
        let mut tensors = Vec::with_capacity(views.len());
        for (name, v) in views {
            let t = tensor_of(&name, &v).map_err(|e| CheckpointError::corrupt(path, e))?;
            tensors.push((name, t));
        }
        Ok(Checkpoint { meta, tensors })
    }

    /// Reads and verifies the checkpoint at `path`: a file, or the folder of a sharded
    /// checkpoint, whose tensors are put together whole (see [`super::sharded`]).
    pub fn read(path: &Path) -> Result<Checkpoint, CheckpointError> {
        if path.is_dir() {
            let mut c = Checkpoint::read(&path.join(super::sharded::INDEX))?;
            if let Some(index) = &c.meta.shards {
                let whole = super::sharded::assemble(path, index)?;
                c.tensors.extend(whole);
                c.tensors.sort_by(|a, b| a.0.cmp(&b.0));
            }
            return Ok(c);
        }
        let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
            path: path.to_owned(),
            source,
        })?;
        Checkpoint::from_bytes(&bytes, path)
    }

    /// Writes the checkpoint to `path` atomically; returns the number of bytes written.
    pub fn write(&self, path: &Path) -> Result<u64, CheckpointError> {
        let bytes = self.to_bytes()?;
        write_atomic(path, &bytes).map_err(|source| CheckpointError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(bytes.len() as u64)
    }
}
