//! `tessera train` refuses plugins that are missing, are not plugins, were tampered with, were
//! built against another interface or libtorch, or reject their settings — each with exit code
//! 1 and a message naming the file or the plugin, before any training.

use std::path::{Path, PathBuf};

use tessera_tests::*;

/// A temp folder with a `plugins/` sub-folder, searched before the target folder.
fn setup(label: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(label);
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).expect("create plugins/");
    (dir, plugins)
}

/// Runs a config whose last algorithm is `plugin` (with `settings`), its folders being
/// `plugins` then the target folder; checks it is refused with `fragments` in the error line,
/// which also names the `[[algorithms]]` line. Returns the error line.
fn refused(
    dir: &TempDir,
    plugins: &Path,
    plugin: &str,
    settings: &str,
    env: &[(&str, &str)],
    fragments: &[&str],
) -> String {
    let mut toml = TrainerToml::new("refused").algorithm("label_smoothing", "");
    toml.plugin_dirs = vec![plugins.to_owned(), target_dir()];
    let toml = toml.algorithm(plugin, settings);
    let text = toml.render();
    let n = 1 + text
        .lines()
        .enumerate()
        .filter(|(_, l)| *l == "[[algorithms]]")
        .map(|(i, _)| i)
        .last()
        .expect("an [[algorithms]] header");
    toml.write_to(dir);
    let out = train(dir, &[], env);
    let line = out.assert_failure(fragments);
    assert!(
        line.contains(&format!("[[algorithms]] at line {n}: ")),
        "the error does not name line {n}:\n{}",
        out.dump()
    );
    assert!(
        !out.stderr.contains("eval at"),
        "it trained anyway:\n{}",
        out.dump()
    );
    line
}

fn shown(path: &Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .display()
        .to_string()
}

#[test]
fn a_missing_plugin_names_the_files_and_folders_searched() {
    let (dir, plugins) = setup("missing");
    let target = target_dir();
    refused(
        &dir,
        &plugins,
        "no_such_plugin",
        "",
        &[],
        &[
            "plugin `no_such_plugin` not found; looked for libno_such_plugin.so or no_such_plugin.so in: ",
            &format!(
                "{} (configured), {} (configured), ",
                plugins.display(),
                target.display()
            ),
            &format!("{} (user folder)", no_user_data().join("tessera/plugins").display()),
            "; `tessera plugins list` shows the plugins found",
        ],
    );
}

#[test]
fn a_misspelled_plugin_gets_close_names() {
    let (dir, plugins) = setup("misspelled");
    refused(
        &dir,
        &plugins,
        "label_smothing",
        "",
        &[],
        &[
            "plugin `label_smothing` not found; ",
            "; did you mean `label_smoothing`?",
        ],
    );
}

/// The first bytes of a real plugin, cut inside its first segment: once made `tessera plugins
/// inspect` die of SIGBUS (dlopen mapped pages past the end of the file).
#[test]
fn a_truncated_plugin_is_refused_before_it_is_mapped() {
    let (dir, plugins) = setup("truncated");
    let bytes = std::fs::read(plugin_path("label_smoothing")).expect("read the plugin");
    let file = plugins.join("libtruncated.so");
    std::fs::write(&file, &bytes[..3000]).expect("write");
    refused(
        &dir,
        &plugins,
        "truncated",
        "",
        &[],
        &[&format!(
            "{}: not a loadable shared library: truncated or damaged: a loadable segment spans bytes ",
            shown(&file)
        )],
    );
    let out = tessera(
        &["plugins", "inspect", file.to_str().expect("UTF-8")],
        dir.path(),
        &[],
    );
    out.assert_failure(&["truncated or damaged"]);
}

#[test]
fn a_plugin_for_another_architecture_is_refused() {
    let (dir, plugins) = setup("foreign-arch");
    let mut bytes = std::fs::read(plugin_path("label_smoothing")).expect("read the plugin");
    // e_machine (offset 18, little-endian here): AArch64 (183) on x86-64, else x86-64 (62).
    let (other, name) = if cfg!(target_arch = "aarch64") {
        (62u16, "x86-64")
    } else {
        (183u16, "AArch64")
    };
    bytes[18..20].copy_from_slice(&other.to_le_bytes());
    let file = plugins.join("libforeign_arch.so");
    std::fs::write(&file, &bytes).expect("write");
    refused(
        &dir,
        &plugins,
        "foreign_arch",
        "",
        &[],
        &[&format!(
            "{}: not a loadable shared library: built for {name}, but this machine is ",
            shown(&file)
        )],
    );
}

