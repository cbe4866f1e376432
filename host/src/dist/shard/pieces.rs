//! A rank's pieces of the parameters: all of them gathered back into whole parameters, or
//! gathered for a checkpoint, and their view for the optimizer (`PieceView`).

use tch::Tensor;

use super::{torch, Piece, ShardError, ShardedParams};
use crate::dist::Group;

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

impl ShardedParams {
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
