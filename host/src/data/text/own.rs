//! The user's own text (`dataset = "text"`): documents read from a folder of `.txt` files (each
//! file a document) and/or `.jsonl` files (each line a JSON object whose `text_field` is a
//! document), hashed by content, split into training and evaluation documents, and tokenized once
//! into a token cache keyed by that hash.
//!
//! The content hash ([`Documents::sha256`]) is the sha256 of a listing with one line per source
//! file: its path relative to the source, its size and the sha256 of its bytes. Every load reads
//! and hashes every file (the documents are needed anyway to train a tokenizer or encode), so
//! any change (an edited, added, removed or renamed file) gives another hash and another cache
//! folder; nothing relies on modification times. The cache folder's key ([`source_key`]) adds
//! what else decides the token streams: the evaluation source's hash or the held-out fraction,
//! and the JSON field read.
//!
//! ```text
//! <cache_dir>/text-<first 16 hex of the key>/SOURCE        what the key was made of (text)
//! <cache_dir>/text-<first 16 hex of the key>/tokenizer-bpe-<vocab>.json
//! <cache_dir>/text-<first 16 hex of the key>/tokens-<16 hex of the tokenizer's sha256>/...
//! ```
//!
//! A token cache that is there but damaged (a file truncated, of another size or sha256, a
//! manifest that does not parse or names another source or tokenizer) is refused with an error
//! naming the file and the folder to delete ([`OnDamage::Refuse`]): it was written atomically,
//! so damage means the disk or someone changed it, which the user should hear of.
//!
//! A folder holding MDS text shards (`index.json`) or WebDataset tar shards is read through the
//! shard readers of [`crate::data::shards`] ([`read_mds_documents`], [`read_wds_documents`]),
//! its content hash a listing of the shard files alike. Other readers plug in through
//! [`Documents::collect`] and [`tokenize_documents`].

use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::cache::OnDamage;
use super::jsonl::jsonl_objects;
use super::tokenizer::MIN_VOCAB_SIZE;
use super::{tokenize, Piece, TokenCorpus, EOS_TOKEN};
use crate::data::DataError;

/// The file describing a cache folder's key, for people.
pub const SOURCE_FILE: &str = "SOURCE";

/// `dataset = "text"` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnTextConfig {
    /// The training text: a folder (its `.txt` and `.jsonl` files, sub-folders included) or one
    /// `.txt` or `.jsonl` file.
    pub path: PathBuf,
    /// The evaluation text, read as `path` is; `None` holds out `eval_fraction` of the
    /// documents.
    pub eval_path: Option<PathBuf>,
    /// The share of documents held out for evaluation without `eval_path`, in (0, 1).
    pub eval_fraction: f64,
    /// The key of a `.jsonl` line's text.
    pub text_field: String,
    /// The size of the BPE vocabulary to train; ignored with `tokenizer`.
    pub vocab_size: usize,
    /// A Hugging Face `tokenizer.json` to use instead of training one.
    pub tokenizer: Option<PathBuf>,
    /// The folder holding the token caches (`text-<key>/` folders).
    pub cache_dir: PathBuf,
}

/// One document: a name that says where it came from (a file's relative path, `FILE:LINE` for a
/// `.jsonl` line) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// Where the document came from.
    pub name: String,
    /// Its text.
    pub text: String,
}

/// The documents of a source and the content hash of the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Documents {
    /// The documents, in the source's order (files sorted by relative path, lines in order).
    pub docs: Vec<Document>,
    /// The sha256 (hex) of the source's listing (see the module doc); another source, or the
    /// same source with any byte changed, has another hash.
    pub sha256: String,
    /// The source, for messages.
    pub origin: String,
}

impl Documents {
    /// The documents read from `origin`, hashed by their `listing` (see the module doc); none
    /// is an error naming `origin` with `empty`, the reason.
    fn listed(
        docs: Vec<Document>,
        listing: &str,
        origin: &Path,
        empty: &str,
    ) -> Result<Documents, DataError> {
        if docs.is_empty() {
            return Err(DataError::format(origin, empty));
        }
        Ok(Documents {
            docs,
            sha256: crate::files::sha256_hex(listing.as_bytes()),
            origin: origin.display().to_string(),
        })
    }

