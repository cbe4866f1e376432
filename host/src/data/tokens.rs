//! Token sources of the loader ([`TokenSource`]): [`PackedSequences`] (next-token targets),
//! [`MaskedSequences`] (masked-LM), [`LabelledSequences`] (classification), [`ChatSequences`]
//! (instruction data, the assistant's tokens scored), and the
//! `synthetic-text` generator.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::source::{TokenRows, TokenSource, TokenTargets};
use super::text::{ChatSequences, LabelledSequences, MaskedSequences, PackedSequences};
use super::DataError;

fn outside(index: usize, len: usize) -> DataError {
    DataError::Invalid(format!("sequence {index} is outside the {len} sequences"))
}

impl TokenSource for PackedSequences {
    fn len(&self) -> usize {
        PackedSequences::len(self)
    }

    fn seq_len(&self) -> usize {
        PackedSequences::seq_len(self)
    }

    fn read(&self, index: usize, _epoch: u64, rows: &mut TokenRows) -> Result<(), DataError> {
        if index >= PackedSequences::len(self) {
            return Err(outside(index, PackedSequences::len(self)));
        }
        let (x, y) = self.sample(index);
        rows.input.extend(x.iter().map(|&t| i64::from(t)));
        rows.target.extend(y.iter().map(|&t| i64::from(t)));
        Ok(())
    }
}

impl TokenSource for ChatSequences {
    fn len(&self) -> usize {
        ChatSequences::len(self)
    }

    fn seq_len(&self) -> usize {
        ChatSequences::seq_len(self)
    }

    fn read(&self, index: usize, _epoch: u64, rows: &mut TokenRows) -> Result<(), DataError> {
        if index >= ChatSequences::len(self) {
            return Err(outside(index, ChatSequences::len(self)));
        }
        self.write(index, &mut rows.input, &mut rows.target);
        Ok(())
    }
}

impl TokenSource for MaskedSequences {
    fn len(&self) -> usize {
        MaskedSequences::len(self)
    }

    fn seq_len(&self) -> usize {
        MaskedSequences::seq_len(self)
    }

    fn read(&self, index: usize, epoch: u64, rows: &mut TokenRows) -> Result<(), DataError> {
        if index >= MaskedSequences::len(self) {
            return Err(outside(index, MaskedSequences::len(self)));
        }
        self.write(index, epoch, &mut rows.input, &mut rows.target);
        Ok(())
    }
}

impl TokenSource for LabelledSequences {
    fn len(&self) -> usize {
        LabelledSequences::len(self)
    }

    fn seq_len(&self) -> usize {
        LabelledSequences::seq_len(self)
    }

    fn targets(&self) -> TokenTargets {
        TokenTargets::PerSequence
    }

    fn padded(&self) -> bool {
        true
    }

    fn paired(&self) -> bool {
        LabelledSequences::paired(self)
    }

    fn label(&self, index: usize) -> Option<i64> {
        self.labels().get(index).copied()
    }

    fn read(&self, index: usize, _epoch: u64, rows: &mut TokenRows) -> Result<(), DataError> {
        if index >= LabelledSequences::len(self) {
            return Err(outside(index, LabelledSequences::len(self)));
        }
        let class = self.write(
            index,
            &mut rows.input,
            &mut rows.attention_mask,
            &mut rows.token_type_ids,
        );
        rows.target.push(class);
        Ok(())
    }
}

/// `n` tokens of `vocab` from a seeded Markov chain that a small model can learn: each token has
/// four likely successors (drawn once from the seed), taken with probabilities 0.6, 0.2, 0.1
/// and 0.05; the remaining 0.05 is a uniformly random token. Its entropy is about 1.9 nats per
/// token against `ln(vocab)` for a model that learned nothing.
pub fn synthetic_tokens(seed: u64, n: usize, vocab: usize) -> Result<Vec<u32>, DataError> {
    if vocab < 2 || u32::try_from(vocab).is_err() {
        return Err(DataError::Invalid(format!(
            "synthetic-text needs a vocabulary of 2 to 2^32 tokens, got {vocab}"
        )));
    }
    // The chain is the same for every split of a run (its seed is fixed); the walk is not.
    let mut chain_rng = ChaCha8Rng::seed_from_u64(0x7e55e7a);
    let successors: Vec<[u32; 4]> = (0..vocab)
        .map(|_| std::array::from_fn(|_| chain_rng.gen_range(0..vocab as u32)))
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n);
    let mut token = rng.gen_range(0..vocab as u32);
    for _ in 0..n {
        out.push(token);
        let u: f64 = rng.gen();
        token = match u {
            u if u < 0.6 => successors[token as usize][0],
            u if u < 0.8 => successors[token as usize][1],
            u if u < 0.9 => successors[token as usize][2],
            u if u < 0.95 => successors[token as usize][3],
            _ => rng.gen_range(0..vocab as u32),
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_read_as_a_token_source_with_shifted_targets() {
        let tokens: Vec<u32> = (0..23).collect();
        let s = PackedSequences::new(std::sync::Arc::new(tokens), 5).unwrap();
        let s: &dyn TokenSource = &s;
        assert_eq!(s.len(), 4); // 22 / 5: the last 2 tokens do not fill a sequence
        let mut rows = TokenRows::default();
        s.read(3, 0, &mut rows).unwrap();
        assert_eq!(rows.input, [15, 16, 17, 18, 19]);
        assert_eq!(rows.target, [16, 17, 18, 19, 20]);
        assert!(rows.attention_mask.is_empty());
        assert!(s.read(4, 0, &mut rows).is_err());
    }

    #[test]
    fn synthetic_tokens_are_seeded_in_range_and_predictable() {
        let a = synthetic_tokens(1, 5000, 50).unwrap();
        assert_eq!(a, synthetic_tokens(1, 5000, 50).unwrap());
        assert_ne!(a, synthetic_tokens(2, 5000, 50).unwrap());
        assert!(a.iter().all(|&t| t < 50));
        // The most frequent successor of a token follows it most of the time.
        let mut counts = vec![[0u32; 50]; 50];
        for w in a.windows(2) {
            counts[w[0] as usize][w[1] as usize] += 1;
        }
        let (top, all): (u32, u32) = counts
            .iter()
            .map(|row| (*row.iter().max().unwrap(), row.iter().sum::<u32>()))
            .fold((0, 0), |(t, a), (x, y)| (t + x, a + y));
        assert!(f64::from(top) / f64::from(all) > 0.55, "{top}/{all}");
        assert!(synthetic_tokens(1, 10, 1).is_err());
    }
}
