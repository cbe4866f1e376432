//! Data-parallel training on libtorch's c10d (`host/csrc/dist.cpp`): joining a group of ranks
//! from torchrun-style environment variables, collectives, the store, and c10d's `Reducer`,
//! which all-reduces gradients in buckets during the backward pass (PyTorch DDP's engine).
//!
//! A process is one rank. `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` say which and
//! where the group meets (`tessera launch` sets them, as do torchrun, Slurm scripts and
//! Kubernetes operators); without them, or with `WORLD_SIZE = 1`, a run has no group.
//!
//! CPU tensors always travel through Gloo; CUDA tensors through NCCL or Gloo
//! (`[distributed] backend`, [`Backend::choose`]). NCCL exists when the build found its headers
//! (see `host/build.rs`; [`nccl_built`]).

use std::ffi::{c_void, CStr, CString};
use std::time::Duration;

use tch::Tensor;

extern "C" {
    fn tessera_dist_last_error() -> *const std::ffi::c_char;
    fn tessera_dist_init(
        addr: *const std::ffi::c_char,
        port: i32,
        rank: i32,
        world: i32,
        timeout_ms: i64,
        op_timeout_ms: i64,
        backend: i32,
        cuda_device: i32,
    ) -> *mut c_void;
    fn tessera_dist_has_nccl() -> i32;
    fn tessera_dist_free(group: *mut c_void);
    fn tessera_dist_all_reduce(
        group: *mut c_void,
        tensors: *mut *mut c_void,
        n: i32,
        op: i32,
    ) -> i32;
    fn tessera_dist_broadcast(
        group: *mut c_void,
        tensors: *mut *mut c_void,
        n: i32,
        root: i32,
    ) -> i32;
    fn tessera_dist_barrier(group: *mut c_void) -> i32;
    fn tessera_dist_store_set(
        group: *mut c_void,
        key: *const std::ffi::c_char,
        data: *const u8,
        len: usize,
    ) -> i32;
    fn tessera_dist_store_get(
        group: *mut c_void,
        key: *const std::ffi::c_char,
        out: *mut c_void,
        put: extern "C" fn(*mut c_void, *const u8, usize),
    ) -> i32;
    fn tessera_dist_store_delete(group: *mut c_void, key: *const std::ffi::c_char) -> i32;
    fn tessera_dist_all_reduce_autograd(group: *mut c_void, input: *mut c_void) -> *mut c_void;
    fn tessera_dist_reducer_new(
        group: *mut c_void,
        params: *mut *mut c_void,
        n: i32,
        bucket_cap_bytes: i64,
        find_unused: i32,
        bucket_view: i32,
    ) -> *mut c_void;
    fn tessera_dist_reducer_free(reducer: *mut c_void);
    fn tessera_dist_reducer_prepare_forward(reducer: *mut c_void) -> i32;
    fn tessera_dist_reducer_prepare_backward(reducer: *mut c_void, loss: *mut c_void) -> i32;
    fn tessera_dist_reducer_stats(reducer: *mut c_void, out: *mut i64) -> i32;
    fn tessera_dist_all_gather_base(
        group: *mut c_void,
        out: *mut c_void,
        input: *mut c_void,
        release: i32,
    ) -> i32;
}

pub mod full;
pub mod shard;
pub mod slices;
pub mod watch;

/// A failure of the group: joining it, or a collective (a rank failed or left).
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// The environment describes no valid rank.
    #[error("{0}")]
    Env(String),
    /// libtorch's c10d failed.
    #[error("{what}: {message}")]
    C10d {
        /// What Tessera was doing.
        what: String,
        /// c10d's message.
        message: String,
    },
}

/// The last shim error on this thread.
fn last_error() -> String {
    // SAFETY: the shim returns a NUL-terminated thread-local string that lives until the next
    // failing call on this thread; it is copied at once.
    sentences(&unsafe { CStr::from_ptr(tessera_dist_last_error()) }.to_string_lossy())
}

/// A libtorch message without the C++ source location and stack frames that may end it, on
/// one line.
fn sentences(text: &str) -> String {
    text.lines()
        .take_while(|l| !l.starts_with("Exception raised from") && !l.starts_with("frame #"))
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn check(rc: i32, what: impl FnOnce() -> String) -> Result<(), DistError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(DistError::C10d {
            what: what(),
            message: last_error(),
        })
    }
}