/// libtorch's own `libc10.so` is a real shared library whose initialisers register kernels:
/// opening it a second time once ended the process with `Key already registered`. It is refused
/// from its bytes (no Tessera root module), so none of its code runs.
#[test]
fn inspecting_a_libtorch_library_runs_none_of_its_code() {
    let dir = TempDir::new("inspect-libc10");
    let libc10 = Path::new(&libtorch()).join("lib").join("libc10.so");
    let out = tessera(
        &["plugins", "inspect", libc10.to_str().expect("UTF-8")],
        dir.path(),
        &[],
    );
    out.assert_failure(&["not a Tessera plugin (it exports no Tessera plugin module)"]);
    assert!(!out.stderr.contains("already registered"), "{}", out.dump());
}

#[test]
fn a_text_file_or_garbage_is_not_a_shared_library() {
    // Garbage that starts like an ELF file: a fixed pseudo-random tail (xorshift), so the test
    // is the same every run.
    let mut garbage = b"\x7fELF\x02\x01\x01".to_vec();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        garbage.push(x as u8);
    }
    for (label, bytes) in [
        ("text", b"this is not an ELF file\n".to_vec()),
        ("garbage", garbage),
    ] {
        let (dir, plugins) = setup(label);
        let file = plugins.join("libnotaplugin.so");
        std::fs::write(&file, &bytes).expect("write");
        refused(
            &dir,
            &plugins,
            "notaplugin",
            "",
            &[],
            &[&format!(
                "{}: not a loadable shared library: ",
                shown(&file)
            )],
        );
    }
}

#[test]
fn a_foreign_shared_library_is_not_a_tessera_plugin() {
    let (dir, plugins) = setup("foreign");
    let file = plugins.join("libnotaplugin.so");
    copy_foreign_shared_library(&file);
    refused(
        &dir,
        &plugins,
        "notaplugin",
        "",
        &[],
        &[&format!(
            "{}: not a Tessera plugin (it exports no Tessera plugin module)",
            shown(&file)
        )],
    );
}

#[test]
fn a_wrong_pinned_sha256_is_refused() {
    let (dir, plugins) = setup("sha");
    let so = plugin_path("cutout");
    let wrong = "0".repeat(64);
    refused(
        &dir,
        &plugins,
        "cutout",
        &format!("sha256 = \"{wrong}\""),
        &[],
        &[&format!(
            "{}: sha256 is {}, but trainer.toml pins {wrong}; refusing to load it",
            shown(&so),
            sha256_hex(&so)
        )],
    );
}

#[test]
fn a_file_named_for_another_plugin_is_refused() {
    let (dir, plugins) = setup("renamed");
    let file = plugins.join("libimpostor.so");
    std::fs::copy(plugin_path("cutout"), &file).expect("copy");
    refused(
        &dir,
        &plugins,
        "impostor",
        "",
        &[],
        &[&format!(
            "{}: the file is named for `impostor` but the plugin calls itself `cutout`",
            shown(&file)
        )],
    );
}

#[test]
fn a_plugin_for_another_plugin_api_is_refused() {
    let (dir, plugins) = setup("api");
    let so = plugin_path("fake_plugin");
    refused(
        &dir,
        &plugins,
        "fake_plugin",
        "",
        &[("TESSERA_FAKE_API_VERSION", "2.0.0")],
        &[&format!(
            "{}: built against tessera-plugin-api 2.0.0, but this tessera needs a 1.x plugin; \
             rebuild the plugin against tessera-plugin-api {}",
            shown(&so),
            tessera_plugin_api::API_VERSION
        )],
    );
}

#[test]
fn a_plugin_for_another_libtorch_is_refused() {
    let (dir, plugins) = setup("libtorch");
    let so = plugin_path("fake_plugin");
    refused(
        &dir,
        &plugins,
        "fake_plugin",
        "",
        &[("TESSERA_FAKE_LIBTORCH_VERSION", "2.12.0")],
        &[
            &format!(
                "{}: built against libtorch 2.12.0, but this tessera runs libtorch {}",
                shown(&so),
                tessera_plugin_api::LIBTORCH_VERSION
            ),
            "rebuild the plugin with the same LIBTORCH",
        ],
    );
}

