//! Composer's ALiBi as plain functions: the head slopes, the causal and bidirectional bias
//! buffers, GPT-2 attention with the bias, and the batch reshape of `AFTER_DATALOADER`.

use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::Error;

/// GPT-2's `masked_bias`: what a causally masked attention weight becomes (not `-inf`; golden
/// quirk 23).
pub const MASKED_BIAS: f64 = -1e4;

fn power_of_two_slopes(n_heads: usize) -> Vec<f64> {
    // Composer: start = 2**(-2**-(log2(n) - 3)); ratio = start; [start * ratio**i].
    let start = 2f64.powf(-(2f64.powf(-((n_heads as f64).log2() - 3.0))));
    (0..n_heads).map(|i| start * start.powf(i as f64)).collect()
}

/// Composer's `_get_alibi_head_slopes(n_heads)`: for a power of two `n`,
/// `start = 2^(−2^−(log2 n − 3))` and slope `i` is `start · start^i`; otherwise the slopes of the
/// largest power of two `p < n`, followed by the even-indexed slopes of `2p`, cut to `n` (golden
/// quirk 7: 3 heads give `[1/16, 1/256, 1/4]`). Computed in `f64` with the same operations as
/// Python, so the values are Composer's to the last bit. `n_heads` must be at least 1.
pub fn alibi_head_slopes(n_heads: usize) -> Result<Vec<f64>, Error> {
    if n_heads == 0 {
        return Err("ALiBi needs at least one attention head".into());
    }
    if n_heads.is_power_of_two() {
        return Ok(power_of_two_slopes(n_heads));
    }
    // The largest power of two below n_heads (Composer: 2**floor(log2(n))).
    let closest = 1usize << (usize::BITS - 1 - n_heads.leading_zeros());
    let mut slopes = power_of_two_slopes(closest);
    slopes.extend(
        alibi_head_slopes(2 * closest)?
            .into_iter()
            .step_by(2)
            .take(n_heads - closest),
    );
    Ok(slopes)
}

/// The slopes as Composer holds them: `torch.Tensor(slopes)`, float32, `(H,)`.
fn slopes_tensor(slopes: &[f64]) -> Result<Tensor, Error> {
    let values: Vec<f32> = slopes.iter().map(|&s| s as f32).collect();
    Ok(Tensor::f_from_slice(&values)?)
}

/// Composer's causal (GPT-2) `alibi` buffer, `(H, 1, max_len)`: `bias[h, 0, j] = slope_h · j`,
/// the same for every query row (softmax is shift-invariant per row, so under the causal mask
/// this equals `−slope_h · (i − j)`), float32 as Composer builds it, then cast to `options`.
pub fn causal_alibi_bias(
    slopes: &[f64],
    max_len: i64,
    options: (Kind, Device),
) -> Result<Tensor, Error> {
    let h = slopes.len() as i64;
    let positions = Tensor::f_arange(max_len, (Kind::Int64, Device::Cpu))?
        .f_unsqueeze(0)?
        .f_repeat([h, 1])?
        .f_unsqueeze(1)?;
    let bias = positions.f_mul(&slopes_tensor(slopes)?.f_view([h, 1, 1])?)?;
    Ok(bias.f_to_kind(options.0)?.f_to_device(options.1)?)
}

/// Composer's bidirectional (BERT) `alibi` buffer, `(1, H, max_len, max_len)`:
/// `bias[0, h, i, j] = −slope_h · |i − j|`, float32, then cast to `options`.
pub fn bidirectional_alibi_bias(
    slopes: &[f64],
    max_len: i64,
    options: (Kind, Device),
) -> Result<Tensor, Error> {
    let h = slopes.len() as i64;
    let context = Tensor::f_arange(max_len, (Kind::Int64, Device::Cpu))?.f_unsqueeze(1)?;
    let memory = Tensor::f_arange(max_len, (Kind::Int64, Device::Cpu))?.f_unsqueeze(0)?;
    let relative = memory
        .f_sub(&context)?
        .f_abs()?
        .f_unsqueeze(0)?
        .f_expand([h, max_len, max_len], false)?;
    let bias = relative
        .f_mul(&slopes_tensor(slopes)?.f_neg()?.f_view([h, 1, 1])?)?
        .f_unsqueeze(0)?;
    Ok(bias.f_to_kind(options.0)?.f_to_device(options.1)?)
}

