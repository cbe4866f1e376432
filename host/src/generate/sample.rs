//! Choosing the next token from a row of logits: greedy (temperature 0), or a draw from the
//! softmax of `logits / temperature` restricted to the `top_k` most likely tokens and then to the
//! smallest set whose probability reaches `top_p` (Hugging Face's `TemperatureLogitsWarper`,
//! `TopKLogitsWarper`, `TopPLogitsWarper`, in that order).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::GenerateError;

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0: greedy (the most likely token; the first of equals). Above 0: the logits are divided
    /// by it before the draw (below 1 sharper, above 1 flatter).
    pub temperature: f64,
    /// Only the `top_k` most likely tokens may be drawn (`None`: all).
    pub top_k: Option<usize>,
    /// Only the most likely tokens whose probabilities add up to `top_p` may be drawn (the
    /// smallest such set; `1.0`: all).
    pub top_p: f64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
        }
    }
}

impl Sampling {
    /// Checks the settings; errors name the option.
    pub fn validate(&self) -> Result<(), GenerateError> {
        let bad = |msg: String| Err(GenerateError::Invalid(msg));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(format!(
                "--temperature must be 0 (greedy) or more, got {}",
                self.temperature
            ));
        }
        if self.top_k == Some(0) {
            return bad("--top-k must be at least 1".to_owned());
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("--top-p must be in (0, 1], got {}", self.top_p));
        }
        Ok(())
    }

    /// Whether tokens are drawn (not greedy).
    pub fn draws(&self) -> bool {
        self.temperature > 0.0
    }
}

/// One sequence's token chooser: its settings and its own random stream, a function of the
/// seed and the prompt's index only, so a prompt gets the same tokens alone or in any batch.
#[derive(Debug)]
pub struct Sampler {
    sampling: Sampling,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// The chooser of prompt `index` under `seed`.
    pub fn new(sampling: Sampling, seed: u64, index: usize) -> Sampler {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(index as u64);
        Sampler { sampling, rng }
    }

    /// The next token given its logits over the vocabulary.
    pub fn next(&mut self, logits: &[f32]) -> usize {
        if !self.sampling.draws() {
            return argmax(logits);
        }
        let t = self.sampling.temperature;
        // Candidates, most likely first (stable: equals keep their order).
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if let Some(k) = self.sampling.top_k {
            order.truncate(k.max(1));
        }
        let best = order.first().map_or(0.0, |&i| f64::from(logits[i]) / t);
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| (f64::from(logits[i]) / t - best).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        // Top-p: keep the most likely tokens until their share reaches top_p (at least one).
        let mut kept = 0;
        let mut share = 0.0;
        for w in &weights {
            kept += 1;
            share += w / total;
            if share >= self.sampling.top_p {
                break;
            }
        }
        let weights = &weights[..kept];
        let total: f64 = weights.iter().sum();
        let mut draw = self.rng.gen::<f64>() * total;
        for (w, &i) in weights.iter().zip(&order) {
            if draw < *w {
                return i;
            }
            draw -= w;
        }
        order[kept - 1]
    }
}

/// The index of the largest value; the first of equals (as `torch.argmax`). NaN never wins.
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] || values[best].is_nan() {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f64, top_k: Option<usize>, top_p: f64) -> Sampling {
        Sampling {
            temperature,
            top_k,
            top_p,
        }
    }

    #[test]
    fn greedy_takes_the_first_largest() {
        let mut s = Sampler::new(Sampling::default(), 0, 0);
        assert_eq!(s.next(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 1);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = [0.3, 2.0, 1.9, -4.0];
        for (k, p) in [(Some(1), 1.0), (None, 1e-6)] {
            let mut s = Sampler::new(sampling(1.5, k, p), 5, 3);
            for _ in 0..50 {
                assert_eq!(s.next(&logits), 1);
            }
        }
    }

    #[test]
    fn draws_follow_the_seed_and_the_probabilities() {
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let draw = |seed, index| {
            let mut s = Sampler::new(sampling(1.0, None, 1.0), seed, index);
            (0..4000).map(|_| s.next(&logits)).collect::<Vec<_>>()
        };
        let a = draw(7, 0);
        assert_eq!(a, draw(7, 0), "the same seed and index draw the same");
        assert_ne!(a, draw(7, 1), "another prompt draws its own");
        assert!(
            a.iter().all(|&i| i < 2),
            "an impossible token is never drawn"
        );
        let ones = a.iter().filter(|&&i| i == 1).count() as f64 / a.len() as f64;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
        // Top-p 0.7 keeps only the token of probability 0.75.
        let mut s = Sampler::new(sampling(1.0, None, 0.7), 7, 0);
        assert!((0..200).all(|_| s.next(&logits) == 1));
    }

    #[test]
    fn bad_settings_name_the_option() {
        for (s, option) in [
            (sampling(-1.0, None, 1.0), "--temperature"),
            (sampling(1.0, Some(0), 1.0), "--top-k"),
            (sampling(1.0, None, 0.0), "--top-p"),
            (sampling(1.0, None, 1.5), "--top-p"),
        ] {
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(option), "{e}");
        }
    }
}
