//! `tessera new-plugin`: writes a plugin crate that builds against `tessera-plugin-api` and
//! works at once — a `cdylib` with one example method, a unit test on the test host, a build
//! script for the tests' rpath and a README saying how to build, install and enable it.
//!
//! The crate is its own cargo workspace (an empty `[workspace]` table), so it can be created
//! anywhere, even inside another workspace's folder. `tessera-plugin-api` is not on crates.io:
//! when the `plugin-api` folder this tessera was built from still exists, the crate depends on
//! it by path and gets a copy of this tessera's `Cargo.lock`, so that it resolves exactly the
//! dependency versions the host was built with (and, sharing a target folder, reuses their
//! builds); otherwise it gets a version requirement and a comment saying what to change.

use std::path::{Path, PathBuf};

use tessera_plugin_api::API_VERSION;

/// The `plugin-api` folder next to the `host` folder this binary was built from.
const PLUGIN_API_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugin-api");

/// Why a plugin crate could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    /// The name is not a valid snake_case crate name.
    #[error("`{name}` is not a valid plugin name: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The destination exists and is not an empty folder.
    #[error("{path} already exists and is not an empty folder; refusing to overwrite it (choose another DIR or remove it)")]
    Exists {
        /// The destination.
        path: PathBuf,
    },
    /// Writing a file failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Rust keywords (strict and reserved, all editions) and names cargo or the build refuse for a
/// crate: none can be a plugin's crate name.
const RESERVED: &[&str] = &[
    "abstract",
    "as",
    "async",
    "await",
    "become",
    "box",
    "break",
    "const",
    "continue",
    "crate",
    "do",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "final",
    "fn",
    "for",
    "gen",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "macro",
    "match",
    "mod",
    "move",
    "mut",
    "override",
    "priv",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "try",
    "type",
    "typeof",
    "unsafe",
    "unsized",
    "use",
    "virtual",
    "where",
    "while",
    "yield",
    "alloc",
    "core",
    "proc_macro",
    "std",
    "test",
    "build",
    "deps",
    "examples",
    "incremental",
    "tessera",
    "tessera_plugin_api",
    "tch",
    "torch_sys",
    "abi_stable",
];

