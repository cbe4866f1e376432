//! Composer's low-rank solver: [`factorize_matrix`] (SVD initialisation, then alternating
//! least squares) and [`factorize_conv2d`] (the same on a convolution's unfolded patches).

use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::Error;

/// Composer's `factorize_matrix` / `factorize_conv2d` default number of alternating
/// least-squares iterations.
pub const DEFAULT_N_ITERS: usize = 3;

/// Composer's `LowRankSolution`: the factors of an approximated linear operator.
#[derive(Debug)]
pub struct LowRankSolution {
    /// The first factor `(D, k)` (a matrix) or `(k, C_in, kh, kw)` (a conv); with `rank == -1`
    /// the whole operator, `(D, M)` or `(C_out, C_in, kh, kw)`.
    pub wa: Tensor,
    /// The second factor `(k, M)` or `(C_out, k, 1, 1)`; `None` when the operator was not
    /// factorized.
    pub wb: Option<Tensor>,
    /// The bias added after the second factor `(M)`, if any.
    pub bias: Option<Tensor>,
    /// The latent size `k`, or `-1` when the operator was not factorized (the rank asked for
    /// was at least the input or output size, or at least the current rank).
    pub rank: i64,
    /// The normalized mean squared error as Composer reports it: `0` when not factorized, and,
    /// when a bias was given, measured against the target *less* that bias while the prediction
    /// includes it (Composer 0.32.1's quirk, kept for comparison).
    pub nmse: f64,
    /// The normalized mean squared error of the returned operator against the real target
    /// (`mean((Y − Ŷ)²) / var(Y)`, unbiased variance), always computed.
    pub target_nmse: f64,
}

/// The geometry of the convolution [`factorize_conv2d`] approximates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Stride (Composer supports only 1; any stride works here).
    pub stride: i64,
    /// Zero padding on each side.
    pub padding: i64,
}

fn lstsq(a: &Tensor, b: &Tensor) -> Result<Tensor, Error> {
    if a.dim() != 2 || b.dim() != 2 || a.size()[0] != b.size()[0] {
        return Err(format!(
            "least squares needs two matrices with as many rows, got {:?} and {:?}",
            a.size(),
            b.size()
        )
        .into());
    }
    // The QR driver: libtorch's CPU default (gelsy) is not deterministic from call to call
    // (golden quirk 18), and `gels` is the only driver on CUDA.
    Ok(a.f_linalg_lstsq(b, None, "gels")?.0)
}

fn nmse(target: &Tensor, prediction: &Tensor) -> Result<f64, Error> {
    let diff = target.f_sub(prediction)?;
    let mse = diff.f_mul(&diff)?.f_mean(None::<Kind>)?;
    Ok(mse.f_div(&target.f_var(true)?)?.f_double_value(&[])?)
}

/// Composer's `_svd_initialize`: the best rank-`k` factors of `Wa` (or of `Wa·Wb`), the square
/// root of the singular values split between them.
fn svd_initialize(wa: &Tensor, wb: Option<&Tensor>, k: i64) -> Result<(Tensor, Tensor), Error> {
    let w = match wb {
        Some(wb) => wa.f_matmul(wb)?,
        None => wa.shallow_clone(),
    };
    let (u, s, v) = w.f_svd(true, true)?;
    let s_sqrt = s.f_narrow(0, 0, k)?.f_sqrt()?;
    let wa = u.f_narrow(1, 0, k)?.f_mul(&s_sqrt)?;
    let wb = v
        .f_narrow(1, 0, k)?
        .f_tr()?
        .f_mul(&s_sqrt.f_reshape([-1, 1])?)?;
    Ok((wa, wb))
}

