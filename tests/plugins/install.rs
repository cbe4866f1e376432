//! Installing Tessera and plugins as a user does: `scripts/install.sh` into a prefix, the pip
//! wheel into a fresh virtual environment, and `tessera plugins install/list/remove`; the
//! installed `tessera` trains the Fashion-MNIST example with no `[plugins] dirs` line, finding
//! the bundled plugins in its own folder.
//!
//! Needs the workspace built (`cargo build --release --workspace`, as `scripts/test.sh` does):
//! the scripts run with `--no-build` and package what `target/release` holds.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tessera_tests::*;

/// How long one script (install, wheel build, venv creation, pip) may take.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(600);

fn script(name: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("scripts").join(name))
        .args(args)
        .current_dir(repo_root())
        .env("CARGO_TARGET_DIR", workspace_target_dir())
        .env("LIBTORCH", libtorch());
    let label = format!("scripts/{name} {}", args.join(" "));
    run_with_timeout(cmd, &label, SCRIPT_TIMEOUT)
}

/// The example's trainer.toml copied into `dir` (no `plugins/` beside it), its runs in `dir`.
fn example_in(dir: &TempDir) -> PathBuf {
    let text = std::fs::read_to_string(repo_root().join("examples/fashion-mnist/trainer.toml"))
        .expect("read the example");
    assert!(
        !text.lines().any(|l| l.trim_start().starts_with("dirs")),
        "the example still names its plugin folders:\n{text}"
    );
    dir.write("trainer.toml", &text)
}

/// A short run of the example with `program` (an installed tessera), checked to have trained;
/// returns its run record.
fn train_example(program: &Path, dir: &TempDir, env: &[(&str, &str)]) -> Value {
    require_fashion_mnist();
    let config = example_in(dir);
    let args = [
        "train",
        config.to_str().expect("UTF-8"),
        "--set",
        "train.max_duration=\"3ba\"",
        "--set",
        "output_dir=\"runs\"",
        "--set",
        "train.eval_subset_batches=1",
        "--set",
        "data.fetch=false",
    ];
    let mut env = env.to_vec();
    let data = data_root();
    env.push(("TESSERA_DATA", data.to_str().expect("UTF-8")));
    let out = run_with_timeout(
        program_command(program, &args, dir.path(), &env),
        &format!("{} {}", program.display(), args.join(" ")),
        COMMAND_TIMEOUT,
    );
    out.assert_success();
    read_json(&dir.path().join("runs/fmnist-cnn/run.json"))
}

/// The folder each plugin of a run record was loaded from.
fn plugin_folders(record: &Value) -> Vec<(String, PathBuf)> {
    record["plugins"]
        .as_array()
        .expect("plugins in run.json")
        .iter()
        .map(|p| {
            let path = PathBuf::from(p["path"].as_str().expect("a plugin path"));
            (
                p["name"].as_str().expect("a name").to_owned(),
                path.parent().expect("a folder").to_owned(),
            )
        })
        .collect()
}