/// `[distributed] backend`: what carries the CUDA tensors' collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// NCCL when the device is CUDA (Gloo when this build has no NCCL, with a warning), Gloo
    /// on the CPU (default).
    #[default]
    Auto,
    /// NCCL: GPU to GPU (NVLink, InfiniBand, sockets); needs a CUDA device and a build with it.
    Nccl,
    /// Gloo: CUDA tensors through host copies.
    Gloo,
}

impl Backend {
    /// Accepted spellings, for the config reader.
    pub const CHOICES: [(&'static str, Backend); 3] = [
        ("auto", Backend::Auto),
        ("nccl", Backend::Nccl),
        ("gloo", Backend::Gloo),
    ];

    /// The backend of CUDA tensors for a run on `device`, given whether this build has NCCL:
    /// the choice and, when `auto` could not have NCCL, a warning that says why.
    pub fn choose(
        self,
        device: tch::Device,
        nccl_built: bool,
    ) -> Result<(Collectives, Option<String>), DistError> {
        let no_nccl = "this Tessera was built without c10d's NCCL backend (its build found no \
                       NCCL and CUDA headers next to libtorch, or a libtorch without CUDA; \
                       scripts/ensure-libtorch.sh installs them, see docs/distributed.md)";
        match (self, device.is_cuda()) {
            (Backend::Gloo, _) | (Backend::Auto, false) => Ok((Collectives::Gloo, None)),
            (Backend::Nccl, false) => Err(DistError::Env(format!(
                "[distributed] backend = \"nccl\" needs a CUDA device, and train.device \
                 resolved to {device:?}; use backend = \"gloo\" (or \"auto\") on the CPU"
            ))),
            (Backend::Nccl, true) if !nccl_built => Err(DistError::Env(format!(
                "[distributed] backend = \"nccl\": {no_nccl}; backend = \"gloo\" all-reduces \
                 CUDA tensors through host copies"
            ))),
            (Backend::Auto, true) if !nccl_built => Ok((
                Collectives::Gloo,
                Some(format!(
                    "[distributed] backend = \"auto\" on CUDA uses Gloo (gradients through host \
                     copies, much slower than NCCL): {no_nccl}"
                )),
            )),
            (Backend::Nccl | Backend::Auto, true) => Ok((Collectives::Nccl, None)),
        }
    }
}

/// What carries a group's CUDA tensors (CPU tensors always go through Gloo).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Collectives {
    /// Gloo, through host copies.
    Gloo,
    /// NCCL.
    Nccl,
}

/// Whether this build has c10d's NCCL backend (`host/build.rs` found its headers and a
/// libtorch with CUDA).
pub fn nccl_built() -> bool {
    // SAFETY: plain C call without arguments.
    unsafe { tessera_dist_has_nccl() == 1 }
}

/// Where this process stands in a data-parallel run, from torchrun-style environment variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnv {
    /// This process's rank, 0..world.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Rank on this machine (`LOCAL_RANK`, default the rank).
    pub local_rank: usize,
    /// Ranks on this machine (`LOCAL_WORLD_SIZE`, default the world).
    pub local_world: usize,
    /// Address of rank 0's store (`MASTER_ADDR`).
    pub master_addr: String,
    /// Port of rank 0's store (`MASTER_PORT`).
    pub master_port: u16,
}

impl RankEnv {
    /// This process's place on its machine (which GPU `train.device = "auto"` gives it).
    pub fn local(&self) -> crate::device::LocalRank {
        crate::device::LocalRank {
            rank: self.local_rank,
            world: self.local_world,
        }
    }

    /// Machines (nodes) in the run: ranks / ranks per node, rounded up (a run whose last
    /// node has fewer ranks still rents it). 1 when `LOCAL_WORLD_SIZE` is not set.
    pub fn nodes(&self) -> usize {
        self.world.div_ceil(self.local_world.max(1))
    }