/// Composer's `factorize_matrix(X, Y, Wa, Wb, bias, rank, n_iters)`: factors `Wa` (`(D, M)`),
/// or the already factorized `Wa·Wb`, into `(D, k)·(k, M)` plus a bias so that
/// `X·Wa·Wb + bias` approximates `Y` (`(N, M)`) in the least-squares sense.
///
/// `rank` below 1 is a fraction of `D`, capped at the current rank (`Wa`'s columns); otherwise
/// it is truncated to an integer. A rank at least `D` or `M` returns the single least-squares
/// matrix (`rank = -1`); a rank at least the current rank returns the factors unchanged
/// (`rank = -1`). Otherwise the factors start from the SVD and take `n_iters` rounds of
/// alternating least squares; the bias is the mean residual (plus the given `bias`, which is
/// first taken out of `Y`).
pub fn factorize_matrix(
    x: &Tensor,
    y: &Tensor,
    wa: &Tensor,
    wb: Option<&Tensor>,
    bias: Option<&Tensor>,
    rank: f64,
    n_iters: usize,
) -> Result<LowRankSolution, Error> {
    if !(rank.is_finite() && rank > 0.0) {
        return Err(format!("the rank must be positive, got {rank}").into());
    }
    if x.dim() != 2 || y.dim() != 2 || wa.dim() != 2 {
        return Err(format!(
            "factorize_matrix takes matrices, got X {:?}, Y {:?}, Wa {:?}",
            x.size(),
            y.size(),
            wa.size()
        )
        .into());
    }
    let x = x.detach();
    let full_target = y.detach();
    let wa = wa.detach();
    let wb = wb.map(Tensor::detach);
    let (d, m) = (x.size()[1], full_target.size()[1]);
    let current_rank = wa.size()[1];
    let k = if rank < 1.0 {
        ((rank * d as f64) as i64).min(current_rank)
    } else {
        rank as i64
    };
    let original_bias = bias.map(Tensor::detach);
    let y = match &original_bias {
        Some(b) => full_target.f_sub(b)?,
        None => full_target.shallow_clone(),
    };
    let with_bias = |pred: Tensor, b: Option<&Tensor>| -> Result<Tensor, Error> {
        Ok(match b {
            Some(b) => pred.f_add(b)?,
            None => pred,
        })
    };

    if k >= d || k >= m {
        let wa = lstsq(&x, &y)?;
        let pred = with_bias(x.f_matmul(&wa)?, original_bias.as_ref())?;
        return Ok(LowRankSolution {
            target_nmse: nmse(&full_target, &pred)?,
            wa,
            wb: None,
            bias: original_bias,
            rank: -1,
            nmse: 0.0,
        });
    }
    if k >= current_rank {
        let mut pred = x.f_matmul(&wa)?;
        if let Some(wb) = &wb {
            pred = pred.f_matmul(wb)?;
        }
        let pred = with_bias(pred, original_bias.as_ref())?;
        return Ok(LowRankSolution {
            target_nmse: nmse(&full_target, &pred)?,
            wa,
            wb,
            bias: original_bias,
            rank: -1,
            nmse: 0.0,
        });
    }

    let (mut wa, mut wb) = svd_initialize(&wa, wb.as_ref(), k)?;
    let ya = lstsq(&x, &y)?;
    for _ in 0..n_iters {
        wb = lstsq(&x.f_matmul(&wa)?, &y)?;
        wa = lstsq(&wb.f_tr()?, &ya.f_tr()?)?.f_tr()?;
    }
    let pred = x.f_matmul(&wa)?.f_matmul(&wb)?;
    let mut new_bias = y
        .f_sub(&pred)?
        .f_mean_dim(&[0i64][..], false, None::<Kind>)?;
    if let Some(b) = &original_bias {
        new_bias = new_bias.f_add(b)?;
    }
    let pred = pred.f_add(&new_bias)?;
    Ok(LowRankSolution {
        // Composer compares the bias-free target with a prediction that has the bias.
        nmse: nmse(&y, &pred)?,
        target_nmse: nmse(&full_target, &pred)?,
        wa: wa.f_contiguous()?,
        wb: Some(wb.f_contiguous()?),
        bias: Some(new_bias),
        rank: k,
    })
}

