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
mod ranks;
mod reducer;
pub mod shard;
pub mod slices;
pub mod watch;

pub(crate) use ranks::plugin_group;
use ranks::set_process_ranks;
pub use ranks::{process_ranks, set_plugin_group, RankEnv};
pub use reducer::{GradReducer, ReducerStats};

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
}

impl Drop for Group {
    fn drop(&mut self) {
        set_process_ranks((0, 1, 0));
        // SAFETY: made by `tessera_dist_init`, freed once.
        unsafe { tessera_dist_free(self.handle) }
    }
}

#[cfg(test)]
mod tests;
