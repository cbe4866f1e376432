//! MosaicML Streaming's MDS format: a folder with `index.json` (version 2) and the shard files it
//! lists (`shard.NNNNN.mds`, or `shard.NNNNN.mds.zstd` when compressed).
//!
//! A shard file is `u32 n`, then `n + 1` `u32` offsets from the start of the file (sample `i`
//! is the bytes `offsets[i]..offsets[i + 1]`), then the writer's configuration as JSON, then the
//! samples. A sample holds a `u32` size for each variable-size column (in column order), then
//! every column's bytes in column order. Every integer is little-endian.

mod values;
mod writer;

pub use values::{decode_value, parse_pil, Dtype, Encoding, Value};
pub use writer::Writer;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value as Json;

use crate::data::DataError;

/// The name of the index file of an MDS folder.
pub const INDEX: &str = "index.json";

/// One column of an MDS dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// `column_names` entry.
    pub name: String,
    /// `column_encodings` entry.
    pub encoding: Encoding,
    /// `column_sizes` entry: the fixed size, or `None` for a size stored per sample.
    pub size: Option<usize>,
}

/// A file named in `index.json` with its size and hashes.
#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    /// File name inside the dataset folder.
    pub basename: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Algorithm → hex digest.
    pub hashes: BTreeMap<String, String>,
}

/// One shard of an MDS dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// Samples in the shard.
    pub samples: usize,
    /// The uncompressed shard file.
    pub raw: FileInfo,
    /// The compressed file, when the shard is compressed.
    pub zip: Option<FileInfo>,
    /// The compression (`zstd:LEVEL`...), when the shard is compressed.
    pub compression: Option<String>,
    /// The columns, in the order their values are stored.
    pub columns: Vec<Column>,
}

impl Shard {
    /// The file the dataset folder holds for this shard (compressed when compressed).
    pub fn stored(&self) -> &FileInfo {
        self.zip.as_ref().unwrap_or(&self.raw)
    }
}

/// The contents of an MDS `index.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Index {
    /// The shards in order: sample `i` of the dataset is in the first shard whose cumulative
    /// count passes `i`.
    pub shards: Vec<Shard>,
}

impl Index {
    /// Reads and checks `dir/index.json`.
    pub fn read(dir: &Path) -> Result<Index, DataError> {
        let path = dir.join(INDEX);
        let text = std::fs::read(&path).map_err(|e| DataError::io(&path, e))?;
        Index::parse(&text, &path)
    }

