//! MosaicML Streaming's MDS format: a folder with `index.json` (version 2) and the shard files it
//! lists (`shard.NNNNN.mds`, or `shard.NNNNN.mds.zstd` when compressed).
//!
//! A shard file is `u32 n`, then `n + 1` `u32` offsets from the start of the file (sample `i`
//! is the bytes `offsets[i]..offsets[i + 1]`), then the writer's configuration as JSON, then the
//! samples. A sample holds a `u32` size for each variable-size column (in column order), then
//! every column's bytes in column order. Every integer is little-endian.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::data::DataError;

/// The name of the index file of an MDS folder.
pub const INDEX: &str = "index.json";

/// A numeric element type of an MDS scalar or `ndarray` column (numpy's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    U8,
    I8,
    U16,
    I16,
    F16,
    U32,
    I32,
    F32,
    U64,
    I64,
    F64,
}

impl Dtype {
    /// Every dtype with its numpy name and the code `ndarray` columns store it as.
    const ALL: [(&'static str, Dtype, u8); 11] = [
        ("uint8", Dtype::U8, 8),
        ("int8", Dtype::I8, 9),
        ("uint16", Dtype::U16, 16),
        ("int16", Dtype::I16, 17),
        ("float16", Dtype::F16, 18),
        ("uint32", Dtype::U32, 32),
        ("int32", Dtype::I32, 33),
        ("float32", Dtype::F32, 34),
        ("uint64", Dtype::U64, 64),
        ("int64", Dtype::I64, 65),
        ("float64", Dtype::F64, 66),
    ];

    /// The dtype of a numpy name.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Self::ALL.iter().find(|(n, ..)| *n == name).map(|e| e.1)
    }

    fn from_code(code: u8) -> Option<Dtype> {
        Self::ALL.iter().find(|e| e.2 == code).map(|e| e.1)
    }

    /// The numpy name.
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|e| e.1 == self).map_or("?", |e| e.0)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// The little-endian element `bytes` (of [`size`](Self::size)) as an `f64`.
    fn to_f64(self, b: &[u8]) -> f64 {
        match self {
            Dtype::U8 => f64::from(b[0]),
            Dtype::I8 => f64::from(b[0] as i8),
            Dtype::U16 => f64::from(u16::from_le_bytes([b[0], b[1]])),
            Dtype::I16 => f64::from(i16::from_le_bytes([b[0], b[1]])),
            Dtype::F16 => f16_to_f64(u16::from_le_bytes([b[0], b[1]])),
            Dtype::U32 => f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::U64 => u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f64,
            Dtype::I64 => i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f64,
            Dtype::F64 => f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
        }
    }

    /// The element as an `i64` when it is an integer type that fits.
    fn to_i64(self, b: &[u8]) -> Option<i64> {
        Some(match self {
            Dtype::U8 => i64::from(b[0]),
            Dtype::I8 => i64::from(b[0] as i8),
            Dtype::U16 => i64::from(u16::from_le_bytes([b[0], b[1]])),
            Dtype::I16 => i64::from(i16::from_le_bytes([b[0], b[1]])),
            Dtype::U32 => i64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::I32 => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::U64 => i64::try_from(u64::from_le_bytes(b[..8].try_into().ok()?)).ok()?,
            Dtype::I64 => i64::from_le_bytes(b[..8].try_into().ok()?),
            Dtype::F16 | Dtype::F32 | Dtype::F64 => return None,
        })
    }
}

/// IEEE half precision to `f64`.
fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((h >> 10) & 0x1f);
    let fraction = f64::from(h & 0x3ff);
    match exponent {
        0 => sign * fraction * 2f64.powi(-24),
        31 if fraction == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        e => sign * (1.0 + fraction / 1024.0) * 2f64.powi(e - 15),
    }
}

/// How an MDS column stores its values (`column_encodings` in `index.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Encoding {
    /// `bytes`: the bytes as they are.
    Bytes,
    /// `str`: UTF-8.
    Str,
    /// `int`: an `i64`.
    Int,
    /// `uint8` ... `float64`: one numpy scalar.
    Scalar(Dtype),
    /// `str_int`, `str_float`, `str_decimal`: a number written as text.
    StrNumber,
    /// `ndarray[:DTYPE[:D0,D1,...]]`: a numpy array, with its dtype and shape in the column
    /// header when the encoding does not fix them.
    NdArray {
        /// The dtype, when the encoding fixes it.
        dtype: Option<Dtype>,
        /// The shape, when the encoding fixes it.
        shape: Option<Vec<usize>>,
    },
    /// `pil`: PIL's raw pixels behind a header (`u32` width, height, mode length; the mode).
    Pil,
    /// `jpeg`: a JPEG file.
    Jpeg,
    /// `png`: a PNG file.
    Png,
    /// `json`: JSON text.
    Json,
    /// An encoding Tessera does not decode (`pkl`, lists of images...): its column can be read
    /// as bytes only.
    Other(String),
}