/// The tensors of a GPT-2 attention block (`gpt2_attention`), in Hugging Face's `Conv1D` layout
/// (`y = x @ W + b`).
#[derive(Debug)]
pub struct Gpt2AttentionWeights {
    /// `c_attn.weight`, `(n_embd, 3·n_embd)`: q, k and v side by side.
    pub c_attn_weight: Tensor,
    /// `c_attn.bias`, `(3·n_embd)`.
    pub c_attn_bias: Tensor,
    /// `c_proj.weight`, `(n_embd, n_embd)`.
    pub c_proj_weight: Tensor,
    /// `c_proj.bias`, `(n_embd)`.
    pub c_proj_bias: Tensor,
}

impl Gpt2AttentionWeights {
    /// Shallow clones: the same storage and autograd identity (what surgery keeps).
    pub fn shallow_clone(&self) -> Gpt2AttentionWeights {
        Gpt2AttentionWeights {
            c_attn_weight: self.c_attn_weight.shallow_clone(),
            c_attn_bias: self.c_attn_bias.shallow_clone(),
            c_proj_weight: self.c_proj_weight.shallow_clone(),
            c_proj_bias: self.c_proj_bias.shallow_clone(),
        }
    }

    /// `(n_embd)` after checking every shape against it.
    pub fn n_embd(&self) -> Result<i64, Error> {
        let c = *self
            .c_attn_weight
            .size()
            .first()
            .ok_or("c_attn.weight is a scalar")?;
        for (what, t, want) in [
            ("c_attn.weight", &self.c_attn_weight, vec![c, 3 * c]),
            ("c_attn.bias", &self.c_attn_bias, vec![3 * c]),
            ("c_proj.weight", &self.c_proj_weight, vec![c, c]),
            ("c_proj.bias", &self.c_proj_bias, vec![c]),
        ] {
            if t.size() != want {
                return Err(format!(
                    "gpt2 attention: {what} has shape {:?}, expected {want:?}",
                    t.size()
                )
                .into());
            }
        }
        Ok(c)
    }
}

/// Options of [`alibi_attention_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionOptions<'a> {
    /// Hugging Face's padding mask `(B, T)` (1 = token, 0 = padding): `(1 − m)·finfo(f32).min`
    /// is added to the weights after the causal mask, as GPT-2 does. Tessera's packed batches
    /// have none.
    pub padding_mask: Option<&'a Tensor>,
    /// Dropout on the attention probabilities (`attn_pdrop`), in training only.
    pub attn_pdrop: f64,
    /// Dropout after `c_proj` (`resid_pdrop`), in training only.
    pub resid_pdrop: f64,
    /// Training mode (dropout on).
    pub train: bool,
}

/// Queries, keys and values `(B, H, T, d)` of a GPT-2 attention block on `x` `(B, T, n_embd)`,
/// after checking `x`, the weights and the bias buffer `alibi` `(H, 1, L ≥ T)`.
struct Projected {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    b: i64,
    t: i64,
    c: i64,
}

fn project(
    x: &Tensor,
    weights: &Gpt2AttentionWeights,
    n_head: i64,
    alibi: &Tensor,
) -> Result<Projected, Error> {
    let c = weights.n_embd()?;
    let size = x.size();
    let [b, t, xc] = size[..] else {
        return Err(format!("gpt2 attention expects (B, T, n_embd) input, got {size:?}").into());
    };
    if xc != c {
        return Err(format!("gpt2 attention: input has {xc} features, n_embd is {c}").into());
    }
    if n_head < 1 || c % n_head != 0 {
        return Err(
            format!("gpt2 attention: n_embd {c} is not divisible by n_head {n_head}").into(),
        );
    }
    let (h, d) = (n_head, c / n_head);
    let bias_len = alibi.size();
    if bias_len.len() != 3 || bias_len[0] != h || bias_len[1] != 1 {
        return Err(format!("the ALiBi bias has shape {bias_len:?}, expected ({h}, 1, L)").into());
    }
    if t > bias_len[2] {
        return Err(format!(
            "a sequence of {t} tokens is longer than ALiBi's max_sequence_length {}",
            bias_len[2]
        )
        .into());
    }
    let qkv = x
        .f_matmul(&weights.c_attn_weight)?
        .f_add(&weights.c_attn_bias)?;
    let parts = qkv.f_split(c, 2)?;
    let heads = |p: &Tensor| -> Result<Tensor, Error> {
        Ok(p.f_view([b, t, h, d])?.f_permute([0, 2, 1, 3])?)
    };
    Ok(Projected {
        q: heads(&parts[0])?,
        k: heads(&parts[1])?,
        v: heads(&parts[2])?,
        b,
        t,
        c,
    })
}

