//! The zero_init_projections plugin on the host's GPT-2.
//!
//! - In-process: after `init` every block's `attn.c_proj.weight` and `mlp.c_proj.weight` are
//!   zero (each block then adds nothing to the residual stream), nothing else changed; the
//!   model's logits equal the float64 PyTorch reference of that model; an untied `lm_head` is
//!   zeroed on request and a tied one refused; the projections that other plugins' surgery put
//!   in are zeroed too, whatever the `trainer.toml` order (gated linear units' fresh `wo`,
//!   relu_squared's and rotary's modules over the same names).
//! - Through the binary: training learns from the zero start (the projections move), the
//!   count is logged, the checkpoint rebuilds the plain tree, bad settings are refused.
//!
//! The settings its plugin refuses are a row of the method table (tests/methods/table.rs).

use serde_json::json;
use tessera::model::Model;
use tessera_plugin_api::tch::Kind;
use tessera_tests::*;

use crate::gpt_models;
use gpt_models::*;

const UNTIED: &str =
    "n_layer = 2\nn_head = 2\nn_embd = 32\nn_positions = 64\ntie_embeddings = false";

fn abs_sum(model: &Model, name: &str) -> f64 {
    model
        .params
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .tensor
        .abs()
        .sum(Kind::Double)
        .double_value(&[])
}

#[test]
fn the_output_projections_start_at_zero_and_the_model_equals_the_reference() {
    let dir = TempDir::new("zero-init");
    let toml = with_model(gpt("zero", &[("zero_init_projections", "")]), UNTIED);
    let built = trainer(&dir, &toml);
    let model = built.model();
    let zeroed: Vec<String> = (0..2)
        .flat_map(|i| {
            [
                format!("transformer.h.{i}.attn.c_proj.weight"),
                format!("transformer.h.{i}.mlp.c_proj.weight"),
            ]
        })
        .collect();
    for e in model.params.entries() {
        let sum = abs_sum(model, &e.name);
        if zeroed.contains(&e.name) {
            assert_eq!(sum, 0.0, "{} is not zero", e.name);
        } else if !e.name.ends_with(".bias") {
            assert!(sum > 0.0, "{} was zeroed", e.name);
        }
    }
    assert!(
        abs_sum(model, "lm_head.weight") > 0.0,
        "lm_head is zeroed by default"
    );
    // The kinds are the plain GPT-2's: nothing was replaced.
    assert_eq!(node(model, "transformer.h.0.attn").0, "gpt2_attention");
    let spec = json!({"n_head": 2, "n_layer": 2, "tied": false});
    if let Some(l) = check_model(model, &spec, 2, 16, 1e-5) {
        println!("zero_init_projections vs PyTorch: logits {l:e}");
    }

    // On request, the untied head too; `attention = false` keeps the attention's.
    let dir = TempDir::new("zero-init-head");
    let toml = with_model(
        gpt(
            "zero",
            &[("zero_init_projections", "lm_head = true\nattention = false")],
        ),
        UNTIED,
    );
    let built = trainer(&dir, &toml);
    let model = built.model();
    assert_eq!(abs_sum(model, "lm_head.weight"), 0.0);
    assert_eq!(abs_sum(model, "transformer.h.1.mlp.c_proj.weight"), 0.0);
    assert!(abs_sum(model, "transformer.h.1.attn.c_proj.weight") > 0.0);
}

#[test]
fn projections_put_in_by_other_plugins_are_zeroed_in_either_order() {
    for plugins in [
        [("gated_linear_units", ""), ("zero_init_projections", "")],
        [("zero_init_projections", ""), ("gated_linear_units", "")],
    ] {
        let dir = TempDir::new("zero-init-glu");
        let built = trainer(&dir, &gpt("zero-glu", &plugins));
        let model = built.model();
        assert_eq!(node(model, "transformer.h.0.mlp").0, "glu_gpt2_mlp");
        for i in 0..2 {
            assert_eq!(
                abs_sum(model, &format!("transformer.h.{i}.mlp.wo.weight")),
                0.0
            );
            assert_eq!(
                abs_sum(model, &format!("transformer.h.{i}.attn.c_proj.weight")),
                0.0
            );
            assert!(abs_sum(model, &format!("transformer.h.{i}.mlp.gated_layer.weight")) > 0.0);
        }
    }
    let dir = TempDir::new("zero-init-surgery");
    let built = trainer(
        &dir,
        &gpt(
            "zero-rest",
            &[
                ("zero_init_projections", ""),
                ("relu_squared", ""),
                ("rotary", ""),
            ],
        ),
    );
    let model = built.model();
    assert_eq!(
        node(model, "transformer.h.1.mlp").0,
        "relu_squared_gpt2_mlp"
    );
    assert_eq!(node(model, "transformer.h.1.attn").0, "gpt2_attention_ext");
    for i in 0..2 {
        assert_eq!(
            abs_sum(model, &format!("transformer.h.{i}.mlp.c_proj.weight")),
            0.0
        );
        assert_eq!(
            abs_sum(model, &format!("transformer.h.{i}.attn.c_proj.weight")),
            0.0
        );
    }
}

#[test]
fn training_from_zero_projections_learns_and_moves_them() {
    let dir = TempDir::new("zero-binary");
    let (record, lines, stderr) = run(&dir, &gpt("zero", &[("zero_init_projections", "")]), &[]);
    assert!(
        stderr.contains("zero_init_projections: 4 output projections start at zero"),
        "{stderr}"
    );
    assert_eq!(
        method_metric(&lines, "zero_init_projections/num_zeroed"),
        [(0, 4.0)]
    );
    assert_trains(&record, &lines);
    let dir2 = TempDir::new("zero-plain");
    let (_, plain, _) = run(&dir2, &gpt("plain", &[]), &[]);
    assert_ne!(losses(&plain), losses(&lines));
    // The checkpoint rebuilds (zeroing at init, then the trained weights load): the
    // projections trained away from zero.
    let built = rebuilt(&dir, "zero");
    let model = built.model();
    assert_eq!(node(model, "transformer.h.0.mlp").0, "gpt2_mlp");
    assert!(abs_sum(model, "transformer.h.0.attn.c_proj.weight") > 0.0);
    assert!(abs_sum(model, "transformer.h.1.mlp.c_proj.weight") > 0.0);
}

#[test]
fn a_tied_head_is_refused_naming_it() {
    // Found at init, where the head is seen tied (the settings `create` refuses are in
    // tests/methods/table.rs).
    let dir = TempDir::new("zero-settings");
    gpt("bad", &[("zero_init_projections", "lm_head = true")]).write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["lm_head", "tied", "tie_embeddings = false"]);
}