    /// Parses the text of an `index.json` (`path` names it in errors).
    pub fn parse(text: &[u8], path: &Path) -> Result<Index, DataError> {
        let bad = |reason: String| DataError::format(path, reason);
        let json: Json = serde_json::from_slice(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        match json.get("version").and_then(Json::as_u64) {
            Some(2) => {}
            other => {
                return Err(bad(format!(
                    "version {} is not the supported MDS index version 2",
                    other.map_or("(missing)".to_string(), |v| v.to_string())
                )))
            }
        }
        let shards = json
            .get("shards")
            .and_then(Json::as_array)
            .ok_or_else(|| bad("no `shards` list".into()))?;
        let shards = shards
            .iter()
            .enumerate()
            .map(|(i, s)| parse_shard(s).map_err(|e| bad(format!("shards[{i}]: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Index { shards })
    }

    /// Total samples.
    pub fn samples(&self) -> usize {
        self.shards.iter().map(|s| s.samples).sum()
    }
}

fn parse_shard(s: &Json) -> Result<Shard, String> {
    let format = s.get("format").and_then(Json::as_str).unwrap_or("");
    if format != "mds" {
        return Err(format!(
            "format `{format}` is not `mds` (Tessera reads MDS shards only)"
        ));
    }
    let samples = s
        .get("samples")
        .and_then(Json::as_u64)
        .ok_or("no `samples` count")? as usize;
    let strings = |key: &str| -> Result<Vec<String>, String> {
        s.get(key)
            .and_then(Json::as_array)
            .ok_or(format!("no `{key}` list"))?
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or(format!("`{key}` holds a non-string"))
            })
            .collect()
    };
    let names = strings("column_names")?;
    let encodings = strings("column_encodings")?;
    let sizes = s
        .get("column_sizes")
        .and_then(Json::as_array)
        .ok_or("no `column_sizes` list")?;
    if names.len() != encodings.len() || names.len() != sizes.len() {
        return Err(format!(
            "{} column_names, {} column_encodings and {} column_sizes",
            names.len(),
            encodings.len(),
            sizes.len()
        ));
    }
    let columns = names
        .into_iter()
        .zip(encodings)
        .zip(sizes)
        .map(|((name, encoding), size)| {
            let parsed = Encoding::parse(&encoding).map_err(|e| format!("column `{name}`: {e}"))?;
            let size = match size {
                Json::Null => None,
                v => Some(
                    v.as_u64()
                        .ok_or(format!("column `{name}`: a column size that is not a number"))?
                        as usize,
                ),
            };
            if parsed.fixed_size().is_some() && parsed.fixed_size() != size {
                return Err(format!(
                    "column `{name}`: encoding `{encoding}` is {:?} bytes, column_sizes says {size:?}",
                    parsed.fixed_size()
                ));
            }
            Ok(Column {
                name,
                encoding: parsed,
                size,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let raw = file_info(s.get("raw_data")).ok_or("no `raw_data` file")?;
    let zip = file_info(s.get("zip_data"));
    let compression = s
        .get("compression")
        .and_then(Json::as_str)
        .map(str::to_string);
    if zip.is_some() != compression.is_some() {
        return Err("`zip_data` and `compression` must be given together".into());
    }
    if let Some(c) = &compression {
        if c.split(':').next() != Some("zstd") {
            return Err(format!(
                "compression `{c}` is not supported (Tessera reads zstd and uncompressed shards)"
            ));
        }
    }
    for f in std::iter::once(&raw).chain(&zip) {
        if f.basename.contains('/') || f.basename.contains('\\') || f.basename.starts_with('.') {
            return Err(format!(
                "shard file name `{}` is not a plain file name",
                f.basename
            ));
        }
    }
    Ok(Shard {
        samples,
        raw,
        zip,
        compression,
        columns,
    })
}

fn file_info(v: Option<&Json>) -> Option<FileInfo> {
    let v = v?;
    let basename = v.get("basename")?.as_str()?.to_string();
    let bytes = v.get("bytes")?.as_u64()?;
    let hashes = v
        .get("hashes")
        .and_then(Json::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    Some(FileInfo {
        basename,
        bytes,
        hashes,
    })
}

/// The bytes of sample `i` of a decompressed shard file.
pub fn sample_bytes<'a>(data: &'a [u8], i: usize, path: &Path) -> Result<&'a [u8], DataError> {
    let word = |k: usize| -> Option<usize> {
        data.get(k * 4..k * 4 + 4)
            .and_then(|b| b.try_into().ok())
            .map(|b| u32::from_le_bytes(b) as usize)
    };
    let n = word(0).ok_or_else(|| DataError::format(path, "shorter than its header"))?;
    if i >= n {
        return Err(DataError::format(
            path,
            format!("sample {i} asked of a shard of {n}"),
        ));
    }
    let (begin, end) = word(1 + i)
        .zip(word(2 + i))
        .ok_or_else(|| DataError::format(path, "shorter than its offsets"))?;
    data.get(begin..end).ok_or_else(|| {
        DataError::format(
            path,
            format!(
                "sample {i} at bytes {begin}..{end} lies outside the file of {}",
                data.len()
            ),
        )
    })
}

/// Splits a sample's bytes into its column values.
pub fn split_columns<'a>(columns: &[Column], sample: &'a [u8]) -> Result<Vec<&'a [u8]>, String> {
    let mut at = 0;
    let mut sizes = Vec::with_capacity(columns.len());
    for c in columns {
        match c.size {
            Some(s) => sizes.push(s),
            None => {
                let b = sample
                    .get(at..at + 4)
                    .ok_or("a sample shorter than its column sizes")?;
                sizes.push(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
                at += 4;
            }
        }
    }
    let mut out = Vec::with_capacity(columns.len());
    for (c, size) in columns.iter().zip(sizes) {
        out.push(
            sample
                .get(at..at + size)
                .ok_or_else(|| format!("column `{}` runs past the end of the sample", c.name))?,
        );
        at += size;
    }
    Ok(out)
}

/// Decompresses a stored shard file as its `compression` says (`None`: as it is).
pub fn decompress(
    compression: Option<&str>,
    data: Vec<u8>,
    path: &Path,
) -> Result<Vec<u8>, DataError> {
    match compression {
        None => Ok(data),
        Some(c) if c.split(':').next() == Some("zstd") => zstd::stream::decode_all(&data[..])
            .map_err(|e| DataError::format(path, format!("zstd: {e}"))),
        Some(c) => Err(DataError::format(
            path,
            format!("compression `{c}` is not supported"),
        )),
    }
}
