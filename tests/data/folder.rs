//! Image folders through the binary: `tessera data export-folder` writes part of Fashion-MNIST as
//! PNGs, `tessera train` trains on them with `dataset = "folder"`, identically for any worker
//! count and across a resume, the exported files decode back to the dataset's own pixels, and
//! the decoding matches torchvision's.

use std::path::Path;

use serde_json::Value;
use tessera::data::{self, folder};
use tessera_tests::dist::{assert_order_is_rank_independent_and_resumes_exactly, use_mlp};
use tessera_tests::*;

/// The cached Fashion-MNIST's class names, as the export names its class folders.
fn fashion_classes() -> &'static [&'static str] {
    data::registry_class_names("fashion-mnist").expect("Fashion-MNIST's class names")
}

/// `tessera data export-folder fashion-mnist <dir>/<name> --limit <limit>`, checked.
fn export(dir: &TempDir, name: &str, limit: usize) -> std::path::PathBuf {
    require_fashion_mnist();
    let out = dir.join(name);
    let limit = limit.to_string();
    let to = out.to_str().expect("a UTF-8 temp path");
    let args = [
        "data",
        "export-folder",
        "fashion-mnist",
        to,
        "--limit",
        &limit,
    ];
    let result = tessera(&args, dir.path(), &[]);
    result.assert_success();
    assert!(
        result.stderr.contains(&format!(
            "wrote {} training and {} validation images",
            10 * limit.parse::<usize>().unwrap(),
            10 * limit.parse::<usize>().unwrap()
        )),
        "{}",
        result.dump()
    );
    out
}

/// A trainer.toml of [`TrainerToml`] reading the image folder `images` (28×28 grey, like the
/// source) with batches of 16.
fn folder_toml(dir: &TempDir, images: &Path, run_name: &str, extra: &str) -> std::path::PathBuf {
    let text = TrainerToml::new(run_name).render().replacen(
        "dataset = \"fashion-mnist\"\n",
        &format!(
            "dataset = \"folder\"\ndata_dir = {}\n",
            toml_string(&images.display().to_string())
        ),
        1,
    );
    let text = text.replacen("batch_size = 64\n", "batch_size = 16\n", 1);
    assert!(text.contains("dataset = \"folder\"") && text.contains("batch_size = 16\n"));
    dir.write(
        "trainer.toml",
        &format!("{text}\n[data.folder]\nsize = 28\nchannels = 1\n{extra}"),
    )
}

fn train_losses(run: &Path) -> Vec<f64> {
    lines_of_kind(&read_jsonl(&run.join("metrics.jsonl")), "train")
        .iter()
        .map(|l| l["data"]["loss"].as_f64().expect("a loss"))
        .collect()
}

#[test]
fn a_folder_on_two_ranks_trains_as_one_process_and_resumes_exactly() {
    // 8 images per class: 80 training images, 5 global batches of 16 per epoch, so 6 batches
    // cross into the second epoch (its own order) and batch 3 is mid-epoch.
    let dir = TempDir::new("folder-ranks");
    let images = export(&dir, "images", 8);
    folder_toml(
        &dir,
        &images,
        "folder-ranks",
        "\n[checkpoint]\ninterval = \"3ba\"\n",
    );
    use_mlp(&dir);
    assert_order_is_rank_independent_and_resumes_exactly(&dir, 8, &[], 1e-6);
}

