//! A new dataset folder (`tessera data export-folder`, `tessera data pack`) written under a
//! temporary name beside its destination (`.NAME.partial-PID-NANOS`) and renamed into place only
//! when complete, so that a failed or interrupted write leaves nothing half-written under the
//! name the user gave.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::data::DataError;

/// A folder being written for `dst`; removed when dropped unless [`StagedFolder::finish`] moved it
/// into place.
#[derive(Debug)]
pub(crate) struct StagedFolder {
    staging: PathBuf,
    dst: PathBuf,
    /// `dst` exists as an empty folder, replaced at the end.
    empty_dst: bool,
}

impl StagedFolder {
    /// Starts writing `dst`, which must not exist or be an empty folder (`verb`, what the user
    /// asked for, words the refusal: "export", "pack"). Creates the parent folders.
    pub(crate) fn new(dst: &Path, verb: &str) -> Result<StagedFolder, DataError> {
        let empty_dst = match fs::read_dir(dst) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(DataError::format(
                        dst,
                        format!(
                            "already exists and is not empty; {verb} to a new folder or delete it"
                        ),
                    ));
                }
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(DataError::io(dst, e)),
        };
        let name = dst
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| DataError::format(dst, "must end in a folder name"))?;
        let parent = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(|e| DataError::io(&parent, e))?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let staging = parent.join(format!(".{name}.partial-{}-{nanos}", std::process::id()));
        fs::create_dir(&staging).map_err(|e| DataError::io(&staging, e))?;
        Ok(StagedFolder {
            staging,
            dst: dst.to_path_buf(),
            empty_dst,
        })
    }

    /// The temporary folder to write into.
    pub(crate) fn path(&self) -> &Path {
        &self.staging
    }

    /// Moves the written folder into place (replacing the empty `dst`, if there was one).
    pub(crate) fn finish(self) -> Result<(), DataError> {
        if self.empty_dst {
            fs::remove_dir(&self.dst).map_err(|e| DataError::io(&self.dst, e))?;
        }
        fs::rename(&self.staging, &self.dst).map_err(|e| DataError::io(&self.dst, e))
    }
}

impl Drop for StagedFolder {
    fn drop(&mut self) {
        // After `finish` the temporary no longer exists and this does nothing.
        let _ = fs::remove_dir_all(&self.staging);
    }
}
