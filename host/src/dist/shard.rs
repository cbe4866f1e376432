//! Sharded data-parallel training (ZeRO, `[distributed] sharding`): each rank keeps the
//! optimizer state (`optimizer`) — and the reduced gradients (`gradients`) — of its 1/world
//! slice of the parameters only, steps that slice, and all-gathers the updated parameters.
//!
//! The trainable parameters are laid out in flat buffers ([`Flat`]: one dtype and device,
//! filled up to `[distributed] bucket_mb` in registration order, padded to a multiple of the
//! world size), and every parameter becomes a view into its buffer (`set_data`, as PyTorch's
//! FSDP does): the model and the methods keep seeing whole parameters. Rank `r` owns elements
//! `[r·S, (r+1)·S)` of every buffer of `world·S` elements; its [`Piece`]s are the parts of the
//! parameters inside that range, in the parameters' memory order, which the optimizer steps as
//! 1-D tensors. Element-wise rules (SGD, Adam, AdamW, Lion) give what they give on the whole
//! parameter.
//!
//! The collectives are c10d's `_allgather_base` and `_reduce_scatter_base` (`csrc/dist.cpp`),
//! issued in buffer order on every rank.

use std::cell::RefCell;
use std::ffi::c_void;

use tch::{Device, Kind, Tensor};

use std::sync::Arc;

use super::full::{FullUnits, UnitGate};
use super::{check, last_error, DistError, Group};
use crate::optim::set_grad;

/// `[distributed] sharding`: what each rank keeps of the training state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// Every rank holds everything (DDP, the default).
    #[default]
    None,
    /// ZeRO-1: optimizer state sharded; gradients all-reduced whole.
    Optimizer,
    /// ZeRO-2: optimizer state and gradients sharded (reduce-scattered).
    Gradients,
    /// ZeRO-3 / FSDP: parameters sharded too, each unit's gathered while it runs
    /// ([`super::full`]).
    Full,
}

impl Sharding {
    /// Accepted spellings, for the config reader.
    pub const CHOICES: [(&'static str, Sharding); 4] = [
        ("none", Sharding::None),
        ("optimizer", Sharding::Optimizer),
        ("gradients", Sharding::Gradients),
        ("full", Sharding::Full),
    ];

    /// Whether the gradients are reduce-scattered (each rank keeps its slice only).
    pub fn shards_gradients(self) -> bool {
        matches!(self, Sharding::Gradients | Sharding::Full)
    }

    /// The name as written in `trainer.toml`.
    pub fn name(self) -> &'static str {
        match self {
            Sharding::None => "none",
            Sharding::Optimizer => "optimizer",
            Sharding::Gradients => "gradients",
            Sharding::Full => "full",
        }
    }
}

/// The dtype of a collective's data on the wire (`[distributed] reduce_dtype`, `gather_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Wire {
    /// `gather_dtype` only: bfloat16 under `train.precision = "amp_bf16"`, float32 otherwise.
    Auto,
    /// The parameters' own dtype (float32): exact.
    Fp32,
    /// bfloat16: half the bytes; values rounded to 8 bits of mantissa.
    Bf16,
}

