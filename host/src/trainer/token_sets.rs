//! A text dataset's training and evaluation token sequences and what the model needs to know
//! of it, read as its config says: synthetic, a corpus, the user's own, labelled or chat text.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::Config;
use crate::data;

use super::error::{fail, Context as _, Result};
use crate::config::DataConfig;

/// A text dataset's training and evaluation sequences and what the model needs to know of it.
pub struct TokenSets {
    /// The training sequences.
    pub train: Arc<dyn data::TokenSource>,
    /// The evaluation sequences.
    pub eval: Arc<dyn data::TokenSource>,
    /// The vocabulary, the classes of labelled text, the special tokens.
    pub facts: data::TextFacts,
    /// The tokenizer file the text was encoded with and its sha256, as the loader read them
    /// (`None` for `synthetic-text`); checkpoints record it for `tessera export --format hf`.
    pub tokenizer: Option<crate::checkpoint::TokenizerFile>,
}

/// The training and evaluation token sequences of a text dataset and its facts:
/// `synthetic-text` generated from the run's seed, a corpus loaded (fetched when allowed) and
/// tokenized, the user's own text read, split and tokenized (cached by its content hash), or
/// the user's labelled text read, split and encoded as `[CLS] tokens [SEP] [PAD]...` samples.
/// With `[data.mlm]`, a language model's sequences are served masked.
pub fn load_token_sets(cfg: &Config) -> Result<TokenSets> {
    let d = &cfg.data;
    let Some(text) = &d.text else {
        fail!("dataset `{}` is not text", d.dataset);
    };
    match d.dataset {
        data::Dataset::Chat => chat_sets(d, text),
        data::Dataset::LabelledText => labelled_sets(d, text),
        _ => stream_sets(cfg, text),
    }
}

/// The user's own text of `[data.text]` at `path` (the cache folder defaults to the data cache's
/// `text/`).
fn own_text(text: &data::TextConfig, path: PathBuf) -> data::OwnTextConfig {
    data::OwnTextConfig {
        path,
        eval_path: text.eval_path.clone(),
        eval_fraction: text.eval_fraction(),
        text_field: text.text_field().to_owned(),
        vocab_size: text.vocab_size,
        tokenizer: text.tokenizer.clone(),
        cache_dir: text
            .cache_dir
            .clone()
            .unwrap_or_else(|| data::default_cache_root().join("text")),
    }
}

/// The tokenizer file the text was encoded with, logged.
fn announce(path: PathBuf, sha256: String) -> Option<crate::checkpoint::TokenizerFile> {
    tracing::info!("tokenizer {} (sha256 {sha256})", path.display());
    Some(crate::checkpoint::TokenizerFile { path, sha256 })
}

/// `dataset = "chat"`: conversations rendered by their template, packed or padded.
fn chat_sets(d: &DataConfig, text: &data::TextConfig) -> Result<TokenSets> {
    let Some(path) = d.data_dir.clone() else {
        fail!("dataset = \"chat\" needs data.data_dir: the conversations");
    };
    let ccfg = data::ChatConfig {
        text: own_text(text, path),
        template: text.chat_template.clone(),
        loss_on: text.loss_on.unwrap_or(data::LossOn::Assistant),
        layout: if text.packing.unwrap_or(false) {
            data::ChatLayout::Packed
        } else {
            data::ChatLayout::Padded
        },
        seq_len: text.seq_len,
        eval_seq_len: text.eval_seq_len(),
        ignore: data::IGNORE_TARGET,
    };
    let loaded = data::load_chat(&ccfg)
        .with_context(|| format!("loading the conversations at {}", ccfg.text.path.display()))?;
    let tokenizer = announce(loaded.tokenizer_path, loaded.tokenizer_sha256);
    let truncated = loaded.train.truncated();
    if truncated > 0 {
        tracing::warn!(
            "{truncated} of {} training conversations are longer than {} tokens and are cut \
             (raise data.text.seq_len, or set data.text.packing = true)",
            loaded.conversations.0,
            text.seq_len + 1
        );
    }
    for (split, seqs) in [("training", &loaded.train), ("evaluation", &loaded.eval)] {
        if seqs.dropped() > 0 {
            tracing::warn!(
                "{} {split} sequences have no assistant token within {} tokens and are left \
                 out (their loss would be a mean over nothing; raise data.text.seq_len)",
                seqs.dropped(),
                seqs.seq_len() + 1
            );
        }
    }
    tracing::info!(
        "chat: {} training and {} evaluation conversations, template {}, {} sequences of {} ({}), {} scored targets ({}), vocabulary {}",
        loaded.conversations.0,
        loaded.conversations.1,
        loaded.template,
        loaded.train.len(),
        text.seq_len,
        if ccfg.layout == data::ChatLayout::Packed { "packed" } else { "one conversation each, padded" },
        loaded.train.scored_targets(),
        if ccfg.loss_on == data::LossOn::Assistant { "the assistant's tokens" } else { "every token" },
        loaded.vocab_size
    );
    Ok(TokenSets {
        facts: data::TextFacts {
            vocab_size: loaded.vocab_size,
            classes: None,
            special_tokens: None,
        },
        train: Arc::new(loaded.train),
        eval: Arc::new(loaded.eval),
        tokenizer,
    })
}

