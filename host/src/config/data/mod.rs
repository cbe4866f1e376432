//! `[data]`: the dataset, the loader settings and `[data.transforms]`.

use std::path::PathBuf;

use serde::Serialize;

mod images;
mod text;

use crate::config::error::{ConfigError, ErrorKind};
use crate::config::reader::{quote_list, Tbl};
use crate::config::required_table;
use crate::config::section::{section, Section};
use crate::data::{
    Dataset, DatasetShape, FolderConfig, MlmConfig, ShardsConfig, SyntheticConfig, TextConfig,
    Transforms,
};
use images::{no_transforms, read_folder, read_shards, read_transforms};
use text::{read_mlm, read_text};

/// `[data]`
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataConfig {
    /// Which dataset.
    pub dataset: Dataset,
    /// Dataset cache root, resolved against the file's folder; `None` = the loader's default.
    /// For `folder`, the image folder itself (required); for `text`, the text itself (a folder
    /// of `.txt`/`.jsonl` files or one such file; required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Fetch a missing registry dataset (default true; no effect on `synthetic` and `folder`).
    pub fetch: bool,
    /// Training batch size (default 128, >= 1).
    pub batch_size: usize,
    /// Evaluation batch size (default 512, >= 1).
    pub eval_batch_size: usize,
    /// Loader threads; 0 loads in the training thread (default 2).
    pub workers: usize,
    /// Batches queued per worker (default 4, >= 1).
    pub prefetch: usize,
    /// Drop the last incomplete training batch (default true).
    pub drop_last: bool,
    /// Shuffle the training set each epoch (default true).
    pub shuffle: bool,
    /// Shape of the synthetic dataset; `Some` exactly when `dataset` is `synthetic`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<SyntheticConfig>,
    /// How an image folder's files become samples; `Some` exactly when `dataset` is `folder`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub folder: Option<FolderConfig>,
    /// How shard samples become images and labels; `Some` exactly when `dataset` is `mds` or
    /// `wds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardsConfig>,
    /// How text becomes token sequences; `Some` exactly when `dataset` is a text dataset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<TextConfig>,
    /// Masked-LM batches (`[data.mlm]`) instead of next-token targets; a language model's text
    /// datasets only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlm: Option<MlmConfig>,
    /// Train-time transforms (recorded only when there are some: a text dataset has none).
    #[serde(skip_serializing_if = "no_transforms")]
    pub transforms: Transforms,
    /// The dataset's image shape and classes (from `synthetic`, `folder` and the folder's
    /// class folders, or the registry's pinned facts).
    #[serde(skip)]
    shape: DatasetShape,
}

section!(DataConfig {
    dataset,
    data_dir: path(),
    fetch: bool(),
    batch_size: uint(1),
    eval_batch_size: uint(1),
    workers: uint(0),
    prefetch: uint(1),
    drop_last: bool(),
    shuffle: bool(),
    synthetic,
    folder,
    shards,
    text,
    mlm,
    transforms,
});

impl DataConfig {
    /// Image channels of the dataset.
    pub fn channels(&self) -> usize {
        self.shape.channels
    }

    /// Image `(height, width)` of the dataset.
    pub fn image_size(&self) -> (usize, usize) {
        (self.shape.height, self.shape.width)
    }

    /// The shape of one image of the dataset, as the model zoo takes it (before transforms
    /// that resize, such as a random crop).
    pub fn input_shape(&self) -> crate::model::InputShape {
        crate::model::InputShape {
            channels: self.shape.channels as i64,
            height: self.shape.height as i64,
            width: self.shape.width as i64,
        }
    }

    /// Number of classes of the dataset (for text: the configured vocabulary size; the
    /// tokenizer's actual vocabulary, and the classes of labelled text, are known once the data
    /// is loaded).
    pub fn num_classes(&self) -> usize {
        self.shape.classes
    }

    /// Whether the dataset is text (token sequences for a language model).
    pub fn is_text(&self) -> bool {
        self.dataset.is_text()
    }
}

