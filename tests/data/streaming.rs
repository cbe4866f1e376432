//! Sharded datasets against the real packages: MDS shards written by MosaicML Streaming's
//! `MDSWriter` (every column encoding, plain and zstd) and WebDataset shards written by
//! `webdataset` read back by Tessera value for value; `tessera data pack`'s shards read by
//! `StreamingDataset` and `webdataset`; training on MDS and WebDataset shards, identical for any
//! worker count, resumed mid-epoch, and on 2 ranks as on 1 process.
//!
//! The packages come from `scripts/ensure-streaming.sh` (`$TESSERA_STREAMING_PYTHONPATH`, as
//! `scripts/test.sh` sets it, else the torch folders plus `~/.cache/tessera/streaming-0.13.0`).
//! Without them the tests that need them are skipped with a notice, unless
//! `TESSERA_REQUIRE_STREAMING=1` (CI) makes that a failure.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tessera::data::shards::mds;
use tessera::data::{SampleData, SampleSource, ShardFormat, Sharded, ShardsConfig};
use tessera_tests::dist::{assert_order_is_rank_independent_and_resumes_exactly, use_mlp};
use tessera_tests::*;

const SCRIPT: &str = "tests/support/streaming_shards.py";

/// `PYTHONPATH` with torch, Pillow, numpy, transformers and the streaming packages.
fn streaming_pythonpath() -> String {
    if let Some(p) = std::env::var_os("TESSERA_STREAMING_PYTHONPATH").filter(|v| !v.is_empty()) {
        return p.to_string_lossy().into_owned();
    }
    let torch = torch_pythonpath();
    let cache = torch.parent().map(Path::to_owned).unwrap_or_default();
    let mut parts = vec![torch.display().to_string()];
    for name in [
        "torchvision-0.28.0",
        "transformers-5.24.0",
        "streaming-0.13.0",
    ] {
        parts.push(cache.join(name).display().to_string());
    }
    parts.join(":")
}

/// Runs the support script; `None` (with a notice, or a failure under
/// `TESSERA_REQUIRE_STREAMING=1`) when the packages do not import.
fn script(args: &[&str]) -> Option<String> {
    let path = streaming_pythonpath();
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    if let Err(why) = python_imports(&path, "streaming, webdataset") {
        let notice = format!(
            "NOTICE: skipping: `import streaming, webdataset` fails with PYTHONPATH={path} \
             (scripts/ensure-streaming.sh installs them): {why}"
        );
        if std::env::var_os("TESSERA_REQUIRE_STREAMING").is_some_and(|v| v == "1") {
            panic!("{notice} and TESSERA_REQUIRE_STREAMING=1");
        }
        eprintln!("{notice}");
        return None;
    }
    let mut cmd = std::process::Command::new(&python);
    cmd.args(["-W", "ignore", SCRIPT])
        .args(args)
        .current_dir(repo_root())
        .env("PYTHONPATH", &path)
        .env("PYTHONWARNINGS", "ignore");
    let out = run_with_timeout(
        cmd,
        &format!("{SCRIPT} {}", args.join(" ")),
        Duration::from_secs(300),
    );
    assert!(out.status.success(), "{}", out.dump());
    Some(out.stdout)
}

/// Sample `i` of `source` decoded as the loader decodes it (8×8: the centre crop keeps every
/// pixel), with its label.
fn decoded(source: &Sharded, i: usize) -> (Vec<u8>, i64) {
    let (data, label) = source.read(i).unwrap().expect("a sample");
    let SampleData::Encoded { bytes, name, plan } = data else {
        panic!("sharded sources serve encoded images");
    };
    let pixels = tessera::data::decode::decode_image(&bytes, &name, plan, &mut rand_free())
        .unwrap_or_else(|e| panic!("{e}"));
    (pixels, label)
}

/// A generator for the centre-crop plan (which draws nothing).
fn rand_free() -> impl rand::Rng {
    <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(0)
}

fn config(format: ShardFormat, image: &str, label: &str) -> ShardsConfig {
    ShardsConfig {
        image: image.into(),
        label: label.into(),
        ..ShardsConfig::new(format, 8, 10)
    }
}

