//! A plugin that panics, fails, or hands back a bad tensor while training: the run stops with a
//! message naming the plugin, the event and the cause (exit code 1, no crash), or, with
//! `on_error = "disable"`, drops the method and finishes. Plus the remaining load-time refusals:
//! another interface's layout, and a plugin listed twice.

use tessera_tests::*;

fn fake_with(label: &str, on_error: Option<&str>) -> TempDir {
    let dir = TempDir::new(label);
    let settings = match on_error {
        Some(policy) => format!("on_error = \"{policy}\""),
        None => String::new(),
    };
    TrainerToml::new(label)
        .algorithm("fake_plugin", &settings)
        .write_to(&dir);
    dir
}

#[test]
fn a_panic_in_a_plugin_stops_the_run_cleanly() {
    let dir = fake_with("panic", None);
    let out = train(&dir, &[], &[("TESSERA_FAKE_PANIC_AT", "after_forward")]);
    let line = out.assert_failure(&[
        "method `fake_plugin` failed at event `after_forward`",
        "panic",
        "fake_plugin was told to panic at after_forward (at tests/fixtures/fake_plugin/src/lib.rs:",
    ]);
    assert!(!line.contains("Aborting"), "{}", out.dump());
    assert!(
        !run_dir(&dir, "panic").join("run.json").exists(),
        "{}",
        out.dump()
    );
}

#[test]
fn an_error_from_a_plugin_stops_the_run() {
    let dir = fake_with("error", None);
    let out = train(&dir, &[], &[("TESSERA_FAKE_ERROR_AT", "batch_start")]);
    out.assert_failure(&[
        "method `fake_plugin` failed at event `batch_start`",
        "fake_plugin was told to fail at batch_start",
    ]);
}

#[test]
fn on_error_disable_drops_the_method_and_finishes() {
    let dir = fake_with("disable", Some("disable"));
    let out = train(&dir, &[], &[("TESSERA_FAKE_PANIC_AT", "before_loss")]);
    out.assert_success();
    assert!(
        out.stderr
            .contains("method `fake_plugin` failed at event `before_loss`")
            && out.stderr.contains("disabled for the rest of the run"),
        "{}",
        out.dump()
    );
    let record = read_json(&run_dir(&dir, "disable").join("run.json"));
    assert_eq!(record["batches"], 3, "{record:#}");
    // Disabled at the first before_loss: it never reached a batch_end.
    let lines = read_jsonl(&run_dir(&dir, "disable").join("metrics.jsonl"));
    assert!(lines_of_kind(&lines, "method").is_empty(), "{lines:?}");
}

#[test]
fn a_tensor_of_the_wrong_batch_size_is_refused_with_a_clear_error() {
    let dir = fake_with("bad-shape", None);
    let out = train(&dir, &[], &[("TESSERA_FAKE_BAD_INPUT", "shape")]);
    out.assert_failure(&[
        "method `fake_plugin` failed at event `after_dataloader`",
        "`input` must keep the batch size 64, got shape [1, 1, 28, 28]",
    ]);
}

#[test]
fn a_library_for_another_interface_is_a_layout_mismatch() {
    let dir = TempDir::new("alien");
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins/");
    std::fs::copy(
        plugin_path("alien_plugin"),
        plugins.join("libalien_plugin.so"),
    )
    .expect("copy");
    let mut toml = TrainerToml::new("alien").algorithm("alien_plugin", "");
    toml.plugin_dirs = vec![plugins.clone()];
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    let shown = std::fs::canonicalize(plugins.join("libalien_plugin.so")).expect("canonical");
    out.assert_failure(&[
        &shown.display().to_string(),
        "its plugin interface layout does not match this tessera's",
    ]);
}

#[test]
fn a_plugin_listed_twice_is_refused() {
    let dir = TempDir::new("twice");
    TrainerToml::new("twice")
        .algorithm("cutout", "")
        .algorithm("cutout", "length = 0.25")
        .write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_failure(&["plugin `cutout` is listed twice"]);
}

#[test]
fn plugins_are_never_loaded_from_the_working_directory() {
    let dir = TempDir::new("cwd");
    // A plugin file sits in the folder tessera runs in, and in no folder searched: not found,
    // and the folders searched do not include the working directory.
    std::fs::copy(plugin_path("cutout"), dir.join("libcwd_only.so")).expect("copy");
    let mut toml = TrainerToml::new("cwd").algorithm("cwd_only", "");
    toml.plugin_dirs = Vec::new();
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    let line = out.assert_failure(&["plugin `cwd_only` not found"]);
    let cwd = std::fs::canonicalize(dir.path()).expect("the folder");
    assert!(
        !line.contains(&format!("{} (", cwd.display())),
        "the working directory was searched: {line}"
    );
    // A plugin of the same name as one in a folder searched (the build folder) is taken from
    // that folder, never from the working directory.
    std::fs::copy(plugin_path("cutout"), dir.join("libcutout.so")).expect("copy");
    let mut toml = TrainerToml::new("cwd").algorithm("cutout", "");
    toml.plugin_dirs = Vec::new();
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let record = read_json(&run_dir(&dir, "cwd").join("run.json"));
    let loaded = record["plugins"][0]["path"]
        .as_str()
        .expect("a plugin path");
    assert!(
        !loaded.starts_with(&cwd.display().to_string()),
        "loaded from the working directory: {loaded}"
    );
}