    /// Collects documents from any reader (the seam for MDS or WebDataset text shards):
    /// `sha256` must change whenever the documents do (a hash of the shards' bytes).
    pub fn collect(
        docs: impl IntoIterator<Item = Result<Document, DataError>>,
        sha256: String,
        origin: String,
    ) -> Result<Documents, DataError> {
        Ok(Documents {
            docs: docs.into_iter().collect::<Result<_, _>>()?,
            sha256,
            origin,
        })
    }
}

/// Reads `path`: a folder of MDS text shards ([`read_mds_documents`]) or WebDataset tar shards
/// ([`read_wds_documents`]), or else a `.txt` or `.jsonl` file, or a folder whose `.txt` and `.jsonl` files
/// (sub-folders included, hidden entries and links to folders skipped) are read in the order of their relative paths
/// as bytes. A `.txt` file is one document; each non-blank line of a `.jsonl` file is a JSON
/// object whose `text_field` is one. Errors name the file (and line); a source without any
/// document is an error.
pub fn read_documents(path: &Path, text_field: &str) -> Result<Documents, DataError> {
    let meta = fs::metadata(path).map_err(|e| DataError::io(path, e))?;
    if meta.is_dir() && path.join(MDS_INDEX).is_file() {
        return read_mds_documents(path, text_field);
    }
    if (meta.is_dir() && holds_tar_files(path)?)
        || (!meta.is_dir() && path.extension().is_some_and(|e| e == "tar"))
    {
        return read_wds_documents(path);
    }
    let files = text_files(path, meta.is_dir())?;
    let mut listing = String::from("tessera text source v1\n");
    let mut docs = Vec::new();
    for (name, file) in &files {
        let bytes = fs::read(file).map_err(|e| DataError::io(file, e))?;
        list_file(&mut listing, name, &bytes);
        if name.ends_with(".jsonl") {
            docs.extend(parse_jsonl(file, name, &bytes, text_field)?);
        } else {
            let text = String::from_utf8(bytes).map_err(|e| {
                DataError::format(
                    file,
                    format!(
                        "is not UTF-8 text (invalid byte at offset {})",
                        e.utf8_error().valid_up_to()
                    ),
                )
            })?;
            docs.push(Document {
                name: name.clone(),
                text,
            });
        }
    }
    Documents::listed(
        docs,
        &listing,
        path,
        "holds no documents (only empty .jsonl files)",
    )
}

/// The `.txt` and `.jsonl` files of `path` as `(name, file)`: a folder's (sub-folders
/// included, hidden entries and links to folders skipped), sorted by their relative paths as
/// bytes, or `path` itself. None is an error naming `path`.
pub(super) fn text_files(path: &Path, is_dir: bool) -> Result<Vec<(String, PathBuf)>, DataError> {
    let files = if is_dir {
        let mut files = Vec::new();
        list_text_files(path, path, &mut files)?;
        files.sort();
        if files.is_empty() {
            return Err(DataError::format(
                path,
                "holds no .txt or .jsonl files (each .txt file is a document; each line of a \
                 .jsonl file is a JSON object with the text)",
            ));
        }
        files
    } else if is_text_file(path) {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        vec![(name, path.to_path_buf())]
    } else {
        return Err(DataError::format(
            path,
            "is neither a folder nor a .txt or .jsonl file",
        ));
    };
    Ok(files)
}

/// The name of an MDS folder's index.
const MDS_INDEX: &str = "index.json";

