//! A shard's image as read: encoded bytes (decoded by the loader) or raw pixels.

use super::mds;

/// An image as stored in a shard, before decoding.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageData {
    /// An image file (JPEG or PNG).
    Encoded(Vec<u8>),
    /// Raw 8-bit pixels: width, height, channels (1, 3 or 4), interleaved.
    Raw {
        /// Width.
        width: u32,
        /// Height.
        height: u32,
        /// Channels per pixel.
        channels: u8,
        /// `width × height × channels` bytes.
        data: Vec<u8>,
    },
}

impl ImageData {
    /// The image of an MDS column value.
    pub fn from_mds(encoding: &mds::Encoding, bytes: &[u8]) -> Result<ImageData, String> {
        use mds::Encoding as E;
        match encoding {
            E::Jpeg | E::Png | E::Bytes => Ok(ImageData::Encoded(bytes.to_vec())),
            E::Pil => {
                let (mode, width, height, raw) = mds::parse_pil(bytes)?;
                let channels = match mode.as_str() {
                    "L" => 1,
                    "RGB" => 3,
                    "RGBA" => 4,
                    other => {
                        return Err(format!(
                            "pil mode `{other}` is not supported (L, RGB, RGBA are)"
                        ))
                    }
                };
                Ok(ImageData::Raw {
                    width,
                    height,
                    channels,
                    data: raw.to_vec(),
                })
            }
            E::NdArray { .. } => match mds::decode_value(encoding, bytes)? {
                mds::Value::Array {
                    dtype: mds::Dtype::U8,
                    shape,
                    data,
                } => {
                    let (h, w, c) = match shape[..] {
                        [h, w] => (h, w, 1),
                        [h, w, c] if matches!(c, 1 | 3 | 4) => (h, w, c),
                        _ => {
                            return Err(format!(
                                "an ndarray image must be H×W or H×W×C (C = 1, 3, 4), got {shape:?}"
                            ))
                        }
                    };
                    Ok(ImageData::Raw {
                        width: u32::try_from(w).map_err(|_| "image too wide")?,
                        height: u32::try_from(h).map_err(|_| "image too tall")?,
                        channels: c as u8,
                        data,
                    })
                }
                mds::Value::Array { dtype, .. } => Err(format!(
                    "an ndarray image must be uint8, got {}",
                    dtype.name()
                )),
                _ => Err("not an ndarray".into()),
            },
            other => Err(format!(
                "encoding `{}` does not hold an image (jpeg, png, pil, ndarray:uint8 or bytes do)",
                other.name()
            )),
        }
    }

    /// The image as an encoded file the loader decodes: stored files as they are, raw pixels
    /// (`pil`, `ndarray`) as a quickly compressed PNG, so every image takes the same decode path
    /// (crops, jitter) as image folders' do.
    pub fn into_encoded(self) -> Result<Vec<u8>, String> {
        match self {
            ImageData::Encoded(bytes) => Ok(bytes),
            ImageData::Raw {
                width,
                height,
                channels,
                data,
            } => {
                let color = match channels {
                    1 => image::ExtendedColorType::L8,
                    3 => image::ExtendedColorType::Rgb8,
                    _ => image::ExtendedColorType::Rgba8,
                };
                let expected = width as usize * height as usize * usize::from(channels);
                if data.len() != expected {
                    return Err(format!(
                        "{width}x{height}x{channels} pixels are {expected} bytes, got {}",
                        data.len()
                    ));
                }
                let mut out = Vec::with_capacity(expected / 2 + 64);
                let encoder = image::codecs::png::PngEncoder::new_with_quality(
                    &mut out,
                    image::codecs::png::CompressionType::Fast,
                    image::codecs::png::FilterType::NoFilter,
                );
                image::ImageEncoder::write_image(encoder, &data, width, height, color)
                    .map_err(|e| format!("re-encoding raw pixels: {e}"))?;
                Ok(out)
            }
        }
    }
}
