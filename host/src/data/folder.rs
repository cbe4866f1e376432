//! Image folders in torchvision's `ImageFolder` layout, read lazily, and the export of a
//! registry dataset as such a folder.
//!
//! A folder `ROOT` holds `ROOT/train/CLASS/...` and `ROOT/val/CLASS/...`. The classes are the
//! sub-folders of `train/` in sorted (byte) order, a class's label its index there; `val/` must
//! have the same class folders. Each class folder holds `.png`, `.jpg` or `.jpeg` files
//! (extension in any case, sub-folders searched too; other files are ignored), taken in sorted
//! path order. Only this file list is read when the run starts: images are decoded when a batch
//! needs them, on the loader's worker threads, so a folder of any size costs no memory up front.
//!
//! Each image is read as bytes by [`ImageFolder::read_encoded`] and decoded by the loader with
//! [`decode_image`](super::decode::decode_image) and the part's [`DecodePlan`] (by content,
//! whatever its extension says; see [`super::decode`]): converted to the configured channels
//! (1: luma with PIL's `convert("L")` weights; 3: RGB; alpha dropped, 16-bit scaled to 8 bits),
//! then cropped and resized. The evaluation part, and the training part unless
//! `random_resized_crop` is set, are resized and cropped like torchvision's `Resize(resize)` +
//! `CenterCrop(size)` (`eval_resize`/`eval_size` for evaluation, both `size` by default); with
//! `random_resized_crop` the training part is torchvision's `RandomResizedCrop(size, scale,
//! ratio)`, drawn per sample from the loader's generator, and optionally colour-jittered.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use image::{ExtendedColorType, ImageFormat};
use rand::SeedableRng;
use serde::Serialize;

use super::decode::{decode_image, ColorJitter, CropPlan, DecodePlan, RandomResizedCrop};
use super::staging::StagedFolder;
use super::{DataError, Split};

/// The training part's folder under the root.
pub const TRAIN: &str = "train";
/// The evaluation part's folder under the root.
pub const VAL: &str = "val";
/// The image extensions read (compared without regard to case).
pub const EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// What to do with a file that cannot be read or decoded (`[data.folder] on_bad_file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBadFile {
    /// Stop the run with an error naming the file (the default).
    Stop,
    /// Leave the sample out of its batch (which is one sample shorter) and log a warning naming
    /// the file and how many have been skipped.
    Skip,
}

impl OnBadFile {
    /// Every choice with its name in `trainer.toml`.
    pub const CHOICES: [(&'static str, OnBadFile); 2] =
        [("stop", OnBadFile::Stop), ("skip", OnBadFile::Skip)];
}

/// `[data.folder]`: how the images of an image folder become samples.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FolderConfig {
    /// The side of the square training samples (required): `Resize(size)` then
    /// `CenterCrop(size)`, or `RandomResizedCrop(size)` with `random_resized_crop`.
    pub size: usize,
    /// 1 (luma) or 3 (RGB); every image is converted to it (default 3).
    pub channels: usize,
    /// What to do with an undecodable file (default stop).
    pub on_bad_file: OnBadFile,
    /// The side of the square evaluation samples (default `size`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_size: Option<usize>,
    /// The shorter side evaluation images are resized to before the centre crop (default the
    /// evaluation size); at least `eval_size`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_resize: Option<usize>,
    /// Training crops as torchvision's `RandomResizedCrop` (default: none, the centre crop).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_resized_crop: Option<RandomResizedCrop>,
    /// Training colour jitter as torchvision's `ColorJitter` (default none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub color_jitter: Option<ColorJitter>,
    /// Decode training JPEGs at a reduced DCT scale when the random crop is at least twice
    /// the sample size (default false: torchvision's pixels; see docs/data.md).
    pub jpeg_dct_scale: bool,
}

impl FolderConfig {
    /// `size`×`size` RGB samples, stopping at a bad file.
    pub fn new(size: usize) -> FolderConfig {
        FolderConfig {
            size,
            channels: 3,
            on_bad_file: OnBadFile::Stop,
            eval_size: None,
            eval_resize: None,
            random_resized_crop: None,
            color_jitter: None,
            jpeg_dct_scale: false,
        }
    }

    /// The evaluation side: `eval_size`, else `size`.
    pub fn eval_side(&self) -> usize {
        self.eval_size.unwrap_or(self.size)
    }

    /// How training images become samples.
    pub fn train_plan(&self) -> DecodePlan {
        DecodePlan {
            channels: self.channels,
            size: self.size,
            crop: match &self.random_resized_crop {
                Some(rrc) => CropPlan::RandomResized(rrc.clone()),
                None => CropPlan::Centre { resize: self.size },
            },
            color_jitter: self.color_jitter.clone(),
            jpeg_dct_scale: self.jpeg_dct_scale,
        }
    }

