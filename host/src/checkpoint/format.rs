//! The file format: safetensors with a JSON metadata entry and a checksum, written atomically.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};
use tch::Tensor;

use super::{Checkpoint, CheckpointError, Meta, FORMAT_VERSION};
use crate::files::{hex, write_atomic};
pub(crate) use crate::tensor_file::{tensor_of, Blob};

const META_KEY: &str = "tessera.checkpoint";
pub(super) const CHECKSUM_KEY: &str = "tessera.sha256";

/// Copies `t` (any device, any layout) into a [`Blob`]; fails for kinds safetensors lacks.
pub(crate) fn blob_of(name: &str, t: &Tensor) -> Result<Blob, CheckpointError> {
    crate::tensor_file::blob_of(name, t).map_err(CheckpointError::Tensor)
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