    /// The rank this process's environment describes; `None` for a single-process run (no
    /// `WORLD_SIZE`, or `WORLD_SIZE = 1`).
    pub fn from_env() -> Result<Option<RankEnv>, DistError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`RankEnv::from_env`] over any variable lookup (for tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<RankEnv>, DistError> {
        let number = |key: &str| -> Result<Option<usize>, DistError> {
            match var(key) {
                None => Ok(None),
                Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
                    DistError::Env(format!(
                        "{key}={v:?} is not a non-negative whole number (data-parallel \
                         environment; see docs/distributed.md)"
                    ))
                }),
            }
        };
        let Some(world) = number("WORLD_SIZE")? else {
            return Ok(None);
        };
        if world == 0 {
            return Err(DistError::Env(
                "WORLD_SIZE=0: a run needs at least one rank".into(),
            ));
        }
        let rank = number("RANK")?;
        if world == 1 && rank.unwrap_or(0) == 0 {
            return Ok(None);
        }
        let rank = rank.ok_or_else(|| {
            DistError::Env(format!(
                "WORLD_SIZE={world} but RANK is not set: every process of a data-parallel run \
                 needs its RANK (tessera launch sets it)"
            ))
        })?;
        if rank >= world {
            return Err(DistError::Env(format!(
                "RANK={rank} is not below WORLD_SIZE={world}"
            )));
        }
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".to_owned());
        let master_port = match var("MASTER_PORT") {
            None => {
                return Err(DistError::Env(format!(
                    "WORLD_SIZE={world} but MASTER_PORT is not set: the ranks meet at \
                     MASTER_ADDR:MASTER_PORT (tessera launch sets both)"
                )))
            }
            Some(p) => p
                .trim()
                .parse::<u16>()
                .map_err(|_| DistError::Env(format!("MASTER_PORT={p:?} is not a port number")))?,
        };
        Ok(Some(RankEnv {
            rank,
            world,
            local_rank: number("LOCAL_RANK")?.unwrap_or(rank),
            local_world: number("LOCAL_WORLD_SIZE")?.unwrap_or(world).max(1),
            master_addr,
            master_port,
        }))
    }
}

/// This process's (rank, world size, local rank) while it is a member of a group; (0, 1, 0)
/// otherwise. What plugins see (`Context::ranks`).
pub fn process_ranks() -> (usize, usize, usize) {
    match RANKS.read() {
        Ok(r) => *r,
        Err(poisoned) => *poisoned.into_inner(),
    }
}

static RANKS: std::sync::RwLock<(usize, usize, usize)> = std::sync::RwLock::new((0, 1, 0));

fn set_process_ranks(value: (usize, usize, usize)) {
    match RANKS.write() {
        Ok(mut r) => *r = value,
        Err(poisoned) => *poisoned.into_inner() = value,
    }
}

/// The run's group as plugins reach it (`Context::all_gather`, plugin-api 1.9): held weakly,
/// so the group still ends with the run that joined it.
static PLUGIN_GROUP: std::sync::RwLock<Option<std::sync::Weak<Group>>> =
    std::sync::RwLock::new(None);

/// Makes `group` the one plugins' collectives go through (until it is dropped).
pub fn set_plugin_group(group: &std::sync::Arc<Group>) {
    let weak = Some(std::sync::Arc::downgrade(group));
    match PLUGIN_GROUP.write() {
        Ok(mut g) => *g = weak,
        Err(poisoned) => *poisoned.into_inner() = weak,
    }
}

/// The group plugins' collectives go through, while the run holds it.
pub(crate) fn plugin_group() -> Option<std::sync::Arc<Group>> {
    match PLUGIN_GROUP.read() {
        Ok(g) => g.as_ref().and_then(std::sync::Weak::upgrade),
        Err(poisoned) => poisoned
            .into_inner()
            .as_ref()
            .and_then(std::sync::Weak::upgrade),
    }
}

/// Every rank's `input` stacked in rank order, `(world, *shape)`, through the run's group; a
/// copy of `input` with a leading dimension of 1 outside a data-parallel run. `input` keeps
/// its value. What a plugin's `Context::all_gather` calls.
pub fn all_gather_stacked(input: &Tensor) -> Result<Tensor, DistError> {
    let group = plugin_group();
    let failed = |e: tch::TchError| DistError::C10d {
        what: "all-gather".into(),
        message: e.to_string(),
    };
    if !input.defined() {
        return Err(DistError::Env("all-gather of an undefined tensor".into()));
    }
    let Some(group) = group else {
        return input
            .f_unsqueeze(0)
            .and_then(|t| t.f_contiguous())
            .map_err(failed);
    };
    let _no_grad = tch::no_grad_guard();
    let mut shape = input.size();
    shape.insert(0, group.world as i64);
    let numel = input.numel() as i64;
    let out = Tensor::f_empty([group.world as i64 * numel], (input.kind(), input.device()))
        .map_err(failed)?;
    // A flat contiguous copy (the collective frees its input's memory; Gloo wants the output
    // `world` times the input along the first dimension).
    let mine = input
        .f_detach_copy()
        .and_then(|t| t.f_reshape([numel]))
        .and_then(|t| t.f_contiguous())
        .map_err(failed)?;
    group.all_gather_base(&out, mine)?;
    out.f_view(shape.as_slice()).map_err(failed)
}

