//! The training and evaluation loops, firing Composer's events in Composer's order
//! (`shared/reference/composer.md` §1.2).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tch::Device;

use crate::config::Config;
use crate::data::Loader;
use crate::engine::{Engine, Event, RunState, Stage};
use crate::model::Model;
use crate::optim::Optimizer;
use crate::report::{EvalRecord, EvalTime, PluginRecord, Reporter, RunRecord, TargetReached};
use crate::time::Timestamp;

mod build;
mod dist;
mod error;
mod eval;
mod export;
mod fit;
mod graph;
pub mod input;
mod losses;
pub mod metrics;
mod microbatch;
mod resume;
mod shard;
mod shard_save;
mod standalone;
mod step;
mod target;
mod tracking;

pub use build::load_datasets;
pub use error::{Result, TrainError};
pub use export::{export_checkpoint, export_peft};
pub use standalone::{standalone_config, PredictSummary};

/// A summary of a finished `fit`.
#[derive(Debug, Clone)]
pub struct FitSummary {
    /// The run record also written to `run.json`.
    pub record: RunRecord,
    /// The signal that interrupted the run (a checkpoint was written), if any.
    pub interrupted_by: Option<i32>,
}

/// The name of a signal number, for messages.
pub fn signal_name(signal: i32) -> &'static str {
    known_signal_name(signal).unwrap_or("a signal")
}

/// The name of a common signal number (`SIGKILL` for 9), or `None`.
pub fn known_signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => return None,
    })
}

/// Owns everything a run needs and runs it.
pub struct Trainer {
    config: Config,
    engine: Engine,
    /// The model, optimizer, clock and batch: what methods act on, and the one source of
    /// truth for the device, the precision and the clock.
    state: RunState,
    train_loader: Loader,
    /// The whole evaluation set (`tessera predict`).
    eval_loader: Loader,
    /// What evaluations score: the fixed subset of `train.eval_subset_batches` (and the choice,
    /// for the run record), or `None` for the whole set.
    eval_subset: Option<(Loader, crate::data::SubsetChoice)>,
    /// A text dataset's vocabulary, classes and special tokens (for the run record).
    text_facts: Option<crate::data::TextFacts>,
    /// The tokenizer file of a text run and its sha256 (`None` for `synthetic-text` and
    /// images).
    tokenizer: Option<crate::checkpoint::TokenizerFile>,
    reporter: Reporter,
    plugins: Vec<PluginRecord>,
    evals: Vec<EvalRecord>,
    /// When each of `evals` ran.
    eval_times: Vec<EvalTime>,
    last_eval_batch: Option<u64>,
    /// The finite training losses summed since the last metrics line (read from the device
    /// by `settle_steps`), and how many.
    running_loss: f64,
    running_batches: u64,
    /// Steps whose loss and non-finite flag are still on the device.
    pending: losses::Pending,
    /// Whether the loss scale was logged yet (`amp_fp16`: at the first check, then on change).
    scale_logged: bool,
    /// The device→host reads of the run (run.json's `host_reads`).
    host_reads: crate::sync::HostReads,
    /// Evaluation and prediction batches to the device (training epochs have their own).
    uploader: input::Uploader,
    /// `train.cuda_graphs`: the captured steps.
    graphs: Option<graph::StepGraphs>,
    /// Samples per forward/backward pass now (`train.microbatch_size`; "auto" halves it on
    /// out-of-memory errors).
    microbatch: usize,
    /// The reads (the observer's, the trainer's own) when `fit` started.
    reads_at_start: (u64, u64),
    train_seconds: f64,
    started: Instant,
    /// Wall seconds of the run before this process (recorded in the checkpoint it resumed).
    wall_before: f64,
    stop: Option<Arc<AtomicUsize>>,
    last_checkpoint_batch: Option<u64>,
    last_checkpoint: Option<PathBuf>,
    resumed_from: Option<PathBuf>,
    skipped_steps: u64,
    /// Samples the model trained on (fewer than the clock's when a method drops some).
    trained_samples: u64,
    /// Drop method metrics (while a resumed run replays `init`..`after_load`, whose metrics
    /// the original run already wrote).
    quiet_metrics: bool,
    purpose: Purpose,
    /// This rank's membership of a data-parallel run (none for a single process).
    dp: Option<dist::DataParallel>,
    /// The stop signal the ranks agreed on at the last step (data-parallel runs).
    agreed_stop: Option<i32>,
    /// Samples of the current step's batch after `after_dataloader` (this rank's).
    step_samples: u64,
    /// When an evaluation first met `train.target`.
    target_reached: Option<TargetReached>,
    /// What `[model] init_weights` loaded (run.json's `init_weights`).
    init_weights: Option<crate::model::InitReport>,
    /// The checkpoint whose weights started the run (`checkpoint.load` with `weights_only`).
    weights_from: Option<PathBuf>,
    /// Bytes the tensors held right after the last optimizer step (`crate::memory::peak`).
    memory_after_step: Option<u64>,
}