#[test]
fn install_sh_installs_a_tessera_that_trains_the_example_with_its_bundled_plugins() {
    let tmp = TempDir::new("install-sh");
    let prefix = tmp.join("prefix");
    let prefix_arg = prefix.to_str().expect("UTF-8");
    script("install.sh", &["--no-build", "--prefix", prefix_arg]).assert_success();
    let bin = prefix.join("bin/tessera");
    let plugins = prefix.join("lib/tessera/plugins");
    assert!(bin.is_file(), "no {}", bin.display());
    for name in ["label_smoothing", "cutout", "blurpool"] {
        assert!(plugins.join(format!("lib{name}.so")).is_file(), "no {name}");
    }
    let api = prefix.join("share/tessera/plugin-api");
    let manifest = std::fs::read_to_string(api.join("Cargo.toml")).expect("plugin-api/Cargo.toml");
    assert!(
        manifest.contains("name = \"tessera-plugin-api\"")
            && !manifest.contains("workspace = true"),
        "the installed plugin-api is not a stand-alone crate:\n{manifest}"
    );
    assert!(api.join("src/lib.rs").is_file());

    // The installed binary finds libtorch (rpath, no LD_LIBRARY_PATH) and its plugins.
    let runs = TempDir::new("install-sh-run");
    let record = train_example(&bin, &runs, &[]);
    let canonical = std::fs::canonicalize(&plugins).expect("the plugins folder");
    for (name, folder) in plugin_folders(&record) {
        assert_eq!(
            folder, canonical,
            "{name} was not loaded from the installation"
        );
    }

    // `plugins list` says where each folder comes from.
    let out = run_with_timeout(
        program_command(&bin, &["plugins", "list"], runs.path(), &[]),
        "installed tessera plugins list",
        COMMAND_TIMEOUT,
    );
    out.assert_success();
    assert!(
        out.stdout
            .contains(&format!("  {} (installation)", canonical.display())),
        "{}",
        out.dump()
    );
    assert!(out.stdout.contains("label_smoothing "), "{}", out.dump());

    // A plugin author needs no checkout: `new-plugin` of the installed tessera depends on the
    // installed plugin-api, and `plugins install` builds the crate and installs it.
    let author = TempDir::new("install-sh-author");
    let krate = author.join("my_shift");
    let krate_arg = krate.to_str().expect("UTF-8");
    run_with_timeout(
        program_command(
            &bin,
            &["new-plugin", "my_shift", krate_arg],
            author.path(),
            &[],
        ),
        "installed tessera new-plugin",
        COMMAND_TIMEOUT,
    )
    .assert_success();
    let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).expect("Cargo.toml");
    let api_shown = std::fs::canonicalize(&api).expect("plugin-api folder");
    assert!(
        manifest.contains(&format!("path = \"{}\"", api_shown.display())),
        "the new crate does not use the installed plugin-api:\n{manifest}"
    );
    assert!(krate.join("Cargo.lock").is_file(), "no Cargo.lock copied");
    let workspace_target = workspace_target_dir();
    let user = author.join("data");
    let out = run_with_timeout(
        program_command(
            &bin,
            &["plugins", "install", krate_arg],
            author.path(),
            &[
                (
                    "CARGO_TARGET_DIR",
                    workspace_target.to_str().expect("UTF-8"),
                ),
                ("XDG_DATA_HOME", user.to_str().expect("UTF-8")),
                ("LIBTORCH", &libtorch()),
            ],
        ),
        "installed tessera plugins install <crate>",
        CARGO_TIMEOUT,
    );
    out.assert_success();
    assert!(
        user.join("tessera/plugins/libmy_shift.so").is_file(),
        "{}",
        out.dump()
    );
    remove_built_plugin("my_shift");

    // Installing again replaces the files in place and keeps a working installation.
    script("install.sh", &["--no-build", "--prefix", prefix_arg]).assert_success();
    let out = run_with_timeout(
        program_command(&bin, &["--version"], runs.path(), &[]),
        "installed tessera --version",
        COMMAND_TIMEOUT,
    );
    out.assert_success();
    let leftovers: Vec<_> = std::fs::read_dir(&plugins)
        .expect("list plugins")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn the_wheel_installs_into_a_fresh_venv_and_trains() {
    let tmp = TempDir::new("wheel");
    let out = script(
        "build-wheel.sh",
        &[
            "--no-build",
            "--out",
            tmp.join("dist").to_str().expect("UTF-8"),
        ],
    );
    out.assert_success();
    let wheel = PathBuf::from(out.stdout.trim());
    assert!(
        wheel.is_file(),
        "no wheel at {}:\n{}",
        wheel.display(),
        out.dump()
    );
    let name = wheel
        .file_name()
        .expect("a name")
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with("tessera-") && name.ends_with(".whl"),
        "{name}"
    );

    // A fresh virtual environment; torch==2.13.0 is the one the tests already have (the
    // LIBTORCH wheel's folder), made visible by a .pth file instead of a 4.7 GB download.
    let venv = tmp.join("venv");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "venv", venv.to_str().expect("UTF-8")]);
    run_with_timeout(cmd, "python3 -m venv", SCRIPT_TIMEOUT).assert_success();
    let venv_python = venv.join("bin/python");
    let mut cmd = Command::new(&venv_python);
    cmd.args([
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['purelib'])",
    ]);
    let site = run_with_timeout(cmd, "venv python sysconfig", SCRIPT_TIMEOUT);
    site.assert_success();
    let torch_parent = Path::new(&libtorch())
        .parent()
        .expect("LIBTORCH is <folder>/torch")
        .to_owned();
    std::fs::write(
        Path::new(site.stdout.trim()).join("torch-wheel.pth"),
        format!("{}\n", torch_parent.display()),
    )
    .expect("write the .pth file");

    // Installed without the network. `--no-deps`: the torch wheel's own requirements (setuptools,
    // the CUDA libraries, ...) are not all in that folder, and resolving them would download;
    // the wheel's one requirement is checked below against the torch the venv sees.
    let mut cmd = Command::new(&venv_python);
    cmd.args([
        "-m",
        "pip",
        "install",
        "--no-index",
        "--no-deps",
        "--disable-pip-version-check",
    ])
    .arg(&wheel);
    run_with_timeout(cmd, "pip install the wheel", SCRIPT_TIMEOUT).assert_success();
    let mut cmd = Command::new(&venv_python);
    cmd.args([
        "-c",
        "import importlib.metadata as m; print(m.requires('tessera')); print(m.version('torch'))",
    ]);
    let requires = run_with_timeout(cmd, "venv python importlib.metadata", SCRIPT_TIMEOUT);
    requires.assert_success();
    assert_eq!(
        requires.stdout, "['torch==2.13.0']\n2.13.0\n",
        "the wheel must require the torch whose libtorch it was built for"
    );
    let launcher = venv.join("bin/tessera");
    assert!(launcher.is_file(), "pip put no tessera command in the venv");

    let runs = TempDir::new("wheel-run");
    let out = run_with_timeout(
        program_command(&launcher, &["--version"], runs.path(), &[]),
        "venv tessera --version",
        COMMAND_TIMEOUT,
    );
    out.assert_success();
    assert!(out.stdout.contains("libtorch 2.13.0"), "{}", out.dump());
    let record = train_example(&launcher, &runs, &[]);
    let package = std::fs::canonicalize(Path::new(site.stdout.trim()).join("tessera"))
        .expect("the installed package");
    for (name, folder) in plugin_folders(&record) {
        assert_eq!(
            folder,
            package.join("lib/tessera/plugins"),
            "{name} was not loaded from the wheel's plugins"
        );
    }
}

