//! Writing checkpoints and resuming runs from them: the trainer hands each component's part to
//! `checkpoint` and gives each part back to its component.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::checkpoint::{self, Checkpoint, Parts, SavedClock, TrainerMeta};
use crate::config;
use crate::engine::Event;
use crate::time::Timestamp;
use tch::Tensor;

use super::error::{fail, Context as _, Result};
use super::shard_save::SlicedSave;
use super::{Purpose, Trainer};

impl Trainer {
    /// Restores everything a checkpoint holds. Surgery already ran at `init`, so the model's
    /// tensors are the ones the checkpoint names; anything that does not fit is an error that
    /// says what differs.
    pub(super) fn apply_checkpoint(&mut self, path: &Path, c: Checkpoint) -> Result<()> {
        let theirs = c
            .meta
            .config
            .get("model")
            .map(|m| m.to_string())
            .unwrap_or_default();
        if let Some(ours) = &self.config.model.torchscript {
            let recorded = c.meta.config["model"]["sha256"].as_str();
            if let Some(recorded) = recorded.filter(|r| !r.eq_ignore_ascii_case(&ours.sha256)) {
                fail!(
                    "the checkpoint was trained from a TorchScript model with sha256 {recorded}, but {} now has sha256 {}: the model file changed, and its weights would not fit the graph they were trained in; restore the file, or start a new run",
                    ours.path.display(),
                    ours.sha256
                );
            }
        }
        // The per-rank batch of the run that wrote it (its global batch: that x its ranks).
        let saved_batch = c.meta.config["data"]["batch_size"].as_u64();
        let parts = c.into_parts()?;
        if self.purpose == Purpose::Fit {
            self.check_node_change(parts.trainer.data_nodes, &parts.clock.timestamp)?;
        }
        let world_changed = self.purpose == Purpose::Fit
            && self.check_world_change(parts.world_size, saved_batch, &parts.clock.timestamp)?;
        // The data position matters only to a run that goes on training.
        if self.purpose == Purpose::Fit
            && !world_changed
            && parts.clock.batches_per_epoch != self.state.clock.run.batches_per_epoch
        {
            fail!(
                "the checkpoint was written with {} batches per epoch, this run has {} (data.batch_size, drop_last or the dataset changed); the data position would not carry over",
                parts.clock.batches_per_epoch,
                self.state.clock.run.batches_per_epoch
            );
        }
        if let Err(e) = self.state.model.params.restore(&parts.model) {
            let ours = serde_json::to_string(&self.config.model).unwrap_or_default();
            fail!("the checkpoint does not fit this model ({e}); it was written for model {theirs}, this run builds {ours}");
        }
        self.state
            .optimizer
            .restore(&parts.optimizer, &self.state.model.params)?;
        self.engine
            .restore(parts.methods, &parts.disabled_methods, self.state.device())?;
        self.state.set_rng(parts.rng);
        // Dropout and methods' torch draws go on where the checkpoint left them.
        match &parts.torch_rng {
            Some(state) => checkpoint::torch_rng::set_cpu_state(state)?,
            None => tracing::warn!(
                "the checkpoint holds no libtorch generator state (written by an older Tessera); \
                 dropout draws after the resume differ from an uninterrupted run's"
            ),
        }
        let on_cuda = self.state.device().is_cuda();
        if let Some(missing) =
            checkpoint::torch_rng::set_cuda_states(&parts.torch_cuda_rng, on_cuda)?
        {
            tracing::warn!("{missing}");
        }
        self.restore_rank_streams(parts.ranks)?;
        self.state.clock.timestamp = parts.clock.timestamp;
        let t = parts.trainer;
        self.wall.train_seconds = t.train_seconds;
        self.history.evals = t.evals;
        self.history.eval_times = t.eval_times;
        self.wall.wall_before = t.wall_seconds;
        self.history.last_eval_batch = t.last_eval_batch;
        self.tally.running_batches = t.running_batches;
        self.tally.skipped_steps = t.skipped_steps;
        self.tally.trained_samples = t.trained_samples;
        self.history.target_reached = self.restored_target(t.target_reached);
        // The microbatch "auto" found goes on; a fixed size is the config's.
        if let (true, Some(size)) = (self.auto_microbatch(), t.microbatch_size) {
            self.microbatch = size;
        }
        match (&mut self.state.scaler, t.grad_scaler) {
            (Some(scaler), Some(saved)) => {
                *scaler = saved;
                // The run before the checkpoint logged the scale already.
                self.tally.scale_logged = true;
            }
            (Some(_), None) => tracing::warn!(
                "the checkpoint holds no loss-scaler state (it was not written under amp_fp16); the scale starts at its initial value"
            ),
            _ => {}
        }
        // The running loss is a host number (read once here; checkpoints before Tessera 0.2
        // held a float32 device sum, which converts exactly).
        self.tally.running_loss = match parts.running_loss {
            Some(l) => crate::sync::read_one(&l)?,
            None => 0.0,
        };
        self.saved.last_checkpoint_batch = Some(self.state.clock.timestamp.batch);
        self.history.resumed_from = Some(path.to_owned());
        Ok(())
    }