/// What a trainer was built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// Training (`Trainer::new`).
    Fit,
    /// Evaluating or predicting without training (`Trainer::standalone`).
    Standalone,
}

impl Trainer {
    /// Makes the run stop cleanly — finish the step, write a checkpoint, return — once `flag`
    /// holds a non-zero signal number (set by a signal handler).
    pub fn set_stop_flag(&mut self, flag: Arc<AtomicUsize>) {
        self.stop = Some(flag);
    }

    /// The signal that asked this run to stop: in a data-parallel run, the one the ranks agreed
    /// on at the last step, so that every rank stops after the same batch.
    fn stop_requested(&self) -> Option<i32> {
        if self.dp.is_some() {
            return self.agreed_stop;
        }
        self.stop_requested_locally()
    }

    /// The signal this process got, if any.
    fn stop_requested_locally(&self) -> Option<i32> {
        self.stop
            .as_ref()
            .map(|f| f.load(Ordering::SeqCst) as i32)
            .filter(|&s| s != 0)
    }

    /// The newest checkpoint this run wrote.
    pub fn last_checkpoint(&self) -> Option<&Path> {
        self.last_checkpoint.as_deref()
    }

    /// The checkpoint this run continued from.
    pub fn resumed_from(&self) -> Option<&Path> {
        self.resumed_from.as_deref()
    }

    /// The tokenizer file the run's text was encoded with (`None` for `synthetic-text` and
    /// images).
    pub fn tokenizer_path(&self) -> Option<&Path> {
        self.tokenizer.as_ref().map(|t| t.path.as_path())
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.state.model
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &Optimizer {
        &self.state.optimizer
    }

    /// The event engine (for per-event counts).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The training clock.
    pub fn timestamp(&self) -> &Timestamp {
        &self.state.clock.timestamp
    }

    /// The input shape the model was built for: the training loader's samples, after the
    /// methods' per-sample transforms.
    pub fn input_shape(&self) -> crate::model::InputShape {
        let (c, h, w) = self.train_loader.sample_shape();
        crate::model::InputShape {
            channels: c as i64,
            height: h as i64,
            width: w as i64,
        }
    }

    /// The training device.
    pub fn device(&self) -> Device {
        self.state.device()
    }

    /// Evaluations so far.
    pub fn evals(&self) -> &[EvalRecord] {
        &self.evals
    }

    fn fire_as(&mut self, event: Event, training: bool) -> Result<()> {
        self.state.clock.training = training;
        self.engine.fire(event, &mut Stage::Run(&mut self.state))?;
        self.after_slices()?;
        if !self.state.metrics.is_empty() {
            let metrics = std::mem::take(&mut self.state.metrics);
            if !self.quiet_metrics {
                self.reporter
                    .method_metrics(self.state.clock.timestamp.batch, &metrics);
            }
        }
        Ok(())
    }

    fn fire(&mut self, event: Event) -> Result<()> {
        self.fire_as(event, true)
    }
}