#[test]
fn trains_on_an_exported_folder_identically_for_any_worker_count() {
    let dir = TempDir::new("folder-train");
    // 8 images per class: 80 training images, 5 batches of 16 per epoch.
    let images = export(&dir, "images", 8);
    let mut classes: Vec<&str> = fashion_classes().to_vec();
    classes.sort();
    assert_eq!(folder::class_names(&images).unwrap(), classes);
    // Nothing but the finished folder (and nothing partial) beside it.
    let beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside, ["images"]);

    let mut results: Vec<(Value, Vec<f64>)> = Vec::new();
    for workers in [0, 2] {
        let run_name = format!("workers{workers}");
        folder_toml(&dir, &images, &run_name, "");
        // 7 batches: into the second epoch, so the epoch's reshuffle is compared too.
        let workers_set = format!("data.workers={workers}");
        train(&dir, &["train.max_duration=7ba", &workers_set], &[]).assert_success();
        let run = run_dir(&dir, &run_name);
        let record = read_json(&run.join("run.json"));
        assert_eq!(record["status"], "completed", "{record:#}");
        assert_eq!(record["batches"], 7, "{record:#}");
        assert_eq!(record["samples"], 7 * 16, "{record:#}");
        assert_eq!(record["config"]["data"]["dataset"], "folder", "{record:#}");
        let losses = train_losses(&run);
        assert_eq!(losses.len(), 7);
        // The evaluation covers all 80 validation images (8 of each class).
        let evals = lines_of_kind(&read_jsonl(&run.join("metrics.jsonl")), "eval")
            .iter()
            .map(|l| l["data"].clone())
            .collect::<Vec<_>>();
        assert!(!evals.is_empty(), "no evaluation");
        for eval in &evals {
            assert_eq!(eval["samples"], 80, "{eval:#}");
        }
        results.push((record, losses));
    }
    let (w0, w2) = (&results[0], &results[1]);
    assert_eq!(w0.1, w2.1, "training losses differ between 0 and 2 workers");
    assert_eq!(w0.0["final_accuracy"], w2.0["final_accuracy"]);

    // Stopped after 3 batches (a checkpoint at the end) and resumed mid-epoch: the same run.
    folder_toml(&dir, &images, "resumed", "");
    train(&dir, &["train.max_duration=3ba", "data.workers=2"], &[]).assert_success();
    let out = train(
        &dir,
        &[
            "train.max_duration=7ba",
            "data.workers=2",
            "checkpoint.autoresume=true",
        ],
        &[],
    );
    out.assert_success();
    assert!(out.stderr.contains("resumed from"), "{}", out.dump());
    let run = run_dir(&dir, "resumed");
    assert_eq!(train_losses(&run), w0.1, "the resumed run differs");
    let record = read_json(&run.join("run.json"));
    assert_eq!(record["final_accuracy"], w0.0["final_accuracy"]);
}

#[test]
fn the_export_decodes_back_to_the_datasets_pixels() {
    let dir = TempDir::new("folder-roundtrip");
    let images = export(&dir, "images", 3);
    let split = data::load("fashion-mnist", &data_root()).expect("the cached Fashion-MNIST");
    let names = fashion_classes();
    let config = data::FolderConfig {
        channels: 1,
        ..data::FolderConfig::new(28)
    };
    let (train, val) =
        folder::ImageFolder::open_split(&images, &config).expect("the exported folder opens");
    for (part, dataset, folder) in [("train", &split.train, &train), ("val", &split.test, &val)] {
        assert_eq!(folder.len(), 30, "{part}");
        let mut per_class = [0usize; 10];
        for (i, file) in folder.files().iter().enumerate() {
            let index: usize = file
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{} is not <index>.png", file.display()));
            let label = dataset.labels[index] as usize;
            per_class[label] += 1;
            let class = file.parent().and_then(|p| p.file_name()).unwrap();
            assert_eq!(class, names[label], "{}", file.display());
            assert_eq!(
                folder.classes()[folder.labels()[i] as usize],
                names[label],
                "{}",
                file.display()
            );
            let pixels = folder.load(i).unwrap().expect("decoded");
            assert_eq!(
                pixels[..],
                dataset.sample(index).unwrap()[..],
                "{} differs from sample {index} of the {part} part",
                file.display()
            );
        }
        // The first 3 of each class were written.
        assert_eq!(per_class, [3; 10], "{part}");
        // Named by the sample's index, zero-padded to the part's length.
        let first_of_class_0 = dataset.labels.iter().position(|&l| l == 0).unwrap();
        let width = (dataset.len() - 1).to_string().len();
        let file = format!("{first_of_class_0:0width$}.png");
        assert!(
            images.join(part).join(names[0]).join(&file).is_file(),
            "{part}/{}/{file}",
            names[0]
        );
    }
}

#[test]
fn folder_errors_name_the_file_or_folder() {
    let dir = TempDir::new("folder-errors");
    let images = export(&dir, "images", 2);

    // The export refuses to overwrite a finished folder.
    let to = images.to_str().unwrap();
    tessera(
        &["data", "export-folder", "fashion-mnist", to, "--limit", "1"],
        dir.path(),
        &[],
    )
    .assert_failure(&[to, "already exists and is not empty"]);

    // A missing val/ is named before training starts.
    let no_val = dir.join("no-val");
    std::fs::create_dir_all(no_val.join("train/a")).unwrap();
    folder_toml(&dir, &no_val, "no-val", "");
    train(&dir, &[], &[])
        .assert_failure(&[&no_val.join("val").display().to_string(), "no such folder"]);

    // An undecodable file stops the run, naming it...
    let bad = images
        .join("train")
        .join(fashion_classes()[3])
        .join("bad.png");
    std::fs::write(&bad, b"not a PNG").unwrap();
    folder_toml(&dir, &images, "bad-stop", "");
    let max = "train.max_duration=2ep";
    train(&dir, &[max], &[]).assert_failure(&[&bad.display().to_string(), "cannot decode"]);

    // ... or is skipped with a warning naming it: 21 files, one left out.
    folder_toml(&dir, &images, "bad-skip", "on_bad_file = \"skip\"\n");
    let out = train(&dir, &[max, "data.drop_last=false"], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains(&bad.display().to_string())
            && out.stderr.contains("1 undecodable file(s)"),
        "{}",
        out.dump()
    );
    let record = read_json(&run_dir(&dir, "bad-skip").join("run.json"));
    assert_eq!(record["samples"], 2 * 20, "{record:#}");
}