/// Whether `dir` itself (not its sub-folders) holds a `.tar` file.
fn holds_tar_files(dir: &Path) -> Result<bool, DataError> {
    for entry in fs::read_dir(dir).map_err(|e| DataError::io(dir, e))? {
        let entry = entry.map_err(|e| DataError::io(dir, e))?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "tar") && path.is_file() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Appends a listing line for one source file: `name`, its size and sha256.
pub(super) fn list_file(listing: &mut String, name: &str, bytes: &[u8]) {
    listing.push_str(&format!(
        "{name}\t{}\t{}\n",
        bytes.len(),
        crate::files::sha256_hex(bytes)
    ));
}

/// Reads an MDS folder (`index.json` and its shards, as MosaicML Streaming's `MDSWriter` or
/// `tessera data pack` write them, zstd-compressed or not): each sample's `text_field` column
/// (encoding `str`) is one document, named `SHARD:SAMPLE`, in the index's order. The content hash
/// lists `index.json` and every shard file (size and sha256 of the stored bytes).
pub fn read_mds_documents(dir: &Path, text_field: &str) -> Result<Documents, DataError> {
    use crate::data::shards::mds;
    let index_path = dir.join(MDS_INDEX);
    let index_bytes = fs::read(&index_path).map_err(|e| DataError::io(&index_path, e))?;
    let index = mds::Index::parse(&index_bytes, &index_path)?;
    let mut listing = String::from("tessera text source v1 mds\n");
    list_file(&mut listing, MDS_INDEX, &index_bytes);
    let mut docs = Vec::with_capacity(index.samples());
    for shard in &index.shards {
        let stored = shard.stored();
        let path = dir.join(&stored.basename);
        let column = shard
            .columns
            .iter()
            .position(|c| c.name == text_field)
            .ok_or_else(|| {
                let names: Vec<String> = shard
                    .columns
                    .iter()
                    .map(|c| format!("{} ({})", c.name, c.encoding.name()))
                    .collect();
                DataError::format(
                    &index_path,
                    format!(
                        "has no column \"{text_field}\" (data.text.text_field); its columns: {}",
                        names.join(", ")
                    ),
                )
            })?;
        if shard.columns[column].encoding != mds::Encoding::Str {
            return Err(DataError::format(
                &index_path,
                format!(
                    "column \"{text_field}\" has encoding `{}`; a text column must be `str`",
                    shard.columns[column].encoding.name()
                ),
            ));
        }
        let bytes = fs::read(&path).map_err(|e| DataError::io(&path, e))?;
        list_file(&mut listing, &stored.basename, &bytes);
        let data = mds::decompress(shard.compression.as_deref(), bytes, &path)?;
        for i in 0..shard.samples {
            let sample = mds::sample_bytes(&data, i, &path)?;
            let at = |e: String| DataError::format(&path, format!("sample {i}: {e}"));
            let values = mds::split_columns(&shard.columns, sample).map_err(at)?;
            let text = std::str::from_utf8(values[column]).map_err(|e| {
                at(format!(
                    "column \"{text_field}\" is not UTF-8 (invalid byte at offset {})",
                    e.valid_up_to()
                ))
            })?;
            docs.push(Document {
                name: format!("{}:{i}", stored.basename),
                text: text.to_owned(),
            });
        }
    }
    Documents::listed(docs, &listing, dir, "holds no samples")
}

/// Reads WebDataset tar shards (a folder's `*.tar` files in name order, or one `.tar` file):
/// each sample's `.txt` member is one document, named `SHARD:KEY`. A sample without one is an
/// error naming its key and fields. The content hash lists every tar file (size and sha256).
pub fn read_wds_documents(path: &Path) -> Result<Documents, DataError> {
    use crate::data::shards::wds;
    let paths = wds::shard_paths(path)?;
    let mut listing = String::from("tessera text source v1 wds\n");
    let mut docs = Vec::new();
    for shard in &paths {
        let name = shard
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bytes = fs::read(shard).map_err(|e| DataError::io(shard, e))?;
        list_file(&mut listing, &name, &bytes);
        let want = ["txt".to_owned()];
        for sample in wds::scan(shard)? {
            let at = |e: String| DataError::format(shard, format!("sample `{}`: {e}", sample.key));
            let Some((_, member)) = sample.field(&want) else {
                let fields: Vec<&str> = sample.fields.iter().map(|(x, _)| x.as_str()).collect();
                return Err(at(format!(
                    "has no .txt member (the text of a WebDataset text sample); its fields: {}",
                    fields.join(", ")
                )));
            };
            let range = usize::try_from(member.offset)
                .ok()
                .zip(usize::try_from(member.size).ok())
                .and_then(|(o, n)| bytes.get(o..o.checked_add(n)?))
                .ok_or_else(|| at("its .txt member lies outside the file".into()))?;
            let text = std::str::from_utf8(range).map_err(|e| {
                at(format!(
                    "its .txt member is not UTF-8 (invalid byte at offset {})",
                    e.valid_up_to()
                ))
            })?;
            docs.push(Document {
                name: format!("{name}:{}", sample.key),
                text: text.to_owned(),
            });
        }
    }
    Documents::listed(docs, &listing, path, "holds no samples")
}

fn is_text_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "txt" || e == "jsonl")
}