impl Wire {
    /// `reduce_dtype`'s choices.
    pub const REDUCE: [(&'static str, Wire); 2] = [("fp32", Wire::Fp32), ("bf16", Wire::Bf16)];
    /// `gather_dtype`'s choices.
    pub const GATHER: [(&'static str, Wire); 3] = [
        ("auto", Wire::Auto),
        ("fp32", Wire::Fp32),
        ("bf16", Wire::Bf16),
    ];

    /// The name `trainer.toml` uses.
    pub fn name(self) -> &'static str {
        match self {
            Wire::Auto => "auto",
            Wire::Fp32 => "fp32",
            Wire::Bf16 => "bf16",
        }
    }
}

/// A failure of the sharded layout or of its collectives.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// A collective failed.
    #[error(transparent)]
    Dist(#[from] DistError),
    /// libtorch failed.
    #[error("{what}: {source}")]
    Torch {
        /// What Tessera was doing.
        what: String,
        /// libtorch's error.
        source: tch::TchError,
    },
    /// A parameter cannot be laid out in a flat buffer.
    #[error("{0}")]
    Layout(String),
}

fn torch<T>(what: &str, r: Result<T, tch::TchError>) -> Result<T, ShardError> {
    r.map_err(|source| ShardError::Torch {
        what: what.to_owned(),
        source,
    })
}

/// One parameter inside a flat buffer.
#[derive(Debug)]
struct Member {
    name: String,
    /// The parameter (a view into the buffer once laid out).
    param: Tensor,
    /// Where its memory starts in the buffer.
    offset: i64,
    numel: i64,
    size: Vec<i64>,
    strides: Vec<i64>,
}

impl Member {
    /// `grad` in the parameter's memory layout: itself when it has it, else a copy, so that
    /// its elements in memory order are the parameter's.
    fn laid_out(&self, grad: Tensor) -> Result<Tensor, tch::TchError> {
        if grad.stride() == self.strides {
            return Ok(grad);
        }
        let g = Tensor::f_empty_strided(&self.size, &self.strides, (grad.kind(), grad.device()))?;
        g.shallow_clone().f_copy_(&grad)?;
        Ok(g)
    }
}

/// What the parameters of one buffer share: the unit (`full`), dtype and device.
type BucketKey = (Option<usize>, Kind, Device);

/// A flat buffer of parameters of one dtype and device.
#[derive(Debug)]
struct Flat {
    /// `world · shard` elements; the parameters are views into it.
    buffer: Tensor,
    /// Elements per rank.
    shard: i64,
    members: Vec<Member>,
    /// `full`: the unit (index into the units given) whose parameters these are, and this
    /// rank's shard of the buffer, a tensor of its own (the buffer's memory comes and goes).
    unit: Option<(usize, Tensor)>,
}

/// A sharded parameter's layout and every rank's slice of it ([`ShardedParams::slices`]).
#[derive(Debug, Clone)]
pub struct ParamSlices {
    /// The parameter's name.
    pub name: String,
    /// Its size.
    pub size: Vec<i64>,
    /// Its strides (the slices follow its memory order).
    pub strides: Vec<i64>,
    /// (rank, first element, length), non-empty ones only.
    pub slices: Vec<(usize, i64, i64)>,
}

/// The part of a parameter this rank steps.
#[derive(Debug)]
pub struct Piece {
    /// The parameter's name.
    pub name: String,
    /// Elements `[start, start + len)` of the parameter in its memory order: a 1-D tensor
    /// sharing the parameter's memory (not a view in autograd's sense), possibly empty.
    pub tensor: Tensor,
    /// First element of the parameter it holds, in memory order.
    pub start: i64,
    /// Number of elements (0 when the parameter lies outside this rank's range).
    pub len: i64,
    flat: usize,
    member: usize,
}

/// Whether `strides` lay out `size` densely without overlap (some permutation of a
/// contiguous layout, as channels-last is).
fn dense(size: &[i64], strides: &[i64]) -> bool {
    let mut dims: Vec<(i64, i64)> = size
        .iter()
        .zip(strides)
        .filter(|(s, _)| **s != 1)
        .map(|(s, t)| (*s, *t))
        .collect();
    dims.sort_by_key(|(_, t)| *t);
    let mut expected = 1;
    for (s, t) in dims {
        if t != expected {
            return false;
        }
        expected *= s;
    }
    true
}

/// A tensor of `len` elements of `source`'s memory from `offset` (absolute in its storage),
/// sharing it without being an autograd view of it.
fn alias(source: &Tensor, offset: i64, len: i64) -> Result<Tensor, tch::TchError> {
    // `set_` takes its storage from a contiguous tensor: an empty 1-D view of `source`'s, at
    // its start (`set_` adds the view's own storage offset to `offset`).
    let base = source.f_as_strided([0], [1], 0)?;
    let mut t = Tensor::f_empty([0], (source.kind(), source.device()))?;
    t.f_set_source_tensor_storage_offset_(&base, offset, [len], [1])
}

extern "C" {
    fn tessera_shard_reducer_new(
        group: *mut c_void,
        world: i32,
        params: *mut *mut c_void,
        offsets: *const i64,
        dims: *const i64,
        sizes: *const i64,
        strides: *const i64,
        counts: *const i64,
        shards: *const i64,
        n_flats: i32,
        reduce_bf16: i32,
    ) -> *mut c_void;
    fn tessera_shard_reducer_free(reducer: *mut c_void);
    fn tessera_shard_reducer_arm(reducer: *mut c_void) -> i32;
    fn tessera_shard_reducer_finish(
        reducer: *mut c_void,
        outs: *mut *mut c_void,
        fired: *mut u8,
    ) -> i32;
}

/// `gradients`: c10d-style hooks on the parameters' gradient accumulators that reduce-scatter
/// each flat buffer as soon as backward produced its gradients (`csrc/dist.cpp`).
struct GradHooks {
    handle: *mut c_void,
}

// SAFETY: used from the training thread; the hooks inside run on autograd's threads and
// synchronise on the shim's own mutex.
unsafe impl Send for GradHooks {}

impl Drop for GradHooks {
    fn drop(&mut self) {
        // SAFETY: made by `tessera_shard_reducer_new`, freed once.
        unsafe { tessera_shard_reducer_free(self.handle) }
    }
}

/// What the backward passes of a step reduce-scattered so far: per buffer this rank's slice
/// (summed over the passes), per parameter whether it got a gradient on this rank.
#[derive(Debug, Default)]
struct Reduced {
    slices: Vec<Tensor>,
    fired: Vec<bool>,
}

/// The trainable parameters laid out for sharding, and this rank's pieces of them.
#[derive(Debug)]
pub struct ShardedParams {
    mode: Sharding,
    rank: usize,
    world: usize,
    flats: Vec<Flat>,
    pieces: Vec<Piece>,
    /// `gradients`: the hooks, once [`ShardedParams::hook_gradients`] set them.
    hooks: Option<GradHooks>,
    /// `gradients`: what this step's backward passes reduced so far.
    reduced: RefCell<Reduced>,
    /// `full`: the units' gates.
    full: FullUnits,
}

impl std::fmt::Debug for GradHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GradHooks")
    }
}

