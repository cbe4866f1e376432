//! The optimizer under `[distributed] sharding` (ZeRO): each rank steps its own piece of every
//! parameter (the `dist` module's sharding lays them out), keeping the optimizer state of that piece
//! only. Pieces are 1-D and share the parameter's memory; the update rules are element-wise,
//! so a piece is stepped as its part of the whole parameter would be. Groups, membership and
//! checkpoints still speak of whole parameters: a restored state is cut into this rank's piece,
//! and the trainer gathers the pieces' state into whole tensors for a checkpoint.

use tch::{TchError, Tensor};

use super::{Optimizer, Slot};

/// Where this rank's part of each sharded parameter lives.
pub trait Shards: Send {
    /// This rank's piece of parameter `name`: a 1-D tensor sharing its memory (possibly
    /// empty); `None` when the parameter is not sharded.
    fn piece(&self, name: &str) -> Option<Tensor>;

    /// Cuts `whole` (a tensor of parameter `name`'s shape) into this rank's piece (a new
    /// tensor); `None` when the parameter is not sharded.
    fn cut(&self, name: &str, whole: &Tensor) -> Option<Result<Tensor, TchError>>;
}

impl Optimizer {
    /// Steps this rank's pieces of the sharded parameters from now on. Call before any state
    /// exists (right after construction; a checkpoint restored later is cut into pieces).
    pub fn shard(&mut self, shards: Box<dyn Shards>) {
        for slot in &mut self.slots {
            if let Some(piece) = shards.piece(&slot.name) {
                let whole = std::mem::replace(&mut slot.param, piece);
                slot.whole = Some(whole);
            }
        }
        self.shards = Some(shards);
    }

    /// The state buffers' names of the algorithm (`exp_avg`, ...), as in checkpoints.
    pub fn buffer_names(&self) -> &'static [&'static str] {
        self.algorithm.buffer_names()
    }

    /// A slot for parameter `param`, stepping this rank's piece of it when it is sharded.
    pub(super) fn slot_for(&self, name: String, param: &Tensor, group: usize) -> Slot {
        let piece = self.shards.as_ref().and_then(|s| s.piece(&name));
        let mut slot = Slot::new(name, param.shallow_clone(), group);
        if let Some(piece) = piece {
            slot.whole = Some(std::mem::replace(&mut slot.param, piece));
        }
        slot
    }

    /// `whole` (a state tensor of parameter `name`'s shape) as this rank steps it: its piece
    /// when the parameter is sharded, else itself.
    pub(super) fn cut(&self, name: &str, whole: Tensor) -> Result<Tensor, TchError> {
        match self.shards.as_ref().and_then(|s| s.cut(name, &whole)) {
            Some(piece) => piece,
            None => Ok(whole),
        }
    }
}