/// Heads merged, `c_proj`, residual dropout: the end of every GPT-2 attention.
fn output(
    context: &Tensor,
    p: &Projected,
    weights: &Gpt2AttentionWeights,
    options: &AttentionOptions<'_>,
) -> Result<Tensor, Error> {
    let merged = context
        .f_permute([0, 2, 1, 3])?
        .f_contiguous()?
        .f_view([p.b, p.t, p.c])?;
    Ok(merged
        .f_matmul(&weights.c_proj_weight)?
        .f_add(&weights.c_proj_bias)?
        .f_dropout(
            options.resid_pdrop,
            options.train && options.resid_pdrop > 0.0,
        )?)
}

/// Hugging Face's padding mask `(B, T)` as the additive float32 `(B, 1, 1, T)`
/// `(1 − m)·finfo(f32).min`, after checking its shape.
fn padding_additive(mask: &Tensor, b: i64, t: i64) -> Result<Tensor, Error> {
    if mask.size() != [b, t] {
        return Err(format!(
            "the padding mask has shape {:?}, expected [{b}, {t}]",
            mask.size()
        )
        .into());
    }
    Ok(mask
        .f_to_kind(Kind::Float)?
        .f_neg()?
        .f_add_scalar(1.0)?
        .f_mul_scalar(f32::MIN as f64)?
        .f_view([b, 1, 1, t])?)
}

/// The most negative finite value of a floating kind (what a masked score may become without
/// overflowing to `−inf`, which would turn a fully masked row into NaN).
fn finite_min(kind: Kind) -> f64 {
    match kind {
        Kind::Half => -65504.0,
        Kind::BFloat16 => -3.389_531_389_251_535_5e38,
        _ => f32::MIN as f64,
    }
}

/// The additive float mask `(1, H, T, T)` (or `(B, H, T, T)` with a padding mask) that makes
/// libtorch's `scaled_dot_product_attention` compute Composer's ALiBi attention from the causal
/// bias buffer `alibi` `(H, 1, L ≥ T)` ([`causal_alibi_bias`]), in `kind` (the query's: SDPA
/// wants the mask in the query's dtype):
///
/// - on and below the diagonal (`j ≤ i`): `alibi[h, 0, j] − alibi[h, 0, i]`, i.e.
///   `−m_h · (i − j)`. Composer adds `alibi[h, 0, j] = m_h · j`; the two differ by `m_h · i`, the
///   same for every key of query row `i`, which the softmax removes. The shifted form is 0 on
///   the diagonal and small near it, so it stays exact where the weights are large when the
///   mask is bfloat16 or float16 (`m_h · j` itself reaches `m_h · (T − 1)`, 511.5 for the
///   first of 12 heads at `T = 1024`, where a bfloat16 step is 4);
/// - above the diagonal: [`MASKED_BIAS`] (`−1e4`). Composer *replaces* those scores by `−1e4`,
///   here `−1e4` is added to them; both weigh `exp(−1e4 − max) = 0` after the softmax as long as
///   the row has one unmasked score far above `−1e4`, which the diagonal is;
/// - with a padding mask, `(1 − m)·finfo(f32).min` added, as GPT-2 does, clamped to `kind`'s
///   most negative finite value.
///
/// The causal part is folded in, so SDPA is called with `is_causal = false` (libtorch refuses
/// a float mask together with `is_causal`).
pub fn alibi_attention_mask(
    alibi: &Tensor,
    t: i64,
    padding_mask: Option<&Tensor>,
    kind: Kind,
) -> Result<Tensor, Error> {
    let s = alibi.size();
    if s.len() != 3 || s[1] != 1 || t > s[2] || t < 0 {
        return Err(format!(
            "the ALiBi bias has shape {s:?}: it cannot give the mask of a sequence of {t} \
             tokens (expected (H, 1, L) with {t} <= L)"
        )
        .into());
    }
    let device = alibi.device();
    let keys = alibi.f_narrow(2, 0, t)?.f_to_kind(Kind::Float)?;
    let shifted = keys.f_sub(&keys.f_transpose(1, 2)?)?;
    let causal = Tensor::f_ones([t, t], (Kind::Bool, device))?.f_tril(0)?;
    let masked = Tensor::f_full([] as [i64; 0], MASKED_BIAS, (Kind::Float, device))?;
    let mask = shifted.f_where_self(&causal, &masked)?.f_unsqueeze(0)?;
    let mask = match padding_mask {
        Some(m) => {
            let b = *m.size().first().ok_or("the padding mask is a scalar")?;
            mask.f_add(&padding_additive(&m.f_to_device(device)?, b, t)?)?
                .f_clamp_min(finite_min(kind))?
        }
        None => mask,
    };
    Ok(mask.f_to_kind(kind)?)
}