/// A reduction over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

/// This process's membership of a group of ranks (c10d process group: Gloo, and NCCL for CUDA
/// tensors when chosen; TCP store).
pub struct Group {
    handle: *mut c_void,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// What carries CUDA tensors.
    pub collectives: Collectives,
}

// SAFETY: c10d's process group and store are thread-safe objects; the handle is only freed in
// `Drop`.
unsafe impl Send for Group {}
// SAFETY: as above: every call goes through c10d, which serialises its own state.
unsafe impl Sync for Group {}

fn ptrs(tensors: &[&Tensor]) -> Vec<*mut c_void> {
    tensors.iter().map(|t| t.as_ptr() as *mut c_void).collect()
}

impl Group {
    /// Joins the group `env` describes: waits up to `rendezvous` for every rank to reach rank
    /// 0's store; collectives then fail after `timeout` without an answer. CUDA tensors go
    /// through `collectives` (NCCL on `device`, which must then be a CUDA device).
    pub fn join(
        env: &RankEnv,
        rendezvous: Duration,
        timeout: Duration,
        collectives: Collectives,
        device: tch::Device,
    ) -> Result<Group, DistError> {
        let (backend, cuda_device) = match (collectives, device) {
            (Collectives::Gloo, _) => (0, -1),
            (Collectives::Nccl, tch::Device::Cuda(i)) => (1, i as i32),
            (Collectives::Nccl, other) => {
                return Err(DistError::Env(format!(
                    "NCCL needs a CUDA device, not {other:?}"
                )))
            }
        };
        let addr = CString::new(env.master_addr.clone())
            .map_err(|_| DistError::Env("MASTER_ADDR holds a NUL byte".into()))?;
        // SAFETY: `addr` is a NUL-terminated string alive for the call.
        let handle = unsafe {
            tessera_dist_init(
                addr.as_ptr(),
                i32::from(env.master_port),
                env.rank as i32,
                env.world as i32,
                rendezvous.as_millis().min(i64::MAX as u128) as i64,
                timeout.as_millis().min(i64::MAX as u128) as i64,
                backend,
                cuda_device,
            )
        };
        if handle.is_null() {
            let message = last_error();
            let hint = if message.contains("Timed out") || message.contains("timed out") {
                format!(
                    " — not every rank arrived within {:.0} s ([distributed] rendezvous_timeout); \
                     check that all {} ranks were started and can reach {}:{}",
                    rendezvous.as_secs_f64(),
                    env.world,
                    env.master_addr,
                    env.master_port
                )
            } else {
                String::new()
            };
            return Err(DistError::C10d {
                what: format!(
                    "rank {} of {}: joining the group at {}:{}{}",
                    env.rank,
                    env.world,
                    env.master_addr,
                    env.master_port,
                    match collectives {
                        Collectives::Nccl => format!(" (NCCL on cuda:{cuda_device})"),
                        Collectives::Gloo => String::new(),
                    }
                ),
                message: format!("{message}{hint}"),
            });
        }
        set_process_ranks((env.rank, env.world, env.local_rank));
        Ok(Group {
            handle,
            rank: env.rank,
            world: env.world,
            collectives,
        })
    }

    /// Reduces `tensor` (contiguous) in place over the ranks.
    pub fn all_reduce(&self, tensor: &Tensor, op: Op) -> Result<(), DistError> {
        let mut p = ptrs(&[tensor]);
        let op = match op {
            Op::Sum => 0,
            Op::Max => 1,
            Op::Min => 2,
        };
        // SAFETY: `p` holds live `at::Tensor*` of tch tensors borrowed for the call.
        check(
            unsafe { tessera_dist_all_reduce(self.handle, p.as_mut_ptr(), p.len() as i32, op) },
            || "all-reduce".into(),
        )
    }

    /// Reduces a few numbers over the ranks (one small all-reduce): each rank's `values`, the
    /// same length everywhere, combined element by element.
    pub fn all_reduce_values(&self, values: &[f64], op: Op) -> Result<Vec<f64>, DistError> {
        let failed = |e: tch::TchError| DistError::C10d {
            what: "all-reduce of values".into(),
            message: e.to_string(),
        };
        let t = Tensor::f_from_slice(values).map_err(failed)?;
        self.all_reduce(&t, op)?;
        Vec::<f64>::try_from(&t).map_err(failed)
    }