    /// Starts a new run from a checkpoint's model weights (`checkpoint.load` with
    /// `weights_only`): the model's tensors (after the methods' surgery at `init`, so the
    /// checkpoint must come from a run whose surgery made the same model), and the states of
    /// the methods this run shares with it (EMA's average goes on); the clock, optimizer,
    /// schedule, random streams and data order start afresh.
    pub(super) fn apply_weights_only(&mut self, path: &Path, c: Checkpoint) -> Result<()> {
        let parts = c.into_parts()?;
        if let Err(e) = self.state.model.params.restore(&parts.model) {
            fail!("the checkpoint's weights do not fit this model ({e}); a run with methods that change the model (surgery) must use the same ones: or export the checkpoint (`tessera export`) and give the file to `[model] init_weights`");
        }
        // This run's methods, by name (their states are not needed here).
        let ours: Vec<&str> = (0..).map_while(|i| self.engine.name_of(i)).collect();
        let (kept, left): (Vec<_>, Vec<_>) = parts
            .methods
            .into_iter()
            .partition(|r| ours.contains(&r.name.as_str()));
        if !left.is_empty() {
            let names: Vec<String> = left.iter().map(|r| r.name.clone()).collect();
            tracing::info!(
                "weights_only: the state of method(s) {} stays behind (not in this run)",
                names.join(", ")
            );
        }
        let carried: Vec<String> = kept
            .iter()
            .filter(|r| r.snapshot.is_some())
            .map(|r| r.name.clone())
            .collect();
        self.engine.restore(kept, &[], self.state.device())?;
        tracing::info!(
            "started from the weights of {} (epoch {}, batch {} of its run){}; a fresh clock, optimizer and schedule",
            path.display(),
            parts.clock.timestamp.epoch,
            parts.clock.timestamp.batch,
            if carried.is_empty() {
                String::new()
            } else {
                format!(", with the state of {}", carried.join(", "))
            }
        );
        self.history.weights_from = Some(path.to_owned());
        Ok(())
    }

