//! `train.cuda_graphs`: the training step captured once in a CUDA graph and replayed per batch,
//! as `torch.cuda.graph` with whole-network capture: forward, backward, the loss scaler and the
//! fused optimizer step become one graph launch, so the host enqueues a step in microseconds
//! whatever the number of kernels.
//!
//! How: the first [`WARMUP_STEPS`] steps at a batch shape run eagerly (libtorch's lazy
//! initialisation, cuDNN's autotuning, the optimizer's state), then the step is captured on a
//! side stream (`csrc/graph.cpp`) with the batch's tensors as its static inputs, and replayed:
//! each later batch of that shape is copied into those inputs (a device copy, stream-ordered),
//! the learning rates are written into their device tensors ([`Optimizer::stage_lr`]), and the
//! graph runs. A batch of another shape (an epoch's smaller last batch, progressive resizing,
//! sequence-length warmup) runs eagerly; a shape that lasts [`WARMUP_STEPS`] steps is captured
//! anew. Everything the step writes is updated in place (parameters, gradients, optimizer state,
//! Adam's step counts, the loss scale), so eager steps and replays mix freely.
//!
//! What cannot be captured is refused at start, naming it ([`check`]): methods hooked inside the
//! captured part of the step (their hooks would run once, at capture), plugin modules (their
//! forward may draw on the host or keep state), data-parallel runs, `microbatch_size = "auto"`,
//! and optimizers whose step needs host numbers (Lion, `per_param`, decoupled SGD).
//! Methods at `after_dataloader`, `batch_start`, `batch_end` and the events outside steps run
//! eagerly as always (a method that changes the batch there changes what is copied in).

use std::ffi::{c_char, c_void, CStr};

use tch::{Device, Kind, Tensor};

use crate::config::Config;
use crate::engine::{Batch, Engine, Event};
use crate::model::Model;
use crate::optim::Optimizer;

use super::error::{fail, Result};
use super::Trainer;

extern "C" {
    fn tessera_graph_last_error() -> *const c_char;
    fn tessera_graph_available() -> i32;
    fn tessera_graph_new(device: i32) -> *mut c_void;
    fn tessera_graph_free(graph: *mut c_void);
    fn tessera_graph_capture_begin(graph: *mut c_void) -> i32;
    fn tessera_graph_capture_end(graph: *mut c_void) -> i32;
    fn tessera_graph_replay(graph: *mut c_void) -> i32;
}

/// Eager steps at a batch shape before it is captured (PyTorch's whole-network example warms
/// up for 3 iterations).
pub const WARMUP_STEPS: u32 = 3;

/// The events fired inside the captured part of a step: a method hooked at one of them would
/// run once, at capture, not at every step.
pub const CAPTURED_EVENTS: [Event; 9] = [
    Event::BEFORE_TRAIN_BATCH,
    Event::BEFORE_FORWARD,
    Event::AFTER_FORWARD,
    Event::BEFORE_LOSS,
    Event::AFTER_LOSS,
    Event::BEFORE_BACKWARD,
    Event::AFTER_BACKWARD,
    Event::AFTER_TRAIN_BATCH,
    Event::OPTIMIZER_STEP,
];

fn shim_error(doing: &str) -> String {
    // SAFETY: a NUL-terminated thread-local string, copied at once.
    let message = unsafe { CStr::from_ptr(tessera_graph_last_error()) }.to_string_lossy();
    format!("{doing}: {message}")
}

/// Whether this build can capture CUDA graphs (libtorch with CUDA, built with its headers).
pub fn available() -> bool {
    // SAFETY: no arguments.
    unsafe { tessera_graph_available() != 0 }
}

/// A CUDA graph of one device (`at::cuda::CUDAGraph`).
pub struct CudaGraph(*mut c_void);

impl CudaGraph {
    /// An empty graph for CUDA device `index`; an error naming the reason without CUDA.
    pub fn new(index: usize) -> std::result::Result<CudaGraph, String> {
        let index = i32::try_from(index).map_err(|_| format!("CUDA device {index}"))?;
        // SAFETY: plain call; the result is owned here (freed in `drop`) or null.
        let raw = unsafe { tessera_graph_new(index) };
        if raw.is_null() {
            return Err(shim_error("making a CUDA graph"));
        }
        Ok(CudaGraph(raw))
    }

