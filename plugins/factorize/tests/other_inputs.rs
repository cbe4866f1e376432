//! The golden comparison's tolerances (`conditioning/mod.rs`) on other inputs of the same kinds:
//! the golden problems' inputs moved by half their own spread in random directions (six seeds,
//! plus the unmoved golden inputs), so every problem has another conditioning.
//!
//! - Our float32 solution is within **half** the tolerance of the same algorithm run in float64
//!   (exact, for these purposes) on the same inputs. Any float32 evaluation of Composer's
//!   operations, with whatever thread count or kernels, is another such rounding, so Composer's
//!   float32 result and ours are within the tolerance of each other.
//! - What should not matter does not: flipping the signs of input features (with the matching
//!   rows of the operator) or the signs and order of a factorized module's latent units leaves
//!   `ŷ`, the bias and the nmse unchanged and transforms `Wa·Wb` and the factors as it should,
//!   within the tolerances.
//! - The solutions meet their optimality conditions: the intercept leaves residuals of mean
//!   zero, the last `Wa` step satisfies its normal equations, zero iterations give the best
//!   rank-`k` approximation (Eckart–Young), and `rank = -1` is the least-squares operator.
//!
//! `tests/composer_reference.py` checks the other direction: the golden test itself on
//! Composer's (re-stated) outputs for 40 other seeds and shapes.

mod conditioning;

use std::f64::consts::PI;

use conditioning::{
    assert_abs, assert_rel, conv_matrix, flip, latent_signs, lstsq64, max_abs, module_product,
    nmse_tolerance, norm, patches, singular_values, variance, Conditioning, C, U,
};
use factorize::{
    factorize_conv2d, factorize_matrix, ConvGeometry, ConvSpec, Factorized, FactorizedConv2d,
    FactorizedLinear, LowRankSolution,
};
use tessera_plugin_api::kit::OwnTensors;
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::golden::{parse_params, Golden};
use tessera_plugin_api::testing::splitmix64;
use tessera_plugin_api::Module;

const CASE: &str = "factorize";
/// Seed 0 keeps the golden inputs; the others move them.
const SEEDS: std::ops::Range<u64> = 0..7;
/// How far the inputs move, in units of their own standard deviation.
const MOVE: f64 = 0.5;

