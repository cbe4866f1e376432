//! `[data]` of a text dataset: `[data.text]` (its keys that apply to another dataset refused)
//! and `[data.mlm]`.

use crate::config::error::{ConfigError, ErrorKind};
use crate::config::reader::{Bounds, Tbl};
use crate::config::section::{section, Section};
use crate::data::{Dataset, LossOn, MlmConfig, TextConfig};

/// The `[data.text]` keys only `dataset = "text"` and `"labelled-text"` (the user's own text)
/// take.
const OWN_TEXT_KEYS: [&str; 4] = ["eval_path", "eval_fraction", "text_field", "cache_dir"];

section!(TextConfig {
    seq_len: uint(1),
    eval_seq_len: uint(1),
    vocab_size: uint(2),
    tokenizer: path(),
    tokens: uint(2),
    eval_tokens: uint(2),
    eval_path: path(),
    eval_fraction: float(Bounds {
        lo: Some((0.0, false)),
        hi: Some((1.0, false)),
    }),
    text_field: string(),
    cache_dir: path(),
    label_field: string(),
    pair_field: string(),
    chat_template: string(),
    loss_on: choice("loss_on setting", &LossOn::CHOICES),
    packing: bool(),
});

section!(MlmConfig {
    probability: float(Bounds {
        lo: Some((0.0, false)),
        hi: Some((1.0, true)),
    }),
    mask_fraction: float(Bounds::UNIT),
    random_fraction: float(Bounds::UNIT),
});

/// `[data.text]` of a text dataset, its keys that apply to another dataset refused; `None`
/// for images (where the table is refused).
pub(super) fn read_text(d: &Tbl<'_>, dataset: Dataset) -> Result<Option<TextConfig>, ConfigError> {
    let text = if dataset.is_text() {
        let t = match d.sub("text", Some(TextConfig::KEYS))? {
            Some(t) => {
                if dataset != Dataset::SyntheticText {
                    for key in ["tokens", "eval_tokens"] {
                        t.reject(
                            key,
                            &format!(
                                "[data.text] {key} only applies to dataset = \"synthetic-text\" \
                                 (a corpus has the tokens it has)"
                            ),
                        )?;
                    }
                } else if t.entry("tokenizer").is_some() {
                    t.reject(
                        "tokenizer",
                        "synthetic-text is generated as token ids; it has no tokenizer",
                    )?;
                }
                if dataset != Dataset::LabelledText {
                    for key in ["label_field", "pair_field"] {
                        t.reject(
                            key,
                            &format!(
                                "[data.text] {key} only applies to dataset = \
                                 \"labelled-text\", not {:?}",
                                dataset.as_str()
                            ),
                        )?;
                    }
                }
                if dataset != Dataset::Chat {
                    for key in ["chat_template", "loss_on", "packing"] {
                        t.reject(
                            key,
                            &format!(
                                "[data.text] {key} only applies to dataset = \"chat\", not {:?}",
                                dataset.as_str()
                            ),
                        )?;
                    }
                } else {
                    t.reject(
                        "text_field",
                        "dataset = \"chat\" reads `messages` (or `prompt` and `completion`) \
                         from each line; it has no text_field",
                    )?;
                }
                if !matches!(
                    dataset,
                    Dataset::Text | Dataset::LabelledText | Dataset::Chat
                ) {
                    for key in OWN_TEXT_KEYS {
                        t.reject(
                            key,
                            &format!(
                                "[data.text] {key} only applies to dataset = \"text\", \
                                 \"labelled-text\" or \"chat\" (your own text), not {:?}",
                                dataset.as_str()
                            ),
                        )?;
                    }
                } else if t.entry("eval_path").is_some() {
                    t.reject(
                        "eval_fraction",
                        "give either eval_path (the evaluation text) or eval_fraction (the share \
                         of documents held out), not both",
                    )?;
                }
                TextConfig::default().read_keys(&t)?
            }
            None => TextConfig::default(),
        };
        Some(t)
    } else {
        d.reject(
            "text",
            &format!(
                "[data.text] only applies to text datasets (sotu, shakespeare, synthetic-text, text, labelled-text, chat), not {:?}",
                dataset.as_str()
            ),
        )?;
        None
    };
    Ok(text)
}

/// `[data.mlm]`: masked-LM settings, for a language model's text datasets only; the fractions
/// of the selected positions replaced by `[MASK]` and by a random token may not exceed 1.
pub(super) fn read_mlm(d: &Tbl<'_>, dataset: Dataset) -> Result<Option<MlmConfig>, ConfigError> {
    if !dataset.is_text() || dataset.is_labelled_text() || dataset == Dataset::Chat {
        let why = if dataset == Dataset::Chat {
            "[data.mlm] makes masked-LM batches from a token stream; dataset = \"chat\" trains a \
             causal language model on the assistant's tokens"
                .to_owned()
        } else if dataset.is_labelled_text() {
            "[data.mlm] makes masked-LM batches from a token stream; dataset = \"labelled-text\" \
             is classification (one label per text): use dataset = \"text\" for your own text"
                .to_owned()
        } else {
            format!(
                "[data.mlm] makes masked-LM batches from text (sotu, shakespeare, text, \
                 synthetic-text), not from dataset {:?}",
                dataset.as_str()
            )
        };
        d.reject("mlm", &why)?;
        return Ok(None);
    }
    let Some(m) = d.sub("mlm", Some(MlmConfig::KEYS))? else {
        return Ok(None);
    };
    let mlm = MlmConfig::default().read_keys(&m)?;
    let sum = mlm.mask_fraction + mlm.random_fraction;
    if sum > 1.0 + 1e-12 {
        let key = if m.entry("random_fraction").is_some() {
            "random_fraction"
        } else {
            "mask_fraction"
        };
        return Err(m.err(
            key,
            ErrorKind::InvalidValue,
            format!(
                "mask_fraction {} + random_fraction {} = {sum} is more than 1: they are shares \
                 of the selected positions (the rest keep their token)",
                mlm.mask_fraction, mlm.random_fraction
            ),
        ));
    }
    Ok(Some(mlm))
}
