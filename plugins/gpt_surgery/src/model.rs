//! The surgery the attention plugins share ([`rebuild_attention`]), written against the kit's
//! [`SurgeryModel`].

use tessera_plugin_api::kit::SurgeryModel;
use tessera_plugin_api::Error;

use crate::attention::{AttentionSpec, AttentionWeights, ExtAttention};

/// The attention surgery rotary and qk_norm share. Every `gpt2_attention` and
/// `gpt2_attention_ext` of the tree is read back into its [`AttentionSpec`] (kind and
/// attributes), `add` puts the plugin's feature into it (returning `false` when the spec
/// already has it: that module is left alone, so a second application changes nothing), and
/// the module is replaced by an [`ExtAttention`] of the new spec over the **same** four tensors
/// (`c_attn.weight`, `c_attn.bias`, `c_proj.weight`, `c_proj.bias`: the optimizer trains them
/// and checkpoints keep their names). Whichever of the two plugins runs first, the other finds
/// its `gpt2_attention_ext` and adds its own feature: both orders give the same module.
/// Returns the paths of the replaced modules. Takes any [`SurgeryModel`] (the host's
/// `Context`, or the kit's `StandIn` in tests).
pub fn rebuild_attention(
    model: &mut impl SurgeryModel,
    mut add: impl FnMut(&mut AttentionSpec) -> Result<bool, Error>,
) -> Result<Vec<String>, Error> {
    let modules = model.modules()?;
    let mut done = Vec::new();
    for m in &modules {
        let Some(spec) = AttentionSpec::from_module(m)? else {
            continue;
        };
        let mut new = spec.clone();
        if !add(&mut new)? || new == spec {
            continue;
        }
        let weights = AttentionWeights {
            c_attn_weight: model.tensor_of(m, "c_attn.weight")?,
            c_attn_bias: model.tensor_of(m, "c_attn.bias")?,
            c_proj_weight: model.tensor_of(m, "c_proj.weight")?,
            c_proj_bias: model.tensor_of(m, "c_proj.bias")?,
        };
        let module = ExtAttention::new(new, weights)
            .map_err(|e| format!("{} `{}`: {}", m.kind, m.path, e.message()))?;
        model.replace(&m.path, module)?;
        done.push(m.path.to_string());
    }
    Ok(done)
}
