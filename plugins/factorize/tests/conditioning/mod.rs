//! How precisely a low-rank solution is determined by its data, and the tolerances that follow.
//!
//! Composer's solver (and ours, which runs the same operations in the same order, in float32,
//! with the same `gels` least-squares driver) is `Ya = lstsq(X, Y)`, an SVD of `W0` (the
//! operator, or `Wa·Wb` for `set_rank`) truncated to `k`, then alternating least squares. With
//! one thread (`OMP_NUM_THREADS=1`, as `generate.py` ran) our factors equal Composer's bit for
//! bit; with libtorch's default thread count MKL splits its products and factorizations
//! differently, and Composer's own results move the same way. Two float32 evaluations round
//! differently, and a few steps amplify that rounding:
//!
//! - the least-squares solve `X⁺Y` (backward stable: exact for data moved by `u` relative): its
//!   solution moves by about `u·κ_LS`, `κ_LS = κ(X)·(1 + κ(X)·tan θ)`, with `κ(X) =
//!   σ_max(X)/σ_min(X)` and `tan θ = ‖Y − X·X⁺Y‖/‖X·X⁺Y‖`; the *fitted values* `X·X⁺Y` by about
//!   `u·(η + κ(X)·tan θ)`, `η = ‖X‖₂‖X⁺Y‖/‖X·X⁺Y‖ ∈ [1, κ(X)]` (Higham, *Accuracy and Stability of
//!   Numerical Algorithms*, 2nd ed., §20.1, to first order). So `Wa·Wb` can move along
//!   directions `X` hardly sees while the prediction `ŷ = X·Wa·Wb + bias` does not;
//! - the truncated SVD: the span of the leading `k` singular vectors moves by about
//!   `u·s₁/(s_k − s_{k+1})` (Wedin's sin Θ theorem), and with `n_iters ≤ 3` the alternating steps
//!   do not converge far enough to forget their start, so the product and `ŷ` inherit it. A
//!   single singular vector moves by `u·s₁/min(s_{j−1} − s_j, s_j − s_{j+1})`, so the individual
//!   factors (beyond the sign of each latent column, which is arbitrary) carry the smallest gap
//!   among the first `k + 1` singular values. The alternating steps are equivariant under any
//!   invertible mixing of the latent columns, so that is all the ambiguity there is.
//!
//! Hence, with `u = 2⁻²⁴` (float32 unit roundoff), the relative tolerances (`max|got − want| ≤
//! tol·max|want|`):
//!
//! | compared | tolerance |
//! | --- | --- |
//! | `ŷ`, the layer's output (and the bias, absolute, times the largest `ŷ`) | `C·u·(η + κ(X)·tan θ + s₁/(s_k − s_{k+1}))` |
//! | `Wa·Wb` (the whole operator for `rank = −1`) | `C·u·(κ(X)·(1 + κ(X)·tan θ) + s₁/(s_k − s_{k+1}))` |
//! | `Wa`, `Wb` after aligning each latent column's sign | the above `+ C·u·s₁/min_{j≤k}(s_j − s_{j+1})` |
//!
//! (no SVD term when the solver returns one least-squares operator, `rank = −1`). `C` holds the
//! constants the first-order bounds leave out (QR, SVD and the products accumulate over up to
//! ~150 terms) and a factor 2 because both sides round. It is measured, not chosen: the golden
//! test on 40 held-out cases of `tests/composer_reference.py` (seeds 1–40, other shapes and
//! data) needs at most `C = 8.5` (the largest `64·err/tol` over 1,490 comparisons: `ŷ` of
//! seed 40's `conv/rank=0.1`; medians 0.04 (bias) to 0.96 (`ŷ`)), so `C = 36` keeps a margin of
//! 4.2×; seeds 41–60, not used to choose it, need at most 6.4. `tests/other_inputs.rs` keeps one
//! float32 run within half of each bound of the same algorithm in float64. The tolerances are tight
//! enough to see a wrong solver: a solver one or two alternating steps short of Composer's
//! fails them (`a_solver_short_of_its_iterations_fails_the_tolerances`). The nmse follows from
//! `ŷ`'s bound (see [`nmse_tolerance`]). A tolerance of [`VACUOUS`] or more means the data do
//! not determine the quantity (two singular values (nearly) tie, or `X` is (nearly) rank
//! deficient): such a case fails rather than being skipped; none of the golden or held-out
//! cases is one.

#![allow(dead_code)] // each test file uses a part

use tessera_plugin_api::tch::{Kind, Tensor};

/// Unit roundoff of float32 (`2⁻²⁴`).
pub const U: f64 = f32::EPSILON as f64 / 2.0;
/// Constant of the tolerances (see the module's comment).
pub const C: f64 = 36.0;
/// A relative tolerance from which on a comparison says nothing: the quantity is not
/// determined by the data to float32 precision, and the case fails ([`within_abs`]).
pub const VACUOUS: f64 = 0.05;

