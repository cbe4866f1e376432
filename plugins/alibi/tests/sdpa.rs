//! ALiBi on libtorch's fused `scaled_dot_product_attention`: the float mask that carries the
//! bias and the causal mask, its exactness near the diagonal in bfloat16, the fused path
//! against Composer's explicit matmul/softmax, and padded rows staying finite.
//! (`golden.rs` checks the fused path against Composer's logits.)

use alibi::{
    alibi_attention_mask, alibi_attention_with, alibi_head_slopes, alibi_sdpa_attention,
    causal_alibi_bias, AttentionOptions, Gpt2AttentionWeights, MASKED_BIAS,
};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::assert_close;

const CPU: Device = Device::Cpu;

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// Random GPT-2 attention weights of width `c` (std 0.5 on q/k so that the scores, not only the
/// bias, shape the attention), in `kind`.
fn weights(c: i64, kind: Kind) -> Gpt2AttentionWeights {
    let w =
        |shape: &[i64], std: f64| (Tensor::randn(shape, (Kind::Float, CPU)) * std).to_kind(kind);
    Gpt2AttentionWeights {
        c_attn_weight: w(&[c, 3 * c], 0.5),
        c_attn_bias: w(&[3 * c], 0.1),
        c_proj_weight: w(&[c, c], 0.2),
        c_proj_bias: w(&[c], 0.1),
    }
}

fn to_kind(w: &Gpt2AttentionWeights, kind: Kind) -> Gpt2AttentionWeights {
    Gpt2AttentionWeights {
        c_attn_weight: w.c_attn_weight.to_kind(kind),
        c_attn_bias: w.c_attn_bias.to_kind(kind),
        c_proj_weight: w.c_proj_weight.to_kind(kind),
        c_proj_bias: w.c_proj_bias.to_kind(kind),
    }
}

/// Equal within float32 rounding, as the golden tests compare (about 1e-6 relative, reductions
/// ordered differently: rtol = atol = 1e-5).
fn close(what: &str, got: &Tensor, want: &Tensor) {
    let scale = want.abs().max().double_value(&[]);
    eprintln!(
        "{what}: max abs error {:e} (largest value {scale:.3})",
        max_abs_diff(got, want)
    );
    assert_close(what, got, want, 1e-5, 1e-5);
}

#[test]
fn the_mask_is_the_shifted_bias_below_the_diagonal_and_masked_bias_above() {
    let slopes = alibi_head_slopes(3).expect("slopes");
    let alibi = causal_alibi_bias(&slopes, 8, (Kind::Float, CPU)).expect("bias");
    let t = 6;
    let mask = alibi_attention_mask(&alibi, t, None, Kind::Float).expect("mask");
    assert_eq!(mask.size(), [1, 3, t, t]);
    for (h, &m) in slopes.iter().enumerate() {
        for i in 0..t {
            for j in 0..t {
                let got = mask.double_value(&[0, h as i64, i, j]);
                let want = if j <= i {
                    // alibi[h, 0, j] - alibi[h, 0, i], both float32 as Composer builds them.
                    (m as f32 * j as f32 - m as f32 * i as f32) as f64
                } else {
                    MASKED_BIAS
                };
                assert_eq!(got, want, "head {h}, query {i}, key {j}");
            }
        }
    }
    // Longer than the buffer: an error naming the length.
    let e = alibi_attention_mask(&alibi, 9, None, Kind::Float).expect_err("too long");
    assert!(e.message().contains("sequence of 9 tokens"), "{e}");
}

#[test]
fn in_bfloat16_the_mask_is_exact_on_the_diagonal_and_rounded_relatively_next_to_it() {
    // GPT-2 small's 12 heads: slope 1/2 for the first, so Composer's unshifted bias reaches
    // 511.5 at 1024 tokens, where a bfloat16 step is 4. The shifted mask is 0 on the diagonal
    // and −m_h on the first sub-diagonal of every row, within bfloat16's relative rounding
    // (2^−8: 8 significant bits), however long the row.
    let t = 1024;
    let slopes = alibi_head_slopes(12).expect("slopes");
    let alibi = causal_alibi_bias(&slopes, t, (Kind::Float, CPU)).expect("bias");
    let mask = alibi_attention_mask(&alibi, t, None, Kind::BFloat16).expect("mask");
    assert_eq!(mask.kind(), Kind::BFloat16);
    let mask = mask.squeeze_dim(0).to_kind(Kind::Double);
    let diagonal = mask.diagonal(0, -2, -1);
    assert_eq!(diagonal.abs().max().double_value(&[]), 0.0);
    let next = mask.diagonal(-1, -2, -1);
    for (h, &m) in slopes.iter().enumerate() {
        let row = next.get(h as i64);
        let worst = (row + m).abs().max().double_value(&[]) / m;
        assert!(
            worst <= 2f64.powi(-8),
            "head {h} (slope {m}): relative error {worst}"
        );
    }
    // Composer's buffer itself in bfloat16 loses the distances at the end of the row:
    // alibi[0, 0, 1022] = 511 and alibi[0, 0, 1023] = 511.5 both round to 512.
    let unshifted = alibi
        .narrow(2, 0, t)
        .to_kind(Kind::BFloat16)
        .to_kind(Kind::Double);
    assert_eq!(
        unshifted.double_value(&[0, 0, t - 1]) - unshifted.double_value(&[0, 0, t - 2]),
        0.0
    );
}