/// The JSON form of a value Tessera decoded, as the script writes the expected ones.
fn value_json(v: &mds::Value) -> Value {
    match v {
        mds::Value::Bytes(b) => serde_json::json!({ "bytes": hex(b) }),
        mds::Value::Str(s) => Value::from(s.clone()),
        mds::Value::Int(i) => Value::from(*i),
        mds::Value::Float(f) => Value::from(*f),
        mds::Value::Array { dtype, shape, .. } => serde_json::json!({
            "dtype": dtype.name(),
            "shape": shape,
            "values": v.as_f64s(),
        }),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// Numbers compared as f64 (integers the script wrote as ints, arrays as lists).
fn same(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Number(a), Value::Number(b)) => {
            a == b || a.as_f64().zip(b.as_f64()).is_some_and(|(a, b)| a == b)
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same(a, b))
        }
        (Value::Object(a), Value::Object(b)) => a
            .iter()
            .all(|(k, v)| k == "pixels" || b.get(k).is_some_and(|w| same(v, w))),
        _ => expected == actual,
    }
}

#[test]
fn mds_written_by_streaming_reads_back_value_for_value() {
    let dir = TempDir::new("mds-python");
    let out = dir.path().display().to_string();
    if script(&["write-mds", &out]).is_none() {
        return;
    }
    let expected: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("expected.json")).unwrap())
            .unwrap();
    for variant in ["plain", "zstd"] {
        let source = Sharded::open(
            dir.path(),
            variant,
            ShardFormat::Mds,
            &config(ShardFormat::Mds, "png", "y"),
        )
        .unwrap_or_else(|e| panic!("{variant}: {e}"));
        assert_eq!(source.len(), expected.len(), "{variant}");
        assert!(source.shard_sizes().len() > 1, "{variant}: one shard only");
        for (i, want) in expected.iter().enumerate() {
            let values = source
                .mds_values(i)
                .unwrap_or_else(|e| panic!("{variant} {i}: {e}"));
            assert_eq!(
                values.len(),
                want.as_object().unwrap().len(),
                "{variant} {i}"
            );
            for (name, value) in &values {
                let got = value_json(value);
                let want = &want[name.as_str()];
                // `json` columns: the text, parsed on both sides.
                let (got, want) = if name == "j" {
                    let text = got.as_str().unwrap();
                    (
                        serde_json::from_str::<Value>(text).unwrap(),
                        serde_json::from_str::<Value>(want.as_str().unwrap()).unwrap(),
                    )
                } else {
                    (got, want.clone())
                };
                assert!(
                    same(&want, &got),
                    "{variant} sample {i} column {name}: expected {want}, read {got}"
                );
            }
        }
        // Images through the loader's path: PNG, PIL raw and the fixed-shape uint8 ndarray
        // decode to exactly the pixels PIL holds (8×8 RGB, so the resize and crop keep them).
        for column in ["png", "pil", "ndf"] {
            let images = Sharded::open(
                dir.path(),
                variant,
                ShardFormat::Mds,
                &config(ShardFormat::Mds, column, "y"),
            )
            .unwrap();
            assert_eq!(images.shape(), (3, 8, 8));
            for (i, want) in expected.iter().enumerate() {
                let (pixels, label) = decoded(&images, i);
                assert_eq!(label, i as i64 % 10);
                let want: Vec<u8> = if column == "ndf" {
                    // H×W×C values, stored as they are.
                    let v: Vec<u8> = want["ndf"]["values"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap() as u8)
                        .collect();
                    (0..3)
                        .flat_map(|c| (0..64).map(move |p| (c, p)))
                        .map(|(c, p)| v[p * 3 + c])
                        .collect()
                } else {
                    want[column]["pixels"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap() as u8)
                        .collect()
                };
                assert_eq!(&pixels[..], &want[..], "{variant} {column} sample {i}");
            }
        }
        // JPEG: the column's bytes (compared above) are the file streaming stored; it decodes
        // to an 8×8 RGB sample (its pixels are the JPEG decoder's, compared with PIL's by the
        // image pipeline's tests, not here: on 8×8 noise, chroma upsampling alone moves them).
        let jpeg = Sharded::open(
            dir.path(),
            variant,
            ShardFormat::Mds,
            &config(ShardFormat::Mds, "jpeg", "y"),
        )
        .unwrap();
        for i in 0..expected.len() {
            let (pixels, label) = decoded(&jpeg, i);
            assert_eq!((pixels.len(), label), (3 * 8 * 8, i as i64 % 10));
        }
    }
}