    /// Captures what `body` enqueues on this thread's device (nothing runs until
    /// [`CudaGraph::replay`]). The capture ends, and the stream is restored, also when `body`
    /// fails; the error of `body` comes first.
    pub fn capture<T>(
        &mut self,
        body: impl FnOnce() -> Result<T>,
    ) -> std::result::Result<Result<T>, String> {
        // SAFETY: `self.0` is a live graph.
        if unsafe { tessera_graph_capture_begin(self.0) } != 0 {
            return Err(shim_error("starting a CUDA graph capture"));
        }
        let out = body();
        // SAFETY: as above; a capture is in progress.
        let ended = unsafe { tessera_graph_capture_end(self.0) };
        if ended != 0 && out.is_ok() {
            return Err(shim_error(
                "ending the CUDA graph capture (an operation in the step cannot be captured: a \
                 read on the host, a blocking copy, an allocation outside the graph's pool)",
            ));
        }
        Ok(out)
    }

    /// Runs the captured kernels once, on the current stream.
    pub fn replay(&self) -> std::result::Result<(), String> {
        // SAFETY: `self.0` is a live, captured graph.
        match unsafe { tessera_graph_replay(self.0) } {
            0 => Ok(()),
            _ => Err(shim_error("replaying the CUDA graph")),
        }
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: made by `tessera_graph_new`, freed once.
        unsafe { tessera_graph_free(self.0) }
    }
}

/// What a batch looks like to a captured graph: its entries' names, shapes and dtypes.
type Signature = Vec<(String, Vec<i64>, Kind)>;

fn signature(batch: &Batch) -> Signature {
    batch
        .keys()
        .into_iter()
        .filter_map(|k| {
            let t = batch.get(&k)?;
            Some((k.clone(), t.size(), t.kind()))
        })
        .collect()
}

/// A captured step: its graph, the static inputs it reads and the outputs it writes.
struct Captured {
    signature: Signature,
    graph: CudaGraph,
    inputs: Batch,
    loss: Option<Tensor>,
    flag: Option<Tensor>,
}

/// The captured steps of a run (one at a time: the current shape's).
pub(super) struct StepGraphs {
    device: usize,
    /// The shape of the last steps and how many ran eagerly at it in a row.
    shape: Option<Signature>,
    eager_at_shape: u32,
    captured: Option<Captured>,
    /// Captures made and replays run (the run log's summary).
    pub captures: u64,
    pub replays: u64,
}

impl StepGraphs {
    pub(super) fn new(device: usize) -> StepGraphs {
        StepGraphs {
            device,
            shape: None,
            eager_at_shape: 0,
            captured: None,
            captures: 0,
            replays: 0,
        }
    }
}

/// Why `train.cuda_graphs` cannot be used with this run, naming what is in the way; `Ok` when
/// it can.
pub(super) fn check(
    config: &Config,
    engine: &Engine,
    model: &Model,
    optimizer: &Optimizer,
    world: usize,
    device: Device,
) -> std::result::Result<(), String> {
    for event in CAPTURED_EVENTS {
        if let Some(method) = engine.methods_at(event).first() {
            return Err(format!(
                "method `{method}` runs at `{}`, inside the step that is captured: its hook \
                 would run once, when the graph is captured, not at every step (only methods at \
                 after_dataloader, batch_start, batch_end and outside the steps can run with \
                 CUDA graphs); remove it or set cuda_graphs = false",
                event.name()
            ));
        }
    }
    if let Some((path, kind)) = model.plugin_modules().first() {
        return Err(format!(
            "the model holds the plugin module `{kind}` (at `{path}`, from a method's \
             surgery): a plugin's forward may draw random numbers on the host or keep state, \
             which a captured graph would freeze; remove the method or set cuda_graphs = false"
        ));
    }
    if config.train.activation_checkpointing.is_some() {
        return Err(
            "train.activation_checkpointing recomputes units in backward with the \
             random generators' states saved and restored on the host, which a captured graph \
             would freeze; remove one of the two"
                .into(),
        );
    }
    optimizer.capturable()?;
    if config.train.microbatch_size == crate::config::MicrobatchSize::Auto {
        return Err(
            "microbatch_size = \"auto\" retries a pass after an out-of-memory error, which a \
             graph cannot; give a number"
                .into(),
        );
    }
    if world > 1 {
        return Err(format!(
            "a data-parallel run ({world} ranks) is not captured yet: its gradient \
             all-reduce runs in libtorch's reducer, outside the graph; use one rank"
        ));
    }
    let Device::Cuda(_) = device else {
        return Err(
            "needs a CUDA device, and this run trains on the CPU (train.device, or no GPU \
             found for \"auto\")"
                .into(),
        );
    };
    if !available() {
        return Err(
            "this build of Tessera has no CUDA graphs: it was built against a libtorch without \
             CUDA, or without the CUDA headers (scripts/ensure-libtorch.sh installs them from \
             PyPI)"
                .into(),
        );
    }
    Ok(())
}

