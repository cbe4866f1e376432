//! `tessera plugins install` and `remove`: a checked plugin file copied into a plugin folder
//! (the user's by default), a plugin crate built against this tessera's libtorch first.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{name_of_file, LoadError, LoadedPlugin, SearchDir};

/// Why a plugin could not be installed or removed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The path is neither a file nor a crate folder.
    #[error("{0}: no such file or folder")]
    Missing(PathBuf),
    /// A folder without `Cargo.toml`.
    #[error(
        "{0}: a folder without Cargo.toml; give a plugin file (.so) or a plugin crate's folder"
    )]
    NotACrate(PathBuf),
    /// The file failed the loader's checks.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// No destination folder (no `XDG_DATA_HOME` or `HOME`).
    #[error("no plugin folder to install into: set XDG_DATA_HOME or HOME, or pass --to DIR")]
    NoUserDir,
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// libtorch's folder could not be found for a crate build.
    #[error("cannot tell which libtorch this tessera runs on; set LIBTORCH to its folder")]
    NoLibtorch,
    /// cargo could not be started or failed.
    #[error("building the plugin crate in {dir}: {reason}")]
    Build {
        /// The crate folder.
        dir: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A name that cannot be a plugin's (it would name a file outside the folder).
    #[error("`{0}` is not a plugin name (letters, digits, `_` and `-` only)")]
    BadName(String),
    /// `remove` found no such plugin in the folder.
    #[error("plugin `{name}` is not in {dir}{elsewhere}")]
    NotInstalled {
        /// The plugin's name.
        name: String,
        /// The folder `remove` works on.
        dir: PathBuf,
        /// Where else it was found, if anywhere.
        elsewhere: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |source| InstallError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Refuses names that are not plain file-name stems (a plugin's name becomes `lib<name>.so`
/// in the folder; `../x` or `a/b` would write or delete elsewhere).
fn check_name(name: &str) -> Result<(), InstallError> {
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        Ok(())
    } else {
        Err(InstallError::BadName(name.to_owned()))
    }
}

/// What `install` did.
#[derive(Debug)]
pub struct Installed {
    /// The plugin's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The installed file.
    pub path: PathBuf,
    /// Whether an older file of the same name was replaced.
    pub replaced: bool,
}

/// The folder `install` and `remove` use: `to`, else the user's plugin folder.
pub fn destination(to: Option<&Path>) -> Result<PathBuf, InstallError> {
    match to {
        Some(dir) => Ok(dir.to_owned()),
        None => super::user_dir().ok_or(InstallError::NoUserDir),
    }
}

/// Checks the plugin file `file` as the loader does (ELF, ABI, plugin-api and libtorch
/// versions) and copies it atomically into `dest` as `lib<name>.so`.
pub fn install_file(file: &Path, dest: &Path) -> Result<Installed, InstallError> {
    let plugin = LoadedPlugin::load(file, None)?;
    check_name(&plugin.name)?;
    std::fs::create_dir_all(dest).map_err(io(dest))?;
    let target = dest.join(format!("lib{}.so", plugin.name));
    let replaced = target.exists();
    if !crate::files::same_file(&plugin.path, &target) {
        let bytes = std::fs::read(&plugin.path).map_err(io(&plugin.path))?;
        crate::files::write_atomic(&target, &bytes).map_err(io(&target))?;
    }
    Ok(Installed {
        name: plugin.name,
        version: plugin.version,
        path: target,
        replaced,
    })
}

/// The libtorch folder (holding `lib/` and `include/`) a plugin must be built against:
/// `$LIBTORCH`, else the folder of the `libtorch_cpu.so` this process has loaded.
pub fn libtorch_dir() -> Result<PathBuf, InstallError> {
    if let Some(dir) = std::env::var_os("LIBTORCH").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(Path::new)
        .find(|p| p.file_name().is_some_and(|n| n == "libtorch_cpu.so"))
        .and_then(|lib| lib.parent()?.parent().map(Path::to_path_buf))
        .ok_or(InstallError::NoLibtorch)
}

/// Builds the plugin crate in `dir` (`cargo build --release --lib`) with `LIBTORCH` set to
/// this tessera's libtorch; cargo's progress goes to standard error. Returns the built `.so`.
pub fn build_crate(dir: &Path) -> Result<PathBuf, InstallError> {
    let manifest = dir.join("Cargo.toml");
    if !manifest.is_file() {
        return Err(InstallError::NotACrate(dir.to_owned()));
    }
    let libtorch = libtorch_dir()?;
    let build_error = |reason: String| InstallError::Build {
        dir: dir.to_owned(),
        reason,
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .args([
            "build",
            "--release",
            "--lib",
            "--message-format=json-render-diagnostics",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .env("LIBTORCH", &libtorch)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| build_error(format!("cannot run {}: {e}", cargo.to_string_lossy())))?;
    if !output.status.success() {
        return Err(build_error(format!(
            "cargo build failed ({}); its messages are above",
            output.status
        )));
    }
    let manifest = std::fs::canonicalize(&manifest).map_err(io(&manifest))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let built = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| {
            m["reason"] == "compiler-artifact"
                && m["manifest_path"].as_str().map(Path::new) == Some(manifest.as_path())
                && m["target"]["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"))
        })
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.as_str().map(PathBuf::from))
        })
        .find(|f| f.extension().is_some_and(|x| x == "so"));
    built.ok_or_else(|| {
        build_error(
            "cargo built no shared library: the crate needs `crate-type = [\"cdylib\"]` under \
             [lib] (as `tessera new-plugin` writes it)"
                .to_owned(),
        )
    })
}

/// Removes plugin `name` (`lib<name>.so` or `<name>.so`) from `dest`. When it is not there,
/// the error names the other folders of `others` that hold it.
pub fn remove(name: &str, dest: &Path, others: &[SearchDir]) -> Result<PathBuf, InstallError> {
    check_name(name)?;
    for file in super::file_names(name) {
        let path = dest.join(file);
        if path.is_file() {
            std::fs::remove_file(&path).map_err(io(&path))?;
            return Ok(path);
        }
    }
    let elsewhere: Vec<String> = super::list_files(others)
        .into_iter()
        .filter(|(path, _)| name_of_file(path).as_deref() == Some(name))
        .map(|(path, dir)| format!("{} ({})", path.display(), dir.origin.label()))
        .collect();
    Err(InstallError::NotInstalled {
        name: name.to_owned(),
        dir: dest.to_owned(),
        elsewhere: if elsewhere.is_empty() {
            String::new()
        } else {
            format!(
                "; it is found at {} (pass --to with that folder to remove it there)",
                elsewhere.join(", ")
            )
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_leave_the_folder_are_refused() {
        for name in ["cutout", "my_method", "blur-pool2"] {
            assert!(check_name(name).is_ok(), "{name}");
        }
        for name in ["", "../cutout", "a/b", "..", "x y", "cut\0out"] {
            let e = check_name(name).expect_err(name).to_string();
            assert!(e.contains("is not a plugin name"), "{e}");
        }
        let dir = std::env::temp_dir().join(format!("tessera-remove-{}", std::process::id()));
        let e = remove("../etc", &dir, &[])
            .expect_err("refused")
            .to_string();
        assert!(e.contains("`../etc` is not a plugin name"), "{e}");
    }
}