impl Encoding {
    /// Parses a `column_encodings` entry.
    pub fn parse(text: &str) -> Result<Encoding, String> {
        let (name, args) = match text.split_once(':') {
            Some((name, args)) => (name, Some(args)),
            None => (text, None),
        };
        if name == "ndarray" {
            let mut parts = args.unwrap_or("").split(':').filter(|p| !p.is_empty());
            let dtype = parts
                .next()
                .map(|d| Dtype::from_name(d).ok_or_else(|| format!("unknown ndarray dtype `{d}`")))
                .transpose()?;
            let shape = parts
                .next()
                .map(|s| {
                    s.split(',')
                        .map(|d| {
                            d.trim()
                                .parse::<usize>()
                                .ok()
                                .filter(|&d| d >= 1)
                                .ok_or_else(|| format!("bad ndarray dimension `{d}` in `{text}`"))
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
                .transpose()?;
            if parts.next().is_some() {
                return Err(format!("`{text}` has more than a dtype and a shape"));
            }
            return Ok(Encoding::NdArray { dtype, shape });
        }
        if args.is_some() {
            return Ok(Encoding::Other(text.to_string()));
        }
        Ok(match name {
            "bytes" => Encoding::Bytes,
            "str" => Encoding::Str,
            "int" => Encoding::Int,
            "str_int" | "str_float" | "str_decimal" => Encoding::StrNumber,
            "pil" => Encoding::Pil,
            "jpeg" => Encoding::Jpeg,
            "png" => Encoding::Png,
            "json" => Encoding::Json,
            other => match Dtype::from_name(other) {
                Some(d) => Encoding::Scalar(d),
                None => Encoding::Other(other.to_string()),
            },
        })
    }

    /// The fixed size of every value in bytes, `None` when each sample stores its size.
    pub fn fixed_size(&self) -> Option<usize> {
        match self {
            Encoding::Int => Some(8),
            Encoding::Scalar(d) => Some(d.size()),
            Encoding::NdArray {
                dtype: Some(d),
                shape: Some(s),
            } => Some(s.iter().product::<usize>() * d.size()),
            _ => None,
        }
    }

    /// The name written in `index.json`.
    pub fn name(&self) -> String {
        match self {
            Encoding::Bytes => "bytes".into(),
            Encoding::Str => "str".into(),
            Encoding::Int => "int".into(),
            Encoding::Scalar(d) => d.name().into(),
            Encoding::StrNumber => "str_float".into(),
            Encoding::NdArray { dtype, shape } => {
                let mut s = String::from("ndarray");
                if let Some(d) = dtype {
                    s.push(':');
                    s.push_str(d.name());
                    if let Some(shape) = shape {
                        s.push(':');
                        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
                        s.push_str(&dims.join(","));
                    }
                }
                s
            }
            Encoding::Pil => "pil".into(),
            Encoding::Jpeg => "jpeg".into(),
            Encoding::Png => "png".into(),
            Encoding::Json => "json".into(),
            Encoding::Other(s) => s.clone(),
        }
    }
}

/// A decoded MDS value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `bytes`, `jpeg`, `png`, `pil` and encodings Tessera does not decode: the stored bytes.
    Bytes(Vec<u8>),
    /// `str` and `json` text.
    Str(String),
    /// `int` and integer scalars.
    Int(i64),
    /// Floating-point scalars and `str_*` numbers.
    Float(f64),
    /// `ndarray`: its dtype, shape and little-endian element bytes.
    Array {
        /// Element type.
        dtype: Dtype,
        /// Dimensions.
        shape: Vec<usize>,
        /// `shape.product() * dtype.size()` bytes.
        data: Vec<u8>,
    },
}

impl Value {
    /// Every element of an array (or the scalar) as `f64`.
    pub fn as_f64s(&self) -> Vec<f64> {
        match self {
            Value::Int(i) => vec![*i as f64],
            Value::Float(f) => vec![*f],
            Value::Array { dtype, data, .. } => data
                .chunks_exact(dtype.size())
                .map(|c| dtype.to_f64(c))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Decodes the bytes of one column value.
pub fn decode_value(encoding: &Encoding, bytes: &[u8]) -> Result<Value, String> {
    Ok(match encoding {
        Encoding::Bytes | Encoding::Jpeg | Encoding::Png | Encoding::Pil | Encoding::Other(_) => {
            Value::Bytes(bytes.to_vec())
        }
        Encoding::Str | Encoding::Json => {
            Value::Str(String::from_utf8(bytes.to_vec()).map_err(|e| format!("not UTF-8: {e}"))?)
        }
        Encoding::Int => Value::Int(i64::from_le_bytes(
            bytes
                .try_into()
                .map_err(|_| format!("an int is 8 bytes, got {}", bytes.len()))?,
        )),
        Encoding::Scalar(d) => {
            if bytes.len() != d.size() {
                return Err(format!(
                    "a {} is {} bytes, got {}",
                    d.name(),
                    d.size(),
                    bytes.len()
                ));
            }
            match d.to_i64(bytes) {
                Some(i) => Value::Int(i),
                None => Value::Float(d.to_f64(bytes)),
            }
        }
        Encoding::StrNumber => {
            let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
            match text.trim().parse::<i64>() {
                Ok(i) => Value::Int(i),
                Err(_) => Value::Float(
                    text.trim()
                        .parse::<f64>()
                        .map_err(|_| format!("`{text}` is not a number"))?,
                ),
            }
        }
        Encoding::NdArray { dtype, shape } => decode_ndarray(*dtype, shape.as_deref(), bytes)?,
    })
}

fn decode_ndarray(
    dtype: Option<Dtype>,
    shape: Option<&[usize]>,
    bytes: &[u8],
) -> Result<Value, String> {
    let mut at = 0;
    let dtype = match dtype {
        Some(d) => d,
        None => {
            let code = *bytes.first().ok_or("an empty ndarray value")?;
            at = 1;
            Dtype::from_code(code).ok_or_else(|| format!("unknown ndarray dtype code {code}"))?
        }
    };
    let shape = match shape {
        Some(s) => s.to_vec(),
        None => {
            let byte = *bytes.get(at).ok_or("an ndarray value without its shape")?;
            at += 1;
            let ndim = usize::from(byte >> 2);
            let width = 1usize << (byte & 3);
            let end = at + ndim * width;
            let dims = bytes
                .get(at..end)
                .ok_or("an ndarray value shorter than its shape")?;
            at = end;
            dims.chunks_exact(width)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b[..width].copy_from_slice(c);
                    usize::try_from(u64::from_le_bytes(b)).map_err(|_| "a dimension too large")
                })
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    let data = &bytes[at..];
    let expected = shape
        .iter()
        .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
        .ok_or("an ndarray shape too large")?;
    if data.len() != expected {
        return Err(format!(
            "an ndarray of {} {shape:?} is {expected} bytes, got {}",
            dtype.name(),
            data.len()
        ));
    }
    Ok(Value::Array {
        dtype,
        shape,
        data: data.to_vec(),
    })
}

/// A PIL-encoded image (`pil`): its mode (`RGB`, `L`, `RGBA`...), width, height and raw pixels.
pub fn parse_pil(bytes: &[u8]) -> Result<(String, u32, u32, &[u8]), String> {
    let u = |i: usize| -> Result<u32, String> {
        bytes
            .get(i * 4..i * 4 + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| "a pil value shorter than its header".to_string())
    };
    let (width, height, mode_len) = (u(0)?, u(1)?, u(2)? as usize);
    let mode = bytes
        .get(12..12 + mode_len)
        .ok_or("a pil value shorter than its mode")?;
    let mode = String::from_utf8(mode.to_vec()).map_err(|_| "a pil mode that is not UTF-8")?;
    Ok((mode, width, height, &bytes[12 + mode_len..]))
}

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

/// An MDS shard writer: samples accumulate until the shard reaches `size_limit` bytes, then
/// the shard is written (atomically) and listed; [`Writer::finish`] writes `index.json` last.
#[derive(Debug)]
pub struct Writer {
    dir: PathBuf,
    columns: Vec<Column>,
    compression: Option<String>,
    size_limit: usize,
    samples: Vec<Vec<u8>>,
    pending: usize,
    config: Vec<u8>,
    shards: Vec<serde_json::Value>,
}

impl Writer {
    /// A writer into the (existing) folder `dir`; columns are sorted by name as streaming's
    /// writer sorts them. `compression` is `None` or `zstd:LEVEL`.
    pub fn new(
        dir: &Path,
        mut columns: Vec<(String, Encoding)>,
        compression: Option<String>,
        size_limit: usize,
    ) -> Result<Writer, DataError> {
        columns.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(c) = &compression {
            let level = c.strip_prefix("zstd:").and_then(|l| l.parse::<i32>().ok());
            if !(c == "zstd" || level.is_some_and(|l| (1..=22).contains(&l))) {
                return Err(DataError::Invalid(format!(
                    "compression `{c}`: Tessera writes `zstd` or `zstd:LEVEL` (1-22)"
                )));
            }
        }
        let columns: Vec<Column> = columns
            .into_iter()
            .map(|(name, encoding)| Column {
                size: encoding.fixed_size(),
                name,
                encoding,
            })
            .collect();
        let config = serde_json::json!({
            "version": 2,
            "format": "mds",
            "compression": compression,
            "hashes": ["sha256"],
            "size_limit": size_limit,
            "column_names": columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            "column_encodings": columns.iter().map(|c| c.encoding.name()).collect::<Vec<_>>(),
            "column_sizes": columns.iter().map(|c| c.size).collect::<Vec<_>>(),
        });
        Ok(Writer {
            dir: dir.to_path_buf(),
            columns,
            compression,
            size_limit,
            samples: Vec::new(),
            pending: 0,
            config: serde_json::to_vec(&config).unwrap_or_default(),
            shards: Vec::new(),
        })
    }

    /// Adds a sample: one encoded value per column, in the order of the names given to
    /// [`Writer::new`] sorted.
    pub fn write(&mut self, values: &[Vec<u8>]) -> Result<(), DataError> {
        if values.len() != self.columns.len() {
            return Err(DataError::Invalid(format!(
                "{} values for {} columns",
                values.len(),
                self.columns.len()
            )));
        }
        let mut sample = Vec::new();
        for (c, v) in self.columns.iter().zip(values) {
            match c.size {
                Some(s) if s != v.len() => {
                    return Err(DataError::Invalid(format!(
                        "column `{}` ({}) takes {s} bytes, got {}",
                        c.name,
                        c.encoding.name(),
                        v.len()
                    )))
                }
                Some(_) => {}
                None => {
                    let n = u32::try_from(v.len()).map_err(|_| {
                        DataError::Invalid(format!("a `{}` value over 4 GiB", c.name))
                    })?;
                    sample.extend_from_slice(&n.to_le_bytes());
                }
            }
        }
        for v in values {
            sample.extend_from_slice(v);
        }
        let extra = 4 + 4 + self.config.len();
        if !self.samples.is_empty() && self.pending + sample.len() + 4 + extra > self.size_limit {
            self.flush()?;
        }
        self.pending += sample.len() + 4;
        self.samples.push(sample);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DataError> {
        if self.samples.is_empty() {
            return Ok(());
        }
        let n = self.samples.len();
        let header = 4 * (n + 2) + self.config.len();
        let mut raw = Vec::with_capacity(header + self.pending);
        raw.extend_from_slice(&(n as u32).to_le_bytes());
        let mut offset = header;
        raw.extend_from_slice(&(offset as u32).to_le_bytes());
        for s in &self.samples {
            offset += s.len();
            let o = u32::try_from(offset).map_err(|_| {
                DataError::Invalid("a shard over 4 GiB; lower the shard size".into())
            })?;
            raw.extend_from_slice(&o.to_le_bytes());
        }
        raw.extend_from_slice(&self.config);
        for s in &self.samples {
            raw.extend_from_slice(s);
        }
        let raw_name = format!("shard.{:05}.mds", self.shards.len());
        let raw_info = info(&raw_name, &raw);
        let (zip_info, stored_name, stored) = match &self.compression {
            Some(c) => {
                let level = c
                    .strip_prefix("zstd:")
                    .and_then(|l| l.parse().ok())
                    .unwrap_or(3);
                // One-shot compression writes the content size in the frame header, which the
                // `zstd` Python package that streaming uses requires.
                let zip = zstd::bulk::compress(&raw, level)
                    .map_err(|e| DataError::Invalid(format!("zstd: {e}")))?;
                let name = format!("{raw_name}.zstd");
                (Some(info(&name, &zip)), name, zip)
            }
            None => (None, raw_name, raw),
        };
        super::write_atomic(&self.dir.join(&stored_name), &stored)?;
        let mut obj = serde_json::json!({
            "version": 2,
            "format": "mds",
            "compression": self.compression,
            "hashes": ["sha256"],
            "size_limit": self.size_limit,
            "column_names": self.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            "column_encodings": self.columns.iter().map(|c| c.encoding.name()).collect::<Vec<_>>(),
            "column_sizes": self.columns.iter().map(|c| c.size).collect::<Vec<_>>(),
            "samples": n,
            "raw_data": raw_info,
        });
        obj["zip_data"] = zip_info.unwrap_or(serde_json::Value::Null);
        self.shards.push(obj);
        self.samples.clear();
        self.pending = 0;
        Ok(())
    }

    /// Writes the last shard and `index.json`; returns the number of shards.
    pub fn finish(mut self) -> Result<usize, DataError> {
        self.flush()?;
        let index = serde_json::json!({ "version": 2, "shards": self.shards });
        let text = serde_json::to_vec(&index)
            .map_err(|e| DataError::Invalid(format!("index.json: {e}")))?;
        super::write_atomic(&self.dir.join(INDEX), &text)?;
        Ok(self.shards.len())
    }
}

fn info(name: &str, data: &[u8]) -> serde_json::Value {
    let hex = crate::files::sha256_hex(data);
    serde_json::json!({ "basename": name, "bytes": data.len(), "hashes": { "sha256": hex } })
}
