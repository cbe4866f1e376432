//! The logit_softcap plugin on the host's GPT-2, with tied and untied heads.
//!
//! - In-process: the real `liblogit_softcap.so` wraps `lm_head` (transparently: the tied head
//!   keeps multiplying by `transformer.wte.weight`, the untied one keeps `lm_head.weight`); the
//!   head (several batch shapes) and the model's logits equal the float64 PyTorch reference
//!   `cap * tanh(logits / cap)` (`tests/support/gpt_reference.py`), and no logit exceeds the cap.
//! - Through the binary: training learns, the checkpoint rebuilds with the wrapper, bad caps are
//!   refused naming the setting, and the export keeps `logit_softcap_lm_head` (with `cap` and
//!   `tied`) and matches the PyTorch twins, tied and untied.
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).
//! Its exports (the file's modules, the PyTorch twins) are the rows `logit_softcap_export_tied`
//! and `_untied` of the export table, with this file's `exported_tied` and `exported_untied`.

use serde_json::json;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_tests::*;

use crate::gpt_models;
use crate::lm_export;
use gpt_models::*;
use lm_export::Export;

const TOL: f64 = 1e-5;
const UNTIED: &str =
    "n_layer = 2\nn_head = 2\nn_embd = 32\nn_positions = 64\ntie_embeddings = false";

fn check(tied: bool) {
    let dir = TempDir::new("softcap-model");
    let mut toml = gpt("softcap", &[("logit_softcap", "cap = 1.5")]);
    if !tied {
        toml = with_model(toml, UNTIED);
    }
    let trainer = trainer(&dir, &toml);
    let model = trainer.model();
    let (kind, attrs) = node(model, "lm_head");
    assert_eq!(kind, "logit_softcap_lm_head");
    assert_eq!(attrs["cap"], 1.5);
    assert_eq!(attrs["tied"], f64::from(u8::from(tied)));
    assert_eq!(attrs["out_features"], 64.0);
    // The head's tensors are what they were: none when tied, its weight when untied.
    assert_eq!(model.params.get("lm_head.weight").is_some(), !tied);
    randomize(model, 0.3, 6);
    tch::manual_seed(2);
    let ids = Tensor::randint(64, [2, 20], (Kind::Int64, Device::Cpu));
    let logits = tch::no_grad(|| model.forward(&ids, false)).unwrap();
    assert_eq!(logits.kind(), Kind::Float);
    let max = logits.abs().max().double_value(&[]);
    assert!(max <= 1.5 && max > 1.0, "max |logit| {max}");

    let spec = json!({"n_head": 2, "n_layer": 2, "cap": 1.5, "tied": tied});
    // Tied, the head's weight is the token embedding's (the node holds none of its own).
    // Hidden states of unit normal features and weights of 0.3: the uncapped logits reach
    // well beyond the cap.
    let extra = if tied {
        let w = &model.params.get("transformer.wte.weight").unwrap().tensor;
        vec![("weight".to_owned(), w.detach().copy())]
    } else {
        Vec::new()
    };
    let Some(m) = check_module(
        model,
        "lm_head",
        "head",
        &spec,
        &[(1, 1), (2, 9), (3, 40)],
        extra,
        TOL,
    ) else {
        return;
    };
    let l = check_model(model, &spec, 2, 20, TOL).expect("torch imports");
    println!("logit_softcap (tied {tied}) vs PyTorch: head {m:e}, logits {l:e}");
}

#[test]
fn the_plugin_on_the_host_gpt2_equals_the_pytorch_reference() {
    check(true);
    check(false);
}

#[test]
fn training_with_capped_logits_learns_and_the_checkpoint_rebuilds_it() {
    for (label, model) in [("tied", None), ("untied", Some(UNTIED))] {
        let dir = TempDir::new("softcap-binary");
        let mut toml = gpt(label, &[("logit_softcap", "")]);
        if let Some(m) = model {
            toml = with_model(toml, m);
        }
        let (record, lines, stderr) = run(&dir, &toml, &[]);
        assert!(
            stderr.contains(&format!(
                "logit_softcap: the logits of the {label} lm_head are capped at 30"
            )),
            "{stderr}"
        );
        assert_trains(&record, &lines);
        let k = kinds(rebuilt(&dir, label).model());
        assert_eq!(k["lm_head"], "logit_softcap_lm_head");
    }
}

/// The method's own part of its export checks (`table::logit_softcap_export_tied` and
/// `_untied`): the head keeps its cap and whether it is tied; untied, the head's weight is
/// exported; tied, the node has none of its own (the token embedding is exported once, under
/// its own name).
fn exported(export: &Export, tied: bool) {
    let Export { tensors, modules } = export;
    assert_eq!(modules[0]["attrs"]["cap"].as_f64(), Some(2.0));
    assert_eq!(
        modules[0]["attrs"]["tied"].as_f64(),
        Some(f64::from(u8::from(tied)))
    );
    let has_head = tensors.iter().any(|(n, _)| n == "lm_head.weight");
    assert_eq!(has_head, !tied, "tied: {tied}");
}

/// [`exported`] of the tied head.
pub fn exported_tied(export: &Export) {
    exported(export, true);
}

/// [`exported`] of the untied head.
pub fn exported_untied(export: &Export) {
    exported(export, false);
}