#[test]
fn webdataset_written_by_webdataset_reads_back_pixel_for_pixel() {
    let dir = TempDir::new("wds-python");
    if script(&["write-wds", &dir.path().display().to_string()]).is_none() {
        return;
    }
    let expected: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("expected.json")).unwrap())
            .unwrap();
    // The folder of shards and a brace pattern name the same dataset.
    for spec in [".", "shard-{000000..000002}.tar"] {
        let source = Sharded::open(
            dir.path(),
            spec,
            ShardFormat::Wds,
            &config(ShardFormat::Wds, "jpg;png", "cls"),
        )
        .unwrap();
        assert_eq!(source.len(), expected.len(), "{spec}");
        assert_eq!(source.shard_sizes(), [10, 10, 3], "{spec}");
        for (i, want) in expected.iter().enumerate() {
            let (pixels, label) = decoded(&source, i);
            assert_eq!(label, want["label"].as_i64().unwrap(), "{spec} {i}");
            let want: Vec<u8> = want["pixels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u8)
                .collect();
            assert_eq!(&pixels[..], &want[..], "{spec} sample {i}");
        }
    }
    // A missing field names the sample, the field and the shard.
    let err = Sharded::open(
        dir.path(),
        ".",
        ShardFormat::Wds,
        &config(ShardFormat::Wds, "jpg", "cls"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("shard-000000.tar") && err.contains("dir/s0000") && err.contains("`jpg`"),
        "{err}"
    );
}

/// A folder of JPEG images made with Pillow (sizes vary, 3 classes), `n` per class and split.
fn jpeg_folder(dir: &TempDir, n: usize) -> PathBuf {
    let root = dir.path().join("images");
    let code = [
        "import numpy as np, os, sys".to_string(),
        "from PIL import Image".into(),
        "rng = np.random.default_rng(3)".into(),
        "for part in ('train', 'val'):".into(),
        "  for c in ('ant', 'bee', 'cat'):".into(),
        "    d = os.path.join(sys.argv[1], part, c)".into(),
        "    os.makedirs(d)".into(),
        format!("    for k in range({n}):"),
        "      h, w = int(rng.integers(20, 40)), int(rng.integers(20, 40))".into(),
        "      a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)".into(),
        "      Image.fromarray(a).save(os.path.join(d, '%03d.jpg' % k), quality=90)".into(),
    ]
    .join("\n");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let mut cmd = std::process::Command::new(&python);
    cmd.args(["-c", &code, root.to_str().unwrap()])
        .env("PYTHONPATH", streaming_pythonpath());
    run_with_timeout(cmd, "making JPEGs with Pillow", Duration::from_secs(120)).assert_success();
    root
}

fn sha256_bytes(b: &[u8]) -> String {
    use sha2::Digest as _;
    hex(&sha2::Sha256::digest(b))
}

#[test]
fn packed_shards_read_back_in_streaming_and_webdataset() {
    let dir = TempDir::new("pack-python");
    if script(&["check", "-"]).is_none() {
        return;
    }
    let images = jpeg_folder(&dir, 4);
    let folder =
        tessera::data::ImageFolder::open_split(&images, &tessera::data::FolderConfig::new(8))
            .unwrap();
    for (format, extra) in [
        ("mds", vec!["--compression", "zstd"]),
        ("mds", vec![]),
        ("wds", vec![]),
    ] {
        let dst = dir.path().join(format!("{format}{}", extra.len()));
        let mut args = vec![
            "data",
            "pack",
            images.to_str().unwrap(),
            dst.to_str().unwrap(),
            "--format",
            format,
            "--shard-size",
            "2KB",
        ];
        args.extend(&extra);
        let out = tessera(&args, dir.path(), &[]);
        out.assert_success();
        for (part, split) in [("train", &folder.0), ("val", &folder.1)] {
            let read: Vec<Value> = if format == "mds" {
                serde_json::from_str(
                    &script(&["read-mds", dst.join(part).to_str().unwrap()]).unwrap(),
                )
                .unwrap()
            } else {
                let shards: Vec<_> = std::fs::read_dir(dst.join(part))
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .collect();
                assert!(shards.len() > 1, "one shard only");
                let pattern = format!(
                    "{}/shard-{{000000..{:06}}}.tar",
                    dst.join(part).display(),
                    shards.len() - 1
                );
                serde_json::from_str(&script(&["read-wds", &pattern]).unwrap()).unwrap()
            };
            assert_eq!(read.len(), split.len(), "{format} {part}");
            for (i, (file, label)) in split.files().iter().zip(split.labels()).enumerate() {
                assert_eq!(
                    read[i]["label"].as_i64(),
                    Some(*label),
                    "{format} {part} {i}"
                );
                let bytes = std::fs::read(file).unwrap();
                if format == "wds" {
                    assert_eq!(
                        read[i]["image_sha256"].as_str(),
                        Some(sha256_bytes(&bytes).as_str())
                    );
                } else {
                    assert_eq!(read[i]["mode"], "RGB");
                }
            }
        }
    }
    // Fashion-MNIST as raw uint8 arrays: numpy reads the very pixels Tessera holds.
    if !uses_fashion_mnist(&dir) {
        return;
    }
    let dst = dir.path().join("fm");
    pack(
        &dir,
        Path::new("fashion-mnist"),
        &dst,
        &["--format", "mds", "--pixels", "ndarray"],
    );
    let read: Vec<Value> =
        serde_json::from_str(&script(&["read-mds", dst.join("val").to_str().unwrap()]).unwrap())
            .unwrap();
    let split = tessera::data::load("fashion-mnist", &data_root()).unwrap();
    assert_eq!(read.len(), split.test.len());
    for i in [0, 1, 4321, 9999] {
        let want: Vec<Value> = split
            .test
            .sample(i)
            .unwrap()
            .iter()
            .map(|&v| Value::from(v))
            .collect();
        assert_eq!(read[i]["array"].as_array().unwrap(), &want, "sample {i}");
        assert_eq!(read[i]["shape"], serde_json::json!([28, 28]));
        assert_eq!(read[i]["label"].as_i64(), Some(split.test.labels[i]));
    }
}

/// A trainer.toml reading the packed shards `root` (16×16 RGB, 3 classes, batch 4).
fn shards_toml(dir: &TempDir, format: &str, root: &Path, run_name: &str) {
    let text = TrainerToml::new(run_name).render().replacen(
        "dataset = \"fashion-mnist\"\n",
        &format!(
            "dataset = \"{format}\"\ndata_dir = {}\n",
            toml_string(&root.display().to_string())
        ),
        1,
    );
    let text = text.replacen("batch_size = 64\n", "batch_size = 4\n", 1);
    assert!(text.contains("batch_size = 4\n"));
    dir.write(
        "trainer.toml",
        &format!("{text}\n[data.shards]\nsize = 16\nclasses = 3\nshuffle_block = 2\n\n[checkpoint]\ninterval = \"3ba\"\n"),
    );
}

fn train_losses(run: &Path) -> Vec<f64> {
    lines_of_kind(&read_jsonl(&run.join("metrics.jsonl")), "train")
        .iter()
        .map(|l| l["data"]["loss"].as_f64().expect("a loss"))
        .collect()
}

#[test]
fn trains_on_packed_shards_for_any_worker_count_and_resumes_mid_epoch() {
    let dir = TempDir::new("shards-train");
    if script(&["check", "-"]).is_none() {
        return;
    }
    // 10 images per class and split: 30 training samples, 7 batches of 4 per epoch.
    let images = jpeg_folder(&dir, 10);
    for format in ["mds", "wds"] {
        let root = dir.path().join(format!("{format}-shards"));
        pack(
            &dir,
            &images,
            &root,
            &["--format", format, "--shard-size", "5KB"],
        );
        let mut losses = Vec::new();
        for workers in [0, 2] {
            let run_name = format!("{format}-w{workers}");
            shards_toml(&dir, format, &root, &run_name);
            // 9 batches: into the second epoch, with its own shard order.
            let w = format!("data.workers={workers}");
            train(&dir, &["train.max_duration=9ba", &w], &[]).assert_success();
            let run = run_dir(&dir, &run_name);
            let record = read_json(&run.join("run.json"));
            assert_eq!(record["status"], "completed", "{record:#}");
            assert_eq!(record["samples"], 9 * 4, "{record:#}");
            assert_eq!(record["config"]["data"]["dataset"], format, "{record:#}");
            let lines = read_jsonl(&run.join("metrics.jsonl"));
            let evals = lines_of_kind(&lines, "eval");
            assert!(!evals.is_empty());
            for e in &evals {
                assert_eq!(e["data"]["samples"], 30, "{e:#}");
            }
            losses.push(train_losses(&run));
        }
        assert_eq!(losses[0].len(), 9);
        assert_eq!(
            losses[0], losses[1],
            "{format}: 0 and 2 workers train differently"
        );
        // Stopped at batch 5 (mid-epoch) and resumed: the same losses.
        shards_toml(&dir, format, &root, &format!("{format}-resumed"));
        train(&dir, &["train.max_duration=5ba", "data.workers=2"], &[]).assert_success();
        let out = train(
            &dir,
            &[
                "train.max_duration=9ba",
                "data.workers=2",
                "checkpoint.autoresume=true",
            ],
            &[],
        );
        out.assert_success();
        assert!(out.stderr.contains("resumed from"), "{}", out.dump());
        assert_eq!(
            train_losses(&run_dir(&dir, &format!("{format}-resumed"))),
            losses[0],
            "{format}: the resumed run differs"
        );
    }
}

#[test]
fn shards_on_two_ranks_train_as_one_process_and_resume_exactly() {
    if script(&["check", "-"]).is_none() {
        return;
    }
    // One format after the other (two 2-rank runs at once would only compete for the cores).
    for (format, compression) in [("mds", &["--compression", "zstd"][..]), ("wds", &[][..])] {
        let dir = TempDir::new(&format!("shards-dp-{format}"));
        let images = jpeg_folder(&dir, 10);
        let root = dir.path().join("shards");
        let mut args = vec!["--format", format, "--shard-size", "5KB"];
        args.extend_from_slice(compression);
        pack(&dir, &images, &root, &args);
        shards_toml(&dir, format, &root, "dp");
        use_mlp(&dir);
        // 2 ranks of batch 2 (a global batch of 4): 7 batches per epoch; checkpoints every 3.
        assert_order_is_rank_independent_and_resumes_exactly(&dir, 2, &[], 1e-6);
    }
}

#[test]
fn a_gpt_trains_on_text_written_by_mds_writer_and_resumes_mid_epoch_exactly() {
    let data = TempDir::new("text-mds-python-data");
    if script(&["check", "-"]).is_none() {
        return;
    }
    let docs = word_documents(40);
    for (i, doc) in docs.iter().enumerate() {
        let part = if i < 36 { "train" } else { "val" };
        data.write(&format!("src/{part}/doc-{i:02}.txt"), doc);
    }
    script(&["write-text", data.path().to_str().unwrap()]).unwrap();
    let (train_dir, val_dir) = (data.join("mds/train"), data.join("mds/val"));
    // MDSWriter's zstd shards hold the documents in order, one sample each (columns id, text).
    let read = tessera::data::text::own::read_documents(&train_dir, "text").unwrap();
    let texts: Vec<&str> = read.docs.iter().map(|d| d.text.as_str()).collect();
    let want: Vec<&str> = docs[..36].iter().map(String::as_str).collect();
    assert_eq!(texts, want);
    let index: Value = read_json(&train_dir.join("index.json"));
    assert!(
        index["shards"].as_array().unwrap().len() > 1
            && index["shards"][0]["compression"] == "zstd",
        "{index:#}"
    );
    let cache = data.join("cache");
    let config = |run: &str| {
        let mut toml = TrainerToml::gpt(run);
        toml.data = format!(
            "dataset = \"text\"\ndata_dir = '{}'\nbatch_size = 8\neval_batch_size = 16\n\
             workers = 1\n\n[data.text]\nseq_len = 32\nvocab_size = 300\ncache_dir = '{}'\n\
             eval_path = '{}'\n",
            train_dir.display(),
            cache.display(),
            val_dir.display()
        );
        toml.max_duration = "8ba".to_owned();
        toml
    };
    // About 36 × 700 tokens: ~100 batches of 8 × 32 per epoch, so batch 4 is mid-epoch.
    tessera_tests::resume::assert_killed_and_resumed_is_exact("text-mds-python", config);
}
