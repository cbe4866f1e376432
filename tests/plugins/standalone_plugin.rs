//! A plugin crate needs nothing of this repository but `tessera-plugin-api`: its folder, copied
//! out of the repository, with the keys its `Cargo.toml` inherits from the workspace made
//! concrete and `tessera-plugin-api` depended on by path, builds and passes its own tests (unit,
//! golden and doc tests), reading the golden files from `TESSERA_GOLDEN_DIR`.
//!
//! The build shares the workspace's target folder (as `tests/plugins/new_plugin.rs` does), so
//! libtorch's bindings are reused; it needs the `LIBTORCH` the workspace was built with.

use std::path::{Path, PathBuf};

use tessera_plugin_api::testing::golden::golden_dir;
use tessera_tests::*;
use toml_edit::{DocumentMut, InlineTable, Item, Value};

/// The plugin copied out; its golden case has the same name.
const PLUGIN: &str = "label_smoothing";

/// Undoes, when dropped, what building the copied crate in the shared target folder left there.
/// Cargo resolves the copied crate's features on its own, so it builds its own variants of some
/// crates (`tch` among them: seconds; `torch-sys`, the slow one, is shared) under new hashed
/// names, which are deleted (those that were there before it ran stay: the `plugins` binary,
/// which runs first, leaves the same variants of `tch` and `abi_stable`); and a cdylib's files
/// carry no hash, so the copy overwrote the workspace's `liblabel_smoothing.{rlib,so}`, which
/// are put back.
struct SharedTargetGuard {
    folders: Vec<(PathBuf, std::collections::HashSet<std::ffi::OsString>)>,
    saved: Vec<(PathBuf, Vec<u8>)>,
}

impl SharedTargetGuard {
    fn new() -> Self {
        let release = target_dir();
        let mut folders = Vec::new();
        let mut saved = Vec::new();
        for folder in [release.join("deps"), release] {
            let mut names = std::collections::HashSet::new();
            for e in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with(&format!("lib{PLUGIN}.")) {
                    if let Ok(bytes) = std::fs::read(e.path()) {
                        saved.push((e.path(), bytes));
                    }
                }
                names.insert(name);
            }
            folders.push((folder, names));
        }
        SharedTargetGuard { folders, saved }
    }
}