/// Standard normal noise from a seeded splitmix64 stream (tests run in parallel threads, so
/// libtorch's global generator would not be reproducible).
fn noise(shape: &[i64], seed: u64) -> Tensor {
    let n: i64 = shape.iter().product();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n as u64;
    let mut uniform = || ((splitmix64(&mut state) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let values: Vec<f32> = (0..n)
        .map(|_| {
            let (a, b) = (uniform(), uniform());
            ((-2.0 * a.ln()).sqrt() * (2.0 * PI * b).cos()) as f32
        })
        .collect();
    Tensor::from_slice(&values).reshape(shape)
}

/// Another input of `t`'s kind: `t` moved by `MOVE` of its standard deviation (seed 0: `t`).
fn moved(t: &Tensor, seed: u64, salt: u64) -> Tensor {
    if seed == 0 {
        return t.copy();
    }
    let std = t.to_kind(Kind::Double).std(true).double_value(&[]);
    t + noise(&t.size(), seed * 1000 + salt) * (MOVE * std)
}

/// `(rank, n_iters)` of every solver result the golden case records under `section`.
fn ranks(g: &Golden, section: &str) -> Vec<(f64, usize)> {
    g.json["results"][section]
        .as_object()
        .unwrap()
        .keys()
        .map(|tag| {
            let p = parse_params(tag.split_once('/').unwrap().1);
            let n_iters = p.get("n_iters").map_or(3, |n| n.parse().unwrap());
            (p["rank"].parse().unwrap(), n_iters)
        })
        .collect()
}

/// What one solution computes, in module layout: `ŷ`, the bias, the pair (`first` `(k, ...)`,
/// `second` `(out, k, ...)`) or the single operator, and both nmse values.
struct Outcome {
    y_hat: Tensor,
    bias: Option<Tensor>,
    pair: Option<(Tensor, Tensor)>,
    operator: Option<Tensor>,
    nmse: [f64; 2],
}

fn matrix_outcome(x: &Tensor, sol: &LowRankSolution) -> Outcome {
    let bias = sol.bias.as_ref().map(Tensor::shallow_clone);
    let product = match &sol.wb {
        Some(wb) => sol.wa.matmul(wb),
        None => sol.wa.shallow_clone(),
    };
    let mut y_hat = x.matmul(&product);
    if let Some(b) = &bias {
        y_hat += b;
    }
    Outcome {
        y_hat,
        bias,
        pair: sol.wb.as_ref().map(|wb| (sol.wa.tr(), wb.tr())),
        operator: sol.wb.is_none().then(|| sol.wa.shallow_clone()),
        nmse: [sol.nmse, sol.target_nmse],
    }
}

fn conv_outcome(x: &Tensor, sol: &LowRankSolution, p: i64) -> Outcome {
    let first = x.conv2d(&sol.wa, None::<&Tensor>, [1, 1], [p, p], [1, 1], 1);
    let y_hat = match &sol.wb {
        Some(wb) => first.conv2d(wb, sol.bias.as_ref(), [1, 1], [0, 0], [1, 1], 1),
        None => first,
    };
    Outcome {
        y_hat,
        bias: sol.bias.as_ref().map(Tensor::shallow_clone),
        pair: sol
            .wb
            .as_ref()
            .map(|wb| (sol.wa.shallow_clone(), wb.shallow_clone())),
        operator: sol.wb.is_none().then(|| sol.wa.shallow_clone()),
        nmse: [sol.nmse, sol.target_nmse],
    }
}

fn module_outcome(m: &Factorized, input: &Tensor) -> Outcome {
    let t: std::collections::BTreeMap<&str, Tensor> = m.tensors().into_iter().collect();
    Outcome {
        y_hat: m.forward(input, false).unwrap(),
        bias: Some(t["module1.bias"].shallow_clone()),
        pair: Some((
            t["module0.weight"].shallow_clone(),
            t["module1.weight"].shallow_clone(),
        )),
        operator: None,
        nmse: [f64::NAN; 2],
    }
}

/// `got` against `want` with `share` of each tolerance of `c`; `target_variance` for the nmse.
fn compare(
    what: &str,
    got: &Outcome,
    want: &Outcome,
    c: &Conditioning,
    share: f64,
    target_variance: f64,
) {
    let scale = max_abs(&want.y_hat);
    let a = share * c.prediction() * scale;
    assert_rel(
        &format!("{what} ŷ"),
        &got.y_hat,
        &want.y_hat,
        share * c.prediction(),
    );
    if let (Some(g), Some(w)) = (&got.bias, &want.bias) {
        assert_abs(&format!("{what} bias"), g, w, a, scale);
    }
    if let (Some((g0, g1)), Some((w0, w1))) = (&got.pair, &want.pair) {
        assert_rel(
            &format!("{what} product"),
            &module_product(g0, g1),
            &module_product(w0, w1),
            share * c.product(),
        );
        let signs = latent_signs(g0, w0, 0);
        let tol = share * c.factors();
        assert_rel(&format!("{what} first"), &flip(g0, &signs, 0), w0, tol);
        assert_rel(&format!("{what} second"), &flip(g1, &signs, 1), w1, tol);
    }
    assert_eq!(got.pair.is_some(), want.pair.is_some(), "{what}");
    if let (Some(g), Some(w)) = (&got.operator, &want.operator) {
        assert_rel(&format!("{what} operator"), g, w, share * c.product());
    }
    for (g, w) in got.nmse.iter().zip(&want.nmse) {
        if w.is_nan() {
            continue;
        }
        let tol = nmse_tolerance(*w, a, target_variance);
        assert!((g - w).abs() <= tol, "{what} nmse {g} vs {w} ({tol:.1e})");
    }
}

fn f64t(t: &Tensor) -> Tensor {
    t.to_kind(Kind::Double)
}

/// The matrix problem of seed `seed`: `X`, `W`, bias, `Y = X·W + bias` (float32).
fn matrix_problem(g: &Golden, seed: u64) -> (Tensor, Tensor, Tensor, Tensor) {
    let x = moved(g.tensor("matrix/X"), seed, 1);
    let w = moved(g.tensor("matrix/W"), seed, 2);
    let b = moved(g.tensor("matrix/bias"), seed, 3);
    let y = x.matmul(&w) + &b;
    (x, y, w, b)
}

/// The conv problem of seed `seed`: `X`, `W`, bias A.
fn conv_problem(g: &Golden, seed: u64) -> (Tensor, Tensor, Tensor) {
    (
        moved(g.tensor("conv/X"), seed, 4),
        moved(g.tensor("conv/W"), seed, 5),
        moved(g.tensor("conv/biasA"), seed, 6),
    )
}

/// The factorized module of `set_rank/<kind>` with moved weights, in `precision`, and the moved
/// input; `relabel` (a permutation and signs) relabels its latent units: the same function.
fn set_rank_module(
    g: &Golden,
    kind: &str,
    seed: u64,
    precision: Kind,
    relabel: Option<(&[i64], &[f64])>,
) -> (Factorized, Tensor) {
    let t = |name: &str, salt: u64| {
        moved(g.tensor(&format!("set_rank/{kind}/{name}")), seed, salt).to_kind(precision)
    };
    let (mut w0, mut w1, b1) = (
        t("before/module0.weight", 7),
        t("before/module1.weight", 8),
        t("before/module1.bias", 9),
    );
    let input = t("input", 10);
    if let Some((perm, signs)) = relabel {
        let index = Tensor::from_slice(perm);
        w0 = flip(&w0.index_select(0, &index), signs, 0);
        w1 = flip(&w1.index_select(1, &index), signs, 1);
    }
    let module = if kind == "conv" {
        let k = w0.size()[2];
        let spec = ConvSpec {
            in_channels: w0.size()[1],
            out_channels: w1.size()[0],
            kernel_size: k,
            stride: 1,
            padding: k / 2,
            groups: 1,
        };
        Factorized::Conv2d(FactorizedConv2d::from_tensors(spec, &w0, &w1, &b1).unwrap())
    } else {
        Factorized::Linear(FactorizedLinear::from_tensors(&w0, &w1, Some(&b1)).unwrap())
    };
    (module, input)
}

/// The conditioning of `set_rank` on `module` (before it runs) with `input`, as in the golden
/// test: `W0 = Wa·Wb`, the target less the bias a linear layer passes.
fn set_rank_conditioning(module: &Factorized, input: &Tensor, to: i64) -> Conditioning {
    let t: std::collections::BTreeMap<&str, Tensor> = module.tensors().into_iter().collect();
    let (w0, w1, b1) = (
        &t["module0.weight"],
        &t["module1.weight"],
        &t["module1.bias"],
    );
    let w = module_product(w0, w1).to_kind(w0.kind());
    match module {
        Factorized::Conv2d(_) => {
            let k = w0.size()[2];
            let x = patches(input, k, k / 2);
            let y = x.matmul(&w) + b1;
            Conditioning::of(&x, &y, &w, to)
        }
        Factorized::Linear(_) => {
            let y = module.forward(input, false).unwrap() - b1;
            Conditioning::of(input, &y, &w, to)
        }
    }
}

#[test]
fn float32_solutions_are_within_half_the_tolerance_of_float64_ones() {
    let g = Golden::load(CASE);
    for seed in SEEDS {
        let (x, y, w, b) = matrix_problem(&g, seed);
        for (rank, n_iters) in ranks(&g, "factorize_matrix") {
            let what = format!("seed {seed} matrix rank {rank} n_iters {n_iters}");
            let s32 = factorize_matrix(&x, &y, &w, None, Some(&b), rank, n_iters).unwrap();
            let (x64, y64, w64, b64) = (f64t(&x), f64t(&y), f64t(&w), f64t(&b));
            let s64 = factorize_matrix(&x64, &y64, &w64, None, Some(&b64), rank, n_iters).unwrap();
            assert_eq!(s32.rank, s64.rank, "{what}");
            let c = Conditioning::of(&x, &(&y - &b), &w, s32.rank);
            let (o32, o64) = (matrix_outcome(&x, &s32), matrix_outcome(&x64, &s64));
            compare(&what, &o32, &o64, &c, 0.5, variance(&y));
        }

        let (x, w, b) = conv_problem(&g, seed);
        let p = w.size()[2] / 2;
        let geometry = ConvGeometry {
            stride: 1,
            padding: p,
        };
        let (xm, wm) = (patches(&x, w.size()[2], p), conv_matrix(&w));
        let ym = xm.matmul(&wm) + &b;
        for (rank, n_iters) in ranks(&g, "factorize_conv2d") {
            let what = format!("seed {seed} conv rank {rank}");
            let s32 = factorize_conv2d(&x, &w, None, Some(&b), None, rank, n_iters, geometry);
            let s32 = s32.unwrap();
            let (x64, w64, b64) = (f64t(&x), f64t(&w), f64t(&b));
            let s64 = factorize_conv2d(&x64, &w64, None, Some(&b64), None, rank, n_iters, geometry)
                .unwrap();
            let c = Conditioning::of(&xm, &ym, &wm, s32.rank);
            let (o32, o64) = (conv_outcome(&x, &s32, p), conv_outcome(&x64, &s64, p));
            compare(&what, &o32, &o64, &c, 0.5, variance(&ym));
        }

        for kind in ["linear", "conv"] {
            let what = format!("seed {seed} set_rank {kind}");
            let to = g.json["results"]["set_rank"][kind]["to"].as_i64().unwrap();
            let (mut m32, in32) = set_rank_module(&g, kind, seed, Kind::Float, None);
            let (mut m64, in64) = set_rank_module(&g, kind, seed, Kind::Double, None);
            let c = set_rank_conditioning(&m32, &in32, to);
            m32.set_rank(&in32, to).unwrap();
            m64.set_rank(&in64, to).unwrap();
            let (o32, o64) = (module_outcome(&m32, &in32), module_outcome(&m64, &in64));
            compare(&what, &o32, &o64, &c, 0.5, f64::NAN);
        }
    }
}

#[test]
fn signs_and_order_that_carry_no_meaning_change_nothing_unique() {
    let g = Golden::load(CASE);
    for seed in SEEDS {
        // Input features with flipped signs, and the operator's matching rows: the same Y.
        let (x, y, w, b) = matrix_problem(&g, seed);
        let d = x.size()[1];
        let s: Vec<f64> = (0..d)
            .map(|j| {
                if (j + seed as i64) % 3 == 0 {
                    -1.0
                } else {
                    1.0
                }
            })
            .collect();
        let (xs, ws) = (flip(&x, &s, 1), flip(&w, &s, 0));
        for (rank, n_iters) in ranks(&g, "factorize_matrix") {
            let what = format!("seed {seed} matrix rank {rank} n_iters {n_iters}, flipped inputs");
            let plain = factorize_matrix(&x, &y, &w, None, Some(&b), rank, n_iters).unwrap();
            let signed = factorize_matrix(&xs, &y, &ws, None, Some(&b), rank, n_iters).unwrap();
            let c = Conditioning::of(&x, &(&y - &b), &w, plain.rank);
            let mut o = matrix_outcome(&xs, &signed);
            // Undo the flip on the input side of the operator: first (k, D), operator (D, M).
            o.pair = o.pair.map(|(f, s2)| (flip(&f, &s, 1), s2));
            o.operator = o.operator.map(|op| flip(&op, &s, 0));
            compare(
                &what,
                &o,
                &matrix_outcome(&x, &plain),
                &c,
                1.0,
                variance(&y),
            );
        }

        // Latent units of a factorized module relabelled (permuted, some signs flipped): the
        // module computes the same function, so set_rank must find the same one.
        for kind in ["linear", "conv"] {
            let what = format!("seed {seed} set_rank {kind}, relabelled latent units");
            let to = g.json["results"]["set_rank"][kind]["to"].as_i64().unwrap();
            let latent = g.json["results"]["set_rank"][kind]["from_latent"]
                .as_i64()
                .unwrap();
            let perm: Vec<i64> = (0..latent)
                .map(|j| (j * 5 + seed as i64) % latent)
                .collect();
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..latent).collect::<Vec<_>>(), "a permutation");
            let signs: Vec<f64> = (0..latent)
                .map(|j| {
                    if (j + seed as i64) % 2 == 0 {
                        -1.0
                    } else {
                        1.0
                    }
                })
                .collect();
            let (mut plain, input) = set_rank_module(&g, kind, seed, Kind::Float, None);
            let relabel = Some((perm.as_slice(), signs.as_slice()));
            let (mut other, _) = set_rank_module(&g, kind, seed, Kind::Float, relabel);
            let c = set_rank_conditioning(&plain, &input, to);
            plain.set_rank(&input, to).unwrap();
            other.set_rank(&input, to).unwrap();
            let (o, p) = (
                module_outcome(&other, &input),
                module_outcome(&plain, &input),
            );
            compare(&what, &o, &p, &c, 1.0, f64::NAN);
        }
    }
}

