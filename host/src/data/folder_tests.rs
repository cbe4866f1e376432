//! Unit tests of `folder`.
use super::super::idx::tests::TempDir;
use super::super::loader::{Loader, LoaderOptions};
use super::super::ImageDataset;
use super::*;
use crate::data::decode::{centre_offset, resized_size};
use std::sync::Arc;

/// Writes an 8-bit image of `color` (L8, La8, Rgb8 or Rgba8) with interleaved `pixels`.
fn write_image(path: &Path, width: u32, height: u32, color: ExtendedColorType, pixels: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let format = ImageFormat::from_path(path).unwrap();
    image::save_buffer_with_format(path, pixels, width, height, color, format).unwrap();
}

/// A `value`-filled 2×2 grey PNG.
fn grey(path: &Path, value: u8) {
    write_image(path, 2, 2, ExtendedColorType::L8, &[value; 4]);
}

fn config(size: usize, channels: usize) -> FolderConfig {
    FolderConfig {
        channels,
        ..FolderConfig::new(size)
    }
}

/// train/ and val/ with classes `cat` and `ant` (given out of order), a few images each.
fn two_class_folder(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    for part in [TRAIN, VAL] {
        grey(&dir.0.join(part).join("cat/b.png"), 20);
        grey(&dir.0.join(part).join("cat/a.PNG"), 10);
        grey(&dir.0.join(part).join("ant/x.png"), 30);
    }
    // Nested folders count, other files do not.
    grey(&dir.0.join("train/ant/more/y.png"), 40);
    fs::write(dir.0.join("train/ant/notes.txt"), "not an image").unwrap();
    fs::write(dir.0.join("train/README"), "not a class").unwrap();
    dir
}