/// `t` in float64.
pub fn f64t(t: &Tensor) -> Tensor {
    t.to_kind(Kind::Double)
}

/// `max |t|`.
pub fn max_abs(t: &Tensor) -> f64 {
    t.abs().max().to_kind(Kind::Double).double_value(&[])
}

/// The Frobenius norm, in float64.
pub fn norm(t: &Tensor) -> f64 {
    f64t(t).square().sum(Kind::Double).sqrt().double_value(&[])
}

/// Singular values of a matrix, largest first, in float64.
pub fn singular_values(t: &Tensor) -> Vec<f64> {
    let (_, s, _) = f64t(t).svd(true, false);
    Vec::<f64>::try_from(&s).unwrap()
}

/// The least-squares solution `X⁺Y` in float64 (SVD driver, safe with rank deficiency).
pub fn lstsq64(x: &Tensor, y: &Tensor) -> Tensor {
    f64t(x).linalg_lstsq(&f64t(y), None, "gelsd").0
}

/// How well one `factorize_matrix` problem determines its solution.
#[derive(Debug, Clone, Copy)]
pub struct Conditioning {
    /// `κ(X) = σ_max(X)/σ_min(X)`.
    pub kappa_x: f64,
    /// `tan θ = ‖Y − X·X⁺Y‖/‖X·X⁺Y‖`: how far the target is from what `X` can fit.
    pub tan_theta: f64,
    /// `η = ‖X‖₂‖X⁺Y‖/‖X·X⁺Y‖`: how much of `κ(X)` the solution brings out in the fit.
    pub eta: f64,
    /// `s₁/(s_k − s_{k+1})` of `W0` (0 when not factorized).
    pub gap: f64,
    /// `s₁/min_{j≤k}(s_j − s_{j+1})` of `W0` (0 when not factorized).
    pub min_gap: f64,
}

impl Conditioning {
    /// The problem `factorize_matrix` solves: inputs `x` `(N, D)`, target `y` `(N, M)` *less the
    /// bias it is given* (Composer subtracts it first), the operator `w0` `(D, M)` whose SVD
    /// starts the iterations (`Wa·Wb` when refactorizing), and the rank it returned (`-1` for a
    /// single least-squares operator, where no SVD is involved).
    pub fn of(x: &Tensor, y: &Tensor, w0: &Tensor, rank: i64) -> Conditioning {
        let (x, y) = (f64t(x), f64t(y));
        let sx = singular_values(&x);
        let kappa_x = sx[0] / sx[sx.len() - 1];
        let ya = lstsq64(&x, &y);
        let fitted = x.matmul(&ya);
        let tan_theta = norm(&(&y - &fitted)) / norm(&fitted);
        let eta = sx[0] * norm(&ya) / norm(&fitted);
        let (mut gap, mut min_gap) = (0.0, 0.0);
        if rank > 0 {
            let s = singular_values(w0);
            let k = rank as usize;
            let gaps: Vec<f64> = (0..k)
                .map(|j| s[j] - s.get(j + 1).unwrap_or(&0.0))
                .collect();
            gap = s[0] / gaps[k - 1];
            min_gap = s[0] / gaps.iter().cloned().fold(f64::INFINITY, f64::min);
        }
        Conditioning {
            kappa_x,
            tan_theta,
            eta,
            gap,
            min_gap,
        }
    }

    /// `κ_LS = κ(X)·(1 + κ(X)·tan θ)`: the least-squares solution's condition number.
    pub fn kappa_ls(&self) -> f64 {
        self.kappa_x * (1.0 + self.kappa_x * self.tan_theta)
    }

    /// Relative tolerance of `ŷ` (and of the layer's output).
    pub fn prediction(&self) -> f64 {
        C * U * (self.eta + self.kappa_x * self.tan_theta + self.gap)
    }

    /// Relative tolerance of `Wa·Wb` (or of the single operator for `rank = -1`).
    pub fn product(&self) -> f64 {
        C * U * (self.kappa_ls() + self.gap)
    }

    /// Relative tolerance of `Wa` and `Wb` once each latent column's sign is aligned.
    pub fn factors(&self) -> f64 {
        self.product() + C * U * self.min_gap
    }
}

/// How far an nmse `‖r‖²/(n·v)` (`v` the target's variance) can move when the prediction moves
/// by at most `a` per element: `|Δ‖r‖²| ≤ 2‖r‖·‖δ‖ + ‖δ‖²` with `‖δ‖ ≤ a·√n`, so
/// `|Δnmse| ≤ 2·√nmse·a/√v + a²/v`, plus the rounding of the two reductions (`C·u·nmse`).
pub fn nmse_tolerance(nmse: f64, a: f64, variance: f64) -> f64 {
    2.0 * nmse.max(0.0).sqrt() * a / variance.sqrt() + a * a / variance + C * U * nmse.abs()
}

