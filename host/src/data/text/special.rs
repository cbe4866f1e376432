//! The special tokens of encoder models (BERT): `[PAD]`, `[CLS]`, `[SEP]` and `[MASK]`, for
//! labelled text (classification) and masked-LM batches alike.
//!
//! The rule: a token the tokenizer has (a Hugging Face BERT `tokenizer.json` has all four) keeps
//! its id; each one it lacks (a trained byte-level BPE has none) gets a new id after the
//! tokenizer's vocabulary of `V` ids, in the order pad, cls, sep, mask. Without any of them:
//! `pad = V`, `cls = V + 1`, `sep = V + 2`, `mask = V + 3`, and the model's vocabulary is
//! `V + 4`. The reserved ids never come out of the tokenizer, so they cannot collide with text.

use serde::{Deserialize, Serialize};

/// The padding token.
pub const PAD_TOKEN: &str = "[PAD]";
/// The classification token that starts a sequence.
pub const CLS_TOKEN: &str = "[CLS]";
/// The separator token that ends a sequence.
pub const SEP_TOKEN: &str = "[SEP]";
/// The token that replaces a masked-LM selected position.
pub const MASK_TOKEN: &str = "[MASK]";

/// The ids of the four special tokens and the vocabulary that holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecialTokens {
    /// `[PAD]`: fills a sequence up to its length (attention mask 0).
    pub pad: u32,
    /// `[CLS]`: first token of a labelled sequence.
    pub cls: u32,
    /// `[SEP]`: last real token of a labelled sequence.
    pub sep: u32,
    /// `[MASK]`: what masked-LM puts at most selected positions.
    pub mask: u32,
    /// The tokenizer's end-of-document id (never masked), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos: Option<u32>,
    /// The model's vocabulary: the tokenizer's `V` plus the reserved ids.
    pub vocab_size: usize,
}

impl SpecialTokens {
    /// The special tokens for a tokenizer of `vocab_size` ids (one more than its largest id)
    /// whose token ids `lookup` gives (`None` for a token it does not have); `eos` is its
    /// end-of-document id, if any. See the module doc for the rule.
    pub fn new(
        vocab_size: usize,
        eos: Option<u32>,
        lookup: impl Fn(&str) -> Option<u32>,
    ) -> SpecialTokens {
        let mut next = vocab_size as u32;
        let mut id = |token: &str| {
            lookup(token).unwrap_or_else(|| {
                next += 1;
                next - 1
            })
        };
        let (pad, cls, sep, mask) = (id(PAD_TOKEN), id(CLS_TOKEN), id(SEP_TOKEN), id(MASK_TOKEN));
        SpecialTokens {
            pad,
            cls,
            sep,
            mask,
            eos,
            vocab_size: (next as usize).max(vocab_size),
        }
    }

    /// The special tokens of a loaded tokenizer.
    pub fn of(tokenizer: &super::TextTokenizer) -> SpecialTokens {
        SpecialTokens::new(tokenizer.vocab_size(), Some(tokenizer.eos_id()), |t| {
            tokenizer.token_id(t)
        })
    }

    /// Whether `id` is one of the special tokens (or the end-of-document token): masked-LM
    /// never selects those positions.
    pub fn is_special(&self, id: u32) -> bool {
        id == self.pad
            || id == self.cls
            || id == self.sep
            || id == self.mask
            || Some(id) == self.eos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tokens_are_reserved_after_the_vocabulary() {
        let s = SpecialTokens::new(100, Some(0), |_| None);
        assert_eq!((s.pad, s.cls, s.sep, s.mask), (100, 101, 102, 103));
        assert_eq!(s.vocab_size, 104);
        assert!(s.is_special(0) && s.is_special(103) && !s.is_special(5));
    }

    #[test]
    fn a_bert_vocabulary_keeps_its_ids() {
        // bert-base-uncased's ids.
        let lookup = |t: &str| match t {
            PAD_TOKEN => Some(0),
            CLS_TOKEN => Some(101),
            SEP_TOKEN => Some(102),
            MASK_TOKEN => Some(103),
            _ => None,
        };
        let s = SpecialTokens::new(30522, Some(102), lookup);
        assert_eq!((s.pad, s.cls, s.sep, s.mask), (0, 101, 102, 103));
        assert_eq!(s.vocab_size, 30522);
    }

    #[test]
    fn only_the_missing_ones_are_added_in_order() {
        let lookup = |t: &str| (t == CLS_TOKEN).then_some(7);
        let s = SpecialTokens::new(50, None, lookup);
        assert_eq!((s.pad, s.cls, s.sep, s.mask), (50, 7, 51, 52));
        assert_eq!(s.vocab_size, 53);
    }
}
