//! Tokenizers: a Hugging Face `tokenizer.json` loaded as a [`TextTokenizer`], and the GPT-2 style
//! byte-level BPE trained on a training split ([`train_bpe`]), cached beside the text it was
//! trained on ([`cached_bpe`]).

use std::fs;
use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use crate::data::DataError;

/// The special token that ends every document in a token stream.
pub const EOS_TOKEN: &str = "<|endoftext|>";

/// Default `data.text.vocab_size` of the trained BPE.
pub const DEFAULT_VOCAB_SIZE: usize = 8192;

/// The smallest BPE vocabulary: the 256 byte symbols and [`EOS_TOKEN`].
pub const MIN_VOCAB_SIZE: usize = 257;

/// End-of-document tokens looked for, in this order, in a user's tokenizer; a BERT tokenizer has
/// none of the first four and separates documents with `[SEP]`, as BERT's pretraining data does.
const EOS_CANDIDATES: [&str; 5] = [EOS_TOKEN, "</s>", "<|end_of_text|>", "<eos>", "[SEP]"];

/// A token's byte range `(start, end)` in the text it came from.
pub type Span = (usize, usize);

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
    /// (`<|endoftext|>`, `</s>`, `<|end_of_text|>`, `<eos>` or `[SEP]`).
    pub fn load(path: &Path) -> Result<TextTokenizer, DataError> {
        let bytes = fs::read(path).map_err(|e| DataError::io(path, e))?;
        Self::from_bytes(path, &bytes)
    }

    pub(super) fn from_bytes(path: &Path, bytes: &[u8]) -> Result<TextTokenizer, DataError> {
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

    /// The id of `token` (a special or ordinary token of the vocabulary), if it has one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token ids of `text` (no end-of-document token added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| DataError::format(&self.path, format!("cannot encode text: {e}")))
    }

    /// The token ids of `text` and each token's byte range in it (no special token added: a
    /// chat template writes its own), as `tokenizer(text, add_special_tokens=False,
    /// return_offsets_mapping=True)` in bytes.
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<Span>), DataError> {
        self.inner
            .encode(text, false)
            .map(|e| (e.get_ids().to_vec(), e.get_offsets().to_vec()))
            .map_err(|e| DataError::format(&self.path, format!("cannot encode text: {e}")))
    }

    /// The token ids of each of `texts` (encoded in parallel; no special token added).
    pub fn encode_each(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>, DataError> {
        let encodings = self
            .inner
            .encode_batch_fast(texts.to_vec(), false)
            .map_err(|e| DataError::format(&self.path, format!("cannot encode text: {e}")))?;
        Ok(encodings.iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// The text of `ids`, special tokens written out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| DataError::format(&self.path, format!("cannot decode ids: {e}")))
    }

    /// Encodes documents in parallel and joins them, each followed by the end-of-document token
    /// when its `ends` flag is set.
    pub(super) fn encode_documents(&self, docs: &[(&str, bool)]) -> Result<Vec<u32>, DataError> {
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
/// The file name of a trained BPE of `vocab_size` in the corpus folder.
pub fn bpe_file_name(vocab_size: usize) -> String {
    format!("tokenizer-bpe-{vocab_size}.json")
}

/// Loads `<dir>/tokenizer-bpe-<vocab>.json`, training and writing it (atomically) when it is
/// missing or does not load.
pub(super) fn cached_bpe(
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