    /// Writes a checkpoint of the current state to the checkpoint folder, points `latest` at it
    /// and applies the retention policy (`checkpoint.keep`).
    pub fn save_checkpoint(&mut self) -> Result<PathBuf> {
        let started = Instant::now();
        // The pending steps' losses are checked first: a non-finite loss under
        // `nonfinite_loss = "stop"` ends the run before a checkpoint is written; the running
        // loss and the loss scaler it saves are up to date.
        self.settle_steps()?;
        let folder = self.config.checkpoint.folder.clone();
        let path = folder.join(checkpoint::file_name(&self.state.clock.timestamp));
        // Data-parallel: ranks 1.. hand their random streams to rank 0, which writes; a sharded
        // optimizer state is gathered whole (every rank takes part).
        let ranks = self.gather_rank_parts()?;
        // Sharded checkpoint: every rank writes its own slices; else a sharded state is
        // gathered into rank 0's file.
        let sliced = self.write_slices(&path)?;
        let (sliced, optimizer) = match sliced {
            Some(Some(s)) => {
                let SlicedSave {
                    folder,
                    index,
                    sharded,
                    optimizer,
                } = s;
                (Some((folder, index, sharded)), Some(optimizer))
            }
            Some(None) => (None, None),
            None => {
                self.whole_parameters()?;
                (None, self.optimizer_snapshot()?)
            }
        };
        if !self.is_rank0() {
            self.saved.last_checkpoint_batch = Some(self.state.clock.timestamp.batch);
            self.saved.last_checkpoint = Some(path.clone());
            return Ok(path);
        }
        let metrics_bytes = self
            .reporter
            .flush()
            .with_context(|| format!("writing {}", self.reporter.metrics_path().display()))?;
        let parts = Parts {
            run_name: self.config.run_name.clone(),
            config: serde_json::to_value(&self.config)?,
            clock: SavedClock {
                timestamp: self.state.clock.timestamp.clone(),
                batches_per_epoch: self.state.clock.run.batches_per_epoch,
            },
            model: match &sliced {
                Some((_, _, sharded)) => self
                    .state
                    .model
                    .params
                    .named_tensors()
                    .into_iter()
                    .filter(|(n, _)| !sharded.contains(n))
                    .collect(),
                None => self.state.model.params.named_tensors(),
            },
            optimizer: optimizer.context("the optimizer's state on rank 0")?,
            methods: self.engine.records()?,
            disabled_methods: self
                .engine
                .disabled()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            rng: self.state.rng().clone(),
            trainer: self.trainer_meta(metrics_bytes),
            running_loss: (self.tally.running_batches > 0)
                .then(|| Tensor::from(self.tally.running_loss)),
            torch_rng: Some(checkpoint::torch_rng::cpu_state()?),
            torch_cuda_rng: checkpoint::torch_rng::cuda_states()?,
            world_size: self.world(),
            ranks,
        };
        let mut c = Checkpoint::from_parts(parts)?;
        let bytes = match sliced {
            Some((folder, index, _)) => {
                let pieces: u64 = index.files.iter().map(|f| f.bytes).sum();
                c.meta.shards = Some(index);
                let written = c
                    .write(&folder.join(checkpoint::sharded::INDEX))
                    .context("writing a checkpoint's index")?;
                finish_folder(&folder, &path)?;
                written + pieces
            }
            None => c.write(&path).context("writing a checkpoint")?,
        };
        checkpoint::update_latest(&folder, &path).with_context(|| {
            format!(
                "pointing {} at the new checkpoint",
                folder.join(checkpoint::LATEST).display()
            )
        })?;
        self.apply_retention(&folder, &path)?;
        self.saved.last_checkpoint_batch = Some(self.state.clock.timestamp.batch);
        self.saved.last_checkpoint = Some(path.clone());
        tracing::info!(
            "checkpoint {} ({:.2} MB in {:.0} ms)",
            path.display(),
            bytes as f64 / 1e6,
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(path)
    }

    /// The trainer's own part of a checkpoint: its clocks, evaluations, counts and what it
    /// found (`metrics_bytes`: the metrics file's length at the checkpoint).
    fn trainer_meta(&self, metrics_bytes: u64) -> TrainerMeta {
        TrainerMeta {
            train_seconds: self.wall.train_seconds,
            evals: self.history.evals.clone(),
            eval_times: self.history.eval_times.clone(),
            wall_seconds: self.wall_seconds(),
            last_eval_batch: self.history.last_eval_batch,
            running_batches: self.tally.running_batches,
            metrics_bytes,
            disabled: Vec::new(),
            skipped_steps: self.tally.skipped_steps,
            trained_samples: self.tally.trained_samples,
            grad_scaler: self.state.scaler.clone(),
            microbatch_size: Some(self.microbatch),
            data_nodes: self.data.train_loader.node_split(),
            target_reached: self.history.target_reached.clone(),
            tokenizer: self.data.tokenizer.clone(),
        }
    }

    /// Fires a `*_checkpoint` event, telling methods whether a checkpoint follows, and writes
    /// it when due: at `checkpoint.interval`, at the end of training and when a stop was
    /// requested.
    pub(super) fn checkpoint_event(&mut self, event: Event, previous: &Timestamp) -> Result<()> {
        let ck = &self.config.checkpoint;
        let interval_event = match event {
            Event::EPOCH_CHECKPOINT => Event::EPOCH_END,
            Event::ITERATION_CHECKPOINT => Event::ITERATION_END,
            _ => Event::BATCH_END,
        };
        let end = self.state.clock.run.reached(
            &self.state.clock.timestamp,
            &self.state.clock.run.max_duration,
        );
        let stop = event == Event::BATCH_CHECKPOINT && self.stop_requested().is_some();
        let due = ck.save
            && (self.due(&ck.interval, previous, interval_event)
                || ((end || stop)
                    && self.saved.last_checkpoint_batch != Some(self.state.clock.timestamp.batch)));
        self.state.checkpoint_pending = due;
        let fired = self.fire(event);
        self.state.checkpoint_pending = false;
        fired?;
        if due {
            self.save_checkpoint()?;
        }
        Ok(())
    }
}

/// The checkpoint a run starts from: `checkpoint.load` (must read), else with `autoresume` the
/// newest good one in the folder (corrupt or partial ones are skipped with a warning).
pub(super) fn find_resume_checkpoint(
    ck: &config::CheckpointConfig,
) -> Result<Option<(PathBuf, Checkpoint)>> {
    if let Some(path) = ck.load.as_ref().filter(|_| !ck.weights_only) {
        let c = Checkpoint::read(path).context("checkpoint.load")?;
        return Ok(Some((path.clone(), c)));
    }
    if !ck.autoresume {
        return Ok(None);
    }
    let found = checkpoint::latest_good(&ck.folder);
    if found.is_none() {
        tracing::info!(
            "autoresume: no usable checkpoint in {}; starting from the beginning",
            ck.folder.display()
        );
    }
    Ok(found)
}

/// Whether `file` lies directly in `folder` (comparing canonical paths when possible).
pub(super) fn same_folder(file: &Path, folder: &Path) -> bool {
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_owned());
    file.parent().map(canon) == Some(canon(folder))
}