/// GPT-2 attention with ALiBi on libtorch's fused `scaled_dot_product_attention` (what the
/// surgery's module runs): `x` `(B, T, n_embd)` with the causal bias buffer `alibi`
/// `(H, 1, L ≥ T)`, the bias and the causal mask passed as one float `attn_mask`
/// ([`alibi_attention_mask`], `is_causal = false`), attention dropout `attn_pdrop` inside SDPA
/// in training, heads merged, `c_proj`, dropout. Equal to [`alibi_attention_with`] (Composer's
/// explicit matmul/softmax) within float rounding; on CUDA libtorch can pick its
/// memory-efficient (or cuDNN) kernel, which takes an additive bias, instead of materialising
/// the `(B, H, T, T)` scores and probabilities.
pub fn alibi_sdpa_attention(
    x: &Tensor,
    weights: &Gpt2AttentionWeights,
    n_head: i64,
    alibi: &Tensor,
    options: AttentionOptions<'_>,
) -> Result<Tensor, Error> {
    let p = project(x, weights, n_head, alibi)?;
    let mask = alibi_attention_mask(alibi, p.t, options.padding_mask, p.q.kind())?;
    let dropout = if options.train {
        options.attn_pdrop
    } else {
        0.0
    };
    let context = Tensor::f_scaled_dot_product_attention(
        &p.q,
        &p.k,
        &p.v,
        Some(mask),
        dropout,
        false,
        None,
        false,
    )?;
    output(&context, &p, weights, &options)
}

/// GPT-2 attention with ALiBi, as Composer's patched `GPT2Attention._attn` computes it, on
/// `x` `(B, T, n_embd)` with the causal bias buffer `alibi` `(H, 1, L ≥ T)`
/// ([`causal_alibi_bias`]): `w = q kᵀ / √d + alibi[:, :, :T]`, causally masked with `−1e4`,
/// plus the padding mask if any, softmax (cast back to v's dtype), dropout, `w v`, heads merged,
/// `c_proj`, dropout. Returns the output `(B, T, n_embd)` and the probabilities `(B, H, T, T)`.
/// The explicit reference: the surgery's module runs [`alibi_sdpa_attention`], which gives the
/// same output on a fused kernel; this form is for when the probabilities are wanted.
pub fn alibi_attention_with(
    x: &Tensor,
    weights: &Gpt2AttentionWeights,
    n_head: i64,
    alibi: &Tensor,
    options: AttentionOptions<'_>,
) -> Result<(Tensor, Tensor), Error> {
    let p = project(x, weights, n_head, alibi)?;
    let (b, t) = (p.b, p.t);
    let d = p.c / n_head;
    let scores =
        p.q.f_matmul(&p.k.f_transpose(-1, -2)?)?
            .f_div_scalar((d as f64).sqrt())?;
    let scores = scores.f_add(&alibi.f_narrow(2, 0, t)?)?;
    let causal = Tensor::f_ones([t, t], (Kind::Bool, x.device()))?.f_tril(0)?;
    let masked = Tensor::f_full(
        [] as [i64; 0],
        MASKED_BIAS,
        (scores.kind(), scores.device()),
    )?;
    let mut scores = scores.f_where_self(&causal, &masked)?;
    if let Some(mask) = options.padding_mask {
        scores = scores.f_add(&padding_additive(mask, b, t)?.f_to_kind(scores.kind())?)?;
    }
    let probs = scores.f_softmax(-1, None::<Kind>)?.f_to_kind(p.v.kind())?;
    let dropped = probs.f_dropout(
        options.attn_pdrop,
        options.train && options.attn_pdrop > 0.0,
    )?;
    let context = dropped.f_matmul(&p.v)?;
    Ok((output(&context, &p, weights, &options)?, probs))
}