impl Trainer {
    /// One training step with CUDA graphs: eager while a shape warms up, captured once it
    /// has, replayed after. The events outside the captured part fire as always.
    pub(super) fn train_batch_graphed(&mut self) -> Result<()> {
        let Some(graphs) = self.graphs.as_mut() else {
            return self.train_batch_eager();
        };
        let shape = signature(&self.state.batch);
        if graphs
            .captured
            .as_ref()
            .is_some_and(|c| c.signature == shape)
        {
            return self.replay_step();
        }
        if graphs.shape.as_ref() == Some(&shape) {
            graphs.eager_at_shape += 1;
        } else {
            graphs.shape = Some(shape.clone());
            graphs.eager_at_shape = 1;
        }
        if graphs.eager_at_shape <= WARMUP_STEPS {
            return self.train_batch_eager();
        }
        self.capture_step(shape)
    }

    /// Captures this batch's step, then replays it once (the capture itself runs nothing).
    fn capture_step(&mut self, shape: Signature) -> Result<()> {
        let Some(device) = self.graphs.as_ref().map(|g| g.device) else {
            return self.train_batch_eager();
        };
        // The graph's memory (activations, gradients, the loss) comes from its own pool: the
        // previous graph's is given back first.
        if let Some(graphs) = self.graphs.as_mut() {
            graphs.captured = None;
        }
        // Static inputs: copies of this batch that later batches are copied into.
        let mut inputs = self.state.batch.shallow_clone();
        for key in inputs.keys() {
            if let Some(t) = inputs.get(&key) {
                let copy = t.f_detach_copy()?;
                inputs.set(&key, copy);
            }
        }
        self.state.batch = inputs.shallow_clone();
        if let Err(e) = self.state.optimizer.prepare_capture() {
            fail!("train.cuda_graphs: {e}");
        }
        self.state.optimizer.stage_lr()?;
        let mut graph = match CudaGraph::new(device) {
            Ok(g) => g,
            Err(e) => fail!("train.cuda_graphs: {e}"),
        };
        let body = match graph.capture(|| self.step_body()) {
            Ok(body) => body,
            Err(e) => fail!("train.cuda_graphs: {e}"),
        };
        let (loss, flag) = body?;
        if let Err(e) = graph.replay() {
            fail!("train.cuda_graphs: {e}");
        }
        self.finish_step(loss.as_ref(), flag.as_ref())?;
        let batch = self.state.clock.timestamp.batch + 1;
        tracing::info!(
            "train.cuda_graphs: captured the step at batch {batch} (input {:?}); later batches of \
             this shape replay it",
            inputs.input().map(Tensor::size).unwrap_or_default()
        );
        if let Some(graphs) = self.graphs.as_mut() {
            graphs.captures += 1;
            graphs.captured = Some(Captured {
                signature: shape,
                graph,
                inputs,
                loss,
                flag,
            });
        }
        Ok(())
    }

    /// Copies this batch into the captured step's inputs and replays it.
    fn replay_step(&mut self) -> Result<()> {
        // Host numbers agreed per step (a stop request, the samples trained), as eager steps.
        let (stop, trained) = self.agree_step(self.tally.step_samples)?;
        self.agreed_stop = stop;
        self.tally.trained_samples += trained;
        let Some(captured) = self.graphs.as_ref().and_then(|g| g.captured.as_ref()) else {
            return self.train_batch_eager();
        };
        for key in captured.inputs.keys() {
            if let (Some(to), Some(from)) = (captured.inputs.get(&key), self.state.batch.get(&key))
            {
                // A device copy on the current stream: the replay reads it in order.
                to.shallow_clone().f_copy_(from)?;
            }
        }
        self.state.optimizer.stage_lr()?;
        self.state.optimizer.replayed_step();
        if let Err(e) = captured.graph.replay() {
            fail!("train.cuda_graphs: {e}");
        }
        let (loss, flag) = (
            captured.loss.as_ref().map(Tensor::shallow_clone),
            captured.flag.as_ref().map(Tensor::shallow_clone),
        );
        self.state.batch = captured.inputs.shallow_clone();
        if let Some(graphs) = self.graphs.as_mut() {
            graphs.replays += 1;
        }
        self.finish_step(loss.as_ref(), flag.as_ref())
    }
}