/// `dataset = "labelled-text"`: texts (or pairs) encoded as classifier samples.
fn labelled_sets(d: &DataConfig, text: &data::TextConfig) -> Result<TokenSets> {
    let Some(path) = d.data_dir.clone() else {
        fail!("dataset = \"labelled-text\" needs data.data_dir: the labelled text");
    };
    let lcfg = data::LabelledTextConfig {
        text: own_text(text, path),
        label_field: text.label_field().to_owned(),
        pair_field: text.pair_field.clone(),
        seq_len: text.seq_len,
        eval_seq_len: text.eval_seq_len(),
    };
    let loaded = data::load_labelled_text(&lcfg)
        .with_context(|| format!("loading the labelled text at {}", lcfg.text.path.display()))?;
    let tokenizer = announce(loaded.tokenizer_path, loaded.tokenizer_sha256);
    tracing::info!(
        "{}: {} training and {} evaluation texts, {} classes{}, vocabulary {}, sequences of {}",
        d.dataset,
        loaded.train.len(),
        loaded.eval.len(),
        loaded.classes.count,
        loaded
            .classes
            .names
            .as_ref()
            .map(|n| format!(" ({})", n.join(", ")))
            .unwrap_or_default(),
        loaded.specials.vocab_size,
        text.seq_len
    );
    Ok(TokenSets {
        facts: data::TextFacts {
            vocab_size: loaded.specials.vocab_size,
            classes: Some(loaded.classes),
            special_tokens: Some(loaded.specials),
        },
        tokenizer,
        train: Arc::new(loaded.train),
        eval: Arc::new(loaded.eval),
    })
}

/// A token stream's datasets (synthetic text, the user's own text, a corpus) in packed
/// sequences, served masked with `[data.mlm]`.
fn stream_sets(cfg: &Config, text: &data::TextConfig) -> Result<TokenSets> {
    let d = &cfg.data;
    let (train, eval, vocab, specials, tokenizer) = token_streams(cfg, text)?;
    let (n_train, n_eval) = (train.len(), eval.len());
    let train =
        data::PackedSequences::new(Arc::new(train), text.seq_len).context("the training split")?;
    let eval = data::PackedSequences::new(Arc::new(eval), text.eval_seq_len())
        .context("the evaluation split")?;
    let Some(mlm) = d.mlm else {
        tracing::info!(
            "{}: {n_train} training and {n_eval} evaluation tokens, vocabulary {vocab}, sequences of {} ({} in evaluation)",
            d.dataset,
            text.seq_len,
            text.eval_seq_len()
        );
        return Ok(TokenSets {
            train: Arc::new(train),
            eval: Arc::new(eval),
            facts: data::TextFacts {
                vocab_size: vocab,
                classes: None,
                special_tokens: None,
            },
            tokenizer,
        });
    };
    tracing::info!(
        "{}: {n_train} training and {n_eval} evaluation tokens, masked-LM (probability {}, [MASK] {}, random {}), vocabulary {} with [MASK] = {}, sequences of {} ({} in evaluation)",
        d.dataset,
        mlm.probability,
        mlm.mask_fraction,
        mlm.random_fraction,
        specials.vocab_size,
        specials.mask,
        text.seq_len,
        text.eval_seq_len()
    );
    let masked =
        |sequences, split| data::MaskedSequences::new(sequences, mlm, specials, cfg.seed, split);
    Ok(TokenSets {
        train: Arc::new(masked(train, data::MlmSplit::Train)),
        eval: Arc::new(masked(eval, data::MlmSplit::Eval)),
        facts: data::TextFacts {
            vocab_size: specials.vocab_size,
            classes: None,
            special_tokens: Some(specials),
        },
        tokenizer,
    })
}

/// The token streams, their vocabulary and the special tokens' ids (tokenizer, if any).
type Streams = (
    Vec<u32>,
    Vec<u32>,
    usize,
    data::SpecialTokens,
    Option<crate::checkpoint::TokenizerFile>,
);

/// The training and evaluation token streams of synthetic text, the user's own text or a
/// corpus, with their vocabulary, special tokens and tokenizer file.
fn token_streams(cfg: &Config, text: &data::TextConfig) -> Result<Streams> {
    let d = &cfg.data;
    Ok(match d.dataset {
        data::Dataset::SyntheticText => (
            data::synthetic_tokens(cfg.seed, text.tokens(), text.vocab_size)?,
            data::synthetic_tokens(
                cfg.seed.wrapping_add(1),
                text.eval_tokens(),
                text.vocab_size,
            )?,
            text.vocab_size,
            data::SpecialTokens::new(text.vocab_size, None, |_| None),
            None,
        ),
        data::Dataset::Text => {
            let Some(path) = d.data_dir.clone() else {
                fail!("dataset = \"text\" needs data.data_dir: the text to train on");
            };
            let cfg = own_text(text, path);
            let loaded = data::load_own_text(&cfg)
                .with_context(|| format!("loading the text at {}", cfg.path.display()))?;
            let specials = data::SpecialTokens::of(&loaded.tokenizer()?);
            let tokenizer = announce(loaded.tokenizer_path, loaded.tokenizer_sha256);
            (
                loaded.train,
                loaded.val,
                loaded.vocab_size,
                specials,
                tokenizer,
            )
        }
        corpus => {
            let root = d.data_dir.clone().unwrap_or_else(data::default_cache_root);
            let loaded = data::load_text(
                &data::CorpusConfig {
                    corpus: corpus.as_str().to_owned(),
                    vocab_size: text.vocab_size,
                    tokenizer: text.tokenizer.clone(),
                },
                &root,
                d.fetch,
            )
            .with_context(|| format!("loading the text corpus `{corpus}`"))?;
            let specials = data::SpecialTokens::of(&loaded.tokenizer()?);
            let tokenizer = announce(loaded.tokenizer_path, loaded.tokenizer_sha256);
            (
                loaded.train,
                loaded.val,
                loaded.vocab_size,
                specials,
                tokenizer,
            )
        }
    })
}