#[test]
fn solutions_meet_their_optimality_conditions() {
    let g = Golden::load(CASE);
    for seed in SEEDS {
        let (x, y, w, b) = matrix_problem(&g, seed);
        let target = f64t(&(&y - &b));
        let ya = lstsq64(&x, &target);
        for (rank, n_iters) in ranks(&g, "factorize_matrix") {
            let what = format!("seed {seed} matrix rank {rank} n_iters {n_iters}");
            let sol = factorize_matrix(&x, &y, &w, None, Some(&b), rank, n_iters).unwrap();
            let c = Conditioning::of(&x, &target, &w, sol.rank);
            let (x64, wa) = (f64t(&x), f64t(&sol.wa));
            let bias = f64t(sol.bias.as_ref().unwrap());
            let Some(wb) = sol.wb.as_ref().map(f64t) else {
                // rank -1: the least-squares operator, Xᵀ(X·Wa − Y) = 0 up to a backward-stable
                // solve's residual c·u·‖X‖(‖X‖‖Wa‖ + ‖Y‖), whatever κ(X) is.
                let r = x64.tr().matmul(&(x64.matmul(&wa) - &target));
                let bound = C * U * norm(&x64) * (norm(&x64) * norm(&wa) + norm(&target));
                assert!(norm(&r) <= bound, "{what}: {:e} > {bound:e}", norm(&r));
                continue;
            };
            let fitted = x64.matmul(&wa).matmul(&wb);
            // The intercept: residual columns of mean zero (rounding of the two sums).
            let mean =
                (&target - &fitted - (&bias - f64t(&b))).mean_dim(&[0i64][..], false, Kind::Double);
            let bound = C * U * (max_abs(&target) + max_abs(&fitted));
            assert!(max_abs(&mean) <= bound, "{what}: residual mean");
            if n_iters == 0 {
                // The truncated SVD is the best rank-k approximation: ‖W − Wa·Wb‖₂ = s_{k+1}.
                let s = singular_values(&w);
                let err = singular_values(&(f64t(&w) - wa.matmul(&wb)))[0];
                let k = sol.rank as usize;
                assert!(
                    (err - s[k]).abs() <= C * U * s[0],
                    "{what}: {err} vs {}",
                    s[k]
                );
                continue;
            }
            // The last step Wa = lstsq(Wbᵀ, Yaᵀ)ᵀ: normal equations (Wa·Wb − Ya)·Wbᵀ = 0, up to a
            // backward-stable solve's residual plus what Ya's own float32 error (u·κ_LS·‖Ya‖)
            // does through Wb.
            let r = (wa.matmul(&wb) - &ya).matmul(&wb.tr());
            let bound = C * U * norm(&wb) * (norm(&wa) * norm(&wb) + c.kappa_ls() * norm(&ya));
            assert!(norm(&r) <= bound, "{what}: {:e} > {bound:e}", norm(&r));
        }
    }
}