impl ShardedParams {
    /// Lays `params` (name, tensor; identical on every rank) out in flat buffers of at most
    /// `bucket_bytes` (a larger parameter gets a buffer of its own) and makes each parameter a
    /// view into its buffer, keeping its values and memory layout. `full`: the parameters of
    /// each of `units` (module paths) get buffers of their own, without the byte cap.
    pub fn new(
        mode: Sharding,
        params: &[(String, Tensor)],
        rank: usize,
        world: usize,
        bucket_bytes: i64,
        units: &[String],
    ) -> Result<ShardedParams, ShardError> {
        let _guard = tch::no_grad_guard();
        let world_i = world as i64;
        let unit_of = |name: &str| {
            units.iter().position(|u| {
                name.strip_prefix(u.as_str())
                    .is_some_and(|r| r.starts_with('.'))
            })
        };
        // Buckets: consecutive parameters of one (unit, dtype, device), up to the byte cap
        // outside units.
        let mut open: Vec<(BucketKey, usize)> = Vec::new();
        let mut groups: Vec<Vec<(String, Tensor)>> = Vec::new();
        let mut group_unit: Vec<Option<usize>> = Vec::new();
        let mut bytes: Vec<i64> = Vec::new();
        for (name, p) in params {
            let unit = if mode == Sharding::Full {
                // The parameters outside every unit (embeddings, head) form one more, index
                // `units.len()`, gathered for a whole step.
                Some(unit_of(name).unwrap_or(units.len()))
            } else {
                None
            };
            let key = (unit, p.kind(), p.device());
            let size = p.size();
            let strides = p.stride();
            if !dense(&size, &strides) {
                return Err(ShardError::Layout(format!(
                    "parameter `{name}` (size {size:?}, strides {strides:?}) is not laid out \
                     densely in memory, so it cannot live in a flat buffer for sharding"
                )));
            }
            let b = p.numel() as i64 * p.kind().elt_size_in_bytes() as i64;
            let slot = open.iter().position(|(k, _)| *k == key);
            let target = match slot {
                Some(i)
                    if unit.is_some_and(|u| u < units.len())
                        || bytes[open[i].1] + b <= bucket_bytes
                        || bytes[open[i].1] == 0 =>
                {
                    open[i].1
                }
                _ => {
                    groups.push(Vec::new());
                    group_unit.push(unit);
                    bytes.push(0);
                    let g = groups.len() - 1;
                    match slot {
                        Some(i) => open[i].1 = g,
                        None => open.push((key, g)),
                    }
                    g
                }
            };
            groups[target].push((name.clone(), p.shallow_clone()));
            bytes[target] += b;
        }
        let mut flats = Vec::with_capacity(groups.len());
        for (group, unit) in groups.into_iter().zip(group_unit) {
            let total: i64 = group.iter().map(|(_, p)| p.numel() as i64).sum();
            let shard = (total + world_i - 1) / world_i;
            let (kind, device) = (group[0].1.kind(), group[0].1.device());
            let buffer = torch(
                "allocating a sharded buffer",
                Tensor::f_zeros([shard * world_i], (kind, device)),
            )?;
            let mut members = Vec::with_capacity(group.len());
            let mut offset = 0;
            for (name, mut param) in group {
                let size = param.size();
                let strides = param.stride();
                let numel = param.numel() as i64;
                let what = format!("laying out parameter `{name}` for sharding");
                let view = torch(&what, buffer.f_as_strided(&size, &strides, offset))?;
                torch(&what, view.shallow_clone().f_copy_(&param))?;
                torch(&what, param.f_set_data(&view))?;
                members.push(Member {
                    name,
                    param,
                    offset,
                    numel,
                    size,
                    strides,
                });
                offset += numel;
            }
            let unit = match unit {
                Some(u) => {
                    let local = torch(
                        "making a parameter shard",
                        buffer
                            .f_narrow(0, rank as i64 * shard, shard)
                            .and_then(|t| t.f_detach_copy()),
                    )?;
                    Some((u, local))
                }
                None => None,
            };
            flats.push(Flat {
                buffer,
                shard,
                members,
                unit,
            });
        }
        let mut pieces = Vec::new();
        for (f, flat) in flats.iter().enumerate() {
            let (lo, hi) = (rank as i64 * flat.shard, (rank as i64 + 1) * flat.shard);
            for (m, member) in flat.members.iter().enumerate() {
                let a = lo.max(member.offset);
                let b = hi.min(member.offset + member.numel).max(a);
                // Under `full` a unit's pieces live in this rank's shard, which stays.
                let tensor = match &flat.unit {
                    Some((_, local)) => alias(local, if b > a { a - lo } else { 0 }, b - a),
                    None => alias(&flat.buffer, if b > a { a } else { 0 }, b - a),
                };
                let tensor = torch("making a parameter shard", tensor)?;
                pieces.push(Piece {
                    name: member.name.clone(),
                    tensor,
                    start: if b > a { a - member.offset } else { 0 },
                    len: b - a,
                    flat: f,
                    member: m,
                });
            }
        }
        Ok(ShardedParams {
            mode,
            rank,
            world,
            flats,
            pieces,
            hooks: None,
            reduced: RefCell::new(Reduced::default()),
            full: FullUnits::default(),
        })
    }

