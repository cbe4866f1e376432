//! A damaged dataset cache stops a run before training with a message naming the file and
//! the fix; the files stay where they were (nothing is deleted behind the user's back).

use std::path::{Path, PathBuf};

use tessera_tests::{data_root, train, TempDir, TrainerToml};

const FILES: [&str; 4] = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
];

/// A private copy of the cached Fashion-MNIST folder in `dir/data/fashion-mnist`, and a
/// trainer.toml reading from it.
fn copy_of_the_cache(dir: &TempDir) -> PathBuf {
    let toml = TrainerToml::new("data").render();
    tessera_tests::require_fashion_mnist();
    let source = data_root().join("fashion-mnist");
    let root = dir.join("data");
    let copy = root.join("fashion-mnist");
    std::fs::create_dir_all(&copy).unwrap();
    for name in FILES.iter().chain(["VERIFIED"].iter()) {
        std::fs::copy(source.join(name), copy.join(name)).unwrap();
    }
    let toml = toml.replacen(
        "fetch = false",
        &format!(
            "fetch = false\ndata_dir = {}",
            tessera_tests::toml_string(&root.display().to_string())
        ),
        1,
    );
    dir.write("trainer.toml", &toml);
    copy
}

fn damaged(label: &str, damage: impl FnOnce(&Path), fragments: &[&str]) {
    let dir = TempDir::new(label);
    let copy = copy_of_the_cache(&dir);
    damage(&copy);
    let before: Vec<String> = std::fs::read_dir(&copy)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let message = train(&dir, &[], &[]).assert_failure(fragments);
    assert!(
        !message.contains("panicked"),
        "a damaged file must not panic: {message}"
    );
    let after: Vec<String> = std::fs::read_dir(&copy)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(before, after, "the cache folder was changed");
}

#[test]
fn a_missing_data_file_is_named() {
    damaged(
        "data-missing",
        |d| std::fs::remove_file(d.join("t10k-labels-idx1-ubyte")).unwrap(),
        &[
            "t10k-labels-idx1-ubyte",
            "No such file",
            "tessera data fetch fashion-mnist",
        ],
    );
}

#[test]
fn an_unreadable_data_file_is_named() {
    // A folder where a file should be: unreadable even for root (who ignores permissions).
    damaged(
        "data-unreadable",
        |d| {
            let f = d.join("train-labels-idx1-ubyte");
            std::fs::remove_file(&f).unwrap();
            std::fs::create_dir(&f).unwrap();
        },
        &["train-labels-idx1-ubyte", "not a regular file"],
    );
}

#[test]
fn a_truncated_data_file_is_named() {
    damaged(
        "data-truncated",
        |d| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("train-images-idx3-ubyte"))
                .unwrap();
            f.set_len(1000).unwrap();
        },
        &[
            "train-images-idx3-ubyte",
            "has 1000 bytes, expected 47040016",
            "truncated or corrupt",
        ],
    );
}

#[test]
fn a_corrupt_header_is_named() {
    // Same size, wrong magic number: passes the size check, fails the IDX reader.
    damaged(
        "data-corrupt",
        |d| {
            let f = d.join("train-labels-idx1-ubyte");
            let mut bytes = std::fs::read(&f).unwrap();
            bytes[3] = 0x03;
            std::fs::write(&f, bytes).unwrap();
        },
        &["train-labels-idx1-ubyte", "magic"],
    );
}

#[test]
fn an_out_of_range_label_is_named() {
    damaged(
        "data-label",
        |d| {
            let f = d.join("t10k-labels-idx1-ubyte");
            let mut bytes = std::fs::read(&f).unwrap();
            bytes[8 + 17] = 200;
            std::fs::write(&f, bytes).unwrap();
        },
        &["t10k-labels-idx1-ubyte", "200"],
    );
}
