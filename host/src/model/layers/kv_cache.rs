//! Incremental decoding (`tessera generate`): what a decoder keeps of the tokens it has already
//! seen, so that each new token costs one position's work instead of the whole sequence's.
//!
//! [`Layer::forward_cached`](super::Layer::forward_cached) runs a layer on the new tokens only.
//! Position-wise layers (linear layers, norms, embeddings, MLPs) compute each position from its
//! own input and simply run their forward; an attention module appends its new keys and values
//! to its slot of the [`KvCache`] and attends over all of them; the decoders read the new
//! tokens' positions from it. Any other layer (a plugin's module that replaced an attention,
//! say) cannot, and records so in the cache: generation then recomputes whole sequences.
//!
//! Sequences of a batch are left-padded to one length: the cache's key mask says which of the
//! keys are real tokens, and each row's positions count its real tokens only, so that a row
//! computes what it would alone.

use tch::{Device, Kind, TchError, Tensor};

/// The keys and values of every attention module of a decoder for the tokens decoded so far,
/// and the step being decoded: the new tokens' positions and which keys each of them sees.
#[derive(Debug, Default)]
pub struct KvCache {
    /// Per attention module, in the order the forward reaches them: keys and values
    /// `(B, heads, past, D)`.
    slots: Vec<(Tensor, Tensor)>,
    /// The slot the next attention module of this step uses.
    next_slot: usize,
    /// Tokens already in the cache (per row, padding included).
    past: i64,
    /// The new tokens' positions `(B, T)` (int64).
    positions: Option<Tensor>,
    /// `(B, 1, T, past + T)`, true where a new token may attend to a key; `None` when every
    /// key is a real token, so that the attention is plainly causal.
    mask: Option<Tensor>,
    /// The first layer met that cannot decode incrementally (its kind).
    unsupported: Option<String>,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// Prepares the step that feeds `new` tokens per row: `real` `(B, past + new)` is 1 at the
    /// real tokens of everything fed so far (this step included) and 0 at left padding. Each
    /// new token's position is the count of real tokens before it in its row (Hugging Face's
    /// `cumsum(attention_mask) - 1`).
    pub fn begin_step(&mut self, real: &Tensor, new: i64) -> Result<(), TchError> {
        let (b, total) = match real.size().as_slice() {
            &[b, total] if total == self.past + new && new > 0 => (b, total),
            s => {
                return Err(TchError::Shape(format!(
                    "kv cache: a key mask of shape {s:?} for {new} new tokens after {}",
                    self.past
                )))
            }
        };
        let device = real.device();
        let real = real.f_ne(0)?;
        let counts = real.f_to_kind(Kind::Int64)?.f_cumsum(1, Kind::Int64)?;
        let positions = counts
            .f_sub_scalar(1)?
            .f_clamp_min(0)?
            .f_narrow(1, self.past, new)?;
        let all_real = bool::try_from(real.f_all()?)?;
        self.mask = if all_real && (new == 1 || self.past == 0) {
            None
        } else {
            Some(step_mask(&real, self.past, new, b, total, device)?)
        };
        self.positions = Some(positions);
        self.next_slot = 0;
        Ok(())
    }

    /// Ends the step: `new` tokens more are cached.
    pub fn end_step(&mut self, new: i64) {
        self.past += new;
    }

    /// Tokens already cached per row (before this step's).
    pub fn past(&self) -> i64 {
        self.past
    }

    /// The new tokens' positions `(B, T)`.
    pub fn positions(&self) -> Result<&Tensor, TchError> {
        self.positions
            .as_ref()
            .ok_or_else(|| TchError::Shape("kv cache: no step begun".to_owned()))
    }

    /// Which keys each new token sees `(B, 1, T, past + T)`; `None`: plain causal attention
    /// (`is_causal` when the step feeds several tokens, all keys when it feeds one).
    pub fn mask(&self) -> Option<&Tensor> {
        self.mask.as_ref()
    }

