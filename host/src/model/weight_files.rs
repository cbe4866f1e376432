//! Where `[model] init_weights` reads from: one safetensors file, or a Hugging Face
//! `save_pretrained` folder — `model.safetensors`, or shards `model-0000k-of-0000n.safetensors`
//! listed by `model.safetensors.index.json` (`weight_map`: tensor name → shard file).
//!
//! A sharded folder is read lazily: first every shard's header (names, shapes, dtypes: a few
//! kilobytes each), against which the names and shapes are checked without any tensor's data,
//! then the shards one at a time, each dropped once its tensors are in the model, so that
//! loading holds at most the largest shard beside the model.

use std::collections::BTreeMap;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

use super::init_weights::InitWeightsError;

/// The single file of a `save_pretrained` folder.
pub const SINGLE: &str = "model.safetensors";
/// The index of a sharded `save_pretrained` folder.
pub const INDEX: &str = "model.safetensors.index.json";

/// The safetensors files `path` names: itself when it is a file; a folder's
/// `model.safetensors`, else the shards its index lists (in the index's order, each once).
pub fn weight_files(path: &Path) -> Result<Vec<PathBuf>, InitWeightsError> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let format = |message: String| InitWeightsError::Format {
        path: path.to_owned(),
        message,
    };
    let single = path.join(SINGLE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = path.join(INDEX);
    if !index.is_file() {
        let pickled = ["pytorch_model.bin", "pytorch_model.bin.index.json"]
            .iter()
            .any(|f| path.join(f).exists());
        return Err(format(format!(
            "a weights folder holds `{SINGLE}` or `{INDEX}` (Hugging Face's save_pretrained), \
             and this one has neither{}",
            if pickled {
                "; its pytorch_model.bin is a pickle: convert it with `python \
                 scripts/to_safetensors.py` (or save_pretrained(safe_serialization=True))"
            } else {
                ""
            }
        )));
    }
    let text = std::fs::read_to_string(&index).map_err(|source| InitWeightsError::Io {
        path: index.clone(),
        source,
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format(format!("{INDEX} is not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| format(format!("{INDEX} has no `weight_map` object")))?;
    let mut files: Vec<PathBuf> = Vec::new();
    for (tensor, file) in map {
        let name = file.as_str().ok_or_else(|| {
            format(format!(
                "{INDEX}: `{tensor}` maps to {file}, not a file name"
            ))
        })?;
        // A shard is a file of this folder, not a path elsewhere.
        if name.contains('/') || name.contains('\\') || name.starts_with('.') {
            return Err(format(format!(
                "{INDEX}: `{tensor}` maps to {name:?}, not a file of this folder"
            )));
        }
        let shard = path.join(name);
        if !files.contains(&shard) {
            if !shard.is_file() {
                return Err(format(format!(
                    "{INDEX} lists {name}, which is missing (for `{tensor}`)"
                )));
            }
            files.push(shard);
        }
    }
    if files.is_empty() {
        return Err(format(format!("{INDEX} lists no tensors")));
    }
    Ok(files)
}

/// The names, shapes and dtypes of a safetensors file, read from its header only.
pub fn header(path: &Path) -> Result<Vec<(String, Vec<i64>, Kind)>, InitWeightsError> {
    let format = |message: String| InitWeightsError::Format {
        path: path.to_owned(),
        message,
    };
    let io = |source| InitWeightsError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => format(
            "not a safetensors file (shorter than the 8 bytes of its header's length)".to_owned(),
        ),
        _ => io(e),
    })?;
    // A safetensors header is JSON: its first byte `{` tells a real header length that happens
    // to look like a pickle's opcodes from a pickle.
    let mut brace = [0u8; 1];
    let json_follows = file.read_exact(&mut brace).is_ok() && brace[0] == b'{';
    if let (Some(what), false) = (pickled(&len), json_follows) {
        return Err(format(format!(
            "this is {what}, not a safetensors file, and a pickle cannot be read safely; convert \
             it once with `python scripts/to_safetensors.py {} model.safetensors` (the \
             state_dict's tensors, same names) and give that file (a Tessera checkpoint goes to \
             `checkpoint.load` with `weights_only = true`)",
            path.display()
        )));
    }
    file.seek(std::io::SeekFrom::Start(8)).map_err(io)?;
    let len = u64::from_le_bytes(len);
    let size = file.metadata().map_err(io)?.len();
    if len > size.saturating_sub(8) || len > 100 << 20 {
        return Err(format(format!(
            "not a safetensors file (its header would be {len} bytes of a {size}-byte file)"
        )));
    }
    let mut text = vec![0u8; len as usize];
    file.read_exact(&mut text).map_err(io)?;
    let json: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&text)
        .map_err(|e| format(format!("not a safetensors file (its header: {e})")))?;
    let mut out = Vec::new();
    for (name, entry) in json {
        if name == "__metadata__" {
            continue;
        }
        let dtype = entry.get("dtype").and_then(|d| d.as_str()).unwrap_or("");
        let kind = match dtype {
            "F64" => Kind::Double,
            "F32" => Kind::Float,
            "F16" => Kind::Half,
            "BF16" => Kind::BFloat16,
            "I64" => Kind::Int64,
            "I32" => Kind::Int,
            "I16" => Kind::Int16,
            "I8" => Kind::Int8,
            "U8" => Kind::Uint8,
            "BOOL" => Kind::Bool,
            other => {
                return Err(format(format!(
                    "`{name}` has dtype {other:?}, which Tessera does not read"
                )))
            }
        };
        let shape = entry
            .get("shape")
            .and_then(|s| s.as_array())
            .map(|dims| {
                dims.iter()
                    .map(|d| d.as_i64().unwrap_or(-1))
                    .collect::<Vec<_>>()
            })
            .filter(|dims| dims.iter().all(|d| *d >= 0))
            .ok_or_else(|| format(format!("`{name}` has no valid shape in the header")))?;
        out.push((name, shape, kind));
    }
    Ok(out)
}

/// What a file starting with `start` is when it is a PyTorch pickle rather than safetensors:
/// `torch.save`'s zip archive (`PK\x03\x04`, PyTorch 1.6 on) or a bare pickle (protocol 2 to
/// 5's `\x80` opcode, older `torch.save` and pickled state dicts).
fn pickled(start: &[u8; 8]) -> Option<&'static str> {
    match start {
        [b'P', b'K', 3, 4, ..] => Some("a PyTorch file (torch.save's zip archive of pickles)"),
        [0x80, 2..=5, ..] => Some("a Python pickle (an older torch.save file)"),
        _ => None,
    }
}

/// A stand-in of a tensor's shape and dtype holding one element (a zero expanded to the
/// shape), for checking names and shapes before any data is read.
pub fn stand_in(shape: &[i64], kind: Kind) -> Result<Tensor, tch::TchError> {
    Tensor::f_zeros([], (kind, tch::Device::Cpu))?.f_expand(shape, false)
}