#[test]
fn inspect_reports_the_same_refusals() {
    let dir = TempDir::new("inspect-refusals");
    let so = plugin_path("fake_plugin");
    let so_arg = so.to_str().expect("UTF-8");
    let out = tessera(
        &["plugins", "inspect", so_arg],
        dir.path(),
        &[("TESSERA_FAKE_LIBTORCH_VERSION", "1.0.0")],
    );
    out.assert_failure(&[
        &format!("inspecting {so_arg}: "),
        "built against libtorch 1.0.0",
    ]);
    // With its true versions the fixture inspects fine.
    let out = tessera(&["plugins", "inspect", so_arg], dir.path(), &[]);
    out.assert_success();
    assert!(
        out.stdout.starts_with(&format!("fake_plugin {VERSION}\n")),
        "{}",
        out.dump()
    );
    assert!(
        out.stdout.contains("  events:     batch_end, eval_end\n"),
        "{}",
        out.dump()
    );
    assert!(out.stdout.contains("    offset = 0.0"), "{}", out.dump());

    let text = dir.write("plugins/libnotaplugin.so", "not a library");
    let out = tessera(
        &["plugins", "inspect", text.to_str().expect("UTF-8")],
        dir.path(),
        &[],
    );
    out.assert_failure(&["not a loadable shared library"]);
}

#[test]
fn list_skips_broken_files_and_says_why() {
    let (dir, plugins) = setup("list-broken");
    std::fs::write(plugins.join("libtext.so"), "not a library").expect("write");
    copy_foreign_shared_library(&plugins.join("libforeign.so"));
    std::fs::copy(
        plugin_path("label_smoothing"),
        plugins.join("liblabel_smoothing.so"),
    )
    .expect("copy");
    let out = tessera(
        &["plugins", "list", "--dir", plugins.to_str().expect("UTF-8")],
        dir.path(),
        &[],
    );
    out.assert_success();
    let so = |name: &str| shown(&plugins.join(name));
    assert!(
        out.stdout.contains(&format!(
            "/libforeign.so: skipped: {}: not a Tessera plugin",
            so("libforeign.so")
        )),
        "{}",
        out.dump()
    );
    assert!(
        out.stdout.contains(&format!(
            "/libtext.so: skipped: {}: not a loadable shared library",
            so("libtext.so")
        )),
        "{}",
        out.dump()
    );
    assert!(
        out.stdout.contains(&format!("label_smoothing {VERSION}\n")),
        "{}",
        out.dump()
    );
}

#[test]
fn settings_the_plugin_rejects_name_the_plugin() {
    let (dir, plugins) = setup("settings");
    let so = shown(&plugin_path("cutout"));
    refused(
        &dir,
        &plugins,
        "cutout",
        "length = 2.0",
        &[],
        &[&format!(
            "plugin `cutout` ({so}): invalid settings: `length` must be in (0, 1), got 2"
        )],
    );
    refused(
        &dir,
        &plugins,
        "cutout",
        "num_hole = 2",
        &[],
        &[&format!(
            "plugin `cutout` ({so}): invalid settings: unknown setting `num_hole` (known: "
        )],
    );
    refused(
        &dir,
        &plugins,
        "cutout",
        "num_holes = \"two\"",
        &[],
        &[
            "plugin `cutout`",
            "setting `num_holes` must be a non-negative integer",
        ],
    );
}

#[test]
fn label_smoothing_rejects_a_smoothing_above_one() {
    let dir = TempDir::new("smoothing");
    TrainerToml::new("ls")
        .algorithm("label_smoothing", "smoothing = 2.0")
        .write_to(&dir);
    let so = shown(&plugin_path("label_smoothing"));
    train(&dir, &[], &[]).assert_failure(&[&format!(
        "plugin `label_smoothing` ({so}): invalid settings: `smoothing` must be in [0, 1], got 2"
    )]);
    TrainerToml::new("ls")
        .algorithm("label_smoothing", "smoothin = 0.2")
        .write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&[&format!(
        "plugin `label_smoothing` ({so}): invalid settings: unknown setting `smoothin` (known: smoothing)"
    )]);
}