/// The checkpoint whose weights start a new run: `checkpoint.load` with `weights_only`, unless
/// the run resumes (`resuming`: autoresume found a checkpoint of its own).
pub(super) fn weights_checkpoint(
    ck: &config::CheckpointConfig,
    resuming: bool,
) -> Result<Option<(PathBuf, Checkpoint)>> {
    match &ck.load {
        Some(path) if ck.weights_only && !resuming => {
            let c = Checkpoint::read(path).context("checkpoint.load")?;
            Ok(Some((path.clone(), c)))
        }
        Some(path) if ck.weights_only => {
            tracing::info!(
                "autoresume: continuing this run's checkpoint, not the weights of {}",
                path.display()
            );
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// Renames the complete folder of a sharded checkpoint to its name (replacing what was there),
/// durably.
fn finish_folder(folder: &Path, path: &Path) -> Result<()> {
    if path.is_dir() {
        std::fs::remove_dir_all(path).with_context(|| format!("replacing {}", path.display()))?;
    } else if path.exists() {
        std::fs::remove_file(path).with_context(|| format!("replacing {}", path.display()))?;
    }
    std::fs::rename(folder, path).with_context(|| format!("writing {}", path.display()))?;
    if let Some(parent) = path.parent() {
        if let Ok(d) = std::fs::File::open(parent) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}
