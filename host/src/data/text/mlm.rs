//! Masked-LM samples (`[data.mlm]`): BERT's pretraining objective over packed token sequences,
//! with the semantics of Hugging Face's `DataCollatorForLanguageModeling`.
//!
//! Each position whose token is not special ([`SpecialTokens::is_special`]: `[PAD]`, `[CLS]`,
//! `[SEP]`, `[MASK]`, the end-of-document token) is selected with `probability`. A selected
//! position's target is its original id and its input becomes `[MASK]` with `mask_fraction`, a
//! uniformly random id of the whole vocabulary (as Hugging Face draws, special ids included)
//! with `random_fraction`, and stays as it is otherwise; every other target is
//! [`IGNORE_TARGET`] (-100, the cross-entropy's default `ignore_index`).
//!
//! The draws of a sample come from a ChaCha generator keyed by (run seed, epoch, split) on the
//! stream of the sample's index ([`sample_rng`]), not from the order of batches: a resumed run,
//! any number of ranks or workers, and an evaluation subset see the same masks. The training
//! masks change each epoch (dynamic masking, as the collator does); evaluation always passes
//! epoch 0, so its masks are fixed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::packing::PackedSequences;
use super::special::SpecialTokens;

/// The target of a position masked-LM does not score (PyTorch's default `ignore_index`).
pub const IGNORE_TARGET: i64 = -100;

/// `[data.mlm]`: how masked-LM selects and replaces tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MlmConfig {
    /// The chance that a non-special position is selected, in (0, 1] (default 0.15).
    pub probability: f64,
    /// The share of selected positions that become `[MASK]` (default 0.8).
    pub mask_fraction: f64,
    /// The share of selected positions that become a random token (default 0.1); the rest,
    /// `1 - mask_fraction - random_fraction`, keep their token.
    pub random_fraction: f64,
}

impl Default for MlmConfig {
    fn default() -> Self {
        MlmConfig {
            probability: 0.15,
            mask_fraction: 0.8,
            random_fraction: 0.1,
        }
    }
}

/// Which split a masked sample belongs to: the two draw from separate generators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlmSplit {
    /// The training sequences.
    Train,
    /// The evaluation sequences.
    Eval,
}

/// The generator of the masking of sample `index` of `split` in `epoch` of a run seeded `seed`.
pub fn sample_rng(seed: u64, epoch: u64, split: MlmSplit, index: usize) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    key[16..24].copy_from_slice(match split {
        MlmSplit::Train => b"mlmtrain",
        MlmSplit::Eval => b"mlm-eval",
    });
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(index as u64);
    rng
}

/// Masks `ids` (see the module doc): appends the model's input to `input` and the targets to
/// `target`, drawing from `rng`.
pub fn mask_tokens(
    ids: &[u32],
    cfg: &MlmConfig,
    specials: &SpecialTokens,
    rng: &mut impl Rng,
    input: &mut Vec<i64>,
    target: &mut Vec<i64>,
) {
    let vocab = specials.vocab_size as u32;
    for &id in ids {
        if specials.is_special(id) || rng.gen::<f64>() >= cfg.probability {
            input.push(i64::from(id));
            target.push(IGNORE_TARGET);
            continue;
        }
        target.push(i64::from(id));
        let u = rng.gen::<f64>();
        let replaced = if u < cfg.mask_fraction {
            specials.mask
        } else if u < cfg.mask_fraction + cfg.random_fraction {
            rng.gen_range(0..vocab)
        } else {
            id
        };
        input.push(i64::from(replaced));
    }
}

/// Packed sequences served as masked-LM samples: sequence `i`'s `T` tokens (the packing's
/// input), masked by the draws of ([`sample_rng`]) `(seed, epoch, split, i)`.
#[derive(Debug, Clone)]
pub struct MaskedSequences {
    sequences: PackedSequences,
    cfg: MlmConfig,
    specials: SpecialTokens,
    seed: u64,
    split: MlmSplit,
}

impl MaskedSequences {
    /// Masked-LM samples over `sequences` of a run seeded `seed`.
    pub fn new(
        sequences: PackedSequences,
        cfg: MlmConfig,
        specials: SpecialTokens,
        seed: u64,
        split: MlmSplit,
    ) -> MaskedSequences {
        MaskedSequences {
            sequences,
            cfg,
            specials,
            seed,
            split,
        }
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.sequences.len()
    }

    /// Always false (packed sequences hold at least one).
    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }

    /// Tokens per sample.
    pub fn seq_len(&self) -> usize {
        self.sequences.seq_len()
    }

    /// Appends sample `index` of `epoch`: its masked input and its targets. Panics when
    /// `index >= len()`.
    pub fn write(&self, index: usize, epoch: u64, input: &mut Vec<i64>, target: &mut Vec<i64>) {
        let (ids, _) = self.sequences.sample(index);
        let mut rng = sample_rng(self.seed, epoch, self.split, index);
        mask_tokens(ids, &self.cfg, &self.specials, &mut rng, input, target);
    }
}

#[cfg(test)]
#[path = "mlm_tests.rs"]
mod tests;
