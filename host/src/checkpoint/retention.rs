//! Which checkpoints a run keeps (`checkpoint.keep_last`, `checkpoint.keep_best`).

use std::path::{Path, PathBuf};

use super::{list, parse_file_name};

/// Deletes all but the newest `keep` checkpoints in `folder` (0 keeps all), never `current`
/// nor one of `kept` (those `keep_best` keeps). Returns the deleted files.
pub fn prune(folder: &Path, keep: usize, current: &Path, kept: &[PathBuf]) -> Vec<PathBuf> {
    if keep == 0 {
        return Vec::new();
    }
    let mut deleted = Vec::new();
    for path in list(folder).into_iter().skip(keep) {
        if path == current || kept.contains(&path) {
            continue;
        }
        // A sharded checkpoint is a folder.
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Ok(()) => deleted.push(path),
            Err(e) => tracing::warn!("cannot delete old checkpoint {}: {e}", path.display()),
        }
    }
    deleted
}

/// The `k` checkpoints of `folder` with the best scores, best first. `score(batch)` is the
/// evaluation at a checkpoint's batch (`None`: none ran there, and the checkpoint is not
/// ranked; nor is one whose score is NaN); `higher_is_better` orders them. Among equal scores
/// the newer checkpoint ranks first.
pub fn best_of(
    folder: &Path,
    k: usize,
    higher_is_better: bool,
    score: impl Fn(u64) -> Option<f64>,
) -> Vec<PathBuf> {
    // Newest first, so a stable sort keeps the newer of equals first.
    let mut ranked: Vec<(f64, PathBuf)> = list(folder)
        .into_iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_string_lossy().into_owned();
            let (_, batch) = parse_file_name(&name)?;
            Some((score(batch).filter(|s| !s.is_nan())?, path))
        })
        .collect();
    ranked.sort_by(|(a, _), (b, _)| {
        if higher_is_better {
            b.total_cmp(a)
        } else {
            a.total_cmp(b)
        }
    });
    ranked.into_iter().take(k).map(|(_, path)| path).collect()
}