#[test]
fn layout_classes_sorted_and_files_in_path_order() {
    let dir = two_class_folder("folder-layout");
    assert_eq!(class_names(&dir.0).unwrap(), ["ant", "cat"]);
    let (train, val) = ImageFolder::open_split(&dir.0, &config(2, 1)).unwrap();
    assert_eq!(train.classes(), ["ant", "cat"]);
    let relative: Vec<String> = train
        .files()
        .iter()
        .map(|f| {
            f.strip_prefix(dir.0.join(TRAIN))
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(
        relative,
        ["ant/more/y.png", "ant/x.png", "cat/a.PNG", "cat/b.png"]
    );
    assert_eq!(train.labels(), [0, 0, 1, 1]);
    assert_eq!((val.len(), val.labels()), (3, &[0i64, 1, 1][..]));
    // Labels and decoded pixels follow the file order.
    let firsts: Vec<u8> = (0..train.len())
        .map(|i| train.load(i).unwrap().unwrap()[0])
        .collect();
    assert_eq!(firsts, [40, 30, 10, 20]);
    assert_eq!(train.shape(), (1, 2, 2));
}

fn open_error(root: &Path, config: &FolderConfig) -> String {
    ImageFolder::open_split(root, config)
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

#[test]
fn layout_errors_name_the_folder() {
    let dir = TempDir::new("folder-errors");
    let root = &dir.0;
    let msg = open_error(root, &config(2, 1));
    assert!(
        msg.contains(&root.join("train").display().to_string()) && msg.contains("no such folder"),
        "{msg}"
    );

    fs::create_dir_all(root.join("train")).unwrap();
    let msg = open_error(root, &config(2, 1));
    assert!(msg.contains("holds no class folders"), "{msg}");

    grey(&root.join("train/a/1.png"), 1);
    grey(&root.join("train/b/1.png"), 2);
    let msg = open_error(root, &config(2, 1));
    assert!(
        msg.contains(&root.join("val").display().to_string()) && msg.contains("no such folder"),
        "{msg}"
    );

    grey(&root.join("val/a/1.png"), 1);
    let msg = open_error(root, &config(2, 1));
    assert!(
        msg.contains("has no folder for class `b`")
            && msg.contains(&root.join("val").display().to_string()),
        "{msg}"
    );

    grey(&root.join("val/b/1.png"), 1);
    grey(&root.join("val/zebra/1.png"), 1);
    let msg = open_error(root, &config(2, 1));
    assert!(
        msg.contains(&root.join("val/zebra").display().to_string())
            && msg.contains("class `zebra` is not a class of"),
        "{msg}"
    );
    fs::remove_dir_all(root.join("val/zebra")).unwrap();
    assert!(ImageFolder::open_split(root, &config(2, 1)).is_ok());

    fs::create_dir_all(root.join("train/c")).unwrap();
    fs::write(root.join("train/c/readme.txt"), "x").unwrap();
    fs::create_dir_all(root.join("val/c")).unwrap();
    let msg = open_error(root, &config(2, 1));
    assert!(
        msg.contains(&root.join("train/c").display().to_string())
            && msg.contains("class folder `c` holds no image"),
        "{msg}"
    );

    let msg = open_error(root, &config(2, 2));
    assert!(
        msg.contains("channels must be 1 (luma) or 3 (RGB)"),
        "{msg}"
    );
    let msg = open_error(root, &config(0, 1));
    assert!(msg.contains("size must be"), "{msg}");
}

#[test]
fn torchvision_resize_and_centre_crop_geometry() {
    // Resize(size): the shorter side becomes `size`, the longer one floor(size * long / short).
    assert_eq!(resized_size(6, 4, 3), (4, 3));
    assert_eq!(resized_size(4, 6, 3), (3, 4));
    assert_eq!(resized_size(640, 480, 224), (298, 224));
    assert_eq!(resized_size(28, 28, 28), (28, 28));
    // CenterCrop: round((length - size) / 2), ties to even as Python's round.
    assert_eq!(centre_offset(4, 3), 0); // round(0.5) = 0
    assert_eq!(centre_offset(5, 2), 2); // round(1.5) = 2
    assert_eq!(centre_offset(7, 2), 2); // round(2.5) = 2
    assert_eq!(centre_offset(298, 224), 37);
}

#[test]
fn decode_converts_channels_and_crops_the_centre() {
    let dir = TempDir::new("folder-decode");
    // A 4×2 RGB image (already 2 high: no resize), each pixel distinct.
    let rgb: Vec<u8> = (0..8u8)
        .flat_map(|i| [i * 30, 255 - i * 30, i * 7])
        .collect();
    let path = dir.0.join("rgb.png");
    write_image(&path, 4, 2, ExtendedColorType::Rgb8, &rgb);
    let pixel = |x: usize, y: usize| &rgb[(y * 4 + x) * 3..][..3];
    // The centre 2×2 square is columns 1 and 2 (offset round(1.0) = 1), as C×H×W planes.
    let mut expected = Vec::new();
    for c in 0..3 {
        for y in 0..2 {
            for x in 1..3 {
                expected.push(pixel(x, y)[c]);
            }
        }
    }
    assert_eq!(decode(&path, 3, 2).unwrap(), expected);
    // Luma with PIL's weights.
    let luma: Vec<u8> = [(1, 0), (2, 0), (1, 1), (2, 1)]
        .iter()
        .map(|&(x, y)| {
            let p = pixel(x, y);
            (0.299 * f64::from(p[0]) + 0.587 * f64::from(p[1]) + 0.114 * f64::from(p[2])).round()
                as u8
        })
        .collect();
    assert_eq!(decode(&path, 1, 2).unwrap(), luma);

    // Grey and grey+alpha images become 3 equal planes; RGBA drops its alpha.
    let grey_path = dir.0.join("grey.png");
    write_image(
        &grey_path,
        2,
        2,
        ExtendedColorType::La8,
        &[9, 255, 8, 0, 7, 1, 6, 128],
    );
    assert_eq!(decode(&grey_path, 3, 2).unwrap(), [9, 8, 7, 6].repeat(3));
    assert_eq!(decode(&grey_path, 1, 2).unwrap(), [9, 8, 7, 6]);
    let rgba_path = dir.0.join("rgba.png");
    write_image(&rgba_path, 1, 1, ExtendedColorType::Rgba8, &[1, 2, 3, 0]);
    assert_eq!(decode(&rgba_path, 3, 1).unwrap(), [1, 2, 3]);
}

#[test]
fn decode_resizes_the_shorter_side() {
    let dir = TempDir::new("folder-resize");
    // 8×4, left half 0, right half 200: resized to 4×2, then the centre 2×2 kept.
    let pixels: Vec<u8> = (0..32).map(|i| if i % 8 < 4 { 0 } else { 200 }).collect();
    let path = dir.0.join("halves.png");
    write_image(&path, 8, 4, ExtendedColorType::L8, &pixels);
    let out = decode(&path, 1, 2).unwrap();
    assert_eq!(out.len(), 4);
    // Both rows alike; the left column darker than the right, mirror images of each other
    // around the edge (the filter is symmetric).
    assert_eq!(out[..2], out[2..]);
    assert!(out[0] < out[1], "{out:?}");
    assert_eq!(u16::from(out[0]) + u16::from(out[1]), 200, "{out:?}");
    // A uniform image stays uniform at any scale, including upscaling.
    let flat = dir.0.join("flat.png");
    write_image(&flat, 3, 5, ExtendedColorType::L8, &[77; 15]);
    assert_eq!(decode(&flat, 1, 7).unwrap(), vec![77; 49]);
}

#[test]
fn decode_reads_jpeg_and_guesses_by_content() {
    let dir = TempDir::new("folder-jpeg");
    let path = dir.0.join("flat.jpg");
    write_image(
        &path,
        8,
        8,
        ExtendedColorType::Rgb8,
        &[100, 150, 200].repeat(64),
    );
    let out = decode(&path, 3, 4).unwrap();
    for (c, want) in [100i16, 150, 200].into_iter().enumerate() {
        for &v in &out[c * 16..(c + 1) * 16] {
            assert!((i16::from(v) - want).abs() <= 2, "channel {c}: {out:?}");
        }
    }
    // A PNG named .jpg decodes by its content.
    let misnamed = dir.0.join("png.jpg");
    fs::copy(dir.0.join("flat.jpg"), dir.0.join("copy.jpg")).unwrap();
    grey(&dir.0.join("real.png"), 66);
    fs::rename(dir.0.join("real.png"), &misnamed).unwrap();
    assert_eq!(decode(&misnamed, 1, 2).unwrap(), [66; 4]);
}

#[test]
fn a_bad_file_stops_or_is_skipped_by_setting() {
    let dir = two_class_folder("folder-bad");
    let bad = dir.0.join("train/cat/c.png");
    fs::write(&bad, b"not a png at all").unwrap();
    let (train, _) = ImageFolder::open_split(&dir.0, &config(2, 1)).unwrap();
    assert_eq!(train.files()[4], bad);
    let msg = train.load(4).unwrap_err().to_string();
    assert!(
        msg.contains(&bad.display().to_string())
            && msg.contains("cannot decode")
            && msg.contains("on_bad_file = \"skip\""),
        "{msg}"
    );

    let skip = FolderConfig {
        on_bad_file: OnBadFile::Skip,
        ..config(2, 1)
    };
    let (train, _) = ImageFolder::open_split(&dir.0, &skip).unwrap();
    assert_eq!(train.load(4).unwrap(), None);
    assert_eq!(train.load(4).unwrap(), None);
    assert_eq!(train.load(3).unwrap(), Some(vec![20; 4]));

    // Through the loader: the batch holding the bad file is one shorter, for any worker count.
    let train: Arc<dyn super::super::SampleSource> = Arc::new(train);
    let batches = |workers| {
        let options = LoaderOptions {
            workers,
            seed: 5,
            ..LoaderOptions::new(2)
        };
        Loader::new(Arc::clone(&train), Arc::new(Vec::new()), options)
            .unwrap()
            .epoch(0, 0)
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    };
    let reference = batches(0);
    assert_eq!(
        reference.iter().map(|b| b.target.len()).sum::<usize>(),
        4,
        "5 files, 1 skipped"
    );
    assert_eq!(batches(2), reference);

    // A batch of nothing but skipped files is an error, not an empty batch.
    let options = LoaderOptions {
        shuffle: false,
        ..LoaderOptions::new(1)
    };
    let results: Vec<_> = Loader::new(Arc::clone(&train), Arc::new(Vec::new()), options)
        .unwrap()
        .epoch(0, 0)
        .collect();
    assert_eq!(results.len(), 5);
    let msg = results[4].as_ref().unwrap_err().to_string();
    assert!(
        msg.contains("every sample of batch 4 was left out"),
        "{msg}"
    );
}

#[test]
fn loader_reads_the_folder_lazily_and_identically_for_any_worker_count() {
    let dir = two_class_folder("folder-loader");
    let (train, _) = ImageFolder::open_split(&dir.0, &config(3, 3)).unwrap();
    // Deleting a file after opening shows that nothing was decoded up front.
    fs::remove_file(dir.0.join("train/cat/b.png")).unwrap();
    let train: Arc<dyn super::super::SampleSource> = Arc::new(train);
    let run = |workers| {
        let options = LoaderOptions {
            workers,
            seed: 9,
            ..LoaderOptions::new(3)
        };
        Loader::new(Arc::clone(&train), Arc::new(Vec::new()), options)
            .unwrap()
            .epoch(1, 0)
            .collect::<Vec<_>>()
    };
    // The batch that needs the deleted file is an error naming it, and the last batch served.
    let reference = run(0);
    let failed = reference.last().unwrap().as_ref().unwrap_err();
    assert!(failed.to_string().contains("b.png"), "{failed}");
    assert_eq!(format!("{:?}", run(2)), format!("{reference:?}"));

    let intact = two_class_folder("folder-loader-2");
    let (train, _) = ImageFolder::open_split(&intact.0, &config(3, 3)).unwrap();
    let train: Arc<dyn super::super::SampleSource> = Arc::new(train);
    let batches = |workers| {
        let options = LoaderOptions {
            workers,
            seed: 9,
            ..LoaderOptions::new(3)
        };
        Loader::new(Arc::clone(&train), Arc::new(Vec::new()), options)
            .unwrap()
            .epoch(1, 0)
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    };
    let reference = batches(0);
    assert_eq!(reference[0].input_shape(), vec![3, 3, 3, 3]);
    assert_eq!(batches(1), reference);
    assert_eq!(batches(3), reference);
}

fn small_split() -> Split {
    let train = ImageDataset::synthetic(3, 12, 1, 4, 4, 3).unwrap();
    let test = ImageDataset::synthetic(4, 6, 1, 4, 4, 3).unwrap();
    Split { train, test }
}

#[test]
fn export_writes_a_folder_that_reads_back_to_the_same_pixels() {
    let dir = TempDir::new("folder-export");
    let split = small_split();
    let out = dir.0.join("exported");
    let names = ["zz", "aa", "mm"];
    let s = export(&split, Some(&names), &out, None).unwrap();
    assert_eq!((s.train, s.val, s.path.clone()), (12, 6, out.clone()));
    // Nothing else is left beside it.
    assert_eq!(fs::read_dir(&dir.0).unwrap().count(), 1);
    // Sample 3 of the training part (label 0) is train/zz/03.png.
    assert!(out.join("train/zz/03.png").is_file());

    let (train, val) = ImageFolder::open_split(&out, &config(4, 1)).unwrap();
    assert_eq!(train.classes(), ["aa", "mm", "zz"]);
    for (part, dataset, folder) in [("train", &split.train, &train), ("val", &split.test, &val)] {
        assert_eq!(folder.len(), dataset.len(), "{part}");
        for (i, (file, &label)) in folder.files().iter().zip(folder.labels()).enumerate() {
            let index: usize = file.file_stem().unwrap().to_str().unwrap().parse().unwrap();
            let class = names[dataset.labels[index] as usize];
            assert_eq!(
                folder.classes()[label as usize],
                class,
                "{}",
                file.display()
            );
            let pixels = folder.load(i).unwrap().unwrap();
            assert_eq!(
                pixels[..],
                dataset.sample(index).unwrap()[..],
                "{}",
                file.display()
            );
        }
    }

    let msg = export(&split, Some(&names), &out, None)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("already exists and is not empty"), "{msg}");
}

#[test]
fn export_limits_per_class_and_names_classes_by_label() {
    let dir = TempDir::new("folder-export-limit");
    let split = small_split();
    let out = dir.0.join("limited");
    fs::create_dir(&out).unwrap(); // an empty folder is fine
    let s = export(&split, None, &out, Some(2)).unwrap();
    assert_eq!((s.train, s.val), (6, 6));
    let names = class_names(&out).unwrap();
    assert_eq!(names, ["0", "1", "2"]);
    for class in &names {
        let mut files: Vec<String> = fs::read_dir(out.join("train").join(class))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        // The first two samples of each class (labels cycle 0, 1, 2).
        let c: usize = class.parse().unwrap();
        assert_eq!(files, [format!("{c:02}.png"), format!("{:02}.png", c + 3)]);
    }
    assert!(export(&split, None, &dir.0.join("zero"), Some(0)).is_err());
    let msg = export(&split, Some(&["a"]), &dir.0.join("few"), None)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("1 class names given for 3 classes"), "{msg}");
    assert!(!dir.0.join("few").exists() && !dir.0.join("zero").exists());

    // An export that fails half-way (a class folder that cannot be made) leaves nothing behind:
    // neither the folder nor its temporary.
    let broken = dir.0.join("broken");
    let msg = export(&split, Some(&["a", "b\0", "c"]), &broken, None)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("partial"), "{msg}");
    let left: Vec<_> = fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["limited"]);
}