    /// `full`: one gate per unit that has parameters here, for its wrapper (path, gate), in the
    /// units' order; the parameters outside the units get one more, gathered for a whole step
    /// ([`ShardedParams::gather_root`]), not returned. The units start whole (the parameters
    /// hold their values); the first [`ShardedParams::release`] frees them.
    /// `wire`: the dtype the units are gathered in for the passes (`[distributed]
    /// gather_dtype`, resolved).
    pub fn gate_units(
        &mut self,
        group: &Group,
        units: &[String],
        wire: Wire,
    ) -> Result<Vec<Arc<UnitGate>>, ShardError> {
        if self.mode != Sharding::Full {
            return Ok(Vec::new());
        }
        let mut gates = Vec::new();
        let root = "(outside the units)".to_owned();
        for (u, path) in units.iter().chain([&root]).enumerate() {
            let flats: Vec<&Flat> = self
                .flats
                .iter()
                .filter(|f| f.unit.as_ref().is_some_and(|(i, _)| *i == u))
                .collect();
            if flats.is_empty() {
                continue;
            }
            let gate = UnitGate::new(path)?;
            for flat in flats {
                if let Some((_, local)) = &flat.unit {
                    gate.add(group, &flat.buffer, local, self.rank, wire == Wire::Bf16)?;
                }
            }
            gates.push(Arc::new(gate));
        }
        let root = gates.pop_if(|g| g.path() == root);
        self.full = FullUnits {
            units: gates.clone(),
            root,
        };
        self.full.link()?;
        self.full.register();
        Ok(gates)
    }

    /// `full`: gathers the parameters outside the units (the embeddings, the head) for the
    /// step's passes; the step's [`ShardedParams::release`] frees them.
    pub fn gather_root(&self) -> Result<(), ShardError> {
        Ok(self.full.gather_root()?)
    }

    /// `full`: makes every unit's parameters whole (collective), for what reads them outside
    /// the training step.
    pub fn summon(&self) -> Result<(), ShardError> {
        Ok(self.full.summon()?)
    }

    /// `full`: frees every unit's parameters, keeping this rank's slice of what they hold.
    pub fn release(&self) -> Result<(), ShardError> {
        Ok(self.full.release()?)
    }

    /// `full`: lets the units made whole go, keeping this rank's slices; returns whether any
    /// was whole.
    pub fn release_whole(&self) -> Result<bool, ShardError> {
        Ok(self.full.release_whole()?)
    }

    /// The mode.
    pub fn mode(&self) -> Sharding {
        self.mode
    }

    /// This rank's pieces, one per parameter (empty ones included), in parameter order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// This rank's piece of parameter `name` with the parameter's size and strides, `None`
    /// when it is not sharded.
    pub fn piece_of(&self, name: &str) -> Option<(&Piece, &[i64], &[i64])> {
        let p = self.pieces.iter().find(|p| p.name == name)?;
        let m = &self.flats[p.flat].members[p.member];
        Some((p, &m.size, &m.strides))
    }

    /// Every sharded parameter's layout and every rank's slice of it: (name, size, strides,
    /// [(rank, first element, length)] in the parameter's memory order, empty slices left out).
    pub fn slices(&self) -> Vec<ParamSlices> {
        let mut out = Vec::new();
        for flat in &self.flats {
            for m in &flat.members {
                let slices = (0..self.world)
                    .filter_map(|r| {
                        let (lo, hi) = (r as i64 * flat.shard, (r as i64 + 1) * flat.shard);
                        let a = lo.max(m.offset);
                        let b = hi.min(m.offset + m.numel);
                        (b > a).then_some((r, a - m.offset, b - a))
                    })
                    .collect();
                out.push(ParamSlices {
                    name: m.name.clone(),
                    size: m.size.clone(),
                    strides: m.strides.clone(),
                    slices,
                });
            }
        }
        out
    }