/// The unbiased variance of all elements, in float64.
pub fn variance(t: &Tensor) -> f64 {
    f64t(t).var(true).double_value(&[])
}

/// Asserts `max|got − want| ≤ tol·max|want|` (the error of a computation with rounding is
/// relative to the tensor's scale, not to each element) and returns the error relative to
/// `max|want|`. A `tol` of [`VACUOUS`] or more fails too: the case does not determine the
/// quantity, so comparing it would say nothing (see [`within_abs`]).
pub fn assert_rel(what: &str, got: &Tensor, want: &Tensor, tol: f64) -> f64 {
    assert_abs(what, got, want, tol * max_abs(want), max_abs(want))
}

/// Asserts `max|got − want| ≤ atol` and returns the error over `scale` ([`within_abs`]).
pub fn assert_abs(what: &str, got: &Tensor, want: &Tensor, atol: f64, scale: f64) -> f64 {
    match within_abs(what, got, want, atol, scale) {
        Ok(rel) => rel,
        Err(why) => panic!("{why}"),
    }
}

/// The error of `got` against `want` over `scale` when `max|got − want| ≤ atol`, else why not.
/// A tolerance of [`VACUOUS`] of the scale or more is an error whatever the difference: nothing
/// is skipped; a case whose data do not determine a quantity (a near-tie of singular values,
/// rank-deficient inputs) is a case to replace.
pub fn within_abs(
    what: &str,
    got: &Tensor,
    want: &Tensor,
    atol: f64,
    scale: f64,
) -> Result<f64, String> {
    assert_eq!(got.size(), want.size(), "{what}: shape");
    let err = max_abs(&(f64t(got) - f64t(want)));
    let rel = err / scale.max(f64::MIN_POSITIVE);
    if atol >= VACUOUS * scale {
        return Err(format!(
            "{what}: the tolerance is {:.1e} of the scale: the data do not determine it (near-tie \
             of singular values or rank-deficient inputs); use a case that does",
            atol / scale
        ));
    }
    if err > atol {
        return Err(format!(
            "{what}: max |got − want| = {err:.3e} ({rel:.2e} of max |want| = {scale:.3e}) \
             exceeds {atol:.3e} ({:.2e})",
            atol / scale
        ));
    }
    Ok(rel)
}

/// `got` with each latent slice (index `j` along `dim`) multiplied by `signs[j]`.
pub fn flip(got: &Tensor, signs: &[f64], dim: i64) -> Tensor {
    let mut shape = vec![1i64; got.dim()];
    shape[dim as usize] = signs.len() as i64;
    got * Tensor::from_slice(signs)
        .to_kind(got.kind())
        .reshape(&shape)
}

/// The signs that align `got`'s latent slices along `dim` with `want`'s (SVD signs are
/// arbitrary); the same signs must then be applied to the other factor.
pub fn latent_signs(got: &Tensor, want: &Tensor, dim: i64) -> Vec<f64> {
    (0..got.size()[dim as usize])
        .map(|j| {
            let dot = (f64t(&got.narrow(dim, j, 1)) * f64t(&want.narrow(dim, j, 1)))
                .sum(Kind::Double)
                .double_value(&[]);
            if dot < 0.0 {
                -1.0
            } else {
                1.0
            }
        })
        .collect()
}

/// `(in·kh·kw, out)`-shaped product of a factorized pair in module layout: `first` `(k, in, kh,
/// kw)` or `(k, in)`, `second` `(out, k, 1, 1)` or `(out, k)`. Unique, unlike the factors.
pub fn module_product(first: &Tensor, second: &Tensor) -> Tensor {
    let k = first.size()[0];
    let out = second.size()[0];
    f64t(&first.reshape([k, -1]))
        .tr()
        .matmul(&f64t(&second.reshape([out, k])).tr())
}

/// Composer's `_activations_conv2d_to_mat`: the `(N·positions, in·kh·kw)` patches of `x`.
pub fn patches(x: &Tensor, kernel: i64, padding: i64) -> Tensor {
    let p = x
        .im2col([kernel, kernel], [1, 1], [padding, padding], [1, 1])
        .transpose(1, 2);
    let fan_in = p.size()[2];
    p.reshape([-1, fan_in])
}

/// A `(out, in, kh, kw)` conv weight as the `(in·kh·kw, out)` matrix that multiplies patches.
pub fn conv_matrix(w: &Tensor) -> Tensor {
    w.reshape([w.size()[0], -1]).tr()
}