#[test]
fn the_fused_path_equals_the_explicit_one_in_float32() {
    tch::manual_seed(0);
    let (b, t, h, c) = (2, 40, 4, 32);
    let slopes = alibi_head_slopes(h as usize).expect("slopes");
    let alibi = causal_alibi_bias(&slopes, 64, (Kind::Float, CPU)).expect("bias");
    let w = weights(c, Kind::Float);
    let x = Tensor::randn([b, t, c], (Kind::Float, CPU));
    let fused =
        alibi_sdpa_attention(&x, &w, h, &alibi, AttentionOptions::default()).expect("fused");
    let (explicit, _) =
        alibi_attention_with(&x, &w, h, &alibi, AttentionOptions::default()).expect("explicit");
    close("fused vs explicit, float32", &fused, &explicit);
    // Right padding (Hugging Face's mask): the unpadded positions agree too, and so do the
    // padded ones (each still sees the unpadded keys before it).
    let padding = Tensor::from_slice(&[1i64; 40])
        .unsqueeze(0)
        .repeat([2, 1])
        .index_fill(1, &Tensor::arange_start(30, 40, (Kind::Int64, CPU)), 0);
    let options = AttentionOptions {
        padding_mask: Some(&padding),
        ..AttentionOptions::default()
    };
    let fused = alibi_sdpa_attention(&x, &w, h, &alibi, options).expect("fused");
    let (explicit, _) = alibi_attention_with(&x, &w, h, &alibi, options).expect("explicit");
    close("fused vs explicit, float32, padded", &fused, &explicit);
}

#[test]
fn a_bfloat16_mask_moves_the_attention_far_less_than_composers_bias_in_bfloat16() {
    // At 1024 tokens with 2 heads (slopes 1/16, 1/256) Composer's bias reaches 64 at the end of
    // the row, where bfloat16 steps by 0.5: rounded to bfloat16 it moves the late rows' scores
    // by up to 0.25. The shifted mask rounds relatively, small near the diagonal where the
    // weights are. The attention itself in float32 here, so only the mask's rounding differs.
    tch::manual_seed(1);
    let (t, h, d) = (1024, 2, 8);
    let slopes = alibi_head_slopes(h as usize).expect("slopes");
    let alibi = causal_alibi_bias(&slopes, t, (Kind::Float, CPU)).expect("bias");
    let qkv: Vec<Tensor> = (0..3)
        .map(|_| Tensor::randn([1, h, t, d], (Kind::Float, CPU)))
        .collect();
    let attend = |mask: Tensor| {
        Tensor::scaled_dot_product_attention(
            &qkv[0],
            &qkv[1],
            &qkv[2],
            Some(mask),
            0.0,
            false,
            None,
            false,
        )
    };
    let exact = attend(alibi_attention_mask(&alibi, t, None, Kind::Float).expect("mask"));
    let shifted = attend(
        alibi_attention_mask(&alibi, t, None, Kind::BFloat16)
            .expect("mask")
            .to_kind(Kind::Float),
    );
    let causal = Tensor::ones([t, t], (Kind::Bool, CPU)).tril(0);
    let composer = alibi
        .narrow(2, 0, t)
        .expand([h, t, t], false)
        .where_scalarother(&causal, MASKED_BIAS)
        .unsqueeze(0)
        .to_kind(Kind::BFloat16)
        .to_kind(Kind::Float);
    let composer = attend(composer);
    let (shifted_err, composer_err) = (
        max_abs_diff(&shifted, &exact),
        max_abs_diff(&composer, &exact),
    );
    eprintln!(
        "attention with the mask in bfloat16 vs float32: shifted {shifted_err:e}, \
         Composer's bias {composer_err:e}"
    );
    assert!(
        shifted_err < composer_err,
        "{shifted_err} vs {composer_err}"
    );
}

#[test]
fn left_padded_rows_stay_finite_in_bfloat16() {
    // A query whose keys are all padding (left padding): every score is masked; clamped to
    // bfloat16's most negative finite value the row stays a (meaningless) finite average
    // instead of 0/0.
    tch::manual_seed(2);
    let (b, t, h, c) = (2, 12, 2, 16);
    let slopes = alibi_head_slopes(h as usize).expect("slopes");
    let alibi = causal_alibi_bias(&slopes, t, (Kind::Float, CPU)).expect("bias");
    let w = to_kind(&weights(c, Kind::Float), Kind::BFloat16);
    let x = Tensor::randn([b, t, c], (Kind::Float, CPU)).to_kind(Kind::BFloat16);
    let padding = Tensor::ones([b, t], (Kind::Int64, CPU)).index_fill(
        1,
        &Tensor::arange(4, (Kind::Int64, CPU)),
        0,
    );
    let mask = alibi_attention_mask(&alibi, t, Some(&padding), Kind::BFloat16).expect("mask");
    assert_eq!(mask.size(), [b, h, t, t]);
    assert_eq!(mask.isfinite().all().int64_value(&[]), 1);
    let options = AttentionOptions {
        padding_mask: Some(&padding),
        ..AttentionOptions::default()
    };
    let out = alibi_sdpa_attention(&x, &w, h, &alibi, options).expect("fused");
    assert_eq!(out.isfinite().all().int64_value(&[]), 1);
}
