//! In-memory image classification datasets: loaded from IDX files or made up (synthetic).

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{idx, DataError};

/// Images with integer class labels, all in memory.
///
/// Pixels are `u8`, stored sample after sample, each sample channel-major (N×C×H×W).
/// `Debug` prints the shape only, not the pixels.
#[derive(Clone, PartialEq, Eq)]
pub struct ImageDataset {
    /// Channels per image (C).
    pub channels: usize,
    /// Rows per image (H).
    pub height: usize,
    /// Columns per image (W).
    pub width: usize,
    /// N×C×H×W pixels.
    pub pixels: Vec<u8>,
    /// One class index per image, each in `0..num_classes`.
    pub labels: Vec<i64>,
    /// Number of classes.
    pub num_classes: usize,
}

impl std::fmt::Debug for ImageDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageDataset")
            .field("len", &self.len())
            .field("channels", &self.channels)
            .field("height", &self.height)
            .field("width", &self.width)
            .field("num_classes", &self.num_classes)
            .finish_non_exhaustive()
    }
}

/// A dataset's official training and test parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The training part.
    pub train: ImageDataset,
    /// The held-out test part.
    pub test: ImageDataset,
}

impl ImageDataset {
    /// Builds a dataset after checking that the sizes fit together and every label is in range.
    pub fn new(
        channels: usize,
        height: usize,
        width: usize,
        pixels: Vec<u8>,
        labels: Vec<i64>,
        num_classes: usize,
    ) -> Result<ImageDataset, DataError> {
        if channels == 0 || height == 0 || width == 0 {
            return Err(DataError::Invalid(format!(
                "image shape {channels}×{height}×{width} has a zero dimension"
            )));
        }
        if num_classes == 0 {
            return Err(DataError::Invalid("num_classes must be at least 1".into()));
        }
        let expected = sample_len(channels, height, width)
            .and_then(|per| per.checked_mul(labels.len()))
            .ok_or_else(|| {
                DataError::Invalid(format!(
                    "{} images of {channels}×{height}×{width} overflow the address space",
                    labels.len()
                ))
            })?;
        if pixels.len() != expected {
            return Err(DataError::Invalid(format!(
                "{} labels of {channels}×{height}×{width} images need {expected} pixels, got {}",
                labels.len(),
                pixels.len()
            )));
        }
        if let Some((i, &label)) = labels
            .iter()
            .enumerate()
            .find(|(_, &l)| l < 0 || l as u64 >= num_classes as u64)
        {
            return Err(DataError::Invalid(format!(
                "label {label} of sample {i} is outside 0..{num_classes}"
            )));
        }
        Ok(ImageDataset {
            channels,
            height,
            width,
            pixels,
            labels,
            num_classes,
        })
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the dataset holds no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Pixels per image (C×H×W).
    pub fn sample_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// The pixels of image `index` (C×H×W), or `None` past the end.
    pub fn sample(&self, index: usize) -> Option<&[u8]> {
        let per = self.sample_len();
        let start = index.checked_mul(per)?;
        self.pixels.get(start..start.checked_add(per)?)
    }

    /// Loads a grey-scale (C = 1) dataset from an IDX image file and an IDX label file.
    ///
    /// Checks that both files hold the same number of samples and that every label is below
    /// `num_classes`; errors name the file at fault.
    pub fn load_idx(
        images_path: &Path,
        labels_path: &Path,
        num_classes: usize,
    ) -> Result<ImageDataset, DataError> {
        let images = idx::read_images(images_path)?;
        let labels = idx::read_labels(labels_path)?;
        if images.count != labels.len() {
            return Err(DataError::Invalid(format!(
                "{} holds {} images but {} holds {} labels",
                images_path.display(),
                images.count,
                labels_path.display(),
                labels.len()
            )));
        }
        if let Some((i, &label)) = labels
            .iter()
            .enumerate()
            .find(|(_, &l)| l as usize >= num_classes)
        {
            return Err(DataError::format(
                labels_path,
                format!("label {label} of sample {i} is not below the {num_classes} classes"),
            ));
        }
        let labels = labels.into_iter().map(i64::from).collect();
        ImageDataset::new(
            1,
            images.height,
            images.width,
            images.pixels,
            labels,
            num_classes,
        )
    }

    /// A seeded, learnable, in-memory dataset of `n` images.
    ///
    /// Each class has a fixed prototype: a smooth random pattern (a coarse random grid, bilinearly
    /// upsampled), so it survives small shifts and flips. A sample is its class prototype plus
    /// uniform per-pixel noise of ±32. Labels cycle through the classes, so the classes are
    /// balanced. The prototypes depend only on `seed`, the shape and `classes`; a sample depends on
    /// `seed` and its index, so the first `k` samples of a larger call equal a call with `n = k`
    /// (use [`Split::synthetic`] for a train/test pair that shares prototypes).
    pub fn synthetic(
        seed: u64,
        n: usize,
        channels: usize,
        height: usize,
        width: usize,
        classes: usize,
    ) -> Result<ImageDataset, DataError> {
        let per = sample_len(channels, height, width).ok_or_else(|| {
            DataError::Invalid(format!(
                "synthetic image shape {channels}×{height}×{width} overflows"
            ))
        })?;
        if per == 0 || classes == 0 {
            return Err(DataError::Invalid(format!(
                "synthetic dataset needs non-zero shape and classes, got {channels}×{height}×{width} with {classes} classes"
            )));
        }
        let total = per.checked_mul(n).ok_or_else(|| {
            DataError::Invalid(format!("{n} synthetic images of {per} pixels overflow"))
        })?;

        let mut prototype_rng = ChaCha8Rng::seed_from_u64(seed);
        prototype_rng.set_stream(0);
        let prototypes: Vec<Vec<f32>> = (0..classes)
            .map(|_| smooth_pattern(&mut prototype_rng, channels, height, width))
            .collect();

        let mut noise_rng = ChaCha8Rng::seed_from_u64(seed);
        noise_rng.set_stream(1);
        let mut pixels = Vec::with_capacity(total);
        let mut labels = Vec::with_capacity(n);
        for i in 0..n {
            let class = i % classes;
            labels.push(class as i64);
            for &value in &prototypes[class] {
                let noisy = value + noise_rng.gen_range(-32.0f32..=32.0);
                pixels.push(noisy.round().clamp(0.0, 255.0) as u8);
            }
        }
        ImageDataset::new(channels, height, width, pixels, labels, classes)
    }

    /// Splits off the samples from `at` on into a new dataset; `self` keeps `0..at`.
    pub fn split_off(&mut self, at: usize) -> ImageDataset {
        let at = at.min(self.len());
        ImageDataset {
            channels: self.channels,
            height: self.height,
            width: self.width,
            pixels: self.pixels.split_off(at * self.sample_len()),
            labels: self.labels.split_off(at),
            num_classes: self.num_classes,
        }
    }
}

impl Split {
    /// A synthetic train/test pair drawn from the same class prototypes
    /// (see [`ImageDataset::synthetic`]); the test samples are distinct from the training ones.
    pub fn synthetic(
        seed: u64,
        train_len: usize,
        test_len: usize,
        channels: usize,
        height: usize,
        width: usize,
        classes: usize,
    ) -> Result<Split, DataError> {
        let total = train_len.checked_add(test_len).ok_or_else(|| {
            DataError::Invalid(format!("{train_len} + {test_len} samples overflow"))
        })?;
        let mut train = ImageDataset::synthetic(seed, total, channels, height, width, classes)?;
        let test = train.split_off(train_len);
        Ok(Split { train, test })
    }
}

fn sample_len(channels: usize, height: usize, width: usize) -> Option<usize> {
    channels.checked_mul(height)?.checked_mul(width)
}

/// A C×H×W pattern in [0, 255]: per channel, a coarse random grid upsampled bilinearly.
fn smooth_pattern(rng: &mut ChaCha8Rng, channels: usize, height: usize, width: usize) -> Vec<f32> {
    const GRID: usize = 4;
    let mut out = Vec::with_capacity(channels * height * width);
    for _ in 0..channels {
        let grid: Vec<f32> = (0..GRID * GRID)
            .map(|_| rng.gen_range(0.0f32..=255.0))
            .collect();
        for y in 0..height {
            let (y0, y1, fy) = grid_coordinate(y, height, GRID);
            for x in 0..width {
                let (x0, x1, fx) = grid_coordinate(x, width, GRID);
                let top = grid[y0 * GRID + x0] * (1.0 - fx) + grid[y0 * GRID + x1] * fx;
                let bottom = grid[y1 * GRID + x0] * (1.0 - fx) + grid[y1 * GRID + x1] * fx;
                out.push(top * (1.0 - fy) + bottom * fy);
            }
        }
    }
    out
}

/// Maps pixel `i` of `len` onto the grid: the two neighbouring grid cells and the blend weight.
fn grid_coordinate(i: usize, len: usize, grid: usize) -> (usize, usize, f32) {
    let position = if len > 1 {
        i as f32 * (grid - 1) as f32 / (len - 1) as f32
    } else {
        0.0
    };
    let lower = (position.floor() as usize).min(grid - 1);
    let upper = (lower + 1).min(grid - 1);
    (lower, upper, position - lower as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idx::{encode, tests::gzip, tests::TempDir};

    #[test]
    fn new_validates_sizes_and_labels() {
        assert!(ImageDataset::new(1, 2, 2, vec![0; 8], vec![0, 1], 2).is_ok());
        let msg = ImageDataset::new(1, 2, 2, vec![0; 7], vec![0, 1], 2)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("need 8 pixels, got 7"), "{msg}");
        let msg = ImageDataset::new(1, 2, 2, vec![0; 8], vec![0, 2], 2)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("label 2 of sample 1"), "{msg}");
        assert!(ImageDataset::new(1, 2, 2, vec![0; 8], vec![-1, 0], 2).is_err());
        assert!(ImageDataset::new(0, 2, 2, vec![], vec![], 2).is_err());
        assert!(ImageDataset::new(1, 2, 2, vec![], vec![], 0).is_err());
        let empty = ImageDataset::new(3, 2, 2, vec![], vec![], 2).unwrap();
        assert!(empty.is_empty());
        assert_eq!(
            format!("{empty:?}"),
            "ImageDataset { len: 0, channels: 3, height: 2, width: 2, num_classes: 2, .. }"
        );
    }

