//! A damaged dataset cache stops a run before training with a message naming the file and
//! the fix; the files stay where they were (nothing is deleted behind the user's back). A fetch
//! (`tessera data fetch`, or a run with `data.fetch = true`) verifies the files' sha256 and
//! repairs a damaged cache by fetching again; `--force` fetches again even a good one. The
//! repair tests serve the package from a stand-in registry (fake `apt-get` and `dpkg-deb` on
//! `PATH`, made from the good cache), so they need no network.

use std::path::{Path, PathBuf};

use tessera_tests::{data_root, sha256_hex, tessera, tool, train, TempDir, TrainerToml};

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

/// Overwrites byte `at` of `file` in `dir` with `value` (same size, other bytes).
fn change_byte(dir: &Path, file: &str, at: usize, value: u8) {
    let f = dir.join(file);
    let mut bytes = std::fs::read(&f).unwrap();
    assert_ne!(bytes[at], value, "the damage must change the byte");
    bytes[at] = value;
    std::fs::write(&f, bytes).unwrap();
}

/// What a run on a cache damaged in place says: the file, that it is damaged, and the fetch.
const DAMAGED: [&str; 2] = ["is damaged", "tessera data fetch fashion-mnist"];

#[test]
fn a_corrupt_header_is_named() {
    // Same size, wrong magic number.
    damaged(
        "data-corrupt",
        |d| change_byte(d, "train-labels-idx1-ubyte", 3, 0x03),
        &["train-labels-idx1-ubyte", DAMAGED[0], DAMAGED[1]],
    );
}

#[test]
fn an_out_of_range_label_is_named() {
    damaged(
        "data-label",
        |d| change_byte(d, "t10k-labels-idx1-ubyte", 8 + 17, 200),
        &["t10k-labels-idx1-ubyte", DAMAGED[0], DAMAGED[1]],
    );
}

#[test]
fn a_changed_pixel_is_found_by_its_checksum() {
    // A valid IDX file with one other pixel value: only the sha256 can tell.
    damaged(
        "data-pixel",
        |d| change_byte(d, "train-images-idx3-ubyte", 16 + 28 * 14 + 14, 0x5a),
        &["train-images-idx3-ubyte", DAMAGED[0], DAMAGED[1]],
    );
}

/// A stand-in package registry in `dir`: `bin/apt-get` and `bin/dpkg-deb` that "download" and
/// "unpack" the good cached Fashion-MNIST files (gzipped, as the Debian package holds them),
/// logging each `apt-get` call to `apt-get.log`. Returns the `PATH` to run `tessera` with.
fn stand_in_registry(dir: &TempDir) -> String {
    let source = data_root().join("fashion-mnist");
    let package = dir.join("package");
    std::fs::create_dir_all(&package).unwrap();
    for name in FILES {
        // Compressed in place: `package/<name>` becomes `package/<name>.gz`.
        let copy = package.join(name);
        std::fs::copy(source.join(name), &copy).unwrap();
        tool("gzip", &["-1", copy.to_str().expect("a UTF-8 temp path")]);
    }
    let log = dir.join("apt-get.log");
    dir.write(
        "bin/apt-get",
        &format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\n[ \"$1\" = download ] && : > dataset-fashion-mnist_0_all.deb\n",
            log.display()
        ),
    );
    dir.write(
        "bin/dpkg-deb",
        &format!(
            "#!/bin/sh\n# dpkg-deb -x DEB DIR\nmkdir -p \"$3/usr/share/datasets/fashion-mnist\" && cp '{}'/*.gz \"$3/usr/share/datasets/fashion-mnist/\"\n",
            package.display()
        ),
    );
    for tool in ["apt-get", "dpkg-deb"] {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(&format!("bin/{tool}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    format!(
        "{}:{}",
        dir.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// How many times the stand-in `apt-get download` ran.
fn downloads(dir: &TempDir) -> usize {
    std::fs::read_to_string(dir.join("apt-get.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("download "))
        .count()
}

/// Every cached file in `copy` has the good cache's bytes.
fn assert_repaired(copy: &Path) {
    let good = data_root().join("fashion-mnist");
    for name in FILES {
        assert_eq!(
            sha256_hex(&copy.join(name)),
            sha256_hex(&good.join(name)),
            "{name} was not repaired"
        );
    }
}

#[test]
fn data_fetch_repairs_a_damaged_cache_and_force_fetches_again() {
    let dir = TempDir::new("data-repair");
    let copy = copy_of_the_cache(&dir);
    let path = stand_in_registry(&dir);
    let root = dir.join("data");
    let root = root.to_str().expect("a UTF-8 temp path");
    let fetch = |extra: &[&str]| {
        let mut args = vec!["data", "fetch", "fashion-mnist", "--dir", root];
        args.extend_from_slice(extra);
        let out = tessera(&args, dir.path(), &[("PATH", &path)]);
        out.assert_success();
        out
    };

    // A good cache verifies without a download.
    let out = fetch(&[]);
    assert!(out.stderr.contains("verified"), "{}", out.dump());
    assert_eq!(downloads(&dir), 0, "{}", out.dump());

    // Damaged in place: named, fetched again, repaired.
    change_byte(&copy, "t10k-images-idx3-ubyte", 16 + 300, 0x11);
    let out = fetch(&[]);
    assert!(
        out.stderr.contains("t10k-images-idx3-ubyte is damaged")
            && out.stderr.contains("fetching it again"),
        "{}",
        out.dump()
    );
    assert_eq!(downloads(&dir), 1, "{}", out.dump());
    assert_repaired(&copy);
    let out = fetch(&[]);
    assert!(!out.stderr.contains("damaged"), "{}", out.dump());
    assert_eq!(downloads(&dir), 1, "a repaired cache verifies");

    // --force fetches a good cache again.
    let out = fetch(&["--force"]);
    assert_eq!(downloads(&dir), 2, "{}", out.dump());
    assert_repaired(&copy);
}

#[test]
fn a_run_with_data_fetch_repairs_a_damaged_cache() {
    let dir = TempDir::new("data-repair-run");
    let copy = copy_of_the_cache(&dir);
    let path = stand_in_registry(&dir);
    let toml = std::fs::read_to_string(dir.join("trainer.toml")).unwrap();
    dir.write(
        "trainer.toml",
        &toml.replacen("fetch = false", "fetch = true", 1),
    );
    change_byte(&copy, "train-labels-idx1-ubyte", 8 + 5, 9);
    let out = train(&dir, &[], &[("PATH", &path)]);
    out.assert_success();
    assert!(
        out.stderr.contains("train-labels-idx1-ubyte is damaged"),
        "{}",
        out.dump()
    );
    assert_eq!(downloads(&dir), 1, "{}", out.dump());
    assert_repaired(&copy);
}
