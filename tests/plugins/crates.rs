//! The workspace's plugin crates as cargo sees them: a crate whose `[lib]` says `test = false`
//! (no unit-test harness is compiled, linked and run for it) has no unit test in `src/` that
//! `cargo test` would silently skip.

use tessera_tests::{repo_root, rust_files};

/// Whether the `[lib]` table of `manifest` (a Cargo.toml's text) sets `test = false`.
fn lib_test_off(manifest: &str) -> bool {
    let table: toml_edit::DocumentMut = manifest.parse().expect("a Cargo.toml parses");
    table
        .get("lib")
        .and_then(|lib| lib.get("test"))
        .and_then(|t| t.as_bool())
        == Some(false)
}

#[test]
fn a_crate_without_a_unit_test_harness_has_no_unit_test() {
    let root = repo_root();
    let mut crates = Vec::new();
    for parent in ["plugins", "tests/fixtures"] {
        for entry in std::fs::read_dir(root.join(parent)).expect("the crates' folder") {
            let dir = entry.expect("a folder entry").path();
            if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
                crates.push(dir);
            }
        }
    }
    let mut off = 0;
    for dir in &crates {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
        if !lib_test_off(&manifest) {
            continue;
        }
        off += 1;
        for file in rust_files(&dir.join("src")) {
            let text = std::fs::read_to_string(&file).expect("a source file");
            assert!(
                !text.contains("#[test]") && !text.contains("#[cfg(test)]"),
                "{} has unit tests, but {} says `test = false` under [lib], so `cargo test` \
                 would skip them: remove that line",
                file.display(),
                dir.join("Cargo.toml").display()
            );
        }
    }
    // The plugins without unit tests (and the test fixtures) skip the harness.
    assert!(off >= 40, "only {off} crates say `test = false`");
}

#[test]
fn lib_test_off_reads_the_lib_table_only() {
    assert!(lib_test_off("[lib]\ntest = false\n"));
    assert!(!lib_test_off("[lib]\ncrate-type = [\"cdylib\"]\n"));
    assert!(!lib_test_off("[[test]]\nname = \"a\"\ntest = false\n"));
    assert!(!lib_test_off("[package]\nname = \"a\"\n"));
}