/// A conv weight `(out, in, kh, kw)` as the matrix `(in·kh·kw, out)` that multiplies patches.
fn conv_weight_to_matrix(w: &Tensor) -> Result<Tensor, Error> {
    Ok(w.f_reshape([w.size()[0], -1])?.f_tr()?)
}

/// The inverse of [`conv_weight_to_matrix`] for a `kh × kw` kernel.
fn matrix_to_conv_weight(m: &Tensor, kh: i64, kw: i64) -> Result<Tensor, Error> {
    let w = m.f_tr()?;
    Ok(w.f_reshape([w.size()[0], -1, kh, kw])?)
}

/// Composer's `factorize_conv2d(X, Wa, Wb, rank, biasA, biasB, n_iters, **conv_kwargs)`:
/// approximates the conv `Wa` (`(out, in, kh, kw)`, plus `bias_a`), or the already factorized
/// pair `Wa` (`(r, in, kh, kw)`, plus `bias_a`) then `Wb` (`(out, r, 1, 1)`, plus `bias_b`), by a
/// `kh × kw` conv to `k` channels without bias followed by a 1×1 conv with bias, on the
/// activations `x` `(N, in, H, W)`. The patches of `x` (unfolded with the conv's `geometry`) are
/// the rows of [`factorize_matrix`]'s `X`, so a fractional `rank` is a share of
/// `in·kh·kw`. The biases are folded into the target, so the reported nmse is right.
#[allow(clippy::too_many_arguments)] // Composer's signature, argument for argument
pub fn factorize_conv2d(
    x: &Tensor,
    wa: &Tensor,
    wb: Option<&Tensor>,
    bias_a: Option<&Tensor>,
    bias_b: Option<&Tensor>,
    rank: f64,
    n_iters: usize,
    geometry: ConvGeometry,
) -> Result<LowRankSolution, Error> {
    if x.dim() != 4 || wa.dim() != 4 {
        return Err(format!(
            "factorize_conv2d takes a (N, C, H, W) input and a 4-d weight, got {:?} and {:?}",
            x.size(),
            wa.size()
        )
        .into());
    }
    let (kh, kw) = (wa.size()[2], wa.size()[3]);
    let ConvGeometry { stride, padding } = geometry;
    let x_mat = x
        .detach()
        .f_im2col([kh, kw], [1, 1], [padding, padding], [stride, stride])?
        .f_transpose(1, 2)?;
    let fan_in = x_mat.size()[2];
    let x_mat = x_mat.f_reshape([-1, fan_in])?;
    let wa_mat = conv_weight_to_matrix(&wa.detach())?;
    let mut y_mat = x_mat.f_matmul(&wa_mat)?;
    if let Some(b) = bias_a {
        y_mat = y_mat.f_add(&b.detach())?;
    }
    let wb_mat = match wb {
        Some(wb) => {
            let wb_mat = conv_weight_to_matrix(&wb.detach())?;
            y_mat = y_mat.f_matmul(&wb_mat)?;
            if let Some(b) = bias_b {
                y_mat = y_mat.f_add(&b.detach())?;
            }
            Some(wb_mat)
        }
        None if bias_b.is_some() => {
            return Err("got bias_b without wb: no conv to add it to".into())
        }
        None => None,
    };
    let solution = factorize_matrix(
        &x_mat,
        &y_mat,
        &wa_mat,
        wb_mat.as_ref(),
        None,
        rank,
        n_iters,
    )?;
    Ok(LowRankSolution {
        wa: matrix_to_conv_weight(&solution.wa, kh, kw)?.f_contiguous()?,
        wb: match &solution.wb {
            Some(wb) => Some(matrix_to_conv_weight(wb, 1, 1)?.f_contiguous()?),
            None => None,
        },
        ..solution
    })
}
