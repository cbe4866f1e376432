//! Where plugins are looked for (`SearchDir` and its `Origin`, the folders in order) and finding
//! one by name.

use super::error::LoadError;
use super::folders::PluginsConfig;
use std::path::{Path, PathBuf};

/// Where a folder of plugins comes from, in search order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `[plugins] dirs` in trainer.toml, or a `--dir` option.
    Configured,
    /// `plugins/` beside the trainer.toml.
    BesideConfig,
    /// A folder of `$TESSERA_PLUGIN_PATH`.
    EnvPath,
    /// The user's folder, `$XDG_DATA_HOME/tessera/plugins` (`tessera plugins install` puts
    /// plugins there).
    User,
    /// The installation's own folder, `lib/tessera/plugins` beside the binary's `bin/`.
    Installation,
    /// The cargo build folder the tessera binary runs from (`target/release`).
    BuildFolder,
}

impl Origin {
    /// How the origin is shown to the user.
    pub fn label(self) -> &'static str {
        match self {
            Origin::Configured => "configured",
            Origin::BesideConfig => "beside trainer.toml",
            Origin::EnvPath => "TESSERA_PLUGIN_PATH",
            Origin::User => "user folder",
            Origin::Installation => "installation",
            Origin::BuildFolder => "build folder",
        }
    }
}

/// A folder searched for plugins, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchDir {
    /// The folder.
    pub path: PathBuf,
    /// Where it comes from.
    pub origin: Origin,
}

impl std::fmt::Display for SearchDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.path.display(), self.origin.label())
    }
}

/// The user's plugin folder: `$XDG_DATA_HOME/tessera/plugins`, by default
/// `~/.local/share/tessera/plugins`; `None` without `XDG_DATA_HOME` and `HOME`.
pub fn user_dir() -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    let data = std::env::var_os("XDG_DATA_HOME")
        .and_then(absolute)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(absolute)
                .map(|h| h.join(".local/share"))
        })?;
    Some(data.join("tessera").join("plugins"))
}

/// The folder of the running `tessera` binary (links resolved): an installation's `bin/`, or a
/// cargo build folder.
pub fn binary_dir() -> Option<PathBuf> {
    let exe = std::fs::canonicalize(std::env::current_exe().ok()?).ok()?;
    exe.parent().map(Path::to_path_buf)
}

/// The installation's own plugin folders: `<bin>/../lib/tessera/plugins` when the running
/// binary sits in an installation's `bin/` (`scripts/install.sh`, the wheel), and the binary's
/// own folder when it is a cargo build folder (it holds cargo's `.cargo-lock`), where the
/// workspace's plugins are built next to it.
pub fn installation_dirs() -> Vec<SearchDir> {
    let Some(bin_dir) = binary_dir() else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    if let Some(prefix) = bin_dir.parent() {
        let installed = prefix.join("lib").join("tessera").join("plugins");
        if installed.is_dir() {
            dirs.push(SearchDir {
                path: installed,
                origin: Origin::Installation,
            });
        }
    }
    if bin_dir.join(".cargo-lock").is_file() {
        dirs.push(SearchDir {
            path: bin_dir,
            origin: Origin::BuildFolder,
        });
    }
    dirs
}

/// The folders named by a configuration's `[plugins]` (`dirs`, then `plugins/` beside the
/// trainer.toml).
pub fn configured_dirs(plugins: &PluginsConfig) -> Vec<SearchDir> {
    let mut dirs: Vec<SearchDir> = plugins
        .dirs
        .iter()
        .map(|path| SearchDir {
            path: path.clone(),
            origin: Origin::Configured,
        })
        .collect();
    if let Some(beside) = &plugins.beside {
        dirs.push(SearchDir {
            path: beside.clone(),
            origin: Origin::BesideConfig,
        });
    }
    dirs
}

