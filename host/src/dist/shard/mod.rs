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

use tch::{Device, Kind, Tensor};

use std::sync::Arc;

mod gradients;
mod pieces;

pub use pieces::PieceView;

use super::full::{FullUnits, UnitGate};
use super::{DistError, Group};
use gradients::{GradHooks, Reduced};

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

/// A bucket's parameters (name, tensor) and its unit (`full`).
type Bucket = (Vec<(String, Tensor)>, Option<usize>);

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

// SAFETY: used from the training thread; the hooks inside run on autograd's threads and
// synchronise on the shim's own mutex.
unsafe impl Send for GradHooks {}

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
        let mut flats = Vec::new();
        for (group, unit) in buckets(mode, params, bucket_bytes, units)? {
            flats.push(lay_out(group, unit, rank, world_i)?);
        }
        let pieces = pieces_of(&flats, rank)?;
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
}

/// The parameters in buckets: consecutive parameters of one (unit, dtype, device), up to
/// `bucket_bytes` outside units (`full`: each unit's own, and one more for the parameters
/// outside every unit); each bucket with its unit.
fn buckets(
    mode: Sharding,
    params: &[(String, Tensor)],
    bucket_bytes: i64,
    units: &[String],
) -> Result<Vec<Bucket>, ShardError> {
    let unit_of = |name: &str| {
        units.iter().position(|u| {
            name.strip_prefix(u.as_str())
                .is_some_and(|r| r.starts_with('.'))
        })
    };
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
    Ok(groups.into_iter().zip(group_unit).collect())
}

/// One bucket laid out in a flat buffer of `world` shards: each parameter made a view into it
/// (keeping its values and memory layout); under `full`, this rank's shard of a unit's buffer
/// copied out to stay.
fn lay_out(
    group: Vec<(String, Tensor)>,
    unit: Option<usize>,
    rank: usize,
    world_i: i64,
) -> Result<Flat, ShardError> {
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
    Ok(Flat {
        buffer,
        shard,
        members,
        unit,
    })
}

/// This rank's piece of every parameter of `flats`.
fn pieces_of(flats: &[Flat], rank: usize) -> Result<Vec<Piece>, ShardError> {
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
    Ok(pieces)
}

#[cfg(test)]
mod tests;