    /// Overwrites `tensor` (contiguous) on every rank with `root`'s.
    pub fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<(), DistError> {
        let mut p = ptrs(&[tensor]);
        // SAFETY: as in `all_reduce`.
        check(
            unsafe {
                tessera_dist_broadcast(self.handle, p.as_mut_ptr(), p.len() as i32, root as i32)
            },
            || format!("broadcast from rank {root}"),
        )
    }

    /// Fills `out` (contiguous, `world × n` elements) with every rank's `input` (`n`
    /// elements), in rank order. `input` must not alias `out`; it is consumed: its memory is
    /// freed as soon as the collective is done.
    pub fn all_gather_base(&self, out: &Tensor, input: Tensor) -> Result<(), DistError> {
        // SAFETY: both are live `at::Tensor*` of tch tensors for the call; the shim frees
        // `input`'s memory, and `input` is dropped right after without being read.
        check(
            unsafe {
                tessera_dist_all_gather_base(self.handle, out.as_ptr() as _, input.as_ptr() as _, 1)
            },
            || "all-gather".into(),
        )
    }

    /// Waits until every rank reaches this call.
    pub fn barrier(&self) -> Result<(), DistError> {
        // SAFETY: the handle is live.
        check(unsafe { tessera_dist_barrier(self.handle) }, || {
            "barrier".into()
        })
    }

    /// Publishes `value` under `key` in the group's store.
    pub fn store_set(&self, key: &str, value: &[u8]) -> Result<(), DistError> {
        let k = CString::new(key).map_err(|_| DistError::Env("store key with NUL".into()))?;
        // SAFETY: `k` and `value` live for the call.
        check(
            unsafe { tessera_dist_store_set(self.handle, k.as_ptr(), value.as_ptr(), value.len()) },
            || format!("publishing `{key}`"),
        )
    }

    /// Waits for `key` in the store (up to the collective timeout) and returns its value.
    pub fn store_get(&self, key: &str) -> Result<Vec<u8>, DistError> {
        extern "C" fn put(out: *mut c_void, data: *const u8, len: usize) {
            // SAFETY: `out` is the `Vec<u8>` below and `data` holds `len` bytes for this call.
            unsafe {
                let out = &mut *(out as *mut Vec<u8>);
                out.extend_from_slice(std::slice::from_raw_parts(data, len));
            }
        }
        let k = CString::new(key).map_err(|_| DistError::Env("store key with NUL".into()))?;
        let mut value: Vec<u8> = Vec::new();
        // SAFETY: `value` outlives the call; `put` only appends to it.
        check(
            unsafe {
                tessera_dist_store_get(
                    self.handle,
                    k.as_ptr(),
                    &mut value as *mut Vec<u8> as *mut c_void,
                    put,
                )
            },
            || format!("waiting for `{key}` from another rank"),
        )?;
        Ok(value)
    }

    /// Removes `key` from the store.
    pub fn store_delete(&self, key: &str) -> Result<(), DistError> {
        let k = CString::new(key).map_err(|_| DistError::Env("store key with NUL".into()))?;
        // SAFETY: `k` lives for the call.
        check(
            unsafe { tessera_dist_store_delete(self.handle, k.as_ptr()) },
            || format!("removing `{key}`"),
        )
    }

    /// The sum of `input` over the ranks as a differentiable operation: its gradient is the sum
    /// over the ranks of the result's gradient (synchronised batch norm's statistics).
    pub fn all_reduce_autograd(&self, input: &Tensor) -> Result<Tensor, DistError> {
        // SAFETY: `input` is a live tensor; the shim returns a new `at::Tensor*` that we own.
        let out = unsafe { tessera_dist_all_reduce_autograd(self.handle, input.as_ptr() as _) };
        if out.is_null() {
            return Err(DistError::C10d {
                what: "all-reduce (batch-norm statistics)".into(),
                message: last_error(),
            });
        }
        // SAFETY: a fresh `at::Tensor*` from the shim, owned by the returned tensor.
        Ok(unsafe { Tensor::from_ptr(out.cast()) })
    }

