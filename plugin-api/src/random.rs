//! Random draws built on a stream of uniform numbers (plugin-api 1.3): the Beta and Gamma
//! distributions and random permutations that MixUp and CutMix draw. [`Context::rng_beta`] and
//! [`Context::rng_permutation`] run them on the host's seeded stream; the functions here take
//! any uniform source, so tests can drive them with a seeded generator of their own.
//!
//! [`Context::rng_beta`]: crate::Context::rng_beta
//! [`Context::rng_permutation`]: crate::Context::rng_permutation

/// A uniform number in `(0, 1]` from a draw `u` in `[0, 1)`: safe to take the logarithm of.
fn open_at_zero(u: f64) -> f64 {
    1.0 - u
}

/// One SplitMix64 step: a small seeded generator for tests and stand-ins (plugin-api 1.11; in
/// `testing` since 1.2), independent of libtorch's global generator.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A standard normal draw (Box–Muller, the cosine branch): two uniforms per draw.
pub fn standard_normal(uniform: &mut dyn FnMut() -> f64) -> f64 {
    let radius = (-2.0 * open_at_zero(uniform()).ln()).sqrt();
    let angle = std::f64::consts::TAU * uniform();
    radius * angle.cos()
}

/// The natural logarithm of a `Gamma(shape, 1)` draw, `shape > 0`.
///
/// Marsaglia and Tsang's method (*A simple method for generating gamma variables*, ACM TOMS
/// 26(3), 2000): for `shape ≥ 1`, with `d = shape − 1/3` and `c = 1/√(9d)`, draw `x` standard
/// normal and `v = (1 + c·x)³` until `v > 0` and a uniform `u` passes the squeeze
/// `u < 1 − 0.0331·x⁴` or the exact test `ln u < x²/2 + d·(1 − v + ln v)`; the draw is `d·v`. For
/// `shape < 1` it boosts: `Gamma(shape) = Gamma(shape + 1) · U^(1/shape)`. Working in logarithms
/// keeps that product from underflowing to 0 for small shapes (`U^(1/0.01)`), so a Beta built
/// from two of them never divides 0 by 0.
pub fn gamma_ln(shape: f64, uniform: &mut dyn FnMut() -> f64) -> f64 {
    if shape < 1.0 {
        let boost = open_at_zero(uniform()).ln() / shape;
        return gamma_ln(shape + 1.0, uniform) + boost;
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = standard_normal(uniform);
        let t = 1.0 + c * x;
        if t <= 0.0 {
            continue;
        }
        let v = t * t * t;
        let u = open_at_zero(uniform());
        let x2 = x * x;
        if u < 1.0 - 0.0331 * x2 * x2 || u.ln() < 0.5 * x2 + d * (1.0 - v + v.ln()) {
            return d.ln() + v.ln();
        }
    }
}

/// A `Beta(a, b)` draw (`a, b > 0`): `X / (X + Y)` with `X ~ Gamma(a)`, `Y ~ Gamma(b)`, `X`
/// drawn first, computed from their logarithms as `1 / (1 + exp(ln Y − ln X))`.
pub fn beta(a: f64, b: f64, uniform: &mut dyn FnMut() -> f64) -> f64 {
    let x = gamma_ln(a, uniform);
    let y = gamma_ln(b, uniform);
    1.0 / (1.0 + (y - x).exp())
}

/// A uniformly random permutation of `0..n` (Fisher–Yates, from the last position down);
/// `below(k)` must return a uniform integer in `0..k`.
pub fn permutation(n: usize, below: &mut dyn FnMut(u64) -> u64) -> Vec<i64> {
    let mut p: Vec<i64> = (0..n as i64).collect();
    for i in (1..n).rev() {
        let j = below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64 uniforms in `[0, 1)`, converted as `Context::rng_f64` does.
    fn uniforms(seed: u64) -> impl FnMut() -> f64 {
        let mut state = seed;
        move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
        }
    }

    fn mean_var(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
        (mean, var)
    }

    #[test]
    fn beta_moments_match_theory_for_both_gamma_branches() {
        // Beta(a, b): mean a/(a+b), variance ab/((a+b)²(a+b+1)). Shapes below and above 1
        // exercise the boosted and the plain Marsaglia–Tsang branches.
        let n = 40_000;
        for (k, (a, b)) in [(0.2, 0.2), (1.0, 1.0), (2.5, 2.5), (0.5, 3.0), (4.0, 1.5)]
            .into_iter()
            .enumerate()
        {
            let mut u = uniforms(k as u64 + 1);
            let xs: Vec<f64> = (0..n).map(|_| beta(a, b, &mut u)).collect();
            let (mean, var) = mean_var(&xs);
            let want_mean = a / (a + b);
            let want_var = a * b / ((a + b) * (a + b) * (a + b + 1.0));
            // Five standard errors: the mean's is sqrt(var/n); the sample variance's is about
            // sqrt((m4 − var²)/n), bounded here by var·sqrt(2/n)·3 for these light tails.
            let se_mean = (want_var / n as f64).sqrt();
            assert!(
                (mean - want_mean).abs() < 5.0 * se_mean,
                "Beta({a}, {b}): mean {mean}, want {want_mean} ± {}",
                5.0 * se_mean
            );
            let se_var = want_var * (2.0 / n as f64).sqrt() * 3.0;
            assert!(
                (var - want_var).abs() < 5.0 * se_var,
                "Beta({a}, {b}): variance {var}, want {want_var} ± {}",
                5.0 * se_var
            );
        }
    }

    #[test]
    fn tiny_shapes_do_not_underflow() {
        let mut u = uniforms(9);
        let xs: Vec<f64> = (0..2000).map(|_| beta(0.01, 0.01, &mut u)).collect();
        assert!(xs.iter().all(|x| x.is_finite()), "a NaN draw");
        // Almost all mass sits at the ends; both ends are reached.
        assert!(xs.iter().any(|&x| x < 1e-6) && xs.iter().any(|&x| x > 1.0 - 1e-6));
    }

    #[test]
    fn permutations_are_permutations_and_uniform() {
        let mut state = 3u64;
        let mut below = |k: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % k
        };
        let n = 4;
        let trials = 24_000;
        let mut counts = std::collections::HashMap::new();
        for _ in 0..trials {
            let p = permutation(n, &mut below);
            let mut sorted = p.clone();
            sorted.sort();
            assert_eq!(sorted, vec![0, 1, 2, 3]);
            *counts.entry(p).or_insert(0usize) += 1;
        }
        // 24 permutations, each expected 1000 times (sd ≈ 31).
        assert_eq!(counts.len(), 24);
        for (p, c) in counts {
            assert!((c as f64 - 1000.0).abs() < 160.0, "{p:?} drawn {c} times");
        }
    }
}
