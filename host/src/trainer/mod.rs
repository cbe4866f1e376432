//! The training and evaluation loops, firing Composer's events in Composer's order
//! (`shared/reference/composer.md` §1.2).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tch::Device;

use crate::config::Config;
use crate::engine::{Engine, Event, RunState, Stage};
use crate::model::Model;
use crate::optim::Optimizer;
use crate::report::{EvalRecord, Reporter, RunRecord};
use crate::time::Timestamp;

mod build;
mod data;
mod dist;
mod error;
mod eval;
mod export;
mod fit;
mod graph;
pub mod input;
mod losses;
mod methods;
pub mod metrics;
mod microbatch;
mod parts;
mod resume;
mod shard;
mod shard_save;
mod standalone;
mod start;
mod step;
mod target;
mod token_sets;
mod tracking;
mod watched;

pub use data::load_datasets;
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
    data: data::RunData,
    reporter: Reporter,
    history: parts::History,
    tally: parts::Tally,
    wall: parts::WallTime,
    saved: parts::Saved,
    /// Evaluation and prediction batches to the device (training epochs have their own).
    uploader: input::Uploader,
    /// `train.cuda_graphs`: the captured steps.
    graphs: Option<graph::StepGraphs>,
    /// Samples per forward/backward pass now (`train.microbatch_size`; "auto" halves it on
    /// out-of-memory errors).
    microbatch: usize,
    stop: Option<Arc<AtomicUsize>>,
    /// Drop method metrics (while a resumed run replays `init`..`after_load`, whose metrics
    /// the original run already wrote).
    quiet_metrics: bool,
    purpose: Purpose,
    /// This rank's membership of a data-parallel run (none for a single process).
    dp: Option<dist::DataParallel>,
    /// The stop signal the ranks agreed on at the last step (data-parallel runs).
    agreed_stop: Option<i32>,
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
        self.saved.last_checkpoint.as_deref()
    }

    /// The checkpoint this run continued from.
    pub fn resumed_from(&self) -> Option<&Path> {
        self.history.resumed_from.as_deref()
    }

    /// The tokenizer file the run's text was encoded with (`None` for `synthetic-text` and
    /// images).
    pub fn tokenizer_path(&self) -> Option<&Path> {
        self.data.tokenizer.as_ref().map(|t| t.path.as_path())
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
        self.data.input_shape()
    }

    /// The training device.
    pub fn device(&self) -> Device {
        self.state.device()
    }

    /// Evaluations so far.
    pub fn evals(&self) -> &[EvalRecord] {
        &self.history.evals
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