    /// c10d's `Reducer` over `params` (the trainable parameters, identical on every rank):
    /// from now on, a backward pass announced with [`GradReducer::prepare_backward`] leaves
    /// every parameter's gradient averaged over the ranks. With `bucket_view` the gradients
    /// live in the reducer's buckets (PyTorch DDP's `gradient_as_bucket_view`: no second copy).
    pub fn reducer(
        &self,
        params: &[&Tensor],
        bucket_bytes: i64,
        find_unused: bool,
        bucket_view: bool,
    ) -> Result<GradReducer, DistError> {
        let mut p = ptrs(params);
        // SAFETY: `p` holds live tensors; c10d keeps its own references to them.
        let handle = unsafe {
            tessera_dist_reducer_new(
                self.handle,
                p.as_mut_ptr(),
                p.len() as i32,
                bucket_bytes,
                i32::from(find_unused),
                i32::from(bucket_view),
            )
        };
        if handle.is_null() {
            return Err(DistError::C10d {
                what: "setting up the gradient all-reduce".into(),
                message: last_error(),
            });
        }
        Ok(GradReducer { handle })
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        set_process_ranks((0, 1, 0));
        // SAFETY: made by `tessera_dist_init`, freed once.
        unsafe { tessera_dist_free(self.handle) }
    }
}

/// PyTorch DDP's timing of the sampled steps (c10d's logger), in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ReducerStats {
    /// Forward pass.
    pub forward: f64,
    /// Backward computation.
    pub backward_compute: f64,
    /// Gradient communication, from the first bucket's all-reduce to the last one's end.
    pub backward_comm: f64,
    /// Time communication and backward computation ran together.
    pub overlap: f64,
}

/// c10d's gradient reducer (see [`Group::reducer`]).
pub struct GradReducer {
    handle: *mut c_void,
}

// SAFETY: used from the training thread only; moved with the trainer.
unsafe impl Send for GradReducer {}

impl GradReducer {
    /// Before the forward pass of a step whose gradients are all-reduced.
    pub fn prepare_forward(&self) -> Result<(), DistError> {
        // SAFETY: the handle is live.
        check(
            unsafe { tessera_dist_reducer_prepare_forward(self.handle) },
            || "gradient all-reduce (forward)".into(),
        )
    }

    /// Before `loss.backward()`: that backward pass all-reduces the gradients.
    pub fn prepare_backward(&self, loss: &Tensor) -> Result<(), DistError> {
        // SAFETY: the handle and the tensor are live.
        check(
            unsafe { tessera_dist_reducer_prepare_backward(self.handle, loss.as_ptr() as _) },
            || "gradient all-reduce".into(),
        )
    }

    /// The averaged timings so far (zero until c10d measured some steps).
    pub fn stats(&self) -> Result<ReducerStats, DistError> {
        let mut out = [0i64; 4];
        // SAFETY: `out` holds the 4 values the shim writes.
        check(
            unsafe { tessera_dist_reducer_stats(self.handle, out.as_mut_ptr()) },
            || "reading the all-reduce timings".into(),
        )?;
        let s = |ns: i64| ns as f64 / 1e9;
        Ok(ReducerStats {
            forward: s(out[0]),
            backward_compute: s(out[1]),
            backward_comm: s(out[2]),
            overlap: s(out[3]),
        })
    }
}

