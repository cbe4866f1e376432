//! The qk_norm plugin on the host's GPT-2, alone and composed with rotary.
//!
//! - In-process: the real `libqk_norm.so` changes every attention block into a
//!   `gpt2_attention_ext` with QK-norm over the same tensors; the modules (several batch
//!   shapes) and the model's logits equal the float64 PyTorch reference
//!   (`tests/support/gpt_reference.py`, `F.rms_norm(q, (D,))`). With rotary, in either order in
//!   `trainer.toml`, the tree is the same (one module with both features), the logits are the
//!   same to the bit, and they equal the reference, which rotates *before* normalising
//!   (modded-nanogpt's 2024-10-14 order) where the plugins normalise first.
//! - Through the binary: training learns, the checkpoint rebuilds with the module, ALiBi's
//!   attention is refused naming it, and the export keeps the module and matches the PyTorch
//!   twins.
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).
//! Its export (the file's modules, the PyTorch twins) is the row `qk_norm_export` of the export
//! table, with this file's `exported` as the method's own assertions.

use serde_json::json;
use tessera_plugin_api::tch;
use tessera_tests::*;

use crate::gpt_models;
use crate::lm_export;
use gpt_models::*;
use lm_export::Export;

const TOL: f64 = 1e-5;

#[test]
fn the_plugin_on_the_host_gpt2_equals_the_pytorch_reference() {
    let dir = TempDir::new("qk-norm-model");
    let toml = with_model(
        gpt("qk", &[("qk_norm", "")]),
        "n_layer = 2\nn_head = 4\nn_embd = 32\nn_positions = 64",
    );
    let trainer = trainer(&dir, &toml);
    let model = trainer.model();
    for i in 0..2 {
        let (kind, attrs) = node(model, &format!("transformer.h.{i}.attn"));
        assert_eq!(kind, "gpt2_attention_ext");
        assert_eq!((attrs["qk_norm"], attrs["rotary"]), (1.0, 0.0));
    }
    // The learned positions stay.
    assert_eq!(node(model, "transformer.wpe").0, "embedding");
    randomize(model, 0.3, 3);
    let spec = json!({"n_head": 4, "n_layer": 2, "rotary": null, "qk_norm": true});
    let Some(m) = check_module(
        model,
        "transformer.h.0.attn",
        "attention",
        &spec,
        &[(1, 1), (2, 9), (4, 64)],
        Vec::new(),
        TOL,
    ) else {
        return;
    };
    let l = check_model(model, &spec, 3, 33, TOL).expect("torch imports");
    println!("qk_norm vs PyTorch: attention {m:e}, logits {l:e}");
}

#[test]
fn with_rotary_both_orders_give_one_module_and_the_same_logits() {
    let model_lines = "n_layer = 2\nn_head = 2\nn_embd = 32\nn_positions = 64";
    let rotary = "fraction = 0.5\nbase = 1000.0";
    let build = |label: &str, plugins: &[(&str, &str)]| {
        let dir = TempDir::new(label);
        let t = trainer(&dir, &with_model(gpt(label, plugins), model_lines));
        (dir, t)
    };
    let (_d1, a) = build("rq", &[("rotary", rotary), ("qk_norm", "")]);
    let (_d2, b) = build("qr", &[("qk_norm", ""), ("rotary", rotary)]);
    let (ma, mb) = (a.model(), b.model());
    assert_eq!(kinds(ma), kinds(mb));
    for i in 0..2 {
        let path = format!("transformer.h.{i}.attn");
        let (kind, attrs) = node(ma, &path);
        assert_eq!(kind, "gpt2_attention_ext");
        assert_eq!(attrs, node(mb, &path).1, "{path}");
        assert_eq!(
            (attrs["qk_norm"], attrs["rotary"], attrs["rotary_dims"]),
            (1.0, 1.0, 8.0)
        );
    }
    assert_eq!(node(ma, "transformer.wpe").0, "rotary_zero_positions");
    // The same tensors under the same names; the same weights give the same logits, bit for
    // bit, whichever order built the module.
    let names = |m: &tessera::model::Model| {
        m.params
            .entries()
            .iter()
            .map(|e| (e.name.clone(), e.role))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(names(ma), names(mb));
    randomize(ma, 0.3, 8);
    randomize(mb, 0.3, 8);
    tch::manual_seed(1);
    let ids = tch::Tensor::randint(64, [2, 40], (tch::Kind::Int64, tch::Device::Cpu));
    let la = tch::no_grad(|| ma.forward(&ids, false)).unwrap();
    let lb = tch::no_grad(|| mb.forward(&ids, false)).unwrap();
    assert!(la.equal(&lb), "the two orders compute differently");
    let spec = json!({
        "n_head": 2, "n_layer": 2,
        "rotary": {"base": 1000.0, "dims": 8}, "qk_norm": true,
    });
    let Some(m) = check_module(
        ma,
        "transformer.h.1.attn",
        "attention",
        &spec,
        &[(1, 1), (2, 7), (3, 50)],
        Vec::new(),
        TOL,
    ) else {
        return;
    };
    let l = check_model(mb, &spec, 2, 40, TOL).expect("torch imports");
    println!("rotary + qk_norm (both orders) vs PyTorch: attention {m:e}, logits {l:e}");
}

#[test]
fn training_with_qk_norm_learns_and_the_checkpoint_rebuilds_it() {
    let dir = TempDir::new("qk-binary");
    let (record, lines, stderr) = run(&dir, &gpt("qk", &[("qk_norm", "")]), &[]);
    assert!(
        stderr.contains("qk_norm: 2 attention blocks RMS-normalise q and k per head"),
        "{stderr}"
    );
    assert_trains(&record, &lines);
    let k = kinds(rebuilt(&dir, "qk").model());
    assert_eq!(k["transformer.h.0.attn"], "gpt2_attention_ext");
    assert_eq!(k["transformer.wpe"], "embedding");
}

#[test]
fn alibi_attention_is_refused_naming_it() {
    for order in [["alibi", "qk_norm"], ["qk_norm", "alibi"]] {
        let dir = TempDir::new("qk-alibi");
        let plugins: Vec<(&str, &str)> = order
            .iter()
            .map(|p| {
                (
                    *p,
                    if *p == "alibi" {
                        "max_sequence_length = 64"
                    } else {
                        ""
                    },
                )
            })
            .collect();
        gpt("both", &plugins).write_to(&dir);
        train(&dir, &[], &[]).assert_failure(&[
            "qk_norm cannot change ALiBi's attention",
            "alibi_gpt2_attention",
        ]);
    }
}

/// The method's own part of its export check (`table::qk_norm_export`): the attention keeps
/// both QK-norm and rotary.
pub fn exported(export: &Export) {
    let attrs = &export.modules[1]["attrs"];
    assert_eq!(attrs["qk_norm"].as_f64(), Some(1.0), "{attrs}");
    assert_eq!(attrs["rotary"].as_f64(), Some(1.0), "{attrs}");
}
