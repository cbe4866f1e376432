//! Rotary position embeddings as Hugging Face's `LlamaRotaryEmbedding`: the inverse frequencies
//! (with the Llama-3 `rope_scaling`), their cosines and sines, the rotation.

use tch::{Kind, TchError, Tensor};

use super::config::RopeScaling;

/// The rotary frequencies of heads of width `dim`: `1 / theta^(2i / dim)`, float32, then Llama
/// 3's scaling (Hugging Face's `_compute_default_rope_parameters` and
/// `_compute_llama3_parameters`, in the same float32 operations).
pub(super) fn inv_freq(
    dim: i64,
    theta: f64,
    scaling: Option<RopeScaling>,
) -> Result<Tensor, TchError> {
    let opts = (Kind::Float, tch::Device::Cpu);
    let exponents = Tensor::f_arange_start_step(0, dim, 2, (Kind::Int64, tch::Device::Cpu))?
        .f_to_kind(Kind::Float)?
        .f_div_scalar(dim as f64)?;
    let base = Tensor::f_full([], theta, opts)?;
    let inv = base.f_pow(&exponents)?.f_reciprocal()?;
    let Some(s) = scaling else {
        return Ok(inv);
    };
    let old = s.original_max_position_embeddings;
    let low_wavelen = old / s.low_freq_factor;
    let high_wavelen = old / s.high_freq_factor;
    let wavelen = inv
        .f_reciprocal()?
        .f_mul_scalar(2.0 * std::f64::consts::PI)?;
    let long = wavelen.f_gt(low_wavelen)?;
    let scaled = inv.f_div_scalar(s.factor)?.f_where_self(&long, &inv)?;
    let smooth = wavelen
        .f_reciprocal()?
        .f_mul_scalar(old)?
        .f_sub_scalar(s.low_freq_factor)?
        .f_div_scalar(s.high_freq_factor - s.low_freq_factor)?;
    let smoothed = smooth
        .f_neg()?
        .f_add_scalar(1.0)?
        .f_mul(&scaled)?
        .f_div_scalar(s.factor)?
        .f_add(&smooth.f_mul(&scaled)?)?;
    let medium = wavelen
        .f_lt(high_wavelen)?
        .f_logical_not()?
        .f_logical_and(&long.f_logical_not()?)?;
    smoothed.f_where_self(&medium, &scaled)
}

/// `(cos, sin)` of `(1, 1, T, D)` for positions `0..t` on `like`'s device, in its kind.
pub(super) fn rotary(
    inv_freq: &Tensor,
    t: i64,
    like: &Tensor,
) -> Result<(Tensor, Tensor), TchError> {
    let positions = Tensor::f_arange(t, (Kind::Float, like.device()))?.f_unsqueeze(0)?;
    rotary_at(inv_freq, &positions, like)
}

/// `(cos, sin)` of `(B, 1, T, D)` for the positions `(B, T)` (each row its own, as generation's
/// left-padded rows have), on `like`'s device, in its kind.
pub(super) fn rotary_at(
    inv_freq: &Tensor,
    positions: &Tensor,
    like: &Tensor,
) -> Result<(Tensor, Tensor), TchError> {
    let device = like.device();
    let freqs = positions
        .f_to_kind(Kind::Float)?
        .f_unsqueeze(-1)?
        .f_mul(&inv_freq.f_to_device(device)?)?;
    let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
    let shape =
        |x: Tensor| -> Result<Tensor, TchError> { x.f_to_kind(like.kind())?.f_unsqueeze(1) };
    Ok((shape(emb.f_cos()?)?, shape(emb.f_sin()?)?))
}

/// `cat(-x₂, x₁)` over the last dimension's halves.
pub(super) fn rotate_half(x: &Tensor) -> Result<Tensor, TchError> {
    let half = x.size().last().copied().unwrap_or(0) / 2;
    let x1 = x.f_narrow(-1, 0, half)?;
    let x2 = x.f_narrow(-1, half, half)?;
    Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)
}

/// `x · cos + rotate_half(x) · sin`: rotary positions applied to queries or keys.
pub(super) fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, TchError> {
    x.f_mul(cos)?.f_add(&rotate_half(x)?.f_mul(sin)?)
}
