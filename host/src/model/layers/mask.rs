//! The attention mask of the forward pass running on this thread: the batch's
//! `attention_mask` entry (`(B, T)`, 1 at tokens, 0 at padding), set around the model's forward
//! by [`with_attention_mask`] and read by the attention layers that can ignore padded keys
//! (BERT's, and plugin modules through plugin-api 1.7's masked forward). A layer's
//! `forward(xs)` takes one tensor; the mask reaches the layers that need it without every
//! container in between passing it on.
//!
//! The batch's `token_type_ids` (sentence pairs: 0 on the first text, 1 on the second) reach
//! BERT's embeddings the same way ([`with_token_type_ids`], [`token_type_ids`]).

use std::cell::RefCell;

use tch::Tensor;

type Slot = std::thread::LocalKey<RefCell<Option<Tensor>>>;

thread_local! {
    static MASK: RefCell<Option<Tensor>> = const { RefCell::new(None) };
    static TYPES: RefCell<Option<Tensor>> = const { RefCell::new(None) };
}

/// Restores a slot's previous tensor when the forward it was set for ends (also on an error or
/// a panic).
struct Restore(&'static Slot, Option<Tensor>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.1.take();
        self.0.with(|m| *m.borrow_mut() = previous);
    }
}

/// Runs `f` with `value` in `slot`, restoring the slot's tensor after.
fn with_slot<R>(slot: &'static Slot, value: Option<&Tensor>, f: impl FnOnce() -> R) -> R {
    let previous = slot.with(|m| m.replace(value.map(Tensor::shallow_clone)));
    let _restore = Restore(slot, previous);
    f()
}

/// Runs `f` with `mask` as the attention mask of the forward pass (`None`: no padding).
pub fn with_attention_mask<R>(mask: Option<&Tensor>, f: impl FnOnce() -> R) -> R {
    with_slot(&MASK, mask, f)
}

/// The attention mask of the forward pass running on this thread, if its batch has one.
pub fn attention_mask() -> Option<Tensor> {
    MASK.with(|m| m.borrow().as_ref().map(Tensor::shallow_clone))
}

/// Runs `f` with `types` as the token type ids of the forward pass (`None`: all 0).
pub fn with_token_type_ids<R>(types: Option<&Tensor>, f: impl FnOnce() -> R) -> R {
    with_slot(&TYPES, types, f)
}

/// The token type ids of the forward pass running on this thread, if its batch has them.
pub fn token_type_ids() -> Option<Tensor> {
    TYPES.with(|m| m.borrow().as_ref().map(Tensor::shallow_clone))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mask_is_seen_inside_only_and_nests() {
        assert!(attention_mask().is_none());
        let a = Tensor::from_slice(&[1i64, 1, 0]);
        let b = Tensor::from_slice(&[1i64, 0, 0]);
        with_attention_mask(Some(&a), || {
            assert!(attention_mask().unwrap().equal(&a));
            with_attention_mask(Some(&b), || {
                assert!(attention_mask().unwrap().equal(&b));
            });
            with_attention_mask(None, || assert!(attention_mask().is_none()));
            assert!(attention_mask().unwrap().equal(&a));
        });
        assert!(attention_mask().is_none());
        let r = std::panic::catch_unwind(|| with_attention_mask(Some(&a), || panic!("boom")));
        assert!(r.is_err());
        assert!(attention_mask().is_none(), "a panic leaves no mask behind");
        with_token_type_ids(Some(&b), || {
            assert!(token_type_ids().unwrap().equal(&b));
            assert!(attention_mask().is_none(), "the slots are apart");
        });
        assert!(token_type_ids().is_none());
    }
}
