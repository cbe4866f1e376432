//! Packed fixed-length sequences over a token stream: what a language model trains on.

use std::sync::Arc;

use crate::data::DataError;

/// Packed fixed-length sequences over a token stream: sequence `i` covers tokens
/// `[i*T, i*T+T]` (`T+1` tokens: the input is the first `T`, the target the last `T`, shifted by
/// one); `len = (tokens.len() - 1) / T`, so a last partial sequence is dropped.
#[derive(Debug, Clone)]
pub struct PackedSequences {
    tokens: Arc<Vec<u32>>,
    seq_len: usize,
    len: usize,
}

impl PackedSequences {
    /// Sequences of `seq_len` tokens over `tokens`; an error when `seq_len` is 0 or the stream
    /// has fewer than `seq_len + 1` tokens.
    pub fn new(tokens: Arc<Vec<u32>>, seq_len: usize) -> Result<PackedSequences, DataError> {
        if seq_len == 0 {
            return Err(DataError::Invalid(
                "the sequence length must be at least 1".to_owned(),
            ));
        }
        if tokens.len() < seq_len + 1 {
            return Err(DataError::Invalid(format!(
                "the token stream has {} tokens, too few for one sequence of length {seq_len} \
                 (needs {}: the inputs and the target shifted by one)",
                tokens.len(),
                seq_len + 1
            )));
        }
        let len = (tokens.len() - 1) / seq_len;
        Ok(PackedSequences {
            tokens,
            seq_len,
            len,
        })
    }

    /// The number of sequences.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: [`PackedSequences::new`] refuses a stream without one whole sequence.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sequence length `T`.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// The token stream.
    pub fn tokens(&self) -> &Arc<Vec<u32>> {
        &self.tokens
    }

    /// Sequence `i`: (input `T` tokens, target `T` tokens). Panics when `i >= len()`.
    pub fn sample(&self, i: usize) -> (&[u32], &[u32]) {
        assert!(
            i < self.len,
            "sequence {i} out of range ({} sequences)",
            self.len
        );
        let start = i * self.seq_len;
        (
            &self.tokens[start..start + self.seq_len],
            &self.tokens[start + 1..start + 1 + self.seq_len],
        )
    }

    /// Writes sequence `i` into `input` and `target` (each `T` long) as `i64`, the dtype of an
    /// embedding's indices. Panics when `i >= len()` or a buffer has another length.
    pub fn write_i64(&self, i: usize, input: &mut [i64], target: &mut [i64]) {
        let (x, y) = self.sample(i);
        assert_eq!(input.len(), self.seq_len, "input buffer length");
        assert_eq!(target.len(), self.seq_len, "target buffer length");
        for (out, &id) in input.iter_mut().zip(x) {
            *out = i64::from(id);
        }
        for (out, &id) in target.iter_mut().zip(y) {
            *out = i64::from(id);
        }
    }
}
