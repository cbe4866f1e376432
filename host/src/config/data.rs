//! `[data]`: the dataset, the loader settings and `[data.transforms]`.

use std::path::PathBuf;

use serde::Serialize;

use super::error::{ConfigError, ErrorKind};
use super::reader::{quote_list, Bounds, Tbl};
use super::required_table;
use super::section::{section, Section};
use crate::data::decode::{ColorJitter, RandomResizedCrop};
use crate::data::{
    folder, Dataset, DatasetShape, FolderConfig, HorizontalFlip, LossOn, MlmConfig, Normalize,
    OnBadFile, RandomCrop, ShardsConfig, SyntheticConfig, TextConfig, Transforms,
};

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

/// The `[data.text]` keys only `dataset = "text"` and `"labelled-text"` (the user's own text)
/// take.
const OWN_TEXT_KEYS: [&str; 4] = ["eval_path", "eval_fraction", "text_field", "cache_dir"];

section!(MlmConfig {
    probability: float(Bounds {
        lo: Some((0.0, false)),
        hi: Some((1.0, true)),
    }),
    mask_fraction: float(Bounds::UNIT),
    random_fraction: float(Bounds::UNIT),
});

section!(ShardsConfig {
    // The image keys, read into `images` as [data.folder]'s.
    size,
    channels,
    on_bad_file,
    eval_size,
    eval_resize,
    random_resized_crop,
    color_jitter,
    jpeg_dct_scale,
    classes,
    image: string(),
    label: string(),
    train: string(),
    val: string(),
    shuffle_block: uint(1),
    cache_dir: path(),
    cache_limit,
    prefetch_shards: uint(0),
});

section!(SyntheticConfig {
    samples: uint(1),
    eval_samples: uint(1),
    channels: uint(1),
    height: uint(1),
    width: uint(1),
    classes: uint(1),
});

section!(FolderConfig {
    size,
    channels: uint(1),
    on_bad_file: choice("on_bad_file setting", &OnBadFile::CHOICES),
    eval_size: uint(1),
    eval_resize: uint(1),
    random_resized_crop,
    color_jitter,
    jpeg_dct_scale: bool(),
});

section!(RandomResizedCrop { scale, ratio });

section!(ColorJitter {
    brightness: float(Bounds::NON_NEGATIVE),
    contrast: float(Bounds::NON_NEGATIVE),
    saturation: float(Bounds::NON_NEGATIVE),
    hue: float(Bounds::HALF),
});

/// A `[low, high]` pair of positive numbers at `key` of `t` (`None` when absent).
fn range(t: &Tbl<'_>, key: &str, what: &str) -> Result<Option<[f64; 2]>, ConfigError> {
    let Some(list) = t.float_list(key, Bounds::POSITIVE)? else {
        return Ok(None);
    };
    match list[..] {
        [low, high] if low <= high => Ok(Some([low, high])),
        _ => Err(t.err(
            key,
            ErrorKind::InvalidValue,
            format!("must be [low, high] with low <= high ({what}), got {list:?}"),
        )),
    }
}

fn no_transforms(t: &Transforms) -> bool {
    *t == Transforms::default()
}

section!(Transforms {
    normalize,
    random_crop,
    horizontal_flip,
});

section!(Normalize { mean, std });

section!(RandomCrop {
    size: uint(1),
    padding: uint(0),
});

section!(HorizontalFlip {
    p: float(Bounds::UNIT),
});

