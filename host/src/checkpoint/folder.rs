//! A run's checkpoint folder: file names, listing newest first, the `latest` link, the newest
//! good checkpoint, temporaries of interrupted writes.

use std::path::{Path, PathBuf};

use super::{Checkpoint, EXTENSION, LATEST};
use crate::files::TMP_PREFIX;
use crate::time::Timestamp;

/// The file name of the checkpoint taken at `t`.
pub fn file_name(t: &Timestamp) -> String {
    format!("ep{}-ba{}.{EXTENSION}", t.epoch, t.batch)
}

/// `(epoch, batch)` of a checkpoint file name written by [`file_name`].
pub fn parse_file_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(&format!(".{EXTENSION}"))?;
    let (ep, ba) = stem.split_once('-')?;
    let ep = ep.strip_prefix("ep")?.parse().ok()?;
    let ba = ba.strip_prefix("ba")?.parse().ok()?;
    Some((ep, ba))
}

/// The checkpoints in `folder`, newest (highest batch, then epoch) first. Temporary files and
/// the `latest` link are not listed.
pub fn list(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut found: Vec<((u64, u64), PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (ep, ba) = parse_file_name(&name)?;
            Some(((ba, ep), e.path()))
        })
        .collect();
    found.sort_by_key(|(key, _)| std::cmp::Reverse(*key));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The newest checkpoint in `folder` that reads and verifies; corrupt or partial ones are
/// skipped with a warning. `None` when there is none.
pub fn latest_good(folder: &Path) -> Option<(PathBuf, Checkpoint)> {
    for path in list(folder) {
        match Checkpoint::read(&path) {
            Ok(c) => return Some((path, c)),
            Err(e) => tracing::warn!("skipping checkpoint: {e}"),
        }
    }
    None
}

/// Points `folder/latest.ckpt` at `target` (a file in `folder`), atomically.
pub fn update_latest(folder: &Path, target: &Path) -> std::io::Result<()> {
    update_link(folder, LATEST, target)
}

/// Points `folder/<link>` (`latest.ckpt`, `best.ckpt`) at `target` (a file in `folder`),
/// atomically.
pub fn update_link(folder: &Path, link: &str, target: &Path) -> std::io::Result<()> {
    let name = target
        .file_name()
        .ok_or_else(|| std::io::Error::other("checkpoint path has no file name"))?;
    let tmp = folder.join(format!("{TMP_PREFIX}{link}.{}", std::process::id()));
    let link = folder.join(link);
    let _ = std::fs::remove_file(&tmp);
    #[cfg(unix)]
    std::os::unix::fs::symlink(name, &tmp)?;
    #[cfg(not(unix))]
    std::fs::copy(target, &tmp)?;
    std::fs::rename(&tmp, &link)?;
    if let Ok(d) = std::fs::File::open(folder) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Removes temporary files left by checkpoint writes that were interrupted (by another
/// process).
pub fn remove_stale_temporaries(folder: &Path) {
    for path in crate::files::remove_stale_temporaries(folder) {
        tracing::info!(
            "removed {} (left by an interrupted checkpoint write)",
            path.display()
        );
    }
}
