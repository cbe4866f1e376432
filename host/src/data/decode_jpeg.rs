//! JPEG region decoding through the system's libjpeg-turbo (`csrc/jpeg.c`, built and linked by
//! `build.rs` when the headers are found, which sets `cfg(tessera_libjpeg)`).

use std::os::raw::{c_char, c_int, c_uchar, c_ulong};

extern "C" {
    fn tessera_jpeg_info(
        data: *const c_uchar,
        len: c_ulong,
        width: *mut c_int,
        height: *mut c_int,
        components: *mut c_int,
        message: *mut c_char,
        message_len: c_int,
    ) -> c_int;
    fn tessera_jpeg_decode_region(
        data: *const c_uchar,
        len: c_ulong,
        denom: c_int,
        x: c_int,
        y: c_int,
        w: c_int,
        h: c_int,
        out: *mut c_uchar,
        scratch: *mut c_uchar,
        scratch_len: c_ulong,
        message: *mut c_char,
        message_len: c_int,
    ) -> c_int;
}

const OK: c_int = 0;
const UNSUPPORTED: c_int = 2;
/// libjpeg's `JMSG_LENGTH_MAX` is 200.
const MESSAGE: usize = 256;

/// Whether `bytes` starts like a JPEG file (SOI then a marker).
pub(super) fn is_jpeg(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xFF, 0xD8, 0xFF])
}

fn message(buffer: &[u8]) -> String {
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

fn int(v: usize, what: &str) -> Result<c_int, String> {
    c_int::try_from(v).map_err(|_| format!("{what} {v} is too large"))
}

/// The image's width and height from its header, or `None` for a colour space decoded another
/// way (CMYK, YCCK).
pub(super) fn info(bytes: &[u8]) -> Result<Option<(usize, usize)>, String> {
    let (mut w, mut h, mut c) = (0, 0, 0);
    let mut buffer = [0u8; MESSAGE];
    // SAFETY: the pointers are valid for the lengths given; the shim only reads `bytes` and
    // writes the three integers and at most MESSAGE bytes of the message.
    let code = unsafe {
        tessera_jpeg_info(
            bytes.as_ptr(),
            bytes.len() as c_ulong,
            &mut w,
            &mut h,
            &mut c,
            buffer.as_mut_ptr().cast(),
            MESSAGE as c_int,
        )
    };
    match code {
        OK if w > 0 && h > 0 => Ok(Some((w as usize, h as usize))),
        OK => Err(format!("it is {w}x{h}")),
        UNSUPPORTED => Ok(None),
        _ => Err(message(&buffer)),
    }
}

/// The scaled image's size: libjpeg's `ceil(length / denom)`.
pub(super) fn scaled(length: usize, denom: usize) -> usize {
    length.div_ceil(denom)
}

/// Rows `y..y + h` and columns `x..x + w` of the image scaled by `1 / denom` (1, 2, 4 or 8;
/// [`scaled`] gives its size), as interleaved RGB, or `None` for a colour space decoded another
/// way.
pub(super) fn decode_region(
    bytes: &[u8],
    scaled_width: usize,
    denom: usize,
    (x, y, w, h): (usize, usize, usize, usize),
) -> Result<Option<Vec<u8>>, String> {
    let mut out = vec![0u8; w * h * 3];
    let mut scratch = vec![0u8; scaled_width * 3];
    let mut buffer = [0u8; MESSAGE];
    // SAFETY: `out` holds w * h * 3 bytes and `scratch` scratch_len bytes, which the shim checks
    // against the scaled width before writing; it only reads `bytes`.
    let code = unsafe {
        tessera_jpeg_decode_region(
            bytes.as_ptr(),
            bytes.len() as c_ulong,
            int(denom, "scale")?,
            int(x, "left")?,
            int(y, "top")?,
            int(w, "width")?,
            int(h, "height")?,
            out.as_mut_ptr(),
            scratch.as_mut_ptr(),
            scratch.len() as c_ulong,
            buffer.as_mut_ptr().cast(),
            MESSAGE as c_int,
        )
    };
    match code {
        OK => Ok(Some(out)),
        UNSUPPORTED => Ok(None),
        _ => Err(message(&buffer)),
    }
}