/// Appends `(relative path with '/', path)` of every `.txt`/`.jsonl` file under `dir`; skips
/// hidden entries (`.name`); follows symbolic links to files, not to folders (no cycles).
fn list_text_files(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(String, PathBuf)>,
) -> Result<(), DataError> {
    for entry in fs::read_dir(dir).map_err(|e| DataError::io(dir, e))? {
        let entry = entry.map_err(|e| DataError::io(dir, e))?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| DataError::io(&path, e))?;
        if kind.is_dir() {
            list_text_files(root, &path, out)?;
        } else if is_text_file(&path) && (kind.is_file() || path.is_file()) {
            let relative = path.strip_prefix(root).unwrap_or(&path);
            let name = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            out.push((name, path));
        }
    }
    Ok(())
}

/// The documents of a `.jsonl` file's bytes: each non-blank line a JSON object whose
/// `text_field` is a string. Errors name the file and the line.
pub fn parse_jsonl(
    path: &Path,
    name: &str,
    bytes: &[u8],
    text_field: &str,
) -> Result<Vec<Document>, DataError> {
    let mut docs = Vec::new();
    jsonl_objects(path, bytes, text_field, |number, text, _| {
        docs.push(Document {
            name: format!("{name}:{number}"),
            text,
        });
        Ok(())
    })?;
    Ok(docs)
}

/// How the evaluation documents are chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EvalSplit<'a> {
    /// The documents of another source.
    Given(&'a Documents),
    /// A fixed share of the training source's documents (see [`held_out`]).
    Fraction(f64),
}

/// The indices of the documents held out for evaluation: `round(n × fraction)` of them (at
/// least 1, at most `n - 1`), those whose sha256 of `tessera eval split\0<name>` is smallest,
/// returned sorted. A fixed pseudo-random sample: it depends only on the documents' names, not
/// on the run's seed, so runs with other seeds evaluate on the same documents.
pub fn held_out(docs: &[Document], fraction: f64) -> Result<Vec<usize>, DataError> {
    let n = docs.len();
    if n < 2 {
        return Err(DataError::Invalid(format!(
            "holding out data.text.eval_fraction = {fraction} of the documents for evaluation \
             needs at least 2 documents, the text has {n}; give data.text.eval_path"
        )));
    }
    let k = ((n as f64 * fraction).round() as usize).clamp(1, n - 1);
    let mut ranked: Vec<([u8; 32], usize)> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut h = Sha256::new();
            h.update(b"tessera eval split\0");
            h.update(d.name.as_bytes());
            (h.finalize().into(), i)
        })
        .collect();
    ranked.sort();
    let mut chosen: Vec<usize> = ranked[..k].iter().map(|&(_, i)| i).collect();
    chosen.sort_unstable();
    Ok(chosen)
}

/// The cache key of a training source with its evaluation split and JSON field: the sha256 (hex)
/// of [`key_text`], all that decides the token streams but the tokenizer (which keys its own
/// sub-folder).
pub fn source_key(train: &Documents, eval: EvalSplit<'_>, text_field: &str) -> String {
    crate::files::sha256_hex(key_text(train, eval, text_field).as_bytes())
}

/// The lines the cache key hashes: the sources' content hashes (not their paths: a moved folder
/// keeps its cache), the held-out fraction and the JSON field.
pub fn key_text(train: &Documents, eval: EvalSplit<'_>, text_field: &str) -> String {
    let eval = match eval {
        EvalSplit::Given(docs) => format!("eval_source {}", docs.sha256),
        EvalSplit::Fraction(f) => format!("eval_fraction {f:?}"),
    };
    format!(
        "train_source {}\n{eval}\ntext_field {text_field}\n",
        train.sha256
    )
}

