//! Sharded checkpoints (`[distributed] sharding` with `checkpoint.sharded`): a folder
//! `ep{E}-ba{B}.ckpt/` in which every rank wrote its own slices of the sharded tensors (the
//! parameters it steps and their optimizer state) into `rank-<r>.pieces`, and rank 0 the
//! rest — metadata, buffers, the methods' and the trainer's state — into [`INDEX`], whose
//! metadata holds the [`ShardIndex`]: which tensor lies where, in which slices, and each
//! file's checksum. Nothing is gathered to one rank to write it.
//!
//! The folder is filled under a temporary name and renamed when every rank's file is there,
//! so a partial set is never a checkpoint (nor `latest`). Reading it ([`super::Checkpoint::read`]
//! on the folder) verifies every file and puts each tensor together whole: the checkpoint is
//! then the one a single file holds, and resumes on any number of ranks and in any mode.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::SafeTensors;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tch::{Kind, Tensor};

use super::format::{blob_of, hash_tensor, tensor_of, CHECKSUM_KEY};
use super::CheckpointError;
use crate::files::{hex, write_atomic};

/// Rank 0's file in a sharded checkpoint folder.
pub const INDEX: &str = "index.ckpt";

const PIECES_KEY: &str = "tessera.pieces";

/// The file of rank `rank`'s slices.
pub fn pieces_file(rank: usize) -> String {
    format!("rank-{rank}.pieces")
}

/// Where the sharded tensors of a checkpoint folder lie.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardIndex {
    /// Ranks that wrote it.
    pub world: usize,
    /// Each rank's file, in rank order.
    pub files: Vec<PieceFile>,
    /// The tensors cut into slices.
    pub tensors: Vec<ShardedTensor>,
}

/// One rank's file of slices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PieceFile {
    /// File name in the folder.
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// SHA-256 of its contents.
    pub sha256: String,
}

/// A tensor saved in slices: its full name (`model/...`, `optim/...`), its size and memory
/// layout, and the slices (rank, first element, length) in its memory order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardedTensor {
    /// Full name in the checkpoint.
    pub name: String,
    /// Size.
    pub size: Vec<i64>,
    /// Strides of its memory layout (the slices follow that order).
    pub strides: Vec<i64>,
    /// (rank, first element, length), covering the tensor once.
    pub slices: Vec<(usize, i64, i64)>,
}

/// Writes `tensors` (1-D slices, by full name) as rank `rank`'s file in `folder`, atomically.
pub fn write_pieces(
    folder: &Path,
    rank: usize,
    tensors: &[(String, Tensor)],
) -> Result<PieceFile, CheckpointError> {
    let name = pieces_file(rank);
    let mut blobs = Vec::with_capacity(tensors.len());
    for (n, t) in tensors {
        blobs.push((n.clone(), blob_of(n, t)?));
    }
    blobs.sort_by(|a, b| a.0.cmp(&b.0));
    let label = format!("rank {rank}");
    let mut h = Sha256::new();
    h.update(label.as_bytes());
    for (n, b) in &blobs {
        hash_tensor(&mut h, n, b.dtype, &b.shape, &b.bytes);
    }
    let info = HashMap::from([
        (PIECES_KEY.to_owned(), label),
        (CHECKSUM_KEY.to_owned(), hex(&h.finalize())),
    ]);
    let bytes =
        safetensors::tensor::serialize(blobs.iter().map(|(n, b)| (n.as_str(), b)), &Some(info))
            .map_err(|e| CheckpointError::Tensor(format!("serializing {name}: {e}")))?;
    let path = folder.join(&name);
    write_atomic(&path, &bytes).map_err(|source| CheckpointError::Io {
        path: path.clone(),
        source,
    })?;
    Ok(PieceFile {
        name,
        bytes: bytes.len() as u64,
        sha256: hex(&Sha256::digest(&bytes)),
    })
}

/// Reads and verifies one rank's file of slices.
fn read_pieces(
    folder: &Path,
    file: &PieceFile,
) -> Result<HashMap<String, Tensor>, CheckpointError> {
    let path = folder.join(&file.name);
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.clone(),
        reason,
    };
    let bytes = std::fs::read(&path).map_err(|source| CheckpointError::Io {
        path: path.clone(),
        source,
    })?;
    let sha = hex(&Sha256::digest(&bytes));
    if bytes.len() as u64 != file.bytes || sha != file.sha256 {
        return Err(corrupt(format!(
            "{} bytes with SHA-256 {sha}; the index expects {} bytes with {}",
            bytes.len(),
            file.bytes,
            file.sha256
        )));
    }
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| corrupt(format!("not a valid safetensors file ({e})")))?;
    let mut out = HashMap::new();
    for (name, v) in st.tensors() {
        let t = tensor_of(&name, &v).map_err(corrupt)?;
        out.insert(name, t);
    }
    Ok(out)
}

/// Every tensor of `index`, put together whole from the files in `folder`.
pub fn assemble(
    folder: &Path,
    index: &ShardIndex,
) -> Result<Vec<(String, Tensor)>, CheckpointError> {
    let mut files = Vec::with_capacity(index.files.len());
    for f in &index.files {
        files.push(read_pieces(folder, f)?);
    }
    let bad = |reason: String| CheckpointError::Corrupt {
        path: folder.to_owned(),
        reason,
    };
    let torch = |name: &str, e: tch::TchError| bad(format!("putting `{name}` together: {e}"));
    let mut out = Vec::with_capacity(index.tensors.len());
    for t in &index.tensors {
        let numel: i64 = t.size.iter().product();
        let mut kind: Option<Kind> = None;
        let mut covered = 0;
        let mut whole: Option<Tensor> = None;
        if numel == 0 {
            let w = Tensor::f_empty_strided(&t.size, &t.strides, (Kind::Float, tch::Device::Cpu))
                .map_err(|e| torch(&t.name, e))?;
            whole = Some(w);
        }
        for &(rank, start, len) in &t.slices {
            if len == 0 {
                continue;
            }
            let piece = files
                .get(rank)
                .and_then(|f| f.get(&t.name))
                .ok_or_else(|| bad(format!("rank {rank}'s slice of `{}` is missing", t.name)))?;
            if piece.numel() as i64 != len || start < 0 || start + len > numel {
                return Err(bad(format!(
                    "rank {rank}'s slice of `{}` holds {} elements, the index {len} from {start} \
                     of {numel}",
                    t.name,
                    piece.numel()
                )));
            }
            let target = match &whole {
                Some(w) => w.shallow_clone(),
                None => {
                    let k = piece.kind();
                    kind = Some(k);
                    let w = Tensor::f_empty_strided(&t.size, &t.strides, (k, tch::Device::Cpu))
                        .map_err(|e| torch(&t.name, e))?;
                    whole = Some(w.shallow_clone());
                    w
                }
            };
            if Some(piece.kind()) != kind {
                return Err(bad(format!("the slices of `{}` differ in dtype", t.name)));
            }
            let flat = target
                .f_as_strided([numel], [1], 0)
                .and_then(|f| f.f_narrow(0, start, len))
                .map_err(|e| torch(&t.name, e))?;
            flat.shallow_clone()
                .f_copy_(piece)
                .map_err(|e| torch(&t.name, e))?;
            covered += len;
        }
        let Some(whole) = whole.filter(|_| covered == numel) else {
            return Err(bad(format!(
                "the slices of `{}` cover {covered} of its {numel} elements",
                t.name
            )));
        };
        out.push((t.name.clone(), whole));
    }
    Ok(out)
}
