//! Parts a [`Trainer`](super::Trainer) is made of besides its config, engine, run state and
//! data (`super::data::RunData`): the history its run record reports, the tally of its losses
//! and samples, its wall-clock time and the checkpoints it wrote.

use std::path::PathBuf;
use std::time::Instant;

use crate::model::InitReport;
use crate::report::{EvalRecord, EvalTime, PluginRecord, TargetReached};
use crate::sync::HostReads;

use super::losses;

/// What the run record (`run.json`) reports besides the clock and the tally, gathered as the
/// run goes.
pub(super) struct History {
    pub(super) plugins: Vec<PluginRecord>,
    pub(super) evals: Vec<EvalRecord>,
    /// When each of `evals` ran.
    pub(super) eval_times: Vec<EvalTime>,
    pub(super) last_eval_batch: Option<u64>,
    /// When an evaluation first met `train.target`.
    pub(super) target_reached: Option<TargetReached>,
    /// What `[model] init_weights` loaded (run.json's `init_weights`).
    pub(super) init_weights: Option<InitReport>,
    /// The checkpoint whose weights started the run (`checkpoint.load` with `weights_only`).
    pub(super) weights_from: Option<PathBuf>,
    pub(super) resumed_from: Option<PathBuf>,
    /// The device→host reads of the run (run.json's `host_reads`).
    pub(super) host_reads: HostReads,
    /// The reads (the observer's, the trainer's own) when `fit` started.
    pub(super) reads_at_start: (u64, u64),
    /// Bytes the tensors held right after the last optimizer step (`crate::memory::peak`).
    pub(super) memory_after_step: Option<u64>,
}

/// The training losses since the last metrics line, and the run's counts of steps and samples.
#[derive(Default)]
pub(super) struct Tally {
    /// The finite training losses summed since the last metrics line (read from the device
    /// by `settle_steps`), and how many.
    pub(super) running_loss: f64,
    pub(super) running_batches: u64,
    /// Steps whose loss and non-finite flag are still on the device.
    pub(super) pending: losses::Pending,
    /// Whether the loss scale was logged yet (`amp_fp16`: at the first check, then on change).
    pub(super) scale_logged: bool,
    pub(super) skipped_steps: u64,
    /// Samples the model trained on (fewer than the clock's when a method drops some).
    pub(super) trained_samples: u64,
    /// Samples of the current step's batch after `after_dataloader` (this rank's).
    pub(super) step_samples: u64,
}

/// Where the run's wall-clock time went.
pub(super) struct WallTime {
    pub(super) train_seconds: f64,
    pub(super) started: Instant,
    /// Wall seconds of the run before this process (recorded in the checkpoint it resumed).
    pub(super) wall_before: f64,
}

/// The checkpoints this run wrote.
#[derive(Default)]
pub(super) struct Saved {
    pub(super) last_checkpoint_batch: Option<u64>,
    pub(super) last_checkpoint: Option<PathBuf>,
}

impl History {
    /// A new run's history: its methods' plugins and what `[model] init_weights` loaded.
    pub(super) fn new(plugins: Vec<PluginRecord>, init_weights: Option<InitReport>) -> History {
        History {
            plugins,
            evals: Vec::new(),
            eval_times: Vec::new(),
            last_eval_batch: None,
            target_reached: None,
            init_weights,
            weights_from: None,
            resumed_from: None,
            host_reads: Default::default(),
            reads_at_start: (0, 0),
            memory_after_step: None,
        }
    }
}

impl WallTime {
    /// A run's wall time, which started at `started`.
    pub(super) fn new(started: Instant) -> WallTime {
        WallTime {
            train_seconds: 0.0,
            started,
            wall_before: 0.0,
        }
    }
}