    /// How evaluation images become samples: `Resize(eval_resize)` + `CenterCrop(eval_size)`.
    pub fn eval_plan(&self) -> DecodePlan {
        let size = self.eval_side();
        DecodePlan {
            channels: self.channels,
            size,
            crop: CropPlan::Centre {
                resize: self.eval_resize.unwrap_or(size),
            },
            color_jitter: None,
            jpeg_dct_scale: false,
        }
    }
}

/// The class names of the folder at `root`: the sub-folders of `root/train`, sorted.
///
/// Reads one directory listing; errors name the folder and say what the layout must be.
pub fn class_names(root: &Path) -> Result<Vec<String>, DataError> {
    let train = root.join(TRAIN);
    let classes = sub_folders(&train)?;
    if classes.is_empty() {
        return Err(DataError::format(
            &train,
            format!("holds no class folders; {}", layout_hint()),
        ));
    }
    Ok(classes)
}

fn layout_hint() -> String {
    format!(
        "an image folder holds {TRAIN}/CLASS/*.png and {VAL}/CLASS/*.png (or .jpg, .jpeg), \
         torchvision's ImageFolder layout"
    )
}

/// The names of the folders in `dir`, sorted; an error naming `dir` if it is not a folder.
fn sub_folders(dir: &Path) -> Result<Vec<String>, DataError> {
    if !dir.is_dir() {
        return Err(DataError::format(
            dir,
            format!("no such folder; {}", layout_hint()),
        ));
    }
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| DataError::io(dir, e))? {
        let entry = entry.map_err(|e| DataError::io(dir, e))?;
        let path = entry.path();
        // `is_dir` follows symbolic links, as torchvision does.
        if !path.is_dir() {
            continue;
        }
        let name = entry
            .file_name()
            .into_string()
            .map_err(|_| DataError::format(&path, "a class folder's name must be valid UTF-8"))?;
        names.push(name);
    }
    names.sort();
    Ok(names)
}