/// Checks that `name` can be both the crate's name and the plugin's name in `trainer.toml`:
/// snake_case ASCII (`a-z`, `0-9`, `_`), starting with a letter, no `__`, not ending in `_`, at
/// most 64 characters, not a Rust keyword or a name the build needs for itself.
pub fn validate_name(name: &str) -> Result<(), ScaffoldError> {
    let fail = |reason: &str| {
        Err(ScaffoldError::InvalidName {
            name: name.to_owned(),
            reason: reason.to_owned(),
        })
    };
    if name.is_empty() {
        return fail("the name is empty");
    }
    if name.len() > 64 {
        return fail("it is longer than 64 characters");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
    {
        let suggestion = name.to_ascii_lowercase().replace('-', "_");
        let hint = if suggestion != name && validate_name(&suggestion).is_ok() {
            format!(" (use `{suggestion}`)")
        } else {
            String::new()
        };
        return fail(&format!(
            "{c:?} is not allowed; use snake_case: lowercase ASCII letters, digits and `_`{hint}"
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return fail("it must start with a lowercase letter");
    }
    if name.ends_with('_') || name.contains("__") {
        return fail("snake_case words are joined by single underscores, with none at the end");
    }
    if RESERVED.contains(&name) {
        return fail("it is a Rust keyword or a name the build uses itself");
    }
    Ok(())
}

/// Where `tessera-plugin-api` comes from in the new crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiSource {
    /// A local `plugin-api` folder.
    Path(PathBuf),
    /// A version requirement (the crate must then be found some other way).
    Version(String),
}

impl ApiSource {
    /// The plugin-api this tessera's installation ships (`share/tessera/plugin-api` beside
    /// its `bin/`, written by `scripts/install.sh` and the wheel), else the `plugin-api` folder
    /// this tessera was built from when it still exists, else a version requirement for this
    /// tessera's interface version.
    pub fn detect() -> ApiSource {
        let installed = crate::plugin::binary_dir()
            .and_then(|bin| Some(bin.parent()?.join("share/tessera/plugin-api")));
        let built_from = std::fs::canonicalize(PLUGIN_API_DIR).ok();
        match installed
            .into_iter()
            .chain(built_from)
            .find(|dir| dir.join("Cargo.toml").is_file())
        {
            Some(dir) => ApiSource::Path(dir),
            None => ApiSource::Version(minor_requirement()),
        }
    }

    /// The `Cargo.lock` that goes with a plugin-api folder: the checkout's (its parent is the
    /// workspace root) or the installation's (`share/tessera/Cargo.lock`), so the new crate
    /// resolves exactly the dependency versions the host was built with.
    fn lock_file(&self) -> Option<PathBuf> {
        match self {
            ApiSource::Path(dir) => Some(dir.parent()?.join("Cargo.lock")).filter(|f| f.is_file()),
            ApiSource::Version(_) => None,
        }
    }
}

/// `"1.1"` for interface 1.1.0: at least this tessera's host calls, any later 1.x.
fn minor_requirement() -> String {
    API_VERSION.split('.').take(2).collect::<Vec<_>>().join(".")
}

fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The text of each file of the new crate, by path relative to its folder.
pub fn files(name: &str, api: &ApiSource) -> Vec<(&'static str, String)> {
    let (dep_comment, dep, dev_dep) = match api {
        ApiSource::Path(dir) => {
            let path = toml_string(&dir.display().to_string());
            let req = minor_requirement();
            (
                "# tessera-plugin-api is not published on crates.io: this is the plugin-api folder of the\n\
                 # tessera that generated this crate. A plugin must be built against the same major\n\
                 # version and the same libtorch as the tessera that loads it."
                    .to_owned(),
                format!("tessera-plugin-api = {{ path = {path}, version = \"{req}\" }}"),
                format!(
                    "tessera-plugin-api = {{ path = {path}, version = \"{req}\", features = [\"testing\"] }}"
                ),
            )
        }
        ApiSource::Version(req) => (
            "# tessera-plugin-api is not published on crates.io, and the plugin-api folder of the\n\
             # tessera that generated this crate was not found. Point both lines at the plugin-api\n\
             # folder of your tessera checkout, e.g.\n\
             #   tessera-plugin-api = { path = \"/path/to/tessera/plugin-api\" }\n\
             # (or at a registry or git source that has it). A plugin must be built against the same\n\
             # major version and the same libtorch as the tessera that loads it."
                .to_owned(),
            format!("tessera-plugin-api = \"{req}\""),
            format!("tessera-plugin-api = {{ version = \"{req}\", features = [\"testing\"] }}"),
        ),
    };
    let type_name = type_name(name);
    vec![
        ("Cargo.toml", cargo_toml(name, &dep_comment, &dep, &dev_dep)),
        ("build.rs", BUILD_RS.to_owned()),
        ("src/lib.rs", LIB_RS.replace("ScaleInput", &type_name)),
        ("README.md", readme(name)),
        (".gitignore", "/target\n".to_owned()),
    ]
    .into_iter()
    .map(|(path, text)| (path, text.replace("{{name}}", name)))
    .collect()
}

/// `my_scale` → `MyScale`.
fn type_name(name: &str) -> String {
    name.split('_')
        .map(|w| {
            let mut cs = w.chars();
            match cs.next() {
                Some(c) => c.to_ascii_uppercase().to_string() + cs.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

fn cargo_toml(name: &str, dep_comment: &str, dep: &str, dev_dep: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"
description = "A Tessera speed-up method, loaded by the tessera binary at run time"
publish = false
build = "build.rs"

# Its own workspace: the crate builds on its own wherever it lives.
[workspace]

[lib]
# cdylib: the lib{name}.so that tessera loads; rlib: for this crate's own tests.
crate-type = ["cdylib", "rlib"]

{dep_comment}
[dependencies]
{dep}

[dev-dependencies]
# The test host (`tessera_plugin_api::testing::TestHost`) for unit tests without tessera.
{dev_dep}

[profile.release]
# Without debug info the plugin is about 1 MB instead of tens of MB.
debug = false
"#
    )
}

const BUILD_RS: &str = r#"// Lets this crate's own tests find libtorch without LD_LIBRARY_PATH. The plugin itself needs no
// rpath: tessera has already loaded libtorch when it opens the plugin.
fn main() {
    if let Ok(lib) = std::env::var("DEP_TESSERA_PLUGIN_API_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
"#;

const LIB_RS: &str = r##"//! `{{name}}`: an example Tessera method. After each training batch is loaded it multiplies the
//! input by `factor` and logs the mean absolute value of the result as the metric
//! `{{name}}/input_abs_mean`. Replace it with your own method.

use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, Event, Hook, Method, Plugin, Settings,
};

/// Multiplies every training input by a constant.
pub struct ScaleInput {
    factor: f64,
}

impl ScaleInput {
    /// The input scaled by `factor`.
    pub fn scale(&self, input: &Tensor) -> Result<Tensor, Error> {
        Ok(input.f_mul_scalar(self.factor)?)
    }
}

impl Method for ScaleInput {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        if event != Event::AFTER_DATALOADER {
            return Ok(());
        }
        let input = ctx
            .tensor(keys::INPUT)
            .ok_or_else(|| Error::from("the batch has no `input`"))?;
        let scaled = self.scale(&input)?;
        let abs_mean = scaled.f_abs()?.f_mean(scaled.kind())?.f_double_value(&[])?;
        ctx.set_tensor(keys::INPUT, scaled)?;
        ctx.log_metric(&format!("{}/input_abs_mean", Self::NAME), abs_mean);
        Ok(())
    }
}

impl Plugin for ScaleInput {
    const NAME: &'static str = "{{name}}";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "multiplies training inputs by `factor` (an example method)";
    const DEFAULT_SETTINGS: &'static str = "factor = 1.0";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::AFTER_DATALOADER)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let factor = settings.f64("factor")?;
        if !factor.is_finite() {
            return Err(Error::config(format!(
                "`factor` must be a finite number, got {factor}"
            )));
        }
        Ok(ScaleInput { factor })
    }
}

export_plugin!(ScaleInput);

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_plugin_api::testing::{RandomSource, TestHost};
    use tessera_plugin_api::{boxed_method, tch::kind::FLOAT_CPU};

    fn method(settings: &str) -> Result<tessera_plugin_api::abi::MethodBox, Error> {
        boxed_method::<ScaleInput>(&Settings::from_json(settings)?)
    }

    #[test]
    fn scales_the_input_and_logs_a_metric() {
        let mut m = method(r#"{"factor": 0.5}"#).unwrap();
        let input = Tensor::full([2, 1, 4, 4], -2.0, FLOAT_CPU);
        let mut host = TestHost::new(RandomSource::Seeded(0)).with(keys::INPUT, &input);
        host.fire(&mut m, Event::AFTER_DATALOADER).unwrap();
        let expected = Tensor::full([2, 1, 4, 4], -1.0, FLOAT_CPU);
        assert!(host.get(keys::INPUT).allclose(&expected, 0.0, 0.0, false));
        assert_eq!(
            host.metrics,
            vec![("{{name}}/input_abs_mean".to_owned(), 1.0)]
        );
    }

    #[test]
    fn rejects_bad_settings() {
        let wrong_type = method(r#"{"factor": "half"}"#).err().unwrap();
        assert!(wrong_type.message().contains("`factor`"), "{wrong_type}");
        let unknown = method(r#"{"fator": 0.5}"#).err().unwrap();
        assert!(unknown.message().contains("fator"), "{unknown}");
    }
}
"##;

fn readme(name: &str) -> String {
    format!(
        r#"# {name}

A speed-up method for Tessera, built as a plugin: a shared library the
unmodified `tessera` binary loads at run time. Generated by `tessera new-plugin {name}`; the
example method multiplies each training input by `factor` and logs the metric
`{name}/input_abs_mean`. Edit `src/lib.rs` to make it yours.

## Build

Build with the same libtorch as the `tessera` that will load it (the host refuses a plugin built
against another libtorch version):

```sh
export LIBTORCH=/path/to/the/libtorch/tessera/uses   # as for building tessera
cargo test --release       # the unit tests, on tessera_plugin_api::testing::TestHost
cargo build --release      # target/release/lib{name}.so
```

Sharing tessera's target folder (`CARGO_TARGET_DIR=/path/to/tessera/target`) reuses its build
of libtorch's bindings, so the build takes seconds instead of minutes.

## Install

Copy the library into a plugins folder and check that tessera accepts it:

```sh
mkdir -p plugins
cp target/release/lib{name}.so plugins/
tessera plugins list --dir plugins
```

tessera loads plugins only from the folders listed in `trainer.toml` and in
`TESSERA_PLUGIN_PATH`, never from the working directory on its own.

## Enable it in trainer.toml

```toml
[plugins]
dirs = ["plugins"]          # relative to the trainer.toml's folder

[[algorithms]]
plugin = "{name}"
factor = 0.5
# sha256 = "..."            # optional: pin the exact file (`tessera plugins list` prints it)
# on_error = "disable"      # optional: on an error, drop the method instead of stopping the run
```

Then `tessera train trainer.toml`; the metric appears in the run's `metrics.jsonl`.

See docs/plugins.md in the tessera repository for the rules a plugin must follow (ABI,
libtorch version, errors, event order, host calls).
"#
    )
}

/// Creates the plugin crate `name` in `dir` (which must not exist or be an empty folder) and
/// returns the files written.
pub fn create(name: &str, dir: &Path) -> Result<Vec<PathBuf>, ScaffoldError> {
    validate_name(name)?;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ScaffoldError::Io { path, source }
    };
    if dir.exists() || dir.is_symlink() {
        let empty = dir.is_dir() && std::fs::read_dir(dir).map_err(io(dir))?.next().is_none();
        if !empty {
            return Err(ScaffoldError::Exists {
                path: dir.to_owned(),
            });
        }
    }
    let api = ApiSource::detect();
    let mut written = Vec::new();
    for (rel, text) in files(name, &api) {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, text).map_err(io(&path))?;
        written.push(path);
    }
    // Same dependency versions as this tessera (abi_stable, tch, ...), and cargo then finds
    // everything in its local cache.
    if let Some(lock) = api.lock_file() {
        let path = dir.join("Cargo.lock");
        std::fs::copy(&lock, &path).map_err(io(&path))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["my_scale", "a", "blur2", "x_1_y"] {
            validate_name(ok).unwrap();
        }
        for bad in [
            "", "My_scale", "my-scale", "1abc", "_a", "a_", "a__b", "fn", "std", "a.b", "é",
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn type_names() {
        assert_eq!(type_name("my_scale"), "MyScale");
        assert_eq!(type_name("blur2"), "Blur2");
    }

    #[test]
    fn templates_name_the_plugin() {
        let files = files("my_scale", &ApiSource::Version("1.1".into()));
        let lib = &files.iter().find(|f| f.0 == "src/lib.rs").unwrap().1;
        assert!(lib.contains("const NAME: &'static str = \"my_scale\";"));
        assert!(lib.contains("export_plugin!(MyScale);"));
        assert!(!lib.contains("{{name}}"));
        let toml = &files.iter().find(|f| f.0 == "Cargo.toml").unwrap().1;
        assert!(toml.contains("name = \"my_scale\""));
        assert!(toml.contains("[workspace]"));
        assert!(toml.contains("tessera-plugin-api = \"1.1\""));
    }
}
