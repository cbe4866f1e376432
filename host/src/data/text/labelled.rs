//! Labelled text for classification (`dataset = "labelled-text"`): `.jsonl` lines, each a JSON
//! object with a text (`text_field`, default `"text"`) and a label (`label_field`, default
//! `"label"`), read from a file or a folder of `.jsonl` files as `dataset = "text"` reads them
//! (same listing, content hash, held-out split and tokenizer cache: the BPE trained on the same
//! training texts is the same file).
//!
//! Labels are all integers (class indices `0..C-1`, `C` = the largest + 1) or all strings (class
//! names; the distinct names of both splits, sorted, are classes `0..C-1`). A sample is
//! `[CLS] tokens [SEP]` padded with `[PAD]` to the sequence length (the tokens truncated to fit),
//! its attention mask 1 on the real tokens (with `[CLS]` and `[SEP]`) and 0 on the padding, and
//! its target the class index; the special ids follow [`super::special`].
//!
//! Sentence pairs (`pair_field`, e.g. `"text_pair"`): a sample is `[CLS] A [SEP] B [SEP]` with
//! token type ids 0 on `[CLS] A [SEP]` and 1 on `B [SEP]` (0 on the padding), as Hugging Face's
//! tokenizer pairs `text` and `text_pair`; a pair longer than the sample is cut "longest
//! first", as its fast tokenizers cut it ([`pair_lengths`]).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::jsonl::{json_kind, jsonl_objects, line_error, missing_field};
use super::own::{
    cache_folder, held_out, list_file, text_files, Document, Documents, EvalSplit, OwnTextConfig,
};
use super::special::SpecialTokens;
use super::tokenizer::{cached_bpe, TextTokenizer};
use crate::data::DataError;

/// Default `data.text.label_field`.
pub const DEFAULT_LABEL_FIELD: &str = "label";

/// `dataset = "labelled-text"` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledTextConfig {
    /// The texts' source, split, tokenizer and cache, as for `dataset = "text"` (`.jsonl` only).
    pub text: OwnTextConfig,
    /// The key of a line's label.
    pub label_field: String,
    /// The key of a line's second text (sentence pairs: Hugging Face's `text_pair`), or `None`
    /// for single texts.
    pub pair_field: Option<String>,
    /// Tokens per training sample, `[CLS]` and `[SEP]` included (at least 3).
    pub seq_len: usize,
    /// Tokens per evaluation sample (at least 3).
    pub eval_seq_len: usize,
}

/// A label as written in a line: a class index or a class name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawLabel {
    /// A class index, `0..C-1`.
    Index(u32),
    /// A class name.
    Name(String),
}

/// The documents of a labelled source and their labels, one per document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelledDocuments {
    /// The texts (named `FILE:LINE`) and the source's content hash.
    pub documents: Documents,
    /// The label of each document.
    pub labels: Vec<RawLabel>,
    /// Each document's second text (sentence pairs); empty without a pair field.
    pub pairs: Vec<String>,
}

/// The classes of a labelled dataset.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Classes {
    /// The number of classes `C`.
    pub count: usize,
    /// Class `i`'s name, when the labels are strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
}

/// The label in `value` (the line's `label_field`), or why it is not one.
pub fn parse_label(
    value: Option<Value>,
    label_field: &str,
    object: &serde_json::Map<String, Value>,
) -> Result<RawLabel, String> {
    match value {
        None => Err(missing_field(label_field, "label_field", object)),
        Some(Value::String(name)) if name.is_empty() => Err(format!(
            "label \"{label_field}\" is an empty string; a class name must not be empty"
        )),
        Some(Value::String(name)) => Ok(RawLabel::Name(name)),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(i), _) => u32::try_from(i).map(RawLabel::Index).map_err(|_| {
                format!("label \"{label_field}\" = {i} is too large for a class index")
            }),
            (None, Some(i)) => Err(format!(
                "label \"{label_field}\" = {i} is negative; a class index is 0 or more"
            )),
            _ => Err(format!(
                "label \"{label_field}\" = {n} is not an integer; a label is a class index \
                 (0, 1, ...) or a class name (a string)"
            )),
        },
        Some(other) => Err(format!(
            "label \"{label_field}\" is {}; a label is a class index (0, 1, ...) or a class \
             name (a string)",
            json_kind(&other)
        )),
    }
}