/// Tessera's decoding (channel conversion, `Resize(size)` + `CenterCrop(size)`) against
/// torchvision's own on random images of several shapes (`scripts/folder_resize_reference.py`):
/// the same crop of the same resize, within 1 of 255 per pixel (PIL rounds its bilinear filter in
/// fixed point, the `image` crate in floating point).
#[test]
fn decoding_matches_torchvision_resize_and_centre_crop() {
    if !python_can_import("torchvision", "image-folder decoding") {
        return;
    }
    let dir = TempDir::new("folder-torchvision");
    let out = python(&[
        "scripts/folder_resize_reference.py",
        dir.path().to_str().expect("a UTF-8 temp path"),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut compared = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "raw") {
            continue;
        }
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let [image, channels, size]: [usize; 3] = stem
            .split('-')
            .map(|p| p.parse().unwrap())
            .collect::<Vec<_>>()
            .try_into()
            .unwrap();
        let expected = std::fs::read(&path).unwrap();
        let png = dir.join(&format!("{image}.png"));
        let got = folder::decode(&png, channels, size).unwrap();
        assert_eq!(got.len(), channels * size * size, "{stem}");
        assert_eq!(expected.len(), got.len(), "{stem}");
        let worst = expected
            .iter()
            .zip(&got)
            .map(|(&a, &b)| a.abs_diff(b))
            .max()
            .unwrap();
        assert!(
            worst <= 1,
            "{stem}: differs from torchvision by up to {worst}"
        );
        compared += 1;
    }
    assert_eq!(compared, 12, "6 images, 2 channel counts each");
}

/// `train.eval_subset_batches` scores a fixed, stratified sample of the whole evaluation set,
/// not its first batches: an image folder lists its files class by class, so 2 batches of 10 of
/// the 80 validation images (8 per class) used to hold the first three classes only.
#[test]
fn the_evaluation_subset_of_a_class_sorted_folder_holds_every_class() {
    let dir = TempDir::new("folder-subset");
    let images = export(&dir, "images", 8);
    folder_toml(&dir, &images, "subset", "");
    let sets = [
        "train.max_duration=2ba",
        "train.eval_interval=1ba",
        "train.eval_subset_batches=2",
        "data.eval_batch_size=10",
    ];
    train(&dir, &sets, &[]).assert_success();
    let record = read_json(&run_dir(&dir, "subset").join("run.json"));
    let subset = &record["eval_subset"];
    assert_eq!(subset["of"], 80, "{record:#}");
    assert_eq!(subset["seed"], 0, "{record:#}");
    assert_eq!(subset["stratified"], true, "{record:#}");
    let indices: Vec<u64> = subset["indices"]
        .as_array()
        .expect("the evaluated indices")
        .iter()
        .map(|i| i.as_u64().expect("an index"))
        .collect();
    assert_eq!(indices.len(), 20, "{record:#}");
    // The validation folder lists 8 images of each class in class order: index / 8 is the class.
    let mut per_class = [0usize; 10];
    for &i in &indices {
        per_class[(i / 8) as usize] += 1;
    }
    assert_eq!(per_class, [2; 10], "evaluated indices {indices:?}");
    // Every evaluation (after batch 1 and batch 2) scored those 20 samples.
    let evals = record["evals"].as_array().expect("evaluations");
    assert_eq!(evals.len(), 2, "{record:#}");
    for eval in evals {
        assert_eq!(eval["samples"], 20, "{eval:#}");
    }

    // Another subset seed draws other samples, still 2 of each class; the training is the same.
    let out = train(
        &dir,
        &[
            &sets[..],
            &["run_name=subset-seed", "train.eval_subset_seed=5"],
        ]
        .concat(),
        &[],
    );
    out.assert_success();
    let other = read_json(&run_dir(&dir, "subset-seed").join("run.json"));
    assert_ne!(other["eval_subset"]["indices"], subset["indices"]);
    assert_eq!(other["eval_subset"]["seed"], 5);
    assert_eq!(
        train_losses(&run_dir(&dir, "subset-seed")),
        train_losses(&run_dir(&dir, "subset"))
    );
}
