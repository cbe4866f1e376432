//! The values of MDS columns: their dtypes and encodings, and decoding a column's bytes
//! (scalars, strings, ndarrays, PIL images).

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
