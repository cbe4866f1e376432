//! A plugin built against an older minor version of `tessera-plugin-api` (kept as a binary
//! fixture in `fixtures/plugin-api-1.0.0/`) loads and runs in the current host, next to
//! plugins built against the current interface, whichever is loaded first.

use std::path::PathBuf;

use tessera_tests::*;

fn old_plugins() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/plugin-api-1.0.0"
    ))
}

#[test]
fn the_fixture_really_is_built_against_1_0_0() {
    let dir = TempDir::new("compat-inspect");
    let file = old_plugins().join("liblabel_smoothing.so");
    let out = tessera(
        &["plugins", "inspect", &file.to_string_lossy()],
        dir.path(),
        &[],
    );
    out.assert_success();
    assert!(out.stdout.contains("plugin-api: 1.0.0"), "{}", out.dump());
}

fn train_with(order: &[&str], tag: &str) {
    let dir = TempDir::new(tag);
    let mut toml = TrainerToml::new(tag);
    toml.plugin_dirs = vec![old_plugins(), target_dir()];
    for plugin in order {
        toml = match *plugin {
            "label_smoothing" => toml.algorithm("label_smoothing", "smoothing = 0.1"),
            other => toml.algorithm(other, "length = 0.25"),
        };
    }
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    let record = read_json(&run_dir(&dir, tag).join("run.json"));
    let plugins = record["plugins"].as_array().expect("plugins");
    let smoothing = plugins
        .iter()
        .find(|p| p["name"] == "label_smoothing")
        .expect("label_smoothing in the run record");
    let path = PathBuf::from(smoothing["path"].as_str().expect("path"));
    assert!(
        path.starts_with(std::fs::canonicalize(old_plugins()).expect("fixture dir")),
        "{path:?}"
    );
    assert_eq!(record["batches"], 3);
}

#[test]
fn an_older_plugin_runs_beside_a_current_one_loaded_after_it() {
    train_with(&["label_smoothing", "cutout"], "compat-old-first");
}

#[test]
fn an_older_plugin_runs_beside_a_current_one_loaded_before_it() {
    train_with(&["cutout", "label_smoothing"], "compat-new-first");
}
