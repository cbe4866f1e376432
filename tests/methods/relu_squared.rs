//! The relu_squared plugin on the host's GPT-2.
//!
//! - In-process: the real `librelu_squared.so` replaces every `gpt2_mlp` by a
//!   `relu_squared_gpt2_mlp` over the same tensors; the MLP (several batch shapes) and the
//!   model's logits equal the float64 PyTorch reference (`F.relu(x).square()`,
//!   `tests/support/gpt_reference.py`).
//! - Through the binary: training learns, the replaced count is logged, the checkpoint rebuilds
//!   with the module, gated linear units are refused in either order (the MLPs would already be
//!   gated), and the export keeps the module and matches the PyTorch twins.
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).
//! Its export (the file's modules, the PyTorch twins) is the row `relu_squared_export` of the export
//! table, with this file's `exported` as the method's own assertions.

use serde_json::json;
use tessera::model::Role;
use tessera_tests::*;

use crate::gpt_models;
use crate::lm_export;
use gpt_models::*;
use lm_export::Export;

const TOL: f64 = 1e-5;

#[test]
fn the_plugin_on_the_host_gpt2_equals_the_pytorch_reference() {
    let dir = TempDir::new("relu2-model");
    let trainer = trainer(&dir, &gpt("relu2", &[("relu_squared", "")]));
    let model = trainer.model();
    for i in 0..2 {
        let path = format!("transformer.h.{i}.mlp");
        let (kind, attrs) = node(model, &path);
        assert_eq!(kind, "relu_squared_gpt2_mlp");
        assert_eq!((attrs["n_embd"], attrs["n_inner"]), (32.0, 128.0));
        for leaf in ["c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"] {
            let e = model.params.get(&format!("{path}.{leaf}")).expect(leaf);
            assert_eq!(e.role, Role::Parameter);
        }
    }
    // The attention is untouched.
    assert_eq!(node(model, "transformer.h.0.attn").0, "gpt2_attention");
    randomize(model, 0.3, 4);
    let spec = json!({"n_head": 2, "n_layer": 2, "relu_squared": true});
    let Some(m) = check_module(
        model,
        "transformer.h.1.mlp",
        "mlp",
        &spec,
        &[(1, 1), (2, 9), (3, 64)],
        Vec::new(),
        TOL,
    ) else {
        return;
    };
    let l = check_model(model, &spec, 2, 30, TOL).expect("torch imports");
    println!("relu_squared vs PyTorch: mlp {m:e}, logits {l:e}");
}

#[test]
fn training_with_relu_squared_learns_and_the_checkpoint_rebuilds_it() {
    let dir = TempDir::new("relu2-binary");
    let (record, lines, stderr) = run(&dir, &gpt("relu2", &[("relu_squared", "")]), &[]);
    assert!(
        stderr.contains("relu_squared: 2 gpt2_mlp blocks use relu(x)^2 instead of GELU"),
        "{stderr}"
    );
    assert_eq!(
        method_metric(&lines, "relu_squared/num_replacements"),
        [(0, 2.0)]
    );
    assert_trains(&record, &lines);
    let dir2 = TempDir::new("relu2-plain");
    let (_, plain, _) = run(&dir2, &gpt("plain", &[]), &[]);
    assert_ne!(losses(&plain), losses(&lines));
    let k = kinds(rebuilt(&dir, "relu2").model());
    assert_eq!(k["transformer.h.1.mlp"], "relu_squared_gpt2_mlp");
}

#[test]
fn gated_linear_units_are_refused_naming_them() {
    for order in [
        ["gated_linear_units", "relu_squared"],
        ["relu_squared", "gated_linear_units"],
    ] {
        let dir = TempDir::new("relu2-glu");
        gpt("both", &[(order[0], ""), (order[1], "")]).write_to(&dir);
        train(&dir, &[], &[]).assert_failure(&[
            "relu_squared cannot be combined with gated_linear_units",
            "glu_gpt2_mlp",
            "act_fn",
        ]);
    }
}

/// The method's own part of its export check (`table::relu_squared_export`): the MLPs keep
/// their dropout and their `c_fc` weights.
pub fn exported(export: &Export) {
    let Export { tensors, modules } = export;
    assert_eq!(modules[0]["attrs"]["resid_pdrop"].as_f64(), Some(0.1));
    assert!(tensors
        .iter()
        .any(|(n, _)| n == "transformer.h.1.mlp.c_fc.weight"));
}