    /// Names of the sharded parameters.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.flats
            .iter()
            .flat_map(|f| f.members.iter().map(|m| m.name.as_str()))
    }

    /// Elements of parameters this rank holds the optimizer state of (its pieces) and the
    /// elements of all sharded parameters.
    pub fn elements(&self) -> (i64, i64) {
        let mine = self.pieces.iter().map(|p| p.len).sum();
        let all = self
            .flats
            .iter()
            .flat_map(|f| f.members.iter().map(|m| m.numel))
            .sum();
        (mine, all)
    }

    /// `optimizer`: gives each piece its slice of the parameter's gradient (all-reduced whole
    /// already), without a copy when the gradient has the parameter's layout; a parameter
    /// without a gradient leaves its piece without one.
    pub fn take_whole_grads(&self) -> Result<(), ShardError> {
        let what = "handing the gradients to the shards";
        for piece in &self.pieces {
            let member = &self.flats[piece.flat].members[piece.member];
            let grad = member.param.grad();
            if !grad.defined() {
                torch(what, set_grad(&piece.tensor, None))?;
                continue;
            }
            let grad = torch(what, member.laid_out(grad))?;
            let offset = torch(what, grad.f_storage_offset())? + piece.start;
            let slice = torch(what, alias(&grad, offset, piece.len))?;
            torch(what, set_grad(&piece.tensor, Some(&slice)))?;
        }
        Ok(())
    }

    /// `gradients`: hooks the parameters' gradient accumulators so that each backward pass
    /// reduce-scatters every buffer as soon as its gradients are there (overlapping the rest of
    /// the backward pass, as DDP's buckets do), freeing the whole gradients as it goes.
    /// `wire`: the dtype the gradients are reduced in (`[distributed] reduce_dtype`).
    pub fn hook_gradients(&mut self, group: &Group, wire: Wire) -> Result<(), ShardError> {
        let mut params: Vec<*mut c_void> = Vec::new();
        let (mut offsets, mut dims, mut sizes, mut strides) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut counts, mut shards) = (Vec::new(), Vec::new());
        for flat in &self.flats {
            counts.push(flat.members.len() as i64);
            shards.push(flat.shard);
            for m in &flat.members {
                params.push(m.param.as_ptr() as *mut c_void);
                offsets.push(m.offset);
                dims.push(m.size.len() as i64);
                sizes.extend_from_slice(&m.size);
                strides.extend_from_slice(&m.strides);
            }
        }
        // SAFETY: every pointer and slice is live for the call; the shim copies what it keeps
        // (tensor handles are reference-counted).
        let handle = unsafe {
            tessera_shard_reducer_new(
                group.handle,
                self.world as i32,
                params.as_mut_ptr(),
                offsets.as_ptr(),
                dims.as_ptr(),
                sizes.as_ptr(),
                strides.as_ptr(),
                counts.as_ptr(),
                shards.as_ptr(),
                self.flats.len() as i32,
                i32::from(wire == Wire::Bf16),
            )
        };
        if handle.is_null() {
            return Err(ShardError::Dist(DistError::C10d {
                what: "setting up the gradient reduce-scatter".into(),
                message: last_error(),
            }));
        }
        self.hooks = Some(GradHooks { handle });
        Ok(())
    }

    /// `gradients`: forgets what earlier passes of an abandoned step reduced.
    pub fn start_step(&self) {
        *self.reduced.borrow_mut() = Reduced::default();
    }

    /// `gradients`: before a backward pass.
    pub fn before_backward(&self) -> Result<(), ShardError> {
        if let Some(h) = &self.hooks {
            // SAFETY: the handle is live.
            check(unsafe { tessera_shard_reducer_arm(h.handle) }, || {
                "preparing the gradient reduce-scatter".into()
            })?;
        }
        Ok(())
    }

    /// `gradients`: after a backward pass: waits for its reduce-scatters and adds this rank's
    /// slices to the step's.
    pub fn after_backward(&self) -> Result<(), ShardError> {
        // `full`: a unit whose input had no gradient is still gathered.
        self.full.free_gathered()?;
        let Some(h) = &self.hooks else {
            return Ok(());
        };
        let members: usize = self.flats.iter().map(|f| f.members.len()).sum();
        let mut outs: Vec<*mut c_void> = vec![std::ptr::null_mut(); self.flats.len()];
        let mut fired = vec![0u8; members];
        // SAFETY: `outs` and `fired` hold as many entries as the shim writes.
        check(
            unsafe {
                tessera_shard_reducer_finish(h.handle, outs.as_mut_ptr(), fired.as_mut_ptr())
            },
            || "reduce-scattering the gradients".into(),
        )?;
        // SAFETY: each entry is a fresh `at::Tensor*` the shim handed over.
        let slices: Vec<Tensor> = outs
            .into_iter()
            .map(|p| unsafe { Tensor::from_ptr(p.cast()) })
            .collect();
        let mut reduced = self.reduced.borrow_mut();
        if reduced.slices.is_empty() {
            reduced.slices = slices;
            reduced.fired = fired.iter().map(|f| *f != 0).collect();
        } else {
            let _guard = tch::no_grad_guard();
            for (sum, s) in reduced.slices.iter_mut().zip(&slices) {
                let _ = torch("adding a pass's gradients", sum.f_add_(s))?;
            }
            for (a, f) in reduced.fired.iter_mut().zip(&fired) {
                *a |= *f != 0;
            }
        }
        Ok(())
    }

    /// `gradients`: gives each piece its slice of the step's reduced gradients. A parameter
    /// that got a gradient on no rank leaves its piece without one (as DDP leaves it `None`);
    /// one that got a gradient on some ranks only was reduced with zeros from the others. One
    /// host all-reduce of the flags per step.
    pub fn take_reduced_grads(&self, group: &Group) -> Result<(), ShardError> {
        let what = "handing the reduced gradients to the shards";
        let reduced = std::mem::take(&mut *self.reduced.borrow_mut());
        let members: usize = self.flats.iter().map(|f| f.members.len()).sum();
        let local: Vec<f64> = if reduced.fired.is_empty() {
            vec![0.0; members]
        } else {
            reduced
                .fired
                .iter()
                .map(|f| f64::from(u8::from(*f)))
                .collect()
        };
        let used = group.all_reduce_values(&local, super::Op::Max)?;
        let mut first = Vec::with_capacity(self.flats.len());
        let mut at = 0;
        for flat in &self.flats {
            first.push(at);
            at += flat.members.len();
        }
        for piece in &self.pieces {
            let flat = &self.flats[piece.flat];
            let member = &flat.members[piece.member];
            let slice = reduced.slices.get(piece.flat);
            let slice = match slice {
                Some(s) if used[first[piece.flat] + piece.member] > 0.0 => s,
                _ => {
                    torch(what, set_grad(&piece.tensor, None))?;
                    continue;
                }
            };
            let start = if piece.len > 0 {
                member.offset + piece.start - self.rank as i64 * flat.shard
            } else {
                0
            };
            let g = torch(what, alias(slice, start, piece.len))?;
            torch(what, set_grad(&piece.tensor, Some(&g)))?;
        }
        Ok(())
    }

    /// `gradients`/`full`, before methods that read the gradients between the backward pass and
    /// the optimizer step (gradient clipping, SAM): every parameter gets its whole reduced
    /// gradient, all-gathered from the ranks' slices (a parameter that got a gradient on no
    /// rank gets none). Collective; [`ShardedParams::scatter_gradients`] undoes it.
    pub fn gather_gradients(&self, group: &Group) -> Result<(), ShardError> {
        let _guard = tch::no_grad_guard();
        let what = "gathering the reduced gradients for the methods";
        let reduced = self.reduced.borrow();
        let local: Vec<f64> = self
            .flats
            .iter()
            .flat_map(|f| f.members.iter())
            .enumerate()
            .map(|(i, _)| f64::from(u8::from(reduced.fired.get(i).copied().unwrap_or(false))))
            .collect();
        let used = group.all_reduce_values(&local, super::Op::Max)?;
        let mut at = 0;
        for (f, flat) in self.flats.iter().enumerate() {
            let first = at;
            at += flat.members.len();
            let Some(slice) = reduced.slices.get(f) else {
                continue;
            };
            let whole = torch(
                what,
                Tensor::f_empty(
                    [flat.shard * self.world as i64],
                    (slice.kind(), slice.device()),
                ),
            )?;
            group.all_gather_base(&whole, torch(what, slice.f_detach_copy())?)?;
            for (m, member) in flat.members.iter().enumerate() {
                let grad = match used[first + m] > 0.0 {
                    true => Some(torch(
                        what,
                        whole.f_as_strided(&member.size, &member.strides, member.offset),
                    )?),
                    false => None,
                };
                torch(what, set_grad(&member.param, grad.as_ref()))?;
            }
        }
        Ok(())
    }

    /// After [`ShardedParams::gather_gradients`] and the methods: this rank's slices take what
    /// the methods left in the whole gradients (clipped, say), and the whole gradients go.
    pub fn scatter_gradients(&self) -> Result<(), ShardError> {
        let _guard = tch::no_grad_guard();
        let what = "taking back the gradients the methods saw";
        let reduced = self.reduced.borrow();
        for (f, flat) in self.flats.iter().enumerate() {
            let (lo, hi) = (
                self.rank as i64 * flat.shard,
                (self.rank as i64 + 1) * flat.shard,
            );
            for member in &flat.members {
                let grad = member.param.grad();
                if let Some(slice) = reduced.slices.get(f).filter(|_| grad.defined()) {
                    let (a, b) = (lo.max(member.offset), hi.min(member.offset + member.numel));
                    if b > a {
                        // A method may have put a gradient of another layout there.
                        let g = torch(what, member.laid_out(grad))?;
                        let offset = torch(what, g.f_storage_offset())? + (a - member.offset);
                        let src = torch(what, alias(&g, offset, b - a))?;
                        let dst = torch(what, slice.f_narrow(0, a - lo, b - a))?;
                        torch(what, dst.shallow_clone().f_copy_(&src))?;
                    }
                }
                torch(what, set_grad(&member.param, None))?;
            }
        }
        Ok(())
    }

    /// Sends each rank's updated slice to every rank: the parameters are whole again.
    pub fn all_gather(&self, group: &Group) -> Result<(), ShardError> {
        let _guard = tch::no_grad_guard();
        let what = "gathering the updated parameters";
        // `full`: the units are gathered when they run.
        for flat in self.flats.iter().filter(|f| f.unit.is_none()) {
            // A copy of this rank's slice: the output must not alias the input.
            let mine = torch(
                what,
                flat.buffer
                    .f_narrow(0, self.rank as i64 * flat.shard, flat.shard)
                    .and_then(|t| t.f_detach_copy()),
            )?;
            group.all_gather_base(&flat.buffer, mine)?;
        }
        Ok(())
    }

    /// Gathers whole tensors from pieces: `state(name)` gives this rank's piece-shaped tensor of
    /// parameter `name` (`None` when it has none: then no rank has one). Returns (name, whole
    /// tensor in the parameter's shape and layout) for the parameters that have one. Every
    /// rank must call it with the same presence of tensors; collective.
    pub fn gather_pieces(
        &self,
        group: &Group,
        state: impl Fn(&str) -> Option<Tensor>,
    ) -> Result<Vec<(String, Tensor)>, ShardError> {
        let _guard = tch::no_grad_guard();
        let what = "gathering the sharded optimizer state";
        let mut out = Vec::new();
        for (f, flat) in self.flats.iter().enumerate() {
            let mine: Vec<(&Piece, Tensor)> = self
                .pieces
                .iter()
                .filter(|p| p.flat == f)
                .filter_map(|p| state(&p.name).map(|t| (p, t)))
                .collect();
            let Some((_, first)) = mine.first() else {
                continue;
            };
            let kind = first.kind();
            let device = first.device();
            let local = torch(what, Tensor::f_zeros([flat.shard], (kind, device)))?;
            let lo = self.rank as i64 * flat.shard;
            for (p, t) in &mine {
                if p.len == 0 {
                    continue;
                }
                let m = &flat.members[p.member];
                let dst = torch(what, local.f_narrow(0, m.offset + p.start - lo, p.len))?;
                let src = torch(what, t.f_reshape([-1]))?;
                torch(what, dst.shallow_clone().f_copy_(&src))?;
            }
            let whole = torch(
                what,
                Tensor::f_empty([flat.shard * self.world as i64], (kind, device)),
            )?;
            group.all_gather_base(&whole, local)?;
            for (p, _) in &mine {
                let m = &flat.members[p.member];
                let t = torch(what, whole.f_as_strided(&m.size, &m.strides, m.offset))?;
                out.push((m.name.clone(), t));
            }
        }
        Ok(out)
    }
}

