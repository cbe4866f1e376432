//! Files that must never be seen half-written, and checksums: the one atomic-write helper and
//! the one hex/sha256 helper of the host (checkpoints, run records, exports, dataset caches and
//! plugin pins use them).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Temporary files of writes in progress (or interrupted by a crash) start with this.
pub const TMP_PREFIX: &str = ".tmp-";

/// The temporary file a write of `path` by this process goes through.
fn temporary_for(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".to_owned());
    dir.join(format!("{TMP_PREFIX}{name}.{}", std::process::id()))
}

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, fsync, rename,
/// fsync of the folder. A crash leaves either the old file or the new one, never a mix, and at
/// worst a stray temporary file (see [`remove_stale_temporaries`]); on error the temporary file
/// is removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_then(path, bytes, || {})
}

/// [`write_atomic`], running `before_rename` once the temporary file is complete and synced (the
/// unit test looks at the folder there).
fn write_atomic_then(
    path: &Path,
    bytes: &[u8],
    before_rename: impl FnOnce(),
) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = temporary_for(path);
    let result = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        before_rename();
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = File::open(dir) {
            d.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Removes from `folder` the temporary files that writes of other processes left behind when
/// they were interrupted; returns them.
pub fn remove_stale_temporaries(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let own = format!(".{}", std::process::id());
    let mut removed = Vec::new();
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        // A folder: a sharded checkpoint's, left by a save that did not finish.
        let is_folder = e.file_type().is_ok_and(|t| t.is_dir());
        let remove = || {
            if is_folder {
                std::fs::remove_dir_all(e.path()).is_ok()
            } else {
                std::fs::remove_file(e.path()).is_ok()
            }
        };
        if name.starts_with(TMP_PREFIX) && !name.ends_with(&own) && remove() {
            removed.push(e.path());
        }
    }
    removed
}

/// Lower-case hexadecimal of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The sha256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The sha256 of the file at `path`, in hex, read in chunks.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// Whether `a` and `b` name the same file (following links; `b` need not exist).
pub fn same_file(a: &Path, b: &Path) -> bool {
    let canonical = |p: &Path| -> Option<PathBuf> {
        if let Ok(c) = std::fs::canonicalize(p) {
            return Some(c);
        }
        let parent = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(parent).ok()?.join(p.file_name()?))
    };
    match (canonical(a), canonical(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("tessera-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("a.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic_then(&path, b"two", || {
            assert!(
                temporary_for(&path).is_file(),
                "the temporary file is written first"
            );
            assert_eq!(
                std::fs::read(&path).unwrap(),
                b"one",
                "the old file is intact"
            );
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1, "only the file itself remains");
        // A stray temporary of another process is removed; our own is not.
        let stray = dir.join(format!("{TMP_PREFIX}a.json.999999999"));
        std::fs::write(&stray, b"x").unwrap();
        assert_eq!(remove_stale_temporaries(&dir), vec![stray]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sha256_of_bytes_and_file_agree_with_the_known_value() {
        // sha256("abc") from FIPS 180-2, appendix B.1.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_hex(b"abc"), abc);
        let path = std::env::temp_dir().join(format!("tessera-sha-{}", std::process::id()));
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(sha256_file(&path).unwrap(), abc);
        let _ = std::fs::remove_file(&path);
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }
}
