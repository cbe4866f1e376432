//! Reading Composer's `alibi_surgery` golden GPT-2 (a tiny Hugging Face `GPT2LMHeadModel`'s
//! weights, token ids, attention mask and logits) for the host's GPT-2: its sizes, and the
//! comparison of logits at the positions its attention mask keeps. Shared by tests/models/gpt2.rs and
//! tests/methods/alibi.rs (`#[path]` module).

use std::collections::BTreeSet;

use tessera::model::Gpt2Config;
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::golden::Golden;

/// Prefix of the golden GPT-2's parameters (Hugging Face state_dict names after it).
pub const PARAM: &str = "gpt2/param/";

/// The golden model's sizes and vocabulary, read from its tensors: vocabulary and width from
/// the token embedding, context from the position embedding, layers from the block names,
/// heads from the ALiBi buffer (one slope row per head).
pub fn golden_sizes(g: &Golden) -> (Gpt2Config, usize) {
    let param = |n: &str| g.tensor(&format!("{PARAM}{n}")).size();
    let (wte, wpe) = (
        param("transformer.wte.weight"),
        param("transformer.wpe.weight"),
    );
    let layers: BTreeSet<&str> = g
        .tensors
        .keys()
        .filter_map(|k| k.strip_prefix(&format!("{PARAM}transformer.h.")))
        .filter_map(|rest| rest.split('.').next())
        .collect();
    let n_head = g.tensor("gpt2/after/h.0.attn.alibi").size()[0];
    let sizes = Gpt2Config {
        n_layer: layers.len(),
        n_head: n_head as usize,
        n_embd: wte[1] as usize,
        n_positions: wpe[0] as usize,
        ..Gpt2Config::default()
    };
    (sizes, wte[0] as usize)
}

/// The largest |got − want| over the positions the golden attention mask keeps, and the check
/// that it is within `rtol`·|want| + `rtol`·max|want| everywhere there. The mask pads at the
/// end only, so with causal attention the kept positions never see a padded one: our model
/// (which takes no mask) must match them; the padded positions' logits are meaningless.
pub fn compare_unpadded(what: &str, got: &Tensor, want: &Tensor, mask: &Tensor, rtol: f64) -> f64 {
    assert_eq!(got.size(), want.size(), "{what}: shape");
    let mask = mask.to_kind(Kind::Int64);
    let (batch, t) = (mask.size()[0], mask.size()[1]);
    let mut worst = 0.0f64;
    for b in 0..batch {
        let row: Vec<i64> = (0..t).map(|i| mask.int64_value(&[b, i])).collect();
        let kept = row.iter().take_while(|&&m| m == 1).count() as i64;
        assert!(
            row[kept as usize..].iter().all(|&m| m == 0),
            "{what}: the golden mask of sample {b} is not right padding: {row:?}"
        );
        let g = got.get(b).narrow(0, 0, kept).to_kind(Kind::Double);
        let w = want.get(b).narrow(0, 0, kept).to_kind(Kind::Double);
        let err = (&g - &w).abs();
        let scale = w.abs().max().double_value(&[]);
        let excess = (&err - (w.abs() * rtol + rtol * scale))
            .max()
            .double_value(&[]);
        let max = err.max().double_value(&[]);
        assert!(
            excess <= 0.0,
            "{what}, sample {b}: max |ours − Hugging Face| = {max:e} exceeds {rtol:e} relative"
        );
        worst = worst.max(max);
    }
    worst
}