/// The tensors of a BERT self-attention (`bert_self_attention`), in PyTorch `Linear` layout
/// (`y = x Wᵀ + b`).
#[derive(Debug)]
pub struct BertAttentionWeights {
    /// `query.weight`, `(C, C)`.
    pub query_weight: Tensor,
    /// `query.bias`, `(C)`.
    pub query_bias: Tensor,
    /// `key.weight`, `(C, C)`.
    pub key_weight: Tensor,
    /// `key.bias`, `(C)`.
    pub key_bias: Tensor,
    /// `value.weight`, `(C, C)`.
    pub value_weight: Tensor,
    /// `value.bias`, `(C)`.
    pub value_bias: Tensor,
}

impl BertAttentionWeights {
    /// The tensors under Hugging Face's names, relative to the module (shallow clones).
    pub fn named(&self) -> Vec<(&'static str, Tensor)> {
        vec![
            ("query.weight", self.query_weight.shallow_clone()),
            ("query.bias", self.query_bias.shallow_clone()),
            ("key.weight", self.key_weight.shallow_clone()),
            ("key.bias", self.key_bias.shallow_clone()),
            ("value.weight", self.value_weight.shallow_clone()),
            ("value.bias", self.value_bias.shallow_clone()),
        ]
    }

    /// `(C)` after checking every shape against it.
    pub fn n_embd(&self) -> Result<i64, Error> {
        let c = *self
            .query_weight
            .size()
            .first()
            .ok_or("query.weight is a scalar")?;
        for (what, t, want) in [
            ("query.weight", &self.query_weight, vec![c, c]),
            ("query.bias", &self.query_bias, vec![c]),
            ("key.weight", &self.key_weight, vec![c, c]),
            ("key.bias", &self.key_bias, vec![c]),
            ("value.weight", &self.value_weight, vec![c, c]),
            ("value.bias", &self.value_bias, vec![c]),
        ] {
            if t.size() != want {
                return Err(format!("{what} has shape {:?}, expected {want:?}", t.size()).into());
            }
        }
        Ok(c)
    }
}

/// BERT self-attention with ALiBi, as Composer's patched `BertSelfAttention.forward` computes
/// it, on libtorch's fused `scaled_dot_product_attention`: `x` `(B, T, C)` with the
/// bidirectional bias `alibi` `(1, H, L ≥ T, L)` ([`bidirectional_alibi_bias`]):
/// `softmax(q kᵀ / √d + mask + alibi[:, :, :T, :T]) v` (the padding mask additive,
/// `(1 − m)·finfo(f32).min` as Hugging Face's), attention dropout `dropout` in training, heads
/// merged: the context `(B, T, C)` before `attention.output`.
pub fn bert_alibi_attention(
    x: &Tensor,
    weights: &BertAttentionWeights,
    n_head: i64,
    alibi: &Tensor,
    padding_mask: Option<&Tensor>,
    dropout: f64,
    train: bool,
) -> Result<Tensor, Error> {
    let c = weights.n_embd()?;
    let (b, t) = match x.size()[..] {
        [b, t, w] if w == c => (b, t),
        _ => {
            return Err(format!(
                "bert attention expects (batch, tokens, {c}) input, got {:?}",
                x.size()
            )
            .into())
        }
    };
    let s = alibi.size();
    if s.len() != 4 || s[1] != n_head || t > s[2] {
        return Err(format!(
            "the input has {t} tokens, more than the {} positions ALiBi was built for \
             (`max_sequence_length`)",
            s.get(2).copied().unwrap_or(0)
        )
        .into());
    }
    let d = c / n_head;
    let heads = |w: &Tensor, bias: &Tensor| -> Result<Tensor, Error> {
        Ok(x.f_linear(w, Some(bias))?
            .f_view([b, t, n_head, d])?
            .f_transpose(1, 2)?)
    };
    let q = heads(&weights.query_weight, &weights.query_bias)?;
    let k = heads(&weights.key_weight, &weights.key_bias)?;
    let v = heads(&weights.value_weight, &weights.value_bias)?;
    let mut bias = alibi
        .f_narrow(2, 0, t)?
        .f_narrow(3, 0, t)?
        .f_to_kind(Kind::Float)?;
    if let Some(m) = padding_mask {
        bias = bias
            .f_add(&padding_additive(&m.f_to_device(x.device())?, b, t)?)?
            .f_clamp_min(finite_min(q.kind()))?;
    }
    let p = if train { dropout } else { 0.0 };
    let context = Tensor::f_scaled_dot_product_attention(
        &q,
        &k,
        &v,
        Some(bias.f_to_kind(q.kind())?),
        p,
        false,
        None,
        false,
    )?;
    Ok(context
        .f_transpose(1, 2)?
        .f_contiguous()?
        .f_view([b, t, c])?)
}