/// Reads a `.jsonl` file or a folder of them (sorted by relative path, as `dataset = "text"`
/// does): each non-blank line a JSON object with the text in `text_field`, the label in
/// `label_field` and, with a `pair_field`, a second text there. Errors name the file and the
/// line: not JSON, a missing or mistyped field, a label neither a non-negative integer nor a
/// string, or labels of both kinds.
pub fn read_labelled(
    path: &Path,
    text_field: &str,
    label_field: &str,
    pair_field: Option<&str>,
) -> Result<LabelledDocuments, DataError> {
    let meta = fs::metadata(path).map_err(|e| DataError::io(path, e))?;
    let mut listing = String::from("tessera text source v1\n");
    let (mut docs, mut labels, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
    // The first label's kind and where it was, to name both lines of a mix.
    let mut first: Option<(bool, String)> = None;
    for (name, file) in text_files(path, meta.is_dir())? {
        if !name.ends_with(".jsonl") {
            return Err(DataError::format(
                &file,
                format!(
                    "labelled text is read from .jsonl lines with a \"{text_field}\" and a \
                     \"{label_field}\" field; a .txt file has no label"
                ),
            ));
        }
        let bytes = fs::read(&file).map_err(|e| DataError::io(&file, e))?;
        list_file(&mut listing, &name, &bytes);
        jsonl_objects(&file, &bytes, text_field, |number, text, mut object| {
            if let Some(field) = pair_field {
                let pair = match object.get(field) {
                    Some(Value::String(pair)) => pair.clone(),
                    Some(other) => {
                        let why = format!(
                            "field \"{field}\" (data.text.pair_field) is {}, not a string",
                            json_kind(other)
                        );
                        return Err(line_error(&file, number, why));
                    }
                    None => {
                        let why = missing_field(field, "pair_field", &object);
                        return Err(line_error(&file, number, why));
                    }
                };
                pairs.push(pair);
            }
            let value = object.remove(label_field);
            let label = parse_label(value, label_field, &object)
                .map_err(|why| line_error(&file, number, why))?;
            let is_name = matches!(label, RawLabel::Name(_));
            match &first {
                None => first = Some((is_name, format!("{name}:{number}"))),
                Some((kind, at)) if *kind != is_name => {
                    return Err(line_error(&file, number, mixed_kinds(is_name, at)));
                }
                Some(_) => {}
            }
            docs.push(Document {
                name: format!("{name}:{number}"),
                text,
            });
            labels.push(label);
            Ok(())
        })?;
    }
    if docs.is_empty() {
        return Err(DataError::format(path, "holds no labelled lines"));
    }
    Ok(LabelledDocuments {
        documents: Documents::collect(
            docs.into_iter().map(Ok),
            crate::files::sha256_hex(listing.as_bytes()),
            path.display().to_string(),
        )?,
        labels,
        pairs,
    })
}

fn mixed_kinds(is_name: bool, first: &str) -> String {
    let (this, that) = if is_name {
        ("a string", "an integer")
    } else {
        ("an integer", "a string")
    };
    format!(
        "the label is {this}, but {first} has {that}; labels are all class indices (integers) \
         or all class names (strings)"
    )
}

/// The classes of `sources` (every split) and each source's labels as class indices: integers
/// as they are (`C` = the largest + 1), strings by their rank among the distinct names (sorted).
pub fn resolve_labels(
    sources: &[&LabelledDocuments],
) -> Result<(Classes, Vec<Vec<i64>>), DataError> {
    let mut names = BTreeSet::new();
    let mut largest: Option<u32> = None;
    let mut kinds: [Option<String>; 2] = [None, None];
    for source in sources {
        for (label, doc) in source.labels.iter().zip(&source.documents.docs) {
            let at = || format!("{} ({})", doc.name, source.documents.origin);
            match label {
                RawLabel::Index(i) => {
                    largest = largest.max(Some(*i));
                    kinds[0].get_or_insert_with(at);
                }
                RawLabel::Name(n) => {
                    names.insert(n.as_str());
                    kinds[1].get_or_insert_with(at);
                }
            }
        }
    }
    if let [Some(index_at), Some(name_at)] = &kinds {
        return Err(DataError::Invalid(format!(
            "{name_at} has a string label, but {index_at} has an integer one; labels are all \
             class indices (integers) or all class names (strings)"
        )));
    }
    let names: Vec<String> = names.into_iter().map(str::to_owned).collect();
    let index_of = |label: &RawLabel| -> i64 {
        match label {
            RawLabel::Index(i) => i64::from(*i),
            RawLabel::Name(n) => names.binary_search(n).map_or(0, |i| i as i64),
        }
    };
    let per_source = sources
        .iter()
        .map(|s| s.labels.iter().map(index_of).collect())
        .collect();
    let classes = match largest {
        Some(largest) => Classes {
            count: largest as usize + 1,
            names: None,
        },
        None => Classes {
            count: names.len(),
            names: Some(names),
        },
    };
    Ok((classes, per_source))
}

/// Writes one sample: `[CLS] tokens [SEP]` then `[PAD]` up to `seq_len` into `input`, and its
/// attention mask (1 on `[CLS]`, the tokens and `[SEP]`, 0 on the padding) into `mask`; the
/// tokens are truncated to `seq_len - 2`. `seq_len` must be at least 2.
pub fn write_sample(
    tokens: &[u32],
    seq_len: usize,
    specials: &SpecialTokens,
    input: &mut Vec<i64>,
    mask: &mut Vec<i64>,
) {
    let kept = &tokens[..tokens.len().min(seq_len - 2)];
    let real = kept.len() + 2;
    input.push(i64::from(specials.cls));
    input.extend(kept.iter().map(|&t| i64::from(t)));
    input.push(i64::from(specials.sep));
    input.extend(std::iter::repeat_n(i64::from(specials.pad), seq_len - real));
    mask.extend(std::iter::repeat_n(1, real));
    mask.extend(std::iter::repeat_n(0, seq_len - real));
}

/// How many tokens of a pair's texts (`a` and `b` tokens long) a sample keeps when `room`
/// tokens are left beside `[CLS]` and the two `[SEP]`s: Hugging Face's fast tokenizers'
/// `"longest_first"` truncation. Nothing is cut when both fit; when the shorter fits in half
/// the room, the longer is cut to the rest; otherwise both are cut to half (the longer text
/// getting the odd token, the second when they are equally long).
pub fn pair_lengths(a: usize, b: usize, room: usize) -> (usize, usize) {
    if a + b <= room {
        return (a, b);
    }
    let short = a.min(b);
    // The shorter's length and the longer's, as `tokenizers`' truncate_encodings computes them.
    let mut n1 = short;
    let mut n2 = if short > room {
        short
    } else {
        short.max(room - short)
    };
    if n1 + n2 > room {
        n1 = room / 2;
        n2 = n1 + room % 2;
    }
    if a > b {
        (n2, n1)
    } else {
        (n1, n2)
    }
}

/// Writes one sentence-pair sample: `[CLS] a [SEP] b [SEP]` then `[PAD]` up to `seq_len` into
/// `input`, its attention mask into `mask` and its token type ids (0 on `[CLS] a [SEP]` and the
/// padding, 1 on `b [SEP]`) into `types`; the texts are cut by [`pair_lengths`] to fit.
/// `seq_len` must be at least 3.
pub fn write_pair_sample(
    (a, b): (&[u32], &[u32]),
    seq_len: usize,
    specials: &SpecialTokens,
    input: &mut Vec<i64>,
    mask: &mut Vec<i64>,
    types: &mut Vec<i64>,
) {
    let (na, nb) = pair_lengths(a.len(), b.len(), seq_len - 3);
    let real = na + nb + 3;
    let ids = |t: &[u32]| t.iter().map(|&t| i64::from(t)).collect::<Vec<_>>();
    input.push(i64::from(specials.cls));
    input.extend(ids(&a[..na]));
    input.push(i64::from(specials.sep));
    input.extend(ids(&b[..nb]));
    input.push(i64::from(specials.sep));
    input.extend(std::iter::repeat_n(i64::from(specials.pad), seq_len - real));
    mask.extend(std::iter::repeat_n(1, real));
    mask.extend(std::iter::repeat_n(0, seq_len - real));
    types.extend(std::iter::repeat_n(0, na + 2));
    types.extend(std::iter::repeat_n(1, nb + 1));
    types.extend(std::iter::repeat_n(0, seq_len - real));
}

/// The encoded samples of one split: what the loader serves.
#[derive(Debug, Clone)]
pub struct LabelledSequences {
    tokens: Vec<Vec<u32>>,
    /// Each sample's second text (sentence pairs).
    pairs: Option<Vec<Vec<u32>>>,
    labels: Vec<i64>,
    seq_len: usize,
    specials: SpecialTokens,
}

impl LabelledSequences {
    /// Samples of `seq_len` (at least 3) from each text's `tokens` and its class index.
    pub fn new(
        tokens: Vec<Vec<u32>>,
        labels: Vec<i64>,
        seq_len: usize,
        specials: SpecialTokens,
    ) -> Result<LabelledSequences, DataError> {
        if seq_len < 3 {
            return Err(DataError::Invalid(format!(
                "data.text.seq_len = {seq_len} is too short for labelled text: a sample is \
                 [CLS], at least one token and [SEP]"
            )));
        }
        if tokens.len() != labels.len() {
            return Err(DataError::Invalid(format!(
                "{} texts but {} labels",
                tokens.len(),
                labels.len()
            )));
        }
        Ok(LabelledSequences {
            tokens,
            pairs: None,
            labels,
            seq_len,
            specials,
        })
    }

    /// The same samples as sentence pairs: `pairs[i]` is sample i's second text
    /// ([`write_pair_sample`]). Fails when the counts differ or `seq_len` is under 5 (`[CLS]`, a
    /// token, `[SEP]`, a token, `[SEP]`).
    pub fn with_pairs(mut self, pairs: Vec<Vec<u32>>) -> Result<LabelledSequences, DataError> {
        if self.seq_len < 5 {
            return Err(DataError::Invalid(format!(
                "data.text.seq_len = {} is too short for sentence pairs: a sample is [CLS], at \
                 least one token, [SEP], at least one token and [SEP]",
                self.seq_len
            )));
        }
        if pairs.len() != self.tokens.len() {
            return Err(DataError::Invalid(format!(
                "{} texts but {} second texts",
                self.tokens.len(),
                pairs.len()
            )));
        }
        self.pairs = Some(pairs);
        Ok(self)
    }

    /// Whether the samples are sentence pairs (with token type ids).
    pub fn paired(&self) -> bool {
        self.pairs.is_some()
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Tokens per sample.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// The class index of every sample.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// Texts (or pairs) longer than a sample holds (truncated).
    pub fn truncated(&self) -> usize {
        match &self.pairs {
            Some(pairs) => self
                .tokens
                .iter()
                .zip(pairs)
                .filter(|(a, b)| a.len() + b.len() > self.seq_len - 3)
                .count(),
            None => self
                .tokens
                .iter()
                .filter(|t| t.len() > self.seq_len - 2)
                .count(),
        }
    }

    /// Appends sample `index` ([`write_sample`], or [`write_pair_sample`] for pairs) to `input`,
    /// `mask` and (pairs only) `types`; returns its class. Panics when `index >= len()`.
    pub fn write(
        &self,
        index: usize,
        input: &mut Vec<i64>,
        mask: &mut Vec<i64>,
        types: &mut Vec<i64>,
    ) -> i64 {
        let (tokens, specials) = (&self.tokens[index], &self.specials);
        match &self.pairs {
            Some(pairs) => {
                let pair = (tokens.as_slice(), pairs[index].as_slice());
                write_pair_sample(pair, self.seq_len, specials, input, mask, types)
            }
            None => write_sample(tokens, self.seq_len, specials, input, mask),
        }
        self.labels[index]
    }
}

/// A loaded labelled dataset.
#[derive(Debug, Clone)]
pub struct LabelledText {
    /// The training samples.
    pub train: LabelledSequences,
    /// The evaluation samples.
    pub eval: LabelledSequences,
    /// The classes.
    pub classes: Classes,
    /// The special token ids and the model's vocabulary.
    pub specials: SpecialTokens,
    /// The tokenizer file (trained into the cache, or the user's).
    pub tokenizer_path: PathBuf,
    /// Its sha256.
    pub tokenizer_sha256: String,
}

/// Loads labelled text: reads `cfg.text.path` (and `cfg.text.eval_path`, else holds out
/// `eval_fraction` of the lines as `dataset = "text"` does), resolves the labels, loads the
/// configured tokenizer or trains (once, cached in the same folder as `dataset = "text"` would)
/// a BPE on the training texts, and encodes every text.
pub fn load_labelled_text(cfg: &LabelledTextConfig) -> Result<LabelledText, DataError> {
    let t = &cfg.text;
    let pair_field = cfg.pair_field.as_deref();
    let train = read_labelled(&t.path, &t.text_field, &cfg.label_field, pair_field)?;
    let given = match &t.eval_path {
        Some(path) => Some(read_labelled(
            path,
            &t.text_field,
            &cfg.label_field,
            pair_field,
        )?),
        None => None,
    };
    let (classes, labels) = match &given {
        Some(eval) => resolve_labels(&[&train, eval])?,
        None => resolve_labels(&[&train])?,
    };
    // (text, second text, class) of each sample of a split.
    type Split<'a> = Vec<(&'a str, Option<&'a str>, i64)>;
    let (train_split, eval_split, eval): (Split<'_>, Split<'_>, EvalSplit<'_>) = match &given {
        Some(eval_docs) => (
            zip_texts(&train, &labels[0]),
            zip_texts(eval_docs, &labels[1]),
            EvalSplit::Given(&eval_docs.documents),
        ),
        None => {
            let held = held_out(&train.documents.docs, t.eval_fraction)?;
            let all = zip_texts(&train, &labels[0]);
            let (mut kept, mut out) = (Vec::new(), Vec::new());
            for (i, sample) in all.into_iter().enumerate() {
                if held.binary_search(&i).is_ok() {
                    out.push(sample);
                } else {
                    kept.push(sample);
                }
            }
            (kept, out, EvalSplit::Fraction(t.eval_fraction))
        }
    };
    let tokenizer = match &t.tokenizer {
        Some(path) => TextTokenizer::load(path)?,
        None => {
            // A BPE trained on the pairs' second texts too: its cache folder is keyed by both
            // fields.
            let keyed = match pair_field {
                Some(pair) => &OwnTextConfig {
                    text_field: format!("{} + {pair}", t.text_field),
                    ..t.clone()
                },
                None => t,
            };
            let (_, dir) = cache_folder(&train.documents, eval, keyed)?;
            let pieces: Vec<(&str, bool)> = train_split
                .iter()
                .flat_map(|&(a, b, _)| std::iter::once(a).chain(b))
                .map(|s| (s, true))
                .collect();
            cached_bpe(&dir, &pieces, t.vocab_size)?
        }
    };
    let specials = SpecialTokens::of(&tokenizer);
    let encode = |split: &Split<'_>, seq_len: usize| -> Result<LabelledSequences, DataError> {
        let texts: Vec<&str> = split.iter().map(|&(a, _, _)| a).collect();
        let tokens = tokenizer.encode_each(&texts)?;
        let labels = split.iter().map(|&(_, _, c)| c).collect();
        let set = LabelledSequences::new(tokens, labels, seq_len, specials)?;
        if pair_field.is_none() {
            return Ok(set);
        }
        let pairs: Vec<&str> = split.iter().map(|&(_, b, _)| b.unwrap_or("")).collect();
        set.with_pairs(tokenizer.encode_each(&pairs)?)
    };
    let train_set = encode(&train_split, cfg.seq_len)?;
    let eval_set = encode(&eval_split, cfg.eval_seq_len)?;
    tracing::info!(
        source = %train.documents.origin,
        train = train_set.len(),
        eval = eval_set.len(),
        classes = classes.count,
        truncated = train_set.truncated() + eval_set.truncated(),
        "labelled text"
    );
    Ok(LabelledText {
        train: train_set,
        eval: eval_set,
        classes,
        specials,
        tokenizer_path: tokenizer.path().to_path_buf(),
        tokenizer_sha256: tokenizer.sha256().to_owned(),
    })
}

/// (text, second text, class) of each document of `source`.
fn zip_texts<'a>(
    source: &'a LabelledDocuments,
    labels: &[i64],
) -> Vec<(&'a str, Option<&'a str>, i64)> {
    let docs = &source.documents.docs;
    docs.iter()
        .enumerate()
        .zip(labels.iter().copied())
        .map(|((i, d), c)| (d.text.as_str(), source.pairs.get(i).map(String::as_str), c))
        .collect()
}

#[cfg(test)]
#[path = "labelled_tests.rs"]
mod tests;
