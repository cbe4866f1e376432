//! Reader for the IDX format of MNIST and Fashion-MNIST, raw or gzip-compressed.
//!
//! Layout (all integers big-endian): `0x00 0x00 type ndim`, then `ndim` u32 dimensions, then the
//! row-major payload. Only the unsigned-byte type (`0x08`) is used by these datasets. A file that
//! starts with the gzip magic `1f 8b` is decompressed on the fly. Every malformed input is a
//! [`DataError::Format`] naming the file; nothing here panics on file contents.

use std::fs::File;
use std::io::{BufReader, ErrorKind, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use super::DataError;

/// Magic number of an IDX file of unsigned bytes with three dimensions (images).
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number of an IDX file of unsigned bytes with one dimension (labels).
pub const LABELS_MAGIC: u32 = 0x0000_0801;

/// A stack of grey-scale images read from an IDX file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// Number of images (N).
    pub count: usize,
    /// Rows per image (H).
    pub height: usize,
    /// Columns per image (W).
    pub width: usize,
    /// N×H×W pixels, row-major; 0 is background.
    pub pixels: Vec<u8>,
}

/// Reads an IDX image file (magic `0x00000803`, N×H×W unsigned bytes), raw or gzip.
pub fn read_images(path: &Path) -> Result<Images, DataError> {
    Ok(images(read_idx(path, IMAGES_MAGIC, "images")?))
}

/// Reads an IDX label file (magic `0x00000801`, N unsigned bytes), raw or gzip.
pub fn read_labels(path: &Path) -> Result<Vec<u8>, DataError> {
    let (_, labels) = read_idx(path, LABELS_MAGIC, "labels")?;
    Ok(labels)
}

/// Parses the bytes of an IDX image file (raw or gzip) held in memory; `name` stands in for the
/// file path in error messages.
pub fn parse_images(bytes: &[u8], name: &str) -> Result<Images, DataError> {
    Ok(images(read_idx_from(
        bytes,
        Path::new(name),
        IMAGES_MAGIC,
        "images",
    )?))
}

/// Parses the bytes of an IDX label file (raw or gzip) held in memory; `name` stands in for the
/// file path in error messages.
pub fn parse_labels(bytes: &[u8], name: &str) -> Result<Vec<u8>, DataError> {
    let (_, labels) = read_idx_from(bytes, Path::new(name), LABELS_MAGIC, "labels")?;
    Ok(labels)
}

/// Wraps the dimensions and payload of a three-dimensional IDX file as [`Images`].
fn images((dims, pixels): (Vec<usize>, Vec<u8>)) -> Images {
    Images {
        count: dims[0],
        height: dims[1],
        width: dims[2],
        pixels,
    }
}

/// Reads an unsigned-byte IDX file with the given magic; returns its dimensions and payload.
fn read_idx(path: &Path, magic: u32, kind: &str) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    read_idx_from(BufReader::new(file), path, magic, kind)
}

/// Reads an unsigned-byte IDX stream with the given magic from `file`, raw or gzip; `path` names
/// the source in errors. Returns the dimensions and the payload.
fn read_idx_from(
    mut file: impl Read,
    path: &Path,
    magic: u32,
    kind: &str,
) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let mut sniff = [0u8; 2];
    let sniffed = read_up_to(&mut file, &mut sniff).map_err(|e| DataError::io(path, e))?;
    let head = std::io::Cursor::new(sniff[..sniffed].to_vec());
    let gzip = sniff[..sniffed] == [0x1f, 0x8b];
    let mut reader: Box<dyn Read + '_> = if gzip {
        Box::new(MultiGzDecoder::new(head.chain(file)))
    } else {
        Box::new(head.chain(file))
    };
    let read_error = |e: std::io::Error, what: &str| -> DataError {
        if gzip && e.kind() != ErrorKind::NotFound && e.kind() != ErrorKind::PermissionDenied {
            DataError::format(path, format!("corrupt gzip data while reading {what}: {e}"))
        } else {
            DataError::io(path, e)
        }
    };

    let ndim = (magic & 0xff) as usize;
    let expected_magic_text =
        format!("0x{magic:08x} (IDX {kind}: unsigned bytes, {ndim} dimension(s))");
    let mut header = vec![0u8; 4 + 4 * ndim];
    let got = read_up_to(&mut reader, &mut header[..4]).map_err(|e| read_error(e, "the header"))?;
    if got < 4 {
        return Err(DataError::format(
            path,
            format!("truncated: {got} byte(s), too short for an IDX header; expected magic {expected_magic_text}"),
        ));
    }
    let found_magic = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    if found_magic != magic {
        return Err(DataError::format(
            path,
            format!("wrong magic 0x{found_magic:08x}, expected {expected_magic_text}"),
        ));
    }
    let got = read_up_to(&mut reader, &mut header[4..]).map_err(|e| read_error(e, "the header"))?;
    if got < 4 * ndim {
        return Err(DataError::format(
            path,
            format!(
                "truncated header: {ndim} dimension(s) need {} bytes, found {got}",
                4 * ndim
            ),
        ));
    }
    let dims: Vec<usize> = header[4..]
        .chunks_exact(4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .collect();
    if let Some(axis) = dims.iter().position(|&d| d == 0) {
        return Err(DataError::format(
            path,
            format!("dimension {axis} is zero (dimensions {dims:?})"),
        ));
    }
    let payload_len = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| DataError::format(path, format!("dimensions {dims:?} overflow")))?;

    // Grow the buffer only as data arrives, so a corrupt header cannot force a huge allocation.
    let mut payload = Vec::new();
    (&mut reader)
        .take(payload_len as u64)
        .read_to_end(&mut payload)
        .map_err(|e| read_error(e, "the payload"))?;
    if payload.len() < payload_len {
        return Err(DataError::format(
            path,
            format!(
                "truncated: dimensions {dims:?} need {payload_len} payload bytes, found {}",
                payload.len()
            ),
        ));
    }
    let mut probe = [0u8; 1];
    let extra = read_up_to(&mut reader, &mut probe).map_err(|e| read_error(e, "the end"))?;
    if extra > 0 {
        return Err(DataError::format(
            path,
            format!("trailing bytes after the {payload_len}-byte payload of dimensions {dims:?}"),
        ));
    }
    Ok((dims, payload))
}

