//! Sharded checkpoints (`checkpoint.sharded` under `[distributed] sharding`): every rank writes
//! its own slices of the sharded parameters and of their optimizer state into the checkpoint's
//! folder, and rank 0 writes the rest with the index ([`crate::checkpoint::sharded`]). Nothing
//! is gathered.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use tch::Tensor;

use crate::checkpoint::sharded::{write_pieces, PieceFile, ShardIndex, ShardedTensor};
use crate::checkpoint::{MODEL_PREFIX, OPTIMIZER_PREFIX};
use crate::files::TMP_PREFIX;
use crate::optim::Snapshot;

use super::error::{fail, Context as _, Result};
use super::Trainer;

/// What rank 0 needs to finish a sharded checkpoint.
pub(super) struct SlicedSave {
    /// The folder being filled, renamed to the checkpoint's path when complete.
    pub folder: PathBuf,
    /// Where the sharded tensors lie.
    pub index: ShardIndex,
    /// The sharded parameters (left out of rank 0's model and optimizer tensors).
    pub sharded: HashSet<String>,
    /// Rank 0's optimizer state, the sharded tensors left out.
    pub optimizer: Snapshot,
}

impl Trainer {
    /// Under sharding with `checkpoint.sharded`: writes this rank's slices for the checkpoint
    /// at `path` (collective). Returns `Some(Some(..))` on rank 0 (what it needs to write the
    /// index and rename the folder), `Some(None)` on the other ranks, and `None` when the
    /// checkpoint is a single file (no sharding, or `checkpoint.sharded = false`).
    pub(super) fn write_slices(&self, path: &Path) -> Result<Option<Option<SlicedSave>>> {
        let Some(dp) = &self.dp else {
            return Ok(None);
        };
        let Some(sharded) = dp
            .sharded
            .as_ref()
            .filter(|_| self.config.checkpoint.sharded)
        else {
            return Ok(None);
        };
        // `full`: what a method wrote into whole parameters goes to the shards first.
        sharded.release()?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .context("a checkpoint path without a file name")?;
        let parent = path.parent().unwrap_or(Path::new("."));
        let folder = parent.join(format!("{TMP_PREFIX}{name}.shards"));
        if dp.rank() == 0 {
            if folder.exists() {
                std::fs::remove_dir_all(&folder)
                    .with_context(|| format!("removing the stale {}", folder.display()))?;
            }
            std::fs::create_dir_all(&folder)
                .with_context(|| format!("creating {}", folder.display()))?;
        }
        dp.group.barrier()?;
        let snapshot = self.state.optimizer.snapshot();
        let buffers = self.state.optimizer.buffer_names();
        let state_of = |key: &str| snapshot.tensors.iter().find(|(n, _)| n == key);
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for piece in sharded.pieces().iter().filter(|p| p.len > 0) {
            tensors.push((
                format!("{MODEL_PREFIX}{}", piece.name),
                piece.tensor.shallow_clone(),
            ));
            for b in buffers {
                let key = format!("{}.{b}", piece.name);
                if let Some((_, t)) = state_of(&key) {
                    tensors.push((format!("{OPTIMIZER_PREFIX}{key}"), t.shallow_clone()));
                }
            }
        }
        let written = write_pieces(&folder, dp.rank(), &tensors).map_err(|e| e.to_string());
        // Every rank's outcome reaches rank 0 through the store, which waits for all of them.
        let n = dp.checkpoints;
        let key = |r: usize| format!("tessera/checkpoint/{n}/pieces{r}");
        dp.group
            .store_set(&key(dp.rank()), &serde_json::to_vec(&written)?)?;
        if dp.rank() != 0 {
            if let Err(e) = written {
                fail!("writing this rank's slices of the checkpoint: {e}");
            }
            return Ok(Some(None));
        }
        let mut files: Vec<PieceFile> = Vec::with_capacity(dp.world());
        for r in 0..dp.world() {
            let bytes = dp.group.store_get(&key(r))?;
            dp.group.store_delete(&key(r))?;
            let file: std::result::Result<PieceFile, String> = serde_json::from_slice(&bytes)?;
            match file {
                Ok(f) => files.push(f),
                Err(e) => fail!("rank {r} could not write its slices of the checkpoint: {e}"),
            }
        }
        let mut index = ShardIndex {
            world: dp.world(),
            files,
            tensors: Vec::new(),
        };
        let mut names = HashSet::new();
        for p in sharded.slices() {
            let entry = |name: String| ShardedTensor {
                name,
                size: p.size.clone(),
                strides: p.strides.clone(),
                slices: p.slices.clone(),
            };
            index
                .tensors
                .push(entry(format!("{MODEL_PREFIX}{}", p.name)));
            for b in buffers {
                let key = format!("{}.{b}", p.name);
                if state_of(&key).is_some() {
                    index
                        .tensors
                        .push(entry(format!("{OPTIMIZER_PREFIX}{key}")));
                }
            }
            names.insert(p.name);
        }
        let mut optimizer = snapshot;
        optimizer.tensors.retain(|(key, _)| {
            !buffers.iter().any(|b| {
                key.strip_suffix(&format!(".{b}"))
                    .is_some_and(|p| names.contains(p))
            })
        });
        Ok(Some(Some(SlicedSave {
            folder,
            index,
            sharded: names,
            optimizer,
        })))
    }
}
