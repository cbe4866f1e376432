//! What the transformer models of the zoo share (GPT-2's, BERT's, Llama's): the checks of
//! their sizes and inputs, the merge of attention heads, the normal init.

use tch::{nn::Init, TchError, Tensor};

use crate::model::layers::{Attr, Layer};

/// `(B, T, C)` of a hidden-state input, checking its rank and width (GPT-2's and BERT's).
pub(super) fn btc(xs: &Tensor, n_embd: i64, what: &str) -> Result<(i64, i64, i64), TchError> {
    match xs.size().as_slice() {
        &[b, t, c] if c == n_embd => Ok((b, t, c)),
        s => Err(TchError::Shape(format!(
            "{what}: expected an input (batch, tokens, {n_embd}), got {s:?}"
        ))),
    }
}

/// normal(0, `std`).
pub(super) fn normal(std: f64) -> Init {
    Init::Randn {
        mean: 0.0,
        stdev: std,
    }
}

/// Attention heads `(B, H, T, D)` merged back into features `(B, T, H·D)`.
pub(super) fn merge_heads(y: &Tensor) -> Result<Tensor, TchError> {
    let (b, h, t, d) = y.size4()?;
    y.f_transpose(1, 2)?
        .f_contiguous()?
        .f_reshape([b, t, h * d])
}

/// Whether `layer` is an `embedding`, and then its row count: the positions a learned position
/// table covers (GPT-2's `wpe`, BERT's `position_embeddings`) while no method replaced it.
pub(super) fn embedding_rows(layer: &dyn Layer) -> Option<i64> {
    if layer.kind() != "embedding" {
        return None;
    }
    layer.attrs().into_iter().find_map(|(k, v)| match (k, v) {
        ("num_embeddings", Attr::Int(n)) => Some(n),
        _ => None,
    })
}

/// Checks a transformer's `[model]` sizes (GPT-2's, BERT's): every count in `counts` at least 1,
/// `n_embd` a multiple of `n_head`, a positive layer-norm epsilon, and the vocabulary (the
/// config's `vocab_size`, else the data's `vocabulary`) at least the data's; returns the
/// vocabulary size. Errors name the key, prefixed with `model`.
pub(super) fn check_sizes(
    model: &str,
    counts: &[(&str, usize)],
    (n_embd, n_head): (usize, usize),
    layer_norm_epsilon: f64,
    (vocab_size, vocabulary): (Option<usize>, i64),
) -> Result<i64, TchError> {
    let bad = |msg: String| Err(TchError::Shape(format!("{model}: {msg}")));
    for (key, v) in counts {
        if *v == 0 {
            return bad(format!("`[model] {key}` must be at least 1, got 0"));
        }
    }
    if !n_embd.is_multiple_of(n_head) {
        return bad(format!(
            "`[model] n_embd` ({n_embd}) must be a multiple of `n_head` ({n_head})"
        ));
    }
    if layer_norm_epsilon.is_nan() || layer_norm_epsilon <= 0.0 {
        return bad(format!(
            "`[model] layer_norm_epsilon` must be > 0, got {layer_norm_epsilon}"
        ));
    }
    let vocab = vocab_size.map_or(vocabulary, |v| v as i64);
    if vocab < vocabulary.max(1) {
        return bad(format!(
            "`[model] vocab_size` ({vocab}) must be at least the {vocabulary} tokens of the \
             data's vocabulary"
        ));
    }
    Ok(vocab)
}