/// GPT-2 attention with ALiBi in evaluation mode (no dropout, no padding): the output
/// `(B, T, n_embd)` of [`alibi_sdpa_attention`] with the causal bias of `slopes` built for `T`.
pub fn alibi_attention(
    x: &Tensor,
    c_attn_weight: &Tensor,
    c_attn_bias: &Tensor,
    c_proj_weight: &Tensor,
    c_proj_bias: &Tensor,
    n_head: i64,
    slopes: &[f64],
) -> Result<Tensor, Error> {
    if slopes.len() as i64 != n_head {
        return Err(format!("{} slopes for {n_head} heads", slopes.len()).into());
    }
    let t = *x
        .size()
        .get(1)
        .ok_or("gpt2 attention expects (B, T, n_embd) input")?;
    let alibi = causal_alibi_bias(slopes, t, (x.kind(), x.device()))?;
    let weights = Gpt2AttentionWeights {
        c_attn_weight: c_attn_weight.shallow_clone(),
        c_attn_bias: c_attn_bias.shallow_clone(),
        c_proj_weight: c_proj_weight.shallow_clone(),
        c_proj_bias: c_proj_bias.shallow_clone(),
    };
    alibi_sdpa_attention(x, &weights, n_head, &alibi, AttentionOptions::default())
}

/// The shape Composer's ALiBi gives a batch tensor `(B, S, ...)` at `AFTER_DATALOADER` with
/// `train_sequence_length_scaling = scale`: `(int(B / scale), int(S · scale), ...)`, which is a
/// `reshape` of the same elements (0.25 turns each sequence into 4 of a quarter of the length).
/// `None` when the element counts differ (Composer's `reshape` then raises); `S` must exist.
pub fn alibi_batch_shape(shape: &[i64], scale: f64) -> Option<Vec<i64>> {
    if shape.len() < 2 || !(scale.is_finite() && scale > 0.0) {
        return None;
    }
    let (b, s) = (shape[0], shape[1]);
    let (nb, ns) = ((b as f64 / scale) as i64, (s as f64 * scale) as i64);
    if nb < 1 || ns < 1 || nb.checked_mul(ns)? != b.checked_mul(s)? {
        return None;
    }
    let mut out = vec![nb, ns];
    out.extend_from_slice(&shape[2..]);
    Some(out)
}

/// Composer's `AFTER_DATALOADER` reshape of one batch tensor (see [`alibi_batch_shape`]); an
/// error naming the shape and the scale when the sizes do not divide.
pub fn reshape_for_alibi(t: &Tensor, scale: f64) -> Result<Tensor, Error> {
    let shape = t.size();
    let new = alibi_batch_shape(&shape, scale).ok_or_else(|| {
        Error::new(
            tessera_plugin_api::ErrorKind::OTHER,
            format!(
                "alibi: a batch tensor of shape {shape:?} cannot become (int(B / {scale}), \
                 int(S · {scale})): the sizes must divide evenly (Composer's reshape fails too); \
                 choose a batch size and sequence length that `train_sequence_length_scaling` \
                 divides"
            ),
        )
    })?;
    Ok(t.f_reshape(&new)?)
}