/// Fills `buf` as far as the reader allows; returns how many bytes were read (short only at EOF).
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Encodes an unsigned-byte IDX file in memory (used by tests and the synthetic fixtures).
#[cfg(test)]
pub(crate) fn encode(dims: &[u32], payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::io::Write;
    use std::path::PathBuf;

    /// A fresh, empty folder under the system temp dir, removed on drop.
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> TempDir {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "tessera-data-test-{tag}-{}-{n}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    impl std::ops::Deref for TempDir {
        type Target = std::path::Path;

        fn deref(&self) -> &std::path::Path {
            &self.0
        }
    }

    pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    fn write(dir: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.0.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn image_bytes() -> Vec<u8> {
        let pixels: Vec<u8> = (0..2 * 3 * 4).map(|i| i as u8).collect();
        encode(&[2, 3, 4], &pixels)
    }

    fn err_text(result: Result<impl std::fmt::Debug, DataError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn reads_raw_and_gzip_images() {
        let dir = TempDir::new("idx-ok");
        let raw = write(&dir, "raw", &image_bytes());
        let gz = write(&dir, "gz", &gzip(&image_bytes()));
        let a = read_images(&raw).unwrap();
        let b = read_images(&gz).unwrap();
        assert_eq!(a, b);
        assert_eq!((a.count, a.height, a.width), (2, 3, 4));
        assert_eq!(a.pixels, (0..24).map(|i| i as u8).collect::<Vec<_>>());
    }

    #[test]
    fn reads_labels() {
        let dir = TempDir::new("idx-labels");
        let path = write(&dir, "labels.gz", &gzip(&encode(&[3], &[7, 0, 9])));
        assert_eq!(read_labels(&path).unwrap(), vec![7, 0, 9]);
    }

    #[test]
    fn wrong_magic_names_file_and_magics() {
        let dir = TempDir::new("idx-magic");
        let path = write(&dir, "labels-as-images", &encode(&[3], &[1, 2, 3]));
        let msg = err_text(read_images(&path));
        assert!(msg.contains("labels-as-images"), "{msg}");
        assert!(msg.contains("wrong magic 0x00000801"), "{msg}");
        assert!(msg.contains("0x00000803"), "{msg}");
        let msg = err_text(read_labels(&write(&dir, "img", &image_bytes())));
        assert!(msg.contains("wrong magic 0x00000803"), "{msg}");
    }

    #[test]
    fn truncated_payload_and_header() {
        let dir = TempDir::new("idx-trunc");
        let mut bytes = image_bytes();
        bytes.pop();
        let msg = err_text(read_images(&write(&dir, "short", &bytes)));
        assert!(msg.contains("short") && msg.contains("truncated"), "{msg}");
        assert!(msg.contains("need 24 payload bytes, found 23"), "{msg}");
        let msg = err_text(read_images(&write(&dir, "hdr", &image_bytes()[..9])));
        assert!(msg.contains("truncated header"), "{msg}");
        let msg = err_text(read_images(&write(&dir, "empty", &[])));
        assert!(msg.contains("too short for an IDX header"), "{msg}");
        // Truncated gzip stream: either a short payload or a corrupt-gzip error, never a panic.
        let gz = gzip(&image_bytes());
        let msg = err_text(read_images(&write(&dir, "short.gz", &gz[..gz.len() - 12])));
        assert!(msg.contains("short.gz"), "{msg}");
        assert!(msg.contains("truncated") || msg.contains("gzip"), "{msg}");
    }

    #[test]
    fn trailing_bytes_rejected() {
        let dir = TempDir::new("idx-trailing");
        let mut bytes = image_bytes();
        bytes.push(0);
        let msg = err_text(read_images(&write(&dir, "long", &bytes)));
        assert!(msg.contains("trailing bytes"), "{msg}");
        let msg = err_text(read_images(&write(&dir, "long.gz", &gzip(&bytes))));
        assert!(msg.contains("trailing bytes"), "{msg}");
    }

    #[test]
    fn zero_dimension_rejected() {
        let dir = TempDir::new("idx-zero");
        let msg = err_text(read_images(&write(
            &dir,
            "zero",
            &encode(&[0, 28, 28], &[]),
        )));
        assert!(msg.contains("dimension 0 is zero"), "{msg}");
        let msg = err_text(read_images(&write(
            &dir,
            "zero2",
            &encode(&[5, 28, 0], &[]),
        )));
        assert!(msg.contains("dimension 2 is zero"), "{msg}");
    }

    #[test]
    fn corrupt_gzip_rejected() {
        let dir = TempDir::new("idx-corrupt");
        // A wrong CRC32 in the gzip trailer.
        let mut gz = gzip(&image_bytes());
        let crc = gz.len() - 8;
        gz[crc] ^= 0xff;
        let msg = err_text(read_images(&write(&dir, "crc.gz", &gz)));
        assert!(
            msg.contains("crc.gz") && msg.contains("corrupt gzip"),
            "{msg}"
        );
        // Flipped bits in the deflate stream: some error naming the file (which one depends on
        // what the damaged stream decodes to), never a panic.
        for i in 10..gz.len() - 8 {
            let mut gz = gzip(&image_bytes());
            gz[i] ^= 0x5a;
            let msg = err_text(read_images(&write(&dir, "bad.gz", &gz)));
            assert!(msg.contains("bad.gz"), "{msg}");
        }
        // Garbage after a complete gzip member is not silently ignored.
        let mut gz = gzip(&image_bytes());
        gz.extend_from_slice(b"garbage!garbage!");
        let msg = err_text(read_images(&write(&dir, "tail.gz", &gz)));
        assert!(msg.contains("tail.gz") && msg.contains("gzip"), "{msg}");
    }

    #[test]
    fn huge_declared_dims_fail_without_allocating() {
        let dir = TempDir::new("idx-huge");
        let path = write(&dir, "huge", &encode(&[u32::MAX, 65535, 65535], &[1, 2, 3]));
        let msg = err_text(read_images(&path));
        assert!(
            msg.contains("overflow") || msg.contains("truncated"),
            "{msg}"
        );
    }

    #[test]
    fn missing_file_is_io_error_naming_it() {
        let msg = err_text(read_labels(Path::new("/nonexistent/tessera-labels")));
        assert!(msg.contains("/nonexistent/tessera-labels"), "{msg}");
    }

    #[test]
    fn parse_from_bytes_matches_the_file_readers() {
        let dir = TempDir::new("idx-bytes");
        let gz = gzip(&image_bytes());
        let path = write(&dir, "img.gz", &gz);
        assert_eq!(
            parse_images(&gz, "img.gz").unwrap(),
            read_images(&path).unwrap()
        );
        assert_eq!(
            parse_labels(&encode(&[3], &[7, 0, 9]), "mem").unwrap(),
            vec![7, 0, 9]
        );
        let msg = err_text(parse_images(&image_bytes()[..9], "in-memory.idx"));
        assert!(msg.starts_with("in-memory.idx: truncated header"), "{msg}");
    }

    /// Every file in `tests/fuzz_regressions/idx` (crash reproducers and hand-made nasty inputs)
    /// and in the seed corpus `fuzz/corpus/idx` goes through both parsers without a panic; errors
    /// name the input, and the path readers agree with the byte parsers.
    #[test]
    fn fuzz_regressions_and_seed_corpus() {
        let mut checked = 0;
        for (folder, path) in
            crate::test_support::files_in(&["tests/fuzz_regressions/idx", "fuzz/corpus/idx"])
        {
            let bytes = std::fs::read(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let images = parse_images(&bytes, &name);
            let labels = parse_labels(&bytes, &name);
            for msg in [images.as_ref().err(), labels.as_ref().err()]
                .into_iter()
                .flatten()
                .map(ToString::to_string)
            {
                assert!(msg.contains(&name), "error does not name {name}: {msg}");
            }
            if let Ok(i) = &images {
                assert_eq!(i.pixels.len(), i.count * i.height * i.width, "{name}");
            }
            // Seed files named after their contents must parse.
            if folder.ends_with("fuzz/corpus/idx") && name.starts_with("images-") {
                assert!(images.is_ok(), "{name}: {:?}", images.err());
            }
            if folder.ends_with("fuzz/corpus/idx") && name.starts_with("labels-") {
                assert!(labels.is_ok(), "{name}: {:?}", labels.err());
            }
            assert_eq!(read_images(&path).ok(), images.ok(), "{name}");
            assert_eq!(read_labels(&path).ok(), labels.ok(), "{name}");
            checked += 1;
        }
        assert!(checked >= 10, "only {checked} files checked");
    }
}