pub(super) fn read(top: &Tbl<'_>) -> Result<DataConfig, ConfigError> {
    let d = required_table(top, "data", DataConfig::KEYS, "`dataset`")?;
    let names: Vec<&str> = Dataset::CHOICES.iter().map(|(n, _)| *n).collect();
    let dataset = d
        .choice("dataset", "dataset", &Dataset::CHOICES)?
        .ok_or_else(|| d.missing("dataset", &quote_list(&names)))?;
    check_remote_data_dir(&d, dataset)?;

    let synthetic = match dataset {
        Dataset::Synthetic => Some(
            d.section("synthetic", SyntheticConfig::default)?
                .unwrap_or_default(),
        ),
        _ => {
            d.reject(
                "synthetic",
                &format!(
                    "[data.synthetic] only applies to dataset = \"synthetic\", not {:?}",
                    dataset.as_str()
                ),
            )?;
            None
        }
    };
    let folder = match dataset {
        Dataset::Folder => Some(read_folder(&d)?),
        _ => {
            d.reject(
                "folder",
                &format!(
                    "[data.folder] only applies to dataset = \"folder\", not {:?}",
                    dataset.as_str()
                ),
            )?;
            None
        }
    };
    let shards = match dataset.shard_format() {
        Some(format) => Some(read_shards(&d, format)?),
        None => {
            d.reject(
                "shards",
                &format!(
                    "[data.shards] only applies to dataset = \"mds\" or \"wds\", not {:?}",
                    dataset.as_str()
                ),
            )?;
            None
        }
    };
    let text = read_text(&d, dataset)?;
    require_data_dir(&d, dataset)?;
    let mlm = read_mlm(&d, dataset)?;
    let shape = dataset_shape(&d, dataset, &synthetic, &folder, &shards, &text)?;

    let data = DataConfig {
        dataset,
        data_dir: None,
        fetch: true,
        batch_size: 128,
        eval_batch_size: 512,
        workers: 2,
        prefetch: 4,
        drop_last: true,
        shuffle: true,
        synthetic,
        folder: folder.map(|(f, _)| f),
        shards,
        text,
        mlm,
        transforms: Transforms::default(),
        shape,
    }
    .read_keys(&d)?;
    let mut data = data;
    if data.shards.is_some() {
        // A remote (`s3://bucket/prefix`) is kept as written, not resolved against the folder.
        if let Some(url) = d
            .string("data_dir")?
            .filter(|s| crate::data::shards::is_remote(s))
        {
            data.data_dir = Some(PathBuf::from(url));
        }
    }
    if data.is_text() {
        // (An empty table is what a recorded config holds.)
        if let Some(t) = d.sub("transforms", Some(Transforms::KEYS))? {
            for key in Transforms::KEYS {
                t.reject(
                    key,
                    &format!(
                        "[data.transforms] are image transforms; dataset {:?} is text",
                        data.dataset.as_str()
                    ),
                )?;
            }
        }
    }
    let transforms = match d.sub("transforms", Some(Transforms::KEYS))? {
        Some(t) => read_transforms(&t, &data)?,
        None => Transforms::default(),
    };
    Ok(DataConfig { transforms, ..data })
}

/// An `s3://` data_dir: for dataset = "mds" only, and a URL that parses.
fn check_remote_data_dir(d: &Tbl<'_>, dataset: Dataset) -> Result<(), ConfigError> {
    if let Some(url) = d
        .string("data_dir")?
        .filter(|s| crate::data::shards::is_remote(s))
    {
        if dataset != Dataset::Mds {
            return Err(d.err(
                "data_dir",
                ErrorKind::InvalidValue,
                format!(
                    "an s3:// data_dir is read for dataset = \"mds\" only (WebDataset shards need \
                     a scan of every tar, the other datasets read local files), not {:?}; copy \
                     the data to a local folder",
                    dataset.as_str()
                ),
            ));
        }
        crate::data::shards::s3::parse_url(&url)
            .map_err(|e| d.err("data_dir", ErrorKind::InvalidValue, e))?;
    }
    Ok(())
}

/// The user's own text, labelled text and conversations need `data_dir`.
fn require_data_dir(d: &Tbl<'_>, dataset: Dataset) -> Result<(), ConfigError> {
    if dataset == Dataset::Text && d.entry("data_dir").is_none() {
        return Err(d.missing(
            "data_dir",
            "your text: a folder of .txt files (each a document) and/or .jsonl files (one JSON \
             object with a \"text\" field per line), or one such file",
        ));
    }
    if dataset == Dataset::LabelledText && d.entry("data_dir").is_none() {
        return Err(d.missing(
            "data_dir",
            "your labelled text: a .jsonl file (one JSON object with a \"text\" and a \
             \"label\" field per line), or a folder of them",
        ));
    }
    if dataset == Dataset::Chat && d.entry("data_dir").is_none() {
        return Err(d.missing(
            "data_dir",
            "your conversations: a .jsonl file (one JSON object with `messages` — a list of \
             {\"role\", \"content\"} — or `prompt` and `completion` per line), or a folder of them",
        ));
    }
    Ok(())
}

/// The shape of a sample: a text sequence's, the synthetic set's, the shards' or the image
/// folder's images', or a registry dataset's.
fn dataset_shape(
    d: &Tbl<'_>,
    dataset: Dataset,
    synthetic: &Option<SyntheticConfig>,
    folder: &Option<(FolderConfig, usize)>,
    shards: &Option<ShardsConfig>,
    text: &Option<TextConfig>,
) -> Result<DatasetShape, ConfigError> {
    let shape = match (&synthetic, &folder) {
        _ if text.is_some() => {
            let t = text
                .as_ref()
                .map(|t| (t.seq_len, t.vocab_size))
                .unwrap_or_default();
            DatasetShape {
                channels: 1,
                height: 1,
                width: t.0,
                classes: t.1,
            }
        }
        (Some(s), _) => s.shape(),
        _ if shards.is_some() => shards
            .as_ref()
            .map(|s| DatasetShape {
                channels: s.images.channels,
                height: s.images.size,
                width: s.images.size,
                classes: s.classes,
            })
            .unwrap_or_default(),
        (_, Some((f, classes))) => DatasetShape {
            channels: f.channels,
            height: f.size,
            width: f.size,
            classes: *classes,
        },
        _ => dataset.registry_shape().ok_or_else(|| {
            d.err(
                "dataset",
                ErrorKind::InvalidValue,
                format!("no image shape is known for dataset {:?}", dataset.as_str()),
            )
        })?,
    };
    Ok(shape)
}
