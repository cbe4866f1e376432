//! `tessera new-plugin`: the generated crate builds outside the workspace against
//! `tessera-plugin-api`, its own unit tests pass, and the unchanged `tessera` binary loads the
//! built library from a plugins folder and trains with it. Bad names and occupied folders are
//! refused with clear errors.
//!
//! The build shares the workspace's target folder, so libtorch's bindings (torch-sys, tch) are
//! reused, and needs the `LIBTORCH` the workspace was built with: run the suite through
//! `scripts/test.sh`, which exports it.

use std::path::PathBuf;

use tessera_tests::*;

/// The values of metric `name` in run `run`'s metrics file.
fn metric(dir: &TempDir, run: &str, name: &str) -> Vec<f64> {
    let lines = read_jsonl(&run_dir(dir, run).join("metrics.jsonl"));
    lines_of_kind(&lines, "method")
        .iter()
        .filter(|l| l["name"] == name)
        .map(|l| l["value"].as_f64().expect("a numeric metric value"))
        .collect()
}

#[test]
fn a_new_plugin_builds_outside_the_workspace_and_trains() {
    require_fashion_mnist();
    let bin = tessera_bin();
    let sha_before = sha256_hex(&bin);
    let tmp = TempDir::new("new-plugin");
    let krate = tmp.join("my_scale");
    let krate_arg = krate.to_str().expect("a UTF-8 temp path");

    // Create.
    tessera(&["new-plugin", "my_scale", krate_arg], tmp.path(), &[]).assert_success();
    for file in ["Cargo.toml", "build.rs", "src/lib.rs", "README.md"] {
        assert!(krate.join(file).is_file(), "new-plugin wrote no {file}");
    }
    let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        manifest.lines().any(|l| l.trim() == "[workspace]"),
        "{manifest}"
    );
    let readme = std::fs::read_to_string(krate.join("README.md")).expect("README.md");
    for needle in [
        "cargo build --release",
        "libmy_scale.so",
        "plugin = \"my_scale\"",
    ] {
        assert!(readme.contains(needle), "README.md lacks {needle:?}");
    }

    // Its own unit tests (on the test host), then the release build.
    cargo(&krate, &["test", "--release", "--quiet"], &[]);
    let progress = cargo(&krate, &["build", "--release"], &[]).stderr;
    assert!(
        !progress.contains("Compiling torch-sys") && !progress.contains("Compiling tch "),
        "building the new plugin rebuilt libtorch's bindings instead of reusing the workspace's \
         target folder:\n{progress}"
    );

    // Install from the crate folder: `tessera plugins install` builds it (sharing the
    // workspace's target folder, so nothing is rebuilt) against this tessera's libtorch, checks
    // the library and copies it into plugins/ beside the trainer.toml. Then keep the
    // workspace's target/release free of it (other tests list the plugins there).
    let plugins = tmp.join("plugins");
    let workspace_target = workspace_target_dir();
    let installed = run_with_timeout(
        tessera_command(
            &["plugins", "install", krate_arg, "--to", "plugins"],
            tmp.path(),
            &[
                (
                    "CARGO_TARGET_DIR",
                    workspace_target.to_str().expect("UTF-8"),
                ),
                ("LIBTORCH", &libtorch()),
            ],
        ),
        "tessera plugins install <crate folder>",
        CARGO_TIMEOUT,
    );
    installed.assert_success();
    assert!(
        installed
            .stdout
            .starts_with("installed my_scale 0.1.0 plugins/libmy_scale.so"),
        "{}",
        installed.dump()
    );
    remove_built_plugin("my_scale");

    let listed = tessera(&["plugins", "list", "--dir", "plugins"], tmp.path(), &[]);
    listed.assert_success();
    assert!(
        listed.stdout.contains("my_scale 0.1.0"),
        "{}",
        listed.dump()
    );

    // Train with it twice, same seed: the inputs it sees are the same, so its metric (the mean
    // |input| after scaling) must halve with factor 0.5.
    let name = "my_scale/input_abs_mean";
    let mut runs = Vec::new();
    for (run, factor) in [("scale-1", "1.0"), ("scale-half", "0.5")] {
        // No [plugins] dirs: plugins/ beside the trainer.toml is searched without configuration.
        let mut toml = TrainerToml::new(run).algorithm("my_scale", &format!("factor = {factor}"));
        toml.plugin_dirs = Vec::new();
        toml.device = Some("cpu".to_owned());
        toml.write_to(&tmp);
        let out = train(&tmp, &[], &[]);
        out.assert_success();
        assert!(
            out.stderr.contains("loaded plugin my_scale 0.1.0"),
            "{}",
            out.dump()
        );
        let record = read_json(&run_dir(&tmp, run).join("run.json"));
        assert_eq!(record["batches"], 3, "{record:#}");
        let plugin = record["plugins"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "my_scale"))
            .unwrap_or_else(|| panic!("my_scale is not in the run record: {record:#}"));
        let path = PathBuf::from(plugin["path"].as_str().expect("path"));
        assert!(
            path.starts_with(std::fs::canonicalize(&plugins).expect("plugins folder")),
            "{path:?}"
        );
        let values = metric(&tmp, run, name);
        assert_eq!(values.len(), 3, "one {name} per batch in {run}: {values:?}");
        assert!(values.iter().all(|v| *v > 0.0), "{values:?}");
        runs.push(values);
    }
    for (full, half) in runs[0].iter().zip(&runs[1]) {
        assert!(
            (half / full - 0.5).abs() < 1e-4,
            "factor 0.5 did not halve the input: {:?} vs {:?}",
            runs[0],
            runs[1]
        );
    }

    assert_eq!(
        sha256_hex(&bin),
        sha_before,
        "the tessera binary changed while building and loading a new plugin"
    );
}