impl Drop for GradReducer {
    fn drop(&mut self) {
        // SAFETY: made by `tessera_dist_reducer_new`, freed once.
        unsafe { tessera_dist_reducer_free(self.handle) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Option<RankEnv>, DistError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RankEnv::from_vars(|k| map.get(k).cloned())
    }

    #[test]
    fn no_world_is_a_single_process() {
        assert_eq!(env(&[]).unwrap(), None);
        assert_eq!(env(&[("WORLD_SIZE", "1"), ("RANK", "0")]).unwrap(), None);
    }

    #[test]
    fn torchrun_variables_are_read() {
        let e = env(&[
            ("WORLD_SIZE", "4"),
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.world, e.local_rank, e.local_world), (3, 4, 1, 2));
        assert_eq!(e.nodes(), 2, "4 ranks, 2 per node");
        assert_eq!((e.master_addr.as_str(), e.master_port), ("10.0.0.1", 29500));
    }

    #[test]
    fn bad_variables_are_named() {
        let msg = |p: &[(&str, &str)]| env(p).unwrap_err().to_string();
        assert!(msg(&[("WORLD_SIZE", "two")]).contains("WORLD_SIZE"));
        assert!(msg(&[("WORLD_SIZE", "2")]).contains("RANK is not set"));
        assert!(
            msg(&[("WORLD_SIZE", "2"), ("RANK", "2"), ("MASTER_PORT", "1")]).contains("not below")
        );
        assert!(msg(&[("WORLD_SIZE", "2"), ("RANK", "1")]).contains("MASTER_PORT"));
        assert!(
            msg(&[("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_PORT", "99999")]).contains("port")
        );
    }

    #[test]
    fn the_backend_follows_the_device() {
        let cuda = tch::Device::Cuda(1);
        let cpu = tch::Device::Cpu;
        for built in [true, false] {
            assert_eq!(
                Backend::Auto.choose(cpu, built).unwrap(),
                (Collectives::Gloo, None)
            );
            assert_eq!(
                Backend::Gloo.choose(cpu, built).unwrap(),
                (Collectives::Gloo, None)
            );
            assert_eq!(
                Backend::Gloo.choose(cuda, built).unwrap(),
                (Collectives::Gloo, None)
            );
            let e = Backend::Nccl.choose(cpu, built).unwrap_err().to_string();
            assert!(
                e.contains("backend = \"nccl\" needs a CUDA device") && e.contains("Cpu"),
                "{e}"
            );
        }
        assert_eq!(
            Backend::Auto.choose(cuda, true).unwrap(),
            (Collectives::Nccl, None)
        );
        assert_eq!(
            Backend::Nccl.choose(cuda, true).unwrap(),
            (Collectives::Nccl, None)
        );
        // A build without NCCL: auto falls back to Gloo and says why; nccl is an error.
        let (c, warning) = Backend::Auto.choose(cuda, false).unwrap();
        assert_eq!(c, Collectives::Gloo);
        let warning = warning.unwrap();
        assert!(
            warning.contains("uses Gloo") && warning.contains("without c10d's NCCL"),
            "{warning}"
        );
        let e = Backend::Nccl.choose(cuda, false).unwrap_err().to_string();
        assert!(
            e.contains("built without c10d's NCCL backend") && e.contains("gloo"),
            "{e}"
        );
    }

    #[test]
    fn this_build_has_nccl_when_its_libtorch_has_cuda() {
        // build.rs compiles the NCCL backend when libtorch_cuda and the headers are there, as
        // they are for the PyPI CUDA wheel that scripts/ensure-libtorch.sh installs.
        if env!("TESSERA_LIBTORCH_HAS_CUDA") == "1" {
            assert!(
                nccl_built(),
                "libtorch has CUDA but the c10d shim was built without NCCL"
            );
        }
    }

    /// Joins a one-rank group on a port the system just gave out. Another test of this binary
    /// can take that port between its release and the store's bind (rank 0's TCP store then
    /// fails with "Address already in use"), and a store left by a failed join can still hold
    /// its port: such a try is repeated on a fresh port.
    fn join_alone(collectives: Collectives, device: tch::Device) -> Result<Group, DistError> {
        let mut tries = 0;
        loop {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .unwrap();
            let env = RankEnv {
                rank: 0,
                world: 1,
                local_rank: 0,
                local_world: 1,
                master_addr: "127.0.0.1".into(),
                master_port: port,
            };
            let joined = Group::join(
                &env,
                Duration::from_secs(20),
                Duration::from_secs(20),
                collectives,
                device,
            );
            match joined {
                Err(e) if tries < 5 && e.to_string().contains("already in use") => tries += 1,
                other => return other,
            }
        }
    }

    /// A one-rank group asked for NCCL reaches c10d's `ProcessGroupNCCL` (its symbols link from
    /// libtorch_cuda): on a machine without a GPU, its own refusal comes back as the error.
    #[test]
    fn nccl_is_linked_and_refuses_a_machine_without_gpu() {
        if !nccl_built() || crate::device::cuda_device_count() > 0 {
            return;
        }
        let e = join_alone(Collectives::Nccl, tch::Device::Cuda(0))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("(NCCL on cuda:0)"), "{e}");
        assert!(
            e.contains("GPU") || e.contains("CUDA") || e.contains("cuda"),
            "{e}"
        );
        // The same group over Gloo works on this machine.
        let g = join_alone(Collectives::Gloo, tch::Device::Cpu).unwrap();
        assert_eq!(g.all_reduce_values(&[1.5], Op::Sum).unwrap(), vec![1.5]);
    }
}