    #[test]
    fn sample_access() {
        let ds = ImageDataset::new(1, 1, 2, vec![1, 2, 3, 4], vec![0, 1], 2).unwrap();
        assert_eq!(ds.len(), 2);
        assert_eq!(ds.sample(1), Some(&[3u8, 4][..]));
        assert_eq!(ds.sample(2), None);
        assert_eq!(ds.sample(usize::MAX), None);
    }

    #[test]
    fn load_idx_checks_counts_and_classes() {
        let dir = TempDir::new("dataset-idx");
        let images = dir.0.join("images.gz");
        std::fs::write(&images, gzip(&encode(&[3, 2, 2], &[9; 12]))).unwrap();
        let labels = dir.0.join("labels");
        std::fs::write(&labels, encode(&[3], &[0, 4, 2])).unwrap();
        let ds = ImageDataset::load_idx(&images, &labels, 10).unwrap();
        assert_eq!((ds.len(), ds.channels, ds.height, ds.width), (3, 1, 2, 2));
        assert_eq!(ds.labels, vec![0, 4, 2]);

        let msg = ImageDataset::load_idx(&images, &labels, 4)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("labels") && msg.contains("label 4 of sample 1"),
            "{msg}"
        );

        let two = dir.0.join("two-labels");
        std::fs::write(&two, encode(&[2], &[0, 1])).unwrap();
        let msg = ImageDataset::load_idx(&images, &two, 10)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("3 images") && msg.contains("2 labels"),
            "{msg}"
        );
        assert!(msg.contains("two-labels"), "{msg}");
    }

    #[test]
    fn synthetic_is_seeded_and_balanced() {
        let a = ImageDataset::synthetic(7, 50, 3, 8, 8, 5).unwrap();
        let b = ImageDataset::synthetic(7, 50, 3, 8, 8, 5).unwrap();
        let c = ImageDataset::synthetic(8, 50, 3, 8, 8, 5).unwrap();
        assert_eq!(a, b);
        assert_ne!(a.pixels, c.pixels);
        assert_eq!(a.pixels.len(), 50 * 3 * 8 * 8);
        for class in 0..5 {
            assert_eq!(a.labels.iter().filter(|&&l| l == class).count(), 10);
        }
        let prefix = ImageDataset::synthetic(7, 20, 3, 8, 8, 5).unwrap();
        assert_eq!(prefix.pixels[..], a.pixels[..prefix.pixels.len()]);
        assert!(ImageDataset::synthetic(1, 4, 0, 8, 8, 5).is_err());
        assert!(ImageDataset::synthetic(1, 4, 1, 8, 8, 0).is_err());
    }

    /// A nearest-class-mean classifier, fit on the training part, must be nearly perfect on the
    /// test part: the classes are well separated, so a small net learns them quickly.
    #[test]
    fn synthetic_is_learnable() {
        let split = Split::synthetic(3, 500, 200, 1, 12, 12, 10).unwrap();
        assert_eq!((split.train.len(), split.test.len()), (500, 200));
        let per = split.train.sample_len();
        let mut means = vec![vec![0f64; per]; 10];
        let mut counts = [0usize; 10];
        for i in 0..split.train.len() {
            let class = split.train.labels[i] as usize;
            counts[class] += 1;
            for (m, &p) in means[class].iter_mut().zip(split.train.sample(i).unwrap()) {
                *m += f64::from(p);
            }
        }
        for (mean, count) in means.iter_mut().zip(counts) {
            mean.iter_mut().for_each(|m| *m /= count as f64);
        }
        let correct = (0..split.test.len())
            .filter(|&i| {
                let x = split.test.sample(i).unwrap();
                let distance = |mean: &Vec<f64>| -> f64 {
                    mean.iter()
                        .zip(x)
                        .map(|(m, &p)| (m - f64::from(p)).powi(2))
                        .sum()
                };
                let best = (0..10)
                    .min_by(|&a, &b| distance(&means[a]).total_cmp(&distance(&means[b])))
                    .unwrap();
                best as i64 == split.test.labels[i]
            })
            .count();
        assert!(correct >= 190, "nearest-mean accuracy {correct}/200");
        // Test samples differ from training samples.
        assert_ne!(split.test.sample(0), split.train.sample(0));
    }
}
