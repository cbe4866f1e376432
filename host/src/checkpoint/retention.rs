//! Which checkpoints a run keeps (`checkpoint.keep`).

use std::path::{Path, PathBuf};

use super::list;

/// Deletes all but the newest `keep` checkpoints in `folder` (0 keeps all), never `current`.
/// Returns the deleted files.
pub fn prune(folder: &Path, keep: usize, current: &Path) -> Vec<PathBuf> {
    if keep == 0 {
        return Vec::new();
    }
    let mut deleted = Vec::new();
    for path in list(folder).into_iter().skip(keep) {
        if path == current {
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