/// What the optimizer needs of the layout ([`crate::optim::Shards`]): this rank's pieces and
/// the parameters' layouts, to cut restored state into pieces.
#[derive(Debug)]
pub struct PieceView {
    pieces: Vec<PieceLayout>,
}

/// One piece as the optimizer sees it: the parameter's name, the piece, its first element and
/// length in the parameter's memory order, and the parameter's size and strides.
#[derive(Debug)]
struct PieceLayout {
    name: String,
    tensor: Tensor,
    start: i64,
    len: i64,
    size: Vec<i64>,
    strides: Vec<i64>,
}

impl ShardedParams {
    /// The optimizer's view of this rank's pieces.
    pub fn view(&self) -> PieceView {
        PieceView {
            pieces: self
                .pieces
                .iter()
                .map(|p| {
                    let m = &self.flats[p.flat].members[p.member];
                    PieceLayout {
                        name: p.name.clone(),
                        tensor: p.tensor.shallow_clone(),
                        start: p.start,
                        len: p.len,
                        size: m.size.clone(),
                        strides: m.strides.clone(),
                    }
                })
                .collect(),
        }
    }
}

impl crate::optim::Shards for PieceView {
    fn piece(&self, name: &str) -> Option<Tensor> {
        self.pieces
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.tensor.shallow_clone())
    }

    fn cut(&self, name: &str, whole: &Tensor) -> Option<Result<Tensor, tch::TchError>> {
        let p = self.pieces.iter().find(|p| p.name == name)?;
        Some(cut(whole, &p.size, &p.strides, p.start, p.len))
    }
}