impl Drop for SharedTargetGuard {
    fn drop(&mut self) {
        for (folder, before) in &self.folders {
            for e in std::fs::read_dir(folder).into_iter().flatten().flatten() {
                if !before.contains(&e.file_name()) && e.path().is_file() {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        for (path, bytes) in &self.saved {
            let _ = std::fs::write(path, bytes);
        }
    }
}

fn repository() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Copies the folder `from` to `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("cannot create {}: {e}", to.display()));
    let entries =
        std::fs::read_dir(from).unwrap_or_else(|e| panic!("cannot list {}: {e}", from.display()));
    for entry in entries {
        let path = entry.expect("a folder entry").path();
        let dest = to.join(path.file_name().expect("a file name"));
        if path.is_dir() {
            copy_dir(&path, &dest);
        } else {
            std::fs::copy(&path, &dest)
                .unwrap_or_else(|e| panic!("cannot copy {}: {e}", path.display()));
        }
    }
}

/// Whether a manifest entry is `key.workspace = true` / `{ workspace = true, ... }`.
fn inherits(item: &Item) -> bool {
    item.as_table_like()
        .and_then(|t| t.get("workspace"))
        .and_then(Item::as_bool)
        == Some(true)
}

/// The plugin's manifest made standalone: inherited package keys take the workspace's values,
/// inherited dependencies the workspace's (relative paths made absolute, keys given next to
/// `workspace = true` kept), the workspace's profiles are copied (without their overrides for
/// the workspace's own packages, `[profile.*.package.*]`, which name no package of the copy),
/// and an empty `[workspace]` table makes the crate its own workspace.
fn standalone_manifest(plugin: &str, workspace: &str, root: &Path) -> String {
    let ws: DocumentMut = workspace.parse().expect("the workspace Cargo.toml parses");
    let mut doc: DocumentMut = plugin.parse().expect("the plugin's Cargo.toml parses");
    let package_keys = ws["workspace"]["package"]
        .as_table()
        .expect("[workspace.package]");
    let package = doc["package"].as_table_mut().expect("[package]");
    for (key, item) in package.iter_mut() {
        if inherits(item) {
            *item = package_keys
                .get(key.get())
                .unwrap_or_else(|| panic!("workspace.package has no `{}`", key.get()))
                .clone();
        }
    }
    let workspace_deps = ws["workspace"]["dependencies"]
        .as_table()
        .expect("[workspace.dependencies]");
    for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
        let Some(deps) = doc.get_mut(section).and_then(Item::as_table_like_mut) else {
            continue;
        };
        for (name, item) in deps.iter_mut() {
            if !inherits(item) {
                continue;
            }
            let mut dep = match workspace_deps.get(name.get()) {
                Some(Item::Value(Value::String(version))) => {
                    let mut t = InlineTable::new();
                    t.insert("version", Value::from(version.value().as_str()));
                    t
                }
                Some(Item::Value(Value::InlineTable(t))) => t.clone(),
                other => panic!("workspace dependency `{}`: {other:?}", name.get()),
            };
            if let Some(path) = dep.get("path").and_then(Value::as_str) {
                let absolute = root.join(path).to_string_lossy().into_owned();
                dep.insert("path", Value::from(absolute));
            }
            let own = item
                .as_table_like()
                .expect("an inheriting entry is a table");
            for (key, value) in own.iter().filter(|(k, _)| *k != "workspace") {
                let value = value.as_value().expect("a plain value").clone();
                dep.insert(key, value);
            }
            *item = Item::Value(Value::InlineTable(dep));
        }
    }
    doc["workspace"] = toml_edit::table();
    if let Some(profile) = ws.get("profile") {
        let mut profile = profile.clone();
        if let Some(profiles) = profile.as_table_like_mut() {
            for (_, settings) in profiles.iter_mut() {
                if let Some(settings) = settings.as_table_like_mut() {
                    settings.remove("package");
                }
            }
        }
        doc["profile"] = profile;
    }
    doc.to_string()
}

/// The `passed` counts of every `test result:` line.
fn passed(stdout: &str) -> Vec<usize> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test result: ok. "))
        .map(|l| {
            l.split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("unreadable test result line: {l}"))
        })
        .collect()
}

#[test]
fn a_plugin_folder_copied_out_of_the_repository_builds_and_passes_its_tests() {
    let root = repository();
    let _restore = SharedTargetGuard::new();
    let tmp = TempDir::new("standalone-plugin");
    let krate = tmp.join(PLUGIN);
    copy_dir(&root.join("plugins").join(PLUGIN), &krate);
    let manifest = standalone_manifest(
        &read(&krate.join("Cargo.toml")),
        &read(&root.join("Cargo.toml")),
        &std::fs::canonicalize(&root).expect("the repository folder"),
    );
    assert!(
        !manifest.contains("workspace = true") && !manifest.contains("workspace=true"),
        "{manifest}"
    );
    assert!(!manifest.contains("tessera-tests"), "{manifest}");
    std::fs::write(krate.join("Cargo.toml"), &manifest).expect("write Cargo.toml");
    // The workspace's lock file, so that every dependency resolves to the version already built.
    std::fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).expect("copy Cargo.lock");

    // The case's golden files, alone in a folder of their own.
    let goldens = tmp.join("golden");
    std::fs::create_dir_all(&goldens).expect("create the golden folder");
    for ext in ["json", "safetensors"] {
        let name = format!("{PLUGIN}.{ext}");
        std::fs::copy(golden_dir(PLUGIN).join(&name), goldens.join(&name))
            .unwrap_or_else(|e| panic!("cannot copy {name}: {e}"));
    }
    let goldens_arg = goldens.to_str().expect("a UTF-8 temp path");

    let out = cargo(
        &krate,
        &["test", "--release"],
        &[("TESSERA_GOLDEN_DIR", goldens_arg)],
    );
    assert!(
        !out.stderr.contains("Compiling torch-sys"),
        "the standalone plugin rebuilt libtorch's C++ bindings:\n{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("Compiling tessera-tests"),
        "{}",
        out.stderr
    );
    // Its two harnesses ran and passed: the golden tests and the README's example as a doc test
    // (its `[lib]` has no unit tests and says `test = false`, so it has no unit-test harness).
    let counts = passed(&out.stdout);
    assert!(
        counts.len() == 2 && counts[0] > 0 && counts[1] > 0,
        "{counts:?}\n{}",
        out.stdout
    );
    assert!(out.stdout.contains("src/lib.rs - (line "), "{}", out.stdout);

    // The goldens really come from TESSERA_GOLDEN_DIR: without the files there the tests fail,
    // naming that folder.
    for ext in ["json", "safetensors"] {
        std::fs::remove_file(goldens.join(format!("{PLUGIN}.{ext}"))).expect("remove a golden");
    }
    let failed = run_with_timeout(
        cargo_command(
            &krate,
            &["test", "--release", "--test", "golden"],
            &[("TESSERA_GOLDEN_DIR", goldens_arg)],
        ),
        "cargo test --release --test golden",
        CARGO_TIMEOUT,
    );
    let stdout = &failed.stdout;
    assert!(!failed.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "golden file {goldens_arg}/{PLUGIN}.json is missing"
        )),
        "{stdout}"
    );
}