#[test]
fn new_plugin_refuses_bad_names() {
    let tmp = TempDir::new("new-plugin-names");
    let cases: [(&str, &str); 8] = [
        ("My_Scale", "(use `my_scale`)"),
        ("my-scale", "(use `my_scale`)"),
        ("1scale", "must start with a lowercase letter"),
        ("my__scale", "single underscores"),
        ("scale_", "single underscores"),
        ("fn", "Rust keyword"),
        ("my.scale", "'.' is not allowed"),
        ("", "the name is empty"),
    ];
    for (i, (name, why)) in cases.iter().enumerate() {
        let dest = tmp.join(&format!("case{i}"));
        let out = tessera(
            &["new-plugin", name, dest.to_str().expect("UTF-8")],
            tmp.path(),
            &[],
        );
        out.assert_failure(&[&format!("`{name}` is not a valid plugin name"), why]);
        assert!(!dest.exists(), "{name:?}: {} was created", dest.display());
    }
}

#[test]
fn new_plugin_refuses_a_non_empty_folder_and_defaults_to_the_name() {
    let tmp = TempDir::new("new-plugin-dirs");
    let taken = tmp.write("taken/notes.txt", "mine");
    let out = tessera(
        &[
            "new-plugin",
            "my_scale",
            tmp.join("taken").to_str().expect("UTF-8"),
        ],
        tmp.path(),
        &[],
    );
    out.assert_failure(&["taken", "already exists", "refusing to overwrite"]);
    assert_eq!(std::fs::read_to_string(&taken).expect("notes"), "mine");
    assert!(!tmp.join("taken/Cargo.toml").exists());

    // An existing empty folder is fine; without DIR the crate goes to ./NAME.
    std::fs::create_dir_all(tmp.join("empty")).expect("mkdir");
    tessera(
        &[
            "new-plugin",
            "other",
            tmp.join("empty").to_str().expect("UTF-8"),
        ],
        tmp.path(),
        &[],
    )
    .assert_success();
    assert!(tmp.join("empty/src/lib.rs").is_file());
    tessera(&["new-plugin", "blur_more"], tmp.path(), &[]).assert_success();
    let lib = std::fs::read_to_string(tmp.join("blur_more/src/lib.rs")).expect("lib.rs");
    assert!(
        lib.contains("const NAME: &'static str = \"blur_more\";"),
        "{lib}"
    );
    assert!(lib.contains("export_plugin!(BlurMore);"), "{lib}");
}