/// Elements `[start, start + len)`, in the memory order of layout (`size`, `strides`), of
/// `whole` (any layout of that size): a new 1-D tensor.
fn cut(
    whole: &Tensor,
    size: &[i64],
    strides: &[i64],
    start: i64,
    len: i64,
) -> Result<Tensor, tch::TchError> {
    let laid = Tensor::f_empty_strided(size, strides, (whole.kind(), whole.device()))?;
    laid.shallow_clone().f_copy_(whole)?;
    let numel = size.iter().product::<i64>();
    let flat = laid.f_as_strided([numel], [1], 0)?;
    flat.f_narrow(0, start, len)?.f_detach_copy()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_layouts_are_recognised() {
        assert!(dense(&[2, 3], &[3, 1]));
        assert!(dense(&[4, 3, 2, 2], &[12, 1, 6, 3]), "channels last");
        assert!(dense(&[5], &[1]));
        assert!(
            dense(&[1, 5], &[99, 1]),
            "size-1 dimensions have any stride"
        );
        assert!(!dense(&[2, 3], &[4, 1]), "padded rows");
        assert!(!dense(&[2, 2], &[1, 1]), "overlapping");
        assert!(!dense(&[3], &[0]), "expanded");
    }

    #[test]
    fn an_alias_reads_the_storage_where_it_is_told() {
        let t = Tensor::arange(10, (Kind::Float, Device::Cpu));
        // A source that starts inside the storage (a view, as a gradient in a bucket is).
        let view = t.narrow(0, 3, 5);
        let a = alias(&view, 4, 3).unwrap();
        assert_eq!(Vec::<f32>::try_from(&a).unwrap(), [4.0, 5.0, 6.0]);
        let _ = a.shallow_clone().fill_(-1.0);
        assert_eq!(t.double_value(&[5]), -1.0, "shares the memory");
    }

    #[test]
    fn pieces_tile_the_parameters_and_keep_their_values() {
        let a = Tensor::arange(10, (Kind::Float, Device::Cpu)).reshape([2, 5]);
        let b = Tensor::arange(3, (Kind::Float, Device::Cpu)) + 100.0;
        let params = vec![
            ("a".to_owned(), a.shallow_clone()),
            ("b".to_owned(), b.shallow_clone()),
        ];
        let world = 3;
        let mut covered = vec![0i64; 13];
        for rank in 0..world {
            let a2 = a.copy();
            let b2 = b.copy();
            let own = vec![
                ("a".to_owned(), a2.shallow_clone()),
                ("b".to_owned(), b2.shallow_clone()),
            ];
            let s =
                ShardedParams::new(Sharding::Optimizer, &own, rank, world, 1 << 20, &[]).unwrap();
            assert_eq!(s.pieces().len(), 2);
            // The parameters kept their values and are views of the buffer now.
            assert!(a2.equal(&a) && b2.equal(&b));
            for p in s.pieces() {
                let base = if p.name == "a" { 0 } else { 10 };
                for i in 0..p.len {
                    covered[(base + p.start + i) as usize] += 1;
                }
                // A piece shares the parameter's memory.
                if p.len > 0 {
                    let _ = p.tensor.shallow_clone().fill_(-1.0);
                }
            }
            let (mine, all) = s.elements();
            assert_eq!((mine, all), ([5, 5, 3][rank], 13));
            assert!(
                a2.lt(0.0).sum(Kind::Int64).int64_value(&[])
                    + b2.lt(0.0).sum(Kind::Int64).int64_value(&[])
                    == mine
            );
        }
        assert!(covered.iter().all(|c| *c == 1), "{covered:?}");
        drop(params);
    }

    #[test]
    fn a_piece_of_a_whole_tensor_follows_the_parameter_layout() {
        // A channels-last parameter: its memory order is (n, h, w, c).
        let p = Tensor::empty_strided([2, 3, 2, 2], [12, 1, 6, 3], (Kind::Float, Device::Cpu));
        p.shallow_clone()
            .copy_(&Tensor::arange(24, (Kind::Float, Device::Cpu)).reshape([2, 3, 2, 2]));
        let params = vec![("w".to_owned(), p.shallow_clone())];
        let s = ShardedParams::new(Sharding::Optimizer, &params, 1, 2, 1 << 20, &[]).unwrap();
        let whole = Tensor::arange(24, (Kind::Float, Device::Cpu)).reshape([2, 3, 2, 2]);
        let view = s.view();
        let piece = crate::optim::Shards::cut(&view, "w", &whole)
            .unwrap()
            .unwrap();
        let own = &s.pieces()[0];
        assert_eq!(own.len, 12);
        assert!(piece.equal(&own.tensor), "{piece} vs {}", own.tensor);
        assert!(crate::optim::Shards::cut(&view, "nope", &whole).is_none());
    }
}
