//! Records which libtorch this crate is compiled against, so that the host can refuse a plugin
//! built for another one, and re-exports the libtorch library folder to dependents (as
//! `DEP_TESSERA_PLUGIN_API_LIBTORCH_LIB`) so their build scripts can set an rpath; this crate's
//! own tests get that rpath too.
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB").unwrap_or_default();
    let version = libtorch_version(Path::new(&lib)).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TESSERA_LIBTORCH_VERSION={version}");
    println!("cargo:libtorch_lib={lib}");
    if !lib.is_empty() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}

/// The version of the libtorch in `lib/..`: `build-version` in a libtorch zip, `version.py` in a
/// PyTorch wheel. A local suffix such as `+cpu` or `+cu130` is kept.
fn libtorch_version(lib: &Path) -> Option<String> {
    let root = lib.parent()?;
    if let Ok(text) = std::fs::read_to_string(root.join("build-version")) {
        return Some(text.trim().to_owned());
    }
    let text = std::fs::read_to_string(root.join("version.py")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("__version__ = "))
        .map(|v| v.trim().trim_matches('\'').trim_matches('"').to_owned())
}
