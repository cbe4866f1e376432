#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use gpt_surgery::kinds::{
    ALIBI_ATTENTION, EXT_ATTENTION, GPT2_ATTENTION, LLAMA_ATTENTION, QK_NORM_PROJECTION,
    SURGERY_PRIORITY,
};
use gpt_surgery::rebuild_attention;
use tessera_plugin_api::kit::{walk, SurgeryModel};
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Inner, Method, Plugin, Settings, Wrapper,
};

pub use gpt_surgery::{qk_rms_norm, ExtAttention};

/// The surgery: refuses a model with ALiBi's attention; every `gpt2_attention` or
/// `gpt2_attention_ext` without QK-norm becomes a `gpt2_attention_ext` with it (the same
/// tensors, its other features kept). Returns the replaced paths; modules that already
/// normalise q and k are left alone, so a second application changes nothing.
pub fn apply_qk_norm(model: &mut impl SurgeryModel) -> Result<Vec<String>, Error> {
    if let Some(m) = model
        .modules()?
        .into_iter()
        .find(|m| m.kind.as_str() == ALIBI_ATTENTION)
    {
        return Err(Error::config(format!(
            "qk_norm cannot change ALiBi's attention ({ALIBI_ATTENTION} at `{}`): it normalises \
             q and k of the {GPT2_ATTENTION} blocks only (with rotary positions instead of \
             ALiBi's, list rotary and qk_norm)",
            m.path
        )));
    }
    rebuild_attention(model, |spec| {
        if spec.qk_norm {
            return Ok(false);
        }
        spec.qk_norm = true;
        Ok(true)
    })
}

/// The wrapper around a llama attention's `q_proj` or `k_proj` (kind [`QK_NORM_PROJECTION`]):
/// runs the projection, then [`qk_rms_norm`] over each head's `head_dim` features. The
/// attention applies its rotary positions after the projection, so queries and keys are
/// normalised before the rotation, as in modded-nanogpt (the rotation keeps each head's root
/// mean square anyway). Transparent: the projection keeps its tensors and names; nothing
/// learned is added (no `q_norm.weight`, unlike Qwen3's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkNormProjection {
    head_dim: i64,
}

impl QkNormProjection {
    /// The wrapper for heads of `head_dim` features.
    pub fn new(head_dim: i64) -> QkNormProjection {
        QkNormProjection { head_dim }
    }
}

/// `qk_rms_norm` of `y` `(..., heads · head_dim)` per head.
pub fn per_head_rms_norm(y: &Tensor, head_dim: i64) -> Result<Tensor, Error> {
    let shape = y.size();
    let mut heads = shape.clone();
    let width = heads.pop().unwrap_or(0);
    if head_dim <= 0 || width % head_dim != 0 {
        return Err(format!(
            "qk_norm: a projection of {width} features is not whole heads of {head_dim}"
        )
        .into());
    }
    heads.extend([width / head_dim, head_dim]);
    qk_rms_norm(&y.f_reshape(&heads)?)?
        .f_reshape(&shape)
        .map_err(Error::from)
}

impl Wrapper for QkNormProjection {
    fn kind(&self) -> &str {
        QK_NORM_PROJECTION
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        vec![("head_dim".to_owned(), self.head_dim as f64)]
    }

    fn forward(&self, input: &Tensor, train: bool, inner: &mut Inner<'_>) -> Result<Tensor, Error> {
        per_head_rms_norm(&inner.forward(input, train)?, self.head_dim)
    }
}

/// The llama surgery: `q_proj` and `k_proj` of every `llama_attention` are wrapped in a
/// [`QkNormProjection`] (a projection LoRA adapted is wrapped with its adapter, so the norm
/// applies to what the attention sees). Returns the attention paths changed; those already
/// normalised are left alone.
pub fn apply_llama_qk_norm(model: &mut impl SurgeryModel) -> Result<Vec<String>, Error> {
    let modules = model.modules()?;
    let mut done = Vec::new();
    for attention in walk::of_kind(&modules, LLAMA_ATTENTION) {
        let head_dim = attention.int_attr("head_dim", None)?;
        let mut changed = false;
        for projection in ["q_proj", "k_proj"] {
            let path = format!("{}.{projection}", attention.path);
            match walk::find(&modules, &path) {
                Some(m) if m.kind.as_str() == QK_NORM_PROJECTION => {}
                Some(_) => {
                    let wrapper = QkNormProjection::new(head_dim);
                    model.wrap_module(&path, wrapper, None, vec![])?;
                    changed = true;
                }
                None => return Err(format!("qk_norm: no module at `{path}`").into()),
            }
        }
        if changed {
            done.push(attention.path.to_string());
        }
    }
    Ok(done)
}

/// The QK-norm method: surgery at `init`.
#[derive(Debug, Clone, Copy, Default)]
pub struct QkNorm;

impl Method for QkNorm {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let llama = apply_llama_qk_norm(ctx)?;
        if !llama.is_empty() {
            ctx.info(&format!(
                "qk_norm: {} llama attention blocks RMS-normalise q and k per head",
                llama.len()
            ));
            return Ok(());
        }
        let done = apply_qk_norm(ctx)?;
        if done.is_empty() {
            let normalised = ctx
                .modules()?
                .iter()
                .filter(|m| {
                    (m.kind.as_str() == EXT_ATTENTION && m.attr("qk_norm") == Some(1.0))
                        || m.kind.as_str() == QK_NORM_PROJECTION
                })
                .count();
            if normalised == 0 {
                ctx.warn(&format!(
                    "qk_norm: the model has no {GPT2_ATTENTION} or {LLAMA_ATTENTION} block: \
                     QK-norm had no effect"
                ));
            }
            return Ok(());
        }
        ctx.info(&format!(
            "qk_norm: {} attention blocks RMS-normalise q and k per head",
            done.len()
        ));
        Ok(())
    }
}

impl Plugin for QkNorm {
    const NAME: &'static str = "qk_norm";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "RMS-normalises queries and keys per head before the attention (GPT-2 surgery at init)";
    const DEFAULT_SETTINGS: &'static str = "";

    fn hooks() -> Vec<Hook> {
        vec![Hook {
            event: Event::INIT,
            priority: SURGERY_PRIORITY,
        }]
    }

    fn create(_settings: &Settings) -> Result<Self, Error> {
        Ok(QkNorm)
    }
}

export_plugin!(QkNorm);

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_plugin_api::tch::{Kind, Tensor};

    #[test]
    fn each_head_is_normalised_on_its_own() {
        // 2 heads of 3: the first scaled by 10, the second by 0.5; each head comes out with a
        // root mean square of 1 and its direction kept.
        let y = Tensor::from_slice(&[10.0f32, 20.0, 20.0, 0.5, 0.0, 0.0]).view([1, 1, 6]);
        let n = per_head_rms_norm(&y, 3).unwrap();
        let r3 = 3f32.sqrt();
        let want =
            Tensor::from_slice(&[1.0 / r3, 2.0 / r3, 2.0 / r3, r3, 0.0, 0.0]).view([1, 1, 6]);
        let diff = (n - want).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{diff}");
        assert!(per_head_rms_norm(
            &Tensor::zeros([1, 5], (Kind::Float, tessera_plugin_api::tch::Device::Cpu)),
            2
        )
        .is_err());
    }
}
