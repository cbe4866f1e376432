//! Class targets (plugin-api 1.3): Composer's `ensure_targets_one_hot`, shared by the methods
//! that mix or soften labels (label smoothing, MixUp, CutMix).

use tch::{Kind, TchError, Tensor};

/// Composer's `ensure_targets_one_hot(output, target)` (`composer/loss/utils.py`): the target
/// as float32 probabilities shaped like `output` `(N, C, d_1, ..., d_K)`.
///
/// The number of classes is `C = output.size()[1]`, as in Composer. `target` is either
/// - class indices of shape `(N, d_1, ..., d_K)` (any integer kind), made one-hot with the class
///   dimension at dim 1; a negative index (an `ignore_index` such as −100) gives an all-zero
///   row, and an index `>= C` is an error; or
/// - probabilities of the same shape as `output`, returned as float32.
pub fn ensure_one_hot(output: &Tensor, target: &Tensor) -> Result<Tensor, TchError> {
    let shape = output.size();
    let num_classes = *shape.get(1).ok_or_else(|| {
        TchError::Shape(format!(
            "model outputs need a class dimension, got shape {shape:?}"
        ))
    })?;
    if target.size() == shape {
        return target.f_to_kind(Kind::Float);
    }
    if target.dim() + 1 != shape.len() {
        return Err(TchError::Shape(format!(
            "targets of shape {:?} are neither class indices nor probabilities for outputs of \
             shape {shape:?}",
            target.size()
        )));
    }
    let dense = one_hot_at_dim1(target, num_classes)?;
    if dense.size() != shape {
        return Err(TchError::Shape(format!(
            "targets of shape {:?} do not match outputs of shape {shape:?}",
            target.size()
        )));
    }
    Ok(dense)
}

/// Composer's `_one_hot(targets, num_classes, dim=1)` as float32: negative indices give all-zero
/// rows; indices `>= num_classes` are an error (libtorch's, from `scatter`: out of bounds).
///
/// Made with `scatter`, not libtorch's `one_hot`, which on the CPU checks the indices' minimum
/// and maximum with reads on the host (`item`) at every call; `scatter` checks each index as it
/// writes (on CUDA, a device-side assertion, as `one_hot` there).
fn one_hot_at_dim1(targets: &Tensor, num_classes: i64) -> Result<Tensor, TchError> {
    if !matches!(
        targets.kind(),
        Kind::Uint8 | Kind::Int8 | Kind::Int16 | Kind::Int | Kind::Int64
    ) {
        return Err(TchError::Kind(format!(
            "index targets must be of an integer kind, got {:?}",
            targets.kind()
        )));
    }
    let index = targets.f_to_kind(Kind::Int64)?;
    let kept = index.f_ge(0)?.f_unsqueeze(-1)?;
    let mut shape = index.size();
    shape.push(num_classes);
    let positions = index.f_clamp_min(0)?.f_unsqueeze(-1)?;
    // A tensor of ones as the source, not a scalar: tch panics in a `Scalar`'s drop when the
    // call it was passed to failed (an index >= C), instead of returning the error.
    let ones = positions.f_ones_like()?.f_to_kind(Kind::Float)?;
    let one_hot = Tensor::f_zeros(&shape, (Kind::Float, index.device()))?
        .f_scatter(-1, &positions, &ones)?
        .f_mul(&kept)?;
    // one_hot appends the class dimension last; Composer's layout has it at dim 1.
    if one_hot.dim() > 2 {
        one_hot.f_movedim(&[-1i64][..], &[1i64][..])?.f_contiguous()
    } else {
        Ok(one_hot)
    }
}

/// `wa·a + wb·b`: how MixUp and CutMix interpolate targets and losses, with Composer's two
/// weights kept as given (`1 − m, m` or `λ, 1 − λ`) rather than one derived from the other.
pub fn mix(a: &Tensor, wa: f64, b: &Tensor, wb: f64) -> Result<Tensor, TchError> {
    a.f_mul_scalar(wa)?.f_add(&b.f_mul_scalar(wb)?)
}

/// `wa·onehot(a) + wb·onehot(b)`, both made dense by [`ensure_one_hot`] against `output`.
pub fn mix_one_hot(
    output: &Tensor,
    a: &Tensor,
    wa: f64,
    b: &Tensor,
    wb: f64,
) -> Result<Tensor, TchError> {
    mix(
        &ensure_one_hot(output, a)?,
        wa,
        &ensure_one_hot(output, b)?,
        wb,
    )
}