/// The image files under `dir` (recursively), in sorted path order.
fn image_files(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in fs::read_dir(&folder).map_err(|e| DataError::io(&folder, e))? {
            let path = entry.map_err(|e| DataError::io(&folder, e))?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
            {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// One part (`train/` or `val/`) of an image folder: its file list and labels, decoded on
/// demand by [`ImageFolder::load`].
pub struct ImageFolder {
    dir: PathBuf,
    files: Vec<PathBuf>,
    labels: Vec<i64>,
    classes: Vec<String>,
    config: FolderConfig,
    /// How this part's images become samples.
    plan: DecodePlan,
    /// Indices of the files skipped as undecodable (with `on_bad_file = "skip"`).
    skipped: Mutex<BTreeSet<usize>>,
}

impl std::fmt::Debug for ImageFolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageFolder")
            .field("dir", &self.dir)
            .field("len", &self.files.len())
            .field("classes", &self.classes.len())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ImageFolder {
    /// Lists the training and evaluation parts of the folder at `root` (no image is decoded).
    ///
    /// Errors name the folder at fault: a missing `train/` or `val/`, no class folders, a class
    /// folder without images, a class of `val/` that `train/` lacks or the other way round, or
    /// a `config` that cannot be served (channels other than 1 or 3, size 0).
    pub fn open_split(
        root: &Path,
        config: &FolderConfig,
    ) -> Result<(ImageFolder, ImageFolder), DataError> {
        if config.channels != 1 && config.channels != 3 {
            return Err(DataError::Invalid(format!(
                "image folder {}: channels must be 1 (luma) or 3 (RGB), got {}",
                root.display(),
                config.channels
            )));
        }
        for (key, value) in [
            ("size", Some(config.size)),
            ("eval_size", config.eval_size),
            ("eval_resize", config.eval_resize),
        ] {
            if let Some(v) = value.filter(|&v| v == 0 || u32::try_from(v).is_err()) {
                return Err(DataError::Invalid(format!(
                    "image folder {}: {key} must be in 1..=2^32-1, got {v}",
                    root.display()
                )));
            }
        }
        if let Some(resize) = config.eval_resize.filter(|&r| r < config.eval_side()) {
            return Err(DataError::Invalid(format!(
                "image folder {}: eval_resize {resize} is smaller than the evaluation size {}",
                root.display(),
                config.eval_side()
            )));
        }
        let classes = class_names(root)?;
        let val = root.join(VAL);
        let val_classes = sub_folders(&val)?;
        if let Some(extra) = val_classes.iter().find(|c| !classes.contains(c)) {
            return Err(DataError::format(
                val.join(extra),
                format!(
                    "class `{extra}` is not a class of {} (whose classes are: {}); val/ and \
                     train/ must have the same class folders",
                    root.join(TRAIN).display(),
                    classes.join(", ")
                ),
            ));
        }
        if let Some(missing) = classes.iter().find(|c| !val_classes.contains(c)) {
            return Err(DataError::format(
                &val,
                format!(
                    "has no folder for class `{missing}` of {}; val/ and train/ must have the \
                     same class folders",
                    root.join(TRAIN).display()
                ),
            ));
        }
        Ok((
            ImageFolder::open(root.join(TRAIN), &classes, config, config.train_plan())?,
            ImageFolder::open(val, &classes, config, config.eval_plan())?,
        ))
    }

    fn open(
        dir: PathBuf,
        classes: &[String],
        config: &FolderConfig,
        plan: DecodePlan,
    ) -> Result<Self, DataError> {
        let mut files = Vec::new();
        let mut labels = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let class_dir = dir.join(class);
            let found = image_files(&class_dir)?;
            if found.is_empty() {
                return Err(DataError::format(
                    &class_dir,
                    format!(
                        "class folder `{class}` holds no image ({} files)",
                        EXTENSIONS.map(|e| format!(".{e}")).join(", ")
                    ),
                ));
            }
            labels.extend(std::iter::repeat_n(label as i64, found.len()));
            files.extend(found);
        }
        Ok(ImageFolder {
            dir,
            files,
            labels,
            classes: classes.to_vec(),
            config: config.clone(),
            plan,
            skipped: Mutex::new(BTreeSet::new()),
        })
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether the part holds no images (never true for an opened folder).
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The class names, in label order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The files, in sample order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The labels, in sample order.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// The (C, H, W) of every sample.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.plan.channels, self.plan.size, self.plan.size)
    }

    /// How this part's images become samples.
    pub fn plan(&self) -> &DecodePlan {
        &self.plan
    }

    /// The bytes and path of sample `index`'s file, read now; `Ok(None)` when the file was
    /// skipped as undecodable before, or cannot be read and `on_bad_file` is `skip`.
    pub fn read_encoded(&self, index: usize) -> Result<Option<(Vec<u8>, String)>, DataError> {
        let path = self.files.get(index).ok_or_else(|| {
            DataError::Invalid(format!(
                "sample {index} is outside the {} images of {}",
                self.files.len(),
                self.dir.display()
            ))
        })?;
        if self.is_skipped(index) {
            return Ok(None);
        }
        match fs::read(path) {
            Ok(bytes) => Ok(Some((bytes, path.display().to_string()))),
            Err(e) => self
                .bad_file(
                    index,
                    DataError::format(
                        path,
                        format!(
                            "cannot read the image: {e}; replace or delete the file, or set \
                             [data.folder] on_bad_file = \"skip\""
                        ),
                    ),
                )
                .map(|()| None),
        }
    }

    /// The C×H×W pixels of sample `index`, decoded now by the part's plan (a random crop drawn
    /// from a generator at seed 0: the loader draws per sample); `Ok(None)` when the file is
    /// undecodable and `on_bad_file` is `skip` (a warning names it the first time).
    pub fn load(&self, index: usize) -> Result<Option<Vec<u8>>, DataError> {
        let Some((bytes, name)) = self.read_encoded(index)? else {
            return Ok(None);
        };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        match decode_image(&bytes, &name, &self.plan, &mut rng) {
            Ok(pixels) => Ok(Some(pixels)),
            Err(e) => self.bad_file(index, e).map(|()| None),
        }
    }

    /// Sample `index` could not be read or decoded (`error` names it): with `on_bad_file =
    /// "skip"` it is recorded (never read again) and a warning names it; else the error.
    pub fn bad_file(&self, index: usize, error: DataError) -> Result<(), DataError> {
        if self.config.on_bad_file != OnBadFile::Skip {
            return Err(error);
        }
        let count = {
            let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
            skipped.insert(index);
            skipped.len()
        };
        tracing::warn!(
            "skipped {error} ({count} undecodable file(s) of {} skipped so far)",
            self.dir.display()
        );
        Ok(())
    }

    fn is_skipped(&self, index: usize) -> bool {
        self.skipped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&index)
    }
}

/// Decodes the image at `path` into `channels`×`size`×`size` `u8` pixels, torchvision's
/// `Resize(size)` + `CenterCrop(size)` (see the module doc); an error names the file.
pub fn decode(path: &Path, channels: usize, size: usize) -> Result<Vec<u8>, DataError> {
    let bytes = fs::read(path).map_err(|e| DataError::io(path, e))?;
    let plan = DecodePlan {
        channels,
        size,
        crop: CropPlan::Centre { resize: size },
        color_jitter: None,
        jpeg_dct_scale: false,
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    decode_image(&bytes, &path.display().to_string(), &plan, &mut rng)
}

/// What [`export`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSummary {
    /// The finished folder.
    pub path: PathBuf,
    /// Images written under `train/`.
    pub train: usize,
    /// Images written under `val/`.
    pub val: usize,
}

/// Writes `split` as an image folder at `dir`: the training part under `train/`, the test part
/// under `val/`, sample `i` of class `c` as `<part>/<class name>/<i>.png` (`i` zero-padded to
/// the part's length, so files sort in sample order), at most `limit` images per class and part
/// (the first ones). Class folders are named `class_names` (in label order) when given, else by
/// the zero-padded label. Folders read back in sorted name order: labels follow the names.
///
/// The folder is written under a temporary name beside `dir` (`.NAME.partial-PID-TIME`) and
/// renamed to `dir` only when complete, so an interrupted export never leaves something that
/// looks finished: a failed one removes its temporary, a killed one leaves it to be deleted by
/// hand. `dir` must not exist or be an empty folder.
pub fn export(
    split: &Split,
    class_names: Option<&[&str]>,
    dir: &Path,
    limit: Option<usize>,
) -> Result<ExportSummary, DataError> {
    let classes = split.train.num_classes;
    let names: Vec<String> = match class_names {
        Some(names) if names.len() == classes => names.iter().map(|n| n.to_string()).collect(),
        Some(names) => {
            return Err(DataError::Invalid(format!(
                "{} class names given for {classes} classes",
                names.len()
            )))
        }
        None => {
            let width = (classes - 1).max(1).to_string().len();
            (0..classes).map(|c| format!("{c:0width$}")).collect()
        }
    };
    if limit == Some(0) {
        return Err(DataError::Invalid(
            "an export limit of 0 images per class leaves every class folder empty".into(),
        ));
    }
    let staging = StagedFolder::new(dir, "export")?;
    let mut counts = [0usize; 2];
    for ((part, dataset), count) in [(TRAIN, &split.train), (VAL, &split.test)]
        .into_iter()
        .zip(&mut counts)
    {
        let part_dir = staging.path().join(part);
        for class in &names {
            let class_dir = part_dir.join(class);
            fs::create_dir_all(&class_dir).map_err(|e| DataError::io(&class_dir, e))?;
        }
        let width = dataset.len().saturating_sub(1).max(1).to_string().len();
        let mut per_class = vec![0usize; classes];
        for (i, &label) in dataset.labels.iter().enumerate() {
            let label = label as usize;
            if limit.is_some_and(|l| per_class[label] >= l) {
                continue;
            }
            per_class[label] += 1;
            let path = part_dir
                .join(&names[label])
                .join(format!("{i:0width$}.png"));
            let pixels = dataset.sample(i).ok_or_else(|| {
                DataError::Invalid(format!("sample {i} is missing from the {part} part"))
            })?;
            write_png(
                &path,
                pixels,
                dataset.channels,
                dataset.width,
                dataset.height,
            )?;
            *count += 1;
        }
    }
    staging.finish()?;
    Ok(ExportSummary {
        path: dir.to_path_buf(),
        train: counts[0],
        val: counts[1],
    })
}

/// Writes C×H×W `u8` pixels (C = 1 or 3) as a PNG.
fn write_png(
    path: &Path,
    pixels: &[u8],
    channels: usize,
    width: usize,
    height: usize,
) -> Result<(), DataError> {
    let (color, data) = match channels {
        1 => (ExtendedColorType::L8, pixels.to_vec()),
        3 => {
            let plane = width * height;
            let interleaved = (0..plane)
                .flat_map(|i| (0..3).map(move |c| pixels[c * plane + i]))
                .collect();
            (ExtendedColorType::Rgb8, interleaved)
        }
        _ => {
            return Err(DataError::Invalid(format!(
                "{}: only 1- or 3-channel images can be written as PNG, not {channels}",
                path.display()
            )))
        }
    };
    let (w, h) = (
        u32::try_from(width).map_err(|_| DataError::format(path, "image too wide"))?,
        u32::try_from(height).map_err(|_| DataError::format(path, "image too tall"))?,
    );
    image::save_buffer_with_format(path, &data, w, h, color, ImageFormat::Png)
        .map_err(|e| DataError::format(path, format!("cannot write the PNG: {e}")))
}

#[cfg(test)]
#[path = "folder_tests.rs"]
mod tests;
