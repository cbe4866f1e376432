//! This rank's slices of the model's tensors for the methods (plugin-api 1.10,
//! `Context::parameter_slice` and `Context::gather_slices`): a method that keeps a copy of the
//! weights (EMA, SWA, Lookahead) keeps only this rank's slice of each sharded parameter.
//!
//! A sharded parameter's slice is this rank's piece ([`super::shard::Piece`]): the run of its
//! elements the rank steps, in its memory order, sharing the memory the rank keeps (under
//! `full` the shard, which stays; otherwise the flat buffer, which is the parameter). Any other
//! tensor (a buffer, a parameter a method updates itself) and every tensor without sharding is
//! whole on every rank, and its slice is itself.
//!
//! Consistency: under `full` the whole parameters a method or the evaluation made whole are let
//! go first (their values kept in the shards) so that the shard is what the slice reads and
//! writes; once the event is over they are made whole again. Under `optimizer` and `gradients`
//! every rank holds the whole parameters: after an event in which a method took a slice to
//! write, the ranks' pieces are all-gathered so that every rank's whole parameters agree.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use tch::Tensor;

use super::shard::{ShardError, ShardedParams, Sharding};
use super::Group;

/// This rank's slice of a model tensor, as the plugin API hands it out.
#[derive(Debug)]
pub struct Slice {
    /// The slice (whole tensor when not `sharded`, else a 1-D piece sharing its memory).
    pub tensor: Tensor,
    /// Whether the ranks hold different parts of the tensor.
    pub sharded: bool,
    /// First element held, in the tensor's memory order.
    pub start: i64,
    /// The whole tensor's size.
    pub size: Vec<i64>,
    /// The whole tensor's strides.
    pub strides: Vec<i64>,
}

thread_local! {
    /// The run's layout, on the training thread where the methods run.
    static LAYOUT: RefCell<Weak<ShardedParams>> = const { RefCell::new(Weak::new()) };
    /// A method took a slice to write in the event now running.
    static WRITTEN: Cell<bool> = const { Cell::new(false) };
    /// `full`: units that were whole were let go for a slice; make them whole again.
    static RESUMMON: Cell<bool> = const { Cell::new(false) };
}

/// Makes `sharded` the layout the methods' slices come from (on this thread, while it lives).
pub fn register(sharded: &Rc<ShardedParams>) {
    LAYOUT.with(|l| *l.borrow_mut() = Rc::downgrade(sharded));
}

fn layout() -> Option<Rc<ShardedParams>> {
    LAYOUT.with(|l| l.borrow().upgrade())
}

/// This rank's slice of `name`, `whole` being the model's tensor of that name (`None`: the
/// model has none). `write`: the caller will change it.
pub fn slice(name: &str, whole: Option<Tensor>, write: bool) -> Result<Option<Slice>, ShardError> {
    let Some(whole) = whole else {
        return Ok(None);
    };
    if let Some(sharded) = layout() {
        if let Some((piece, size, strides)) = sharded.piece_of(name) {
            if sharded.mode() == Sharding::Full {
                if sharded.release_whole()? {
                    RESUMMON.with(|r| r.set(true));
                }
            } else if write {
                WRITTEN.with(|w| w.set(true));
            }
            return Ok(Some(Slice {
                tensor: piece.tensor.shallow_clone(),
                sharded: true,
                start: piece.start,
                size: size.to_vec(),
                strides: strides.to_vec(),
            }));
        }
    }
    Ok(Some(Slice {
        size: whole.size(),
        strides: whole.stride(),
        tensor: whole,
        sharded: false,
        start: 0,
    }))
}

/// The whole tensors of `slices` (name, a tensor shaped as this rank's slice of it), in order:
/// the sharded ones gathered from every rank (collective), the others as they are. A name may
/// come more than once (a method's two copies of one tensor).
pub fn gather(slices: Vec<(String, Tensor)>) -> Result<Vec<Tensor>, ShardError> {
    let mut out: Vec<Option<Tensor>> = Vec::with_capacity(slices.len());
    let mut pending = Vec::new();
    let layout = layout();
    for (i, (name, t)) in slices.iter().enumerate() {
        match layout.as_ref().and_then(|s| s.piece_of(name)) {
            Some((piece, _, _)) => {
                if t.numel() as i64 != piece.len {
                    return Err(ShardError::Layout(format!(
                        "gather_slices: `{name}`: a slice of {} elements, this rank's slice \
                         has {}",
                        t.numel(),
                        piece.len
                    )));
                }
                pending.push(i);
                out.push(None);
            }
            None => out.push(Some(t.shallow_clone())),
        }
    }
    if let (Some(sharded), false) = (&layout, pending.is_empty()) {
        let Some(group) = super::plugin_group() else {
            return Err(ShardError::Layout(
                "gather_slices: sharded tensors outside a data-parallel run".into(),
            ));
        };
        // Each round gathers each name once (every rank asks for the same names in the same
        // order, so the rounds match).
        while !pending.is_empty() {
            let mut round: Vec<usize> = Vec::new();
            let mut rest = Vec::new();
            for i in pending {
                if round.iter().any(|&j| slices[j].0 == slices[i].0) {
                    rest.push(i);
                } else {
                    round.push(i);
                }
            }
            let find = |n: &str| round.iter().copied().find(|&j| slices[j].0 == n);
            let gathered =
                sharded.gather_pieces(&group, |n| find(n).map(|j| slices[j].1.shallow_clone()))?;
            for (name, whole) in gathered {
                if let Some(j) = find(&name) {
                    out[j] = Some(whole);
                }
            }
            pending = rest;
        }
    }
    out.into_iter()
        .zip(&slices)
        .map(|(t, (name, _))| {
            t.ok_or_else(|| ShardError::Layout(format!("gather_slices: `{name}` was not gathered")))
        })
        .collect()
}

/// After an event: under `optimizer` and `gradients`, when a method wrote slices, every rank's
/// pieces reach every rank; under `full`, units let go for a slice are made whole again.
/// Collective when it acts (every rank ran the same methods).
pub fn after_event(group: &Group, sharded: &ShardedParams) -> Result<(), ShardError> {
    if WRITTEN.with(|w| w.replace(false)) {
        sharded.all_gather(group)?;
    }
    if RESUMMON.with(|r| r.replace(false)) {
        sharded.summon()?;
    }
    Ok(())
}