/// Tokenizes `train` with its evaluation split, as a registry corpus is: the configured
/// tokenizer or a BPE trained on the training documents (cached), both splits encoded once into
/// the token cache `<cache_dir>/text-<key>/`, which is refused when damaged. The seam for other
/// readers of documents.
pub fn tokenize_documents(
    train: &Documents,
    eval: EvalSplit<'_>,
    cfg: &OwnTextConfig,
) -> Result<TokenCorpus, DataError> {
    if cfg.tokenizer.is_none() && cfg.vocab_size < MIN_VOCAB_SIZE {
        return Err(DataError::Invalid(format!(
            "data.text.vocab_size = {} is too small: a byte-level BPE needs at least \
             {MIN_VOCAB_SIZE} (256 byte symbols and {EOS_TOKEN})",
            cfg.vocab_size
        )));
    }
    let (train_docs, eval_docs): (Vec<Piece<'_>>, Vec<Piece<'_>>) = match eval {
        EvalSplit::Given(docs) => (
            train.docs.iter().map(|d| (d.text.as_str(), true)).collect(),
            docs.docs.iter().map(|d| (d.text.as_str(), true)).collect(),
        ),
        EvalSplit::Fraction(fraction) => {
            let held = held_out(&train.docs, fraction)?;
            let mut split = (Vec::new(), Vec::new());
            let mut next = held.iter().peekable();
            for (i, d) in train.docs.iter().enumerate() {
                if next.peek() == Some(&&i) {
                    next.next();
                    split.1.push((d.text.as_str(), true));
                } else {
                    split.0.push((d.text.as_str(), true));
                }
            }
            split
        }
    };
    let (key, dir) = cache_folder(train, eval, cfg)?;
    tracing::info!(
        source = %train.origin,
        documents = train.docs.len(),
        train_documents = train_docs.len(),
        eval_documents = eval_docs.len(),
        cache = %dir.display(),
        "own text"
    );
    tokenize(
        &dir,
        &format!("text-{key}"),
        cfg.tokenizer.as_deref(),
        cfg.vocab_size,
        (&train_docs, &eval_docs),
        OnDamage::Refuse,
    )
}

/// The cache folder `<cache_dir>/text-<first 16 hex of the key>/` of `train` with its
/// evaluation split (created, with its `SOURCE` file), and the key ([`source_key`]).
pub(super) fn cache_folder(
    train: &Documents,
    eval: EvalSplit<'_>,
    cfg: &OwnTextConfig,
) -> Result<(String, PathBuf), DataError> {
    let key = source_key(train, eval, &cfg.text_field);
    let dir = cfg.cache_dir.join(format!("text-{}", &key[..16]));
    fs::create_dir_all(&dir).map_err(|e| DataError::io(&dir, e))?;
    let source = dir.join(SOURCE_FILE);
    if !source.is_file() {
        let eval_origin = match eval {
            EvalSplit::Given(docs) => docs.origin.clone(),
            EvalSplit::Fraction(f) => format!("{f:?} of the training documents"),
        };
        let text = format!(
            "# token cache of dataset = \"text\"; the folder's key is the sha256 of the lines \
             below\n# train: {}\n# eval: {eval_origin}\n{}",
            train.origin,
            key_text(train, eval, &cfg.text_field)
        );
        crate::files::write_atomic(&source, text.as_bytes())
            .map_err(|e| DataError::io(&source, e))?;
    }
    Ok((key, dir))
}

/// Loads the user's text as token ids: reads and hashes `cfg.path` (and `cfg.eval_path`),
/// splits it and tokenizes it through the token cache ([`tokenize_documents`]).
pub fn load_own_text(cfg: &OwnTextConfig) -> Result<TokenCorpus, DataError> {
    let train = read_documents(&cfg.path, &cfg.text_field)?;
    match &cfg.eval_path {
        Some(path) => {
            let eval = read_documents(path, &cfg.text_field)?;
            tokenize_documents(&train, EvalSplit::Given(&eval), cfg)
        }
        None => tokenize_documents(&train, EvalSplit::Fraction(cfg.eval_fraction), cfg),
    }
}

#[cfg(test)]
#[path = "own_tests.rs"]
mod tests;