/// Every folder searched for plugins, in order (the first file found wins): `configured`
/// (trainer.toml's `[plugins] dirs` and `plugins/` beside it, or `--dir` options), the folders
/// of `$TESSERA_PLUGIN_PATH` (colon-separated), the user's folder ([`user_dir`]), then the
/// installation's ([`installation_dirs`]). A folder listed twice is searched once.
pub fn search_dirs(configured: Vec<SearchDir>) -> Vec<SearchDir> {
    let mut all = configured;
    if let Some(extra) = std::env::var_os("TESSERA_PLUGIN_PATH") {
        all.extend(
            std::env::split_paths(&extra)
                .filter(|p| !p.as_os_str().is_empty())
                .map(|path| SearchDir {
                    path,
                    origin: Origin::EnvPath,
                }),
        );
    }
    if let Some(path) = user_dir() {
        all.push(SearchDir {
            path,
            origin: Origin::User,
        });
    }
    all.extend(installation_dirs());
    let mut seen: Vec<PathBuf> = Vec::new();
    all.retain(|dir| {
        let key = std::fs::canonicalize(&dir.path).unwrap_or_else(|_| dir.path.clone());
        if seen.contains(&key) {
            false
        } else {
            seen.push(key);
            true
        }
    });
    all
}

/// File names a plugin called `name` may have.
pub(super) fn file_names(name: &str) -> [String; 2] {
    [format!("lib{name}.so"), format!("{name}.so")]
}

/// The plugin name a file name stands for (`libcutout.so` and `cutout.so` for `cutout`).
pub fn name_of_file(path: &Path) -> Option<String> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".so")?;
    let name = stem.strip_prefix("lib").unwrap_or(stem);
    (!name.is_empty()).then(|| name.to_owned())
}

/// Names among `found` close to `name` (edit distance), best first, at most three.
fn close_names(name: &str, found: &[String]) -> Vec<String> {
    let mut scored: Vec<(f64, &String)> = found
        .iter()
        .map(|f| (strsim::normalized_damerau_levenshtein(name, f), f))
        .filter(|(score, f)| *score >= 0.75 || f.contains(name) || name.contains(f.as_str()))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let mut names: Vec<String> = Vec::new();
    for (_, f) in scored {
        if !names.contains(f) {
            names.push(f.clone());
        }
    }
    names.truncate(3);
    names
}

/// Finds the file of plugin `name` in `dirs` (first match wins).
pub fn find(name: &str, dirs: &[SearchDir]) -> Result<PathBuf, LoadError> {
    let candidates = file_names(name);
    for dir in dirs {
        for file in &candidates {
            let path = dir.path.join(file);
            if path.is_file() {
                return Ok(path);
            }
        }
    }
    let found: Vec<String> = list_files(dirs)
        .iter()
        .filter_map(|(path, _)| name_of_file(path))
        .collect();
    let close = close_names(name, &found);
    let hint = if !close.is_empty() {
        let quoted: Vec<String> = close.iter().map(|n| format!("`{n}`")).collect();
        format!("; did you mean {}?", quoted.join(" or "))
    } else if found.is_empty() {
        "; no plugin files are there: `tessera plugins install FILE` installs one, or add its \
         folder to [plugins] dirs (see docs/install.md)"
            .to_owned()
    } else {
        "; `tessera plugins list` shows the plugins found".to_owned()
    };
    Err(LoadError::NotFound {
        name: name.to_owned(),
        candidates: candidates.join(" or "),
        dirs: if dirs.is_empty() {
            "(no folders)".to_owned()
        } else {
            dirs.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        },
        hint,
    })
}

/// Every plugin file (`*.so`) in `dirs` with its folder, sorted by folder (in search order)
/// then name.
pub fn list_files(dirs: &[SearchDir]) -> Vec<(PathBuf, &SearchDir)> {
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir.path) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "so") && p.is_file())
            .collect();
        files.sort();
        out.extend(files.into_iter().map(|f| (f, dir)));
    }
    out
}