pub(super) fn read(top: &Tbl<'_>) -> Result<DataConfig, ConfigError> {
    let d = required_table(top, "data", DataConfig::KEYS, "`dataset`")?;
    let names: Vec<&str> = Dataset::CHOICES.iter().map(|(n, _)| *n).collect();
    let dataset = d
        .choice("dataset", "dataset", &Dataset::CHOICES)?
        .ok_or_else(|| d.missing("dataset", &quote_list(&names)))?;
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
    let mlm = read_mlm(&d, dataset)?;
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

/// `[data.mlm]`: masked-LM settings, for a language model's text datasets only; the fractions
/// of the selected positions replaced by `[MASK]` and by a random token may not exceed 1.
fn read_mlm(d: &Tbl<'_>, dataset: Dataset) -> Result<Option<MlmConfig>, ConfigError> {
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

/// `[data.folder]` (required with `data_dir` for `dataset = "folder"`) and the number of class
/// folders in `data_dir/train`: the only look at the folder until the run starts.
fn read_folder(d: &Tbl<'_>) -> Result<(FolderConfig, usize), ConfigError> {
    let root = d.path("data_dir")?.ok_or_else(|| {
        d.missing(
            "data_dir",
            "the image folder, holding train/CLASS/*.png and val/CLASS/*.png",
        )
    })?;
    let f = d
        .sub("folder", Some(FolderConfig::KEYS))?
        .ok_or_else(|| d.missing("folder", "a [data.folder] table with the image `size`"))?;
    let size = f.uint("size", 1)?.ok_or_else(|| {
        f.missing(
            "size",
            "the side of the square samples: each image is resized (shorter side) and centre-cropped to it",
        )
    })?;
    let config = read_image_keys(&f, FolderConfig::new(size).read_keys(&f)?)?;
    let classes = folder::class_names(&root)
        .map_err(|e| d.err("data_dir", ErrorKind::InvalidValue, e.to_string()))?;
    Ok((config, classes.len()))
}

/// The image keys of `[data.folder]` or `[data.shards]` beyond those `read_keys` reads (crops,
/// jitter), and their checks.
fn read_image_keys(f: &Tbl<'_>, mut config: FolderConfig) -> Result<FolderConfig, ConfigError> {
    if let Some(r) = f.sub("random_resized_crop", Some(RandomResizedCrop::KEYS))? {
        let mut crop = RandomResizedCrop::default();
        if let Some(scale) = range(&r, "scale", "the crop's share of the image area")? {
            crop.scale = scale;
        }
        if let Some(ratio) = range(&r, "ratio", "the crop's width / height")? {
            crop.ratio = ratio;
        }
        config.random_resized_crop = Some(crop);
    }
    config.color_jitter = f.section("color_jitter", ColorJitter::default)?;
    let eval_side = config.eval_side();
    if let Some(resize) = config.eval_resize.filter(|&r| r < eval_side) {
        return Err(f.err(
            "eval_resize",
            ErrorKind::InvalidValue,
            format!(
                "must be at least the evaluation size {eval_side} (images are resized, then the \
                 centre {eval_side}x{eval_side} is cropped), got {resize}"
            ),
        ));
    }
    if config.channels != 1 && config.channels != 3 {
        return Err(f.err(
            "channels",
            ErrorKind::InvalidValue,
            format!(
                "must be 1 (luma) or 3 (RGB), got {}; every image is converted to it",
                config.channels
            ),
        ));
    }
    for (key, value) in [
        ("size", Some(config.size)),
        ("eval_size", config.eval_size),
        ("eval_resize", config.eval_resize),
    ] {
        if let Some(v) = value.filter(|&v| u32::try_from(v).is_err()) {
            return Err(f.err(
                key,
                ErrorKind::InvalidValue,
                format!("must be below 2^32, got {v}"),
            ));
        }
    }
    Ok(config)
}

/// `[data.shards]` (required with `data_dir` for `dataset = "mds"` and `"wds"`).
fn read_shards(d: &Tbl<'_>, format: crate::data::ShardFormat) -> Result<ShardsConfig, ConfigError> {
    if d.entry("data_dir").is_none() {
        return Err(d.missing(
            "data_dir",
            "the folder holding the split folders (train/, val/) of the shards",
        ));
    }
    let s = d.sub("shards", Some(ShardsConfig::KEYS))?.ok_or_else(|| {
        d.missing(
            "shards",
            "a [data.shards] table with the image `size` and the number of `classes`",
        )
    })?;
    let size = s.uint("size", 1)?.ok_or_else(|| {
        s.missing(
            "size",
            "the side of the square samples: each image is resized (shorter side) and centre-cropped to it",
        )
    })?;
    let classes = s.uint("classes", 1)?.ok_or_else(|| {
        s.missing(
            "classes",
            "the number of classes (labels lie in 0..classes)",
        )
    })?;
    let mut config = ShardsConfig::new(format, size, classes).read_keys(&s)?;
    if let Some(text) = s.string("cache_limit")? {
        config.cache_limit = crate::data::shards::cache::parse_size(&text)
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                s.err(
                    "cache_limit",
                    ErrorKind::InvalidValue,
                    format!("`{text}` is not a size such as 10GB, 500MB or 64GiB"),
                )
            })?;
    }
    config.images = read_image_keys(&s, FolderConfig::new(size).read_keys(&s)?)?;
    for (key, value) in [
        ("image", &config.image),
        ("label", &config.label),
        ("train", &config.train),
        ("val", &config.val),
    ] {
        if value.trim().is_empty() {
            return Err(s.err(key, ErrorKind::InvalidValue, "must not be empty"));
        }
    }
    Ok(config)
}

fn read_transforms(t: &Tbl<'_>, data: &DataConfig) -> Result<Transforms, ConfigError> {
    let channels = data.channels();
    let mut out = Transforms::default();
    if let Some(n) = t.sub("normalize", Some(Normalize::KEYS))? {
        let mean = n
            .float_list("mean", Bounds::ANY)?
            .ok_or_else(|| n.missing("mean", "a number or a list of 1 or C numbers"))?;
        let std = n
            .float_list("std", Bounds::POSITIVE)?
            .ok_or_else(|| n.missing("std", "a number or a list of 1 or C numbers, each > 0"))?;
        for (key, list) in [("mean", &mean), ("std", &std)] {
            if list.len() != 1 && list.len() != channels {
                return Err(n.err(
                    key,
                    ErrorKind::InvalidValue,
                    format!(
                        "must have 1 value or one per channel ({channels} for {}), got {}",
                        data.dataset,
                        list.len()
                    ),
                ));
            }
        }
        let to_f32 = |l: Vec<f64>| l.into_iter().map(|v| v as f32).collect();
        out.normalize = Some(Normalize {
            mean: to_f32(mean),
            std: to_f32(std),
        });
    }
    if let Some(c) = t.sub("random_crop", Some(RandomCrop::KEYS))? {
        let (h, w) = data.image_size();
        if h != w && c.entry("size").is_none() {
            return Err(c.missing("size", "the crop side (the images are not square)"));
        }
        let crop = RandomCrop::new(h).read_keys(&c)?;
        let limit = h.min(w).saturating_add(crop.padding.saturating_mul(2));
        if crop.size > limit {
            return Err(c.err(
                "size",
                ErrorKind::InvalidValue,
                format!(
                    "must be <= {limit} (the {h}x{w} image plus 2 x padding {}), got {}",
                    crop.padding, crop.size
                ),
            ));
        }
        out.random_crop = Some(crop);
    }
    out.horizontal_flip = t.section("horizontal_flip", HorizontalFlip::default)?;
    Ok(out)
}