    /// An attention module's keys and values for all tokens so far: this step's `k` and `v`
    /// `(B, heads, T, D)` appended to what the module cached at earlier steps.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor), TchError> {
        let slot = self.next_slot;
        self.next_slot += 1;
        let (k, v) = match self.slots.get(slot) {
            Some((past_k, past_v)) => (
                Tensor::f_cat(&[past_k, k], 2)?,
                Tensor::f_cat(&[past_v, v], 2)?,
            ),
            None if slot == self.slots.len() && self.past == 0 => {
                (k.shallow_clone(), v.shallow_clone())
            }
            None => {
                return Err(TchError::Shape(format!(
                    "kv cache: attention module {slot} has no keys for the {} tokens before",
                    self.past
                )))
            }
        };
        if slot < self.slots.len() {
            self.slots[slot] = (k.shallow_clone(), v.shallow_clone());
        } else {
            self.slots.push((k.shallow_clone(), v.shallow_clone()));
        }
        Ok((k, v))
    }

    /// Keeps the cached rows `rows` (int64 indices, in the new order) and drops the first
    /// `drop_front` tokens of every row (padding all of them share): the batch shrinks as its
    /// sequences end.
    pub fn keep(&mut self, rows: &Tensor, drop_front: i64) -> Result<(), TchError> {
        let kept = self.past - drop_front;
        for (k, v) in &mut self.slots {
            *k = k.f_index_select(0, rows)?.f_narrow(2, drop_front, kept)?;
            *v = v.f_index_select(0, rows)?.f_narrow(2, drop_front, kept)?;
        }
        self.past = kept;
        Ok(())
    }

    /// Records that a layer of kind `kind` cannot decode incrementally; the error to return.
    pub fn unsupported(&mut self, kind: &str) -> TchError {
        if self.unsupported.is_none() {
            self.unsupported = Some(kind.to_owned());
        }
        TchError::Kind(format!(
            "a `{kind}` module cannot decode incrementally (with a kv cache)"
        ))
    }

    /// The kind of the first layer that could not decode incrementally, if one was met.
    pub fn unsupported_kind(&self) -> Option<&str> {
        self.unsupported.as_deref()
    }
}

/// `(B, 1, new, total)`: query `i` (at column `past + i`) sees key `j` when `j <= past + i`
/// and `j` is a real token, or `j` is the query itself (so that a padding query attends to
/// something, and no row of the softmax is empty).
fn step_mask(
    real: &Tensor,
    past: i64,
    new: i64,
    b: i64,
    total: i64,
    device: Device,
) -> Result<Tensor, TchError> {
    let keys = Tensor::f_arange(total, (Kind::Int64, device))?.f_view([1, total])?;
    let queries =
        Tensor::f_arange_start(past, past + new, (Kind::Int64, device))?.f_view([new, 1])?;
    let causal = keys.f_le_tensor(&queries)?;
    let itself = keys.f_eq_tensor(&queries)?;
    let visible = real
        .f_view([b, 1, total])?
        .f_logical_and(&causal.f_unsqueeze(0)?)?
        .f_logical_or(&itself.f_unsqueeze(0)?)?;
    visible.f_unsqueeze(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_real_tokens_and_padding_sees_only_itself() {
        let mut cache = KvCache::new();
        let real = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1]).view([2, 4]);
        cache.begin_step(&real, 4).unwrap();
        let positions = Vec::<i64>::try_from(cache.positions().unwrap().flatten(0, -1)).unwrap();
        assert_eq!(positions, [0, 0, 0, 1, 0, 1, 2, 3]);
        let mask = cache.mask().expect("padding needs a mask");
        assert_eq!(mask.size(), [2, 1, 4, 4]);
        let row0 = Vec::<bool>::try_from(mask.get(0).flatten(0, -1)).unwrap();
        #[rustfmt::skip]
        assert_eq!(row0, [
            true, false, false, false,
            false, true, false, false,
            false, false, true, false,
            false, false, true, true,
        ]);
        cache.end_step(4);
        let real = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 5]);
        cache.begin_step(&real, 1).unwrap();
        let positions = Vec::<i64>::try_from(cache.positions().unwrap().flatten(0, -1)).unwrap();
        assert_eq!(positions, [2, 4]);
        let row0 = Vec::<bool>::try_from(cache.mask().unwrap().get(0).flatten(0, -1)).unwrap();
        assert_eq!(row0, [false, false, true, true, true]);
    }

    #[test]
    fn without_padding_the_attention_is_plainly_causal() {
        let mut cache = KvCache::new();
        let real = Tensor::ones([2, 3], (Kind::Int64, Device::Cpu));
        cache.begin_step(&real, 3).unwrap();
        assert!(cache.mask().is_none());
        let k = Tensor::ones([2, 1, 3, 4], (Kind::Float, Device::Cpu));
        let (all_k, _) = cache.append(&k, &k).unwrap();
        assert_eq!(all_k.size(), [2, 1, 3, 4]);
        cache.end_step(3);
        let real = Tensor::ones([2, 4], (Kind::Int64, Device::Cpu));
        cache.begin_step(&real, 1).unwrap();
        assert!(cache.mask().is_none());
        let k = Tensor::ones([2, 1, 1, 4], (Kind::Float, Device::Cpu));
        let (all_k, _) = cache.append(&k, &k).unwrap();
        assert_eq!(all_k.size(), [2, 1, 4, 4]);
        assert!(cache.unsupported_kind().is_none());
        let _ = cache.unsupported("alibi_gpt2_attention");
        assert_eq!(cache.unsupported_kind(), Some("alibi_gpt2_attention"));
    }
}