#[test]
fn plugins_install_checks_and_copies_a_library_then_remove_deletes_it() {
    let tmp = TempDir::new("plugins-install");
    let data_home = tmp.join("data");
    let data_arg = data_home.to_str().expect("UTF-8");
    let env = [("XDG_DATA_HOME", data_arg)];
    let user = data_home.join("tessera/plugins");

    // A broken file is refused, and nothing is installed.
    let broken = tmp.write("libbroken.so", "not a library");
    let out = tessera(
        &["plugins", "install", broken.to_str().expect("UTF-8")],
        tmp.path(),
        &env,
    );
    out.assert_failure(&["not a loadable shared library"]);
    assert!(!user.join("libbroken.so").exists());

    // A plugin is checked and copied into the user's folder.
    let so = plugin_path("cutout");
    let out = tessera(
        &["plugins", "install", so.to_str().expect("UTF-8")],
        tmp.path(),
        &env,
    );
    out.assert_success();
    assert!(
        out.stdout.starts_with(&format!(
            "installed cutout {VERSION} {}",
            user.join("libcutout.so").display()
        )),
        "{}",
        out.dump()
    );
    assert_eq!(sha256_hex(&user.join("libcutout.so")), sha256_hex(&so));
    // The build folder comes later in the search order: the user's copy is the one loaded.
    let out = tessera(&["plugins", "list"], tmp.path(), &env);
    out.assert_success();
    let user_shown = std::fs::canonicalize(&user).expect("user folder");
    assert!(
        out.stdout
            .contains(&format!("  folder:     {} (user folder)", user.display()))
            || out.stdout.contains(&format!(
                "  folder:     {} (user folder)",
                user_shown.display()
            )),
        "{}",
        out.dump()
    );
    assert!(out.stdout.contains("  shadowed:   by "), "{}", out.dump());

    // Installing again replaces it.
    let out = tessera(
        &["plugins", "install", so.to_str().expect("UTF-8")],
        tmp.path(),
        &env,
    );
    out.assert_success();
    assert!(out.stdout.starts_with("replaced cutout "), "{}", out.dump());

    // Remove, then removing again names where else it is.
    let out = tessera(&["plugins", "remove", "cutout"], tmp.path(), &env);
    out.assert_success();
    assert!(!user.join("libcutout.so").exists());
    let out = tessera(&["plugins", "remove", "cutout"], tmp.path(), &env);
    out.assert_failure(&[
        &format!("plugin `cutout` is not in {}", user.display()),
        "(build folder)",
    ]);
}

#[test]
fn plugins_beside_the_trainer_toml_and_in_the_user_folder_are_found_without_configuration() {
    require_fashion_mnist();
    // The run's folder holds plugins/ with label_smoothing; cutout comes from the user's
    // folder. TESSERA_PLUGIN_PATH and [plugins] dirs are not set; the build folder is searched
    // last and would also have both, so each must come from the earlier folder.
    let tmp = TempDir::new("default-folders");
    let beside = tmp.join("plugins");
    std::fs::create_dir_all(&beside).expect("plugins/");
    std::fs::copy(
        plugin_path("label_smoothing"),
        beside.join("liblabel_smoothing.so"),
    )
    .expect("copy");
    let data_home = tmp.join("data");
    let user = data_home.join("tessera/plugins");
    std::fs::create_dir_all(&user).expect("user folder");
    std::fs::copy(plugin_path("cutout"), user.join("libcutout.so")).expect("copy");
    let record = train_example(
        &tessera_bin(),
        &tmp,
        &[("XDG_DATA_HOME", data_home.to_str().expect("UTF-8"))],
    );
    let folders: std::collections::BTreeMap<String, PathBuf> =
        plugin_folders(&record).into_iter().collect();
    let canonical = |p: &Path| std::fs::canonicalize(p).expect("a folder");
    assert_eq!(folders["label_smoothing"], canonical(&beside));
    assert_eq!(folders["cutout"], canonical(&user));
    // The run records the folders its trainer.toml named (plugins/ beside it), so a run
    // re-read from its record (a sweep's, a resumed one) searches the same ones.
    let dirs = record["config"]["plugins"]["dirs"]
        .as_array()
        .expect("plugins.dirs in the record");
    assert_eq!(dirs.len(), 1, "{dirs:?}");
}
