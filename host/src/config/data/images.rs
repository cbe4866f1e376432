//! `[data]` of images: the synthetic set, an image folder, shards, their image keys, and
//! `[data.transforms]`.

use super::DataConfig;
use crate::config::error::{ConfigError, ErrorKind};
use crate::config::reader::{Bounds, Tbl};
use crate::config::section::{section, Section};
use crate::data::decode::{ColorJitter, RandomResizedCrop};
use crate::data::{
    folder, FolderConfig, HorizontalFlip, Normalize, OnBadFile, RandomCrop, ShardsConfig,
    SyntheticConfig, Transforms,
};

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

pub(super) fn no_transforms(t: &Transforms) -> bool {
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

/// `[data.folder]` (required with `data_dir` for `dataset = "folder"`) and the number of class
/// folders in `data_dir/train`: the only look at the folder until the run starts.
pub(super) fn read_folder(d: &Tbl<'_>) -> Result<(FolderConfig, usize), ConfigError> {
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
pub(super) fn read_shards(
    d: &Tbl<'_>,
    format: crate::data::ShardFormat,
) -> Result<ShardsConfig, ConfigError> {
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

pub(super) fn read_transforms(t: &Tbl<'_>, data: &DataConfig) -> Result<Transforms, ConfigError> {
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
