//! GatedLinearUnits against Composer's golden case (`tests/golden/gated_linear_units.*`).
//!
//! For every settings case of `results.surgery` (the default and `bias_relu`): with the new
//! layer-0 weights Composer drew (`<case>/param/bert.encoder.layer.0.output.*`),
//! [`bert_glu_block`] must turn `<case>/layer0_glu_input` into `<case>/layer0_glu_output`, and
//! the GPT-2 variant [`gpt2_glu_mlp`] must be the same block without its residual LayerNorm.
//! Then the surgery over a stand-in GPT-2 tree: names, shapes, parameter count (Composer's
//! `3·d·d_ff + d` plus what the settings add), fresh trainable weights from the seeded stream,
//! idempotence, the module's output and export.

use std::collections::BTreeMap;

use gated_linear_units::{
    apply_gated_linear_units, bert_glu_block, gpt2_glu_mlp, Activation, GatedLinearUnits,
    GluModule, GluSettings, GluWeights, GLU_MLP, GPT2_MLP,
};
use serde_json::Value;
use tessera_plugin_api::kit::{StandIn, SurgeryModel};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings, settings_for};
use tessera_plugin_api::{boxed_method, Module, Plugin};

const CASE: &str = "gated_linear_units";
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-5;

fn check(what: &str, got: &Tensor, want: &Tensor) {
    let err = (got.to_kind(Kind::Double) - want.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[]);
    eprintln!("{what}: max abs error {err:e}");
    assert_close(what, got, want, RTOL, ATOL);
}

/// Hugging Face's activation as the golden JSON names it (`act_fn`: a class or `ACT2FN` key).
fn activation(name: &str) -> Activation {
    match name {
        "GELUActivation" => Activation::Gelu,
        "NewGELUActivation" => Activation::GeluNew,
        other => Activation::parse(other).unwrap_or_else(|| panic!("activation `{other}`")),
    }
}

#[test]
fn layer0_glu_blocks_match_composer() {
    let g = Golden::load(CASE);
    let cases = g.json["results"]["surgery"]
        .as_object()
        .expect("results.surgery");
    assert!(cases.len() >= 2, "cases: {:?}", cases.keys());
    for (case, r) in cases {
        let prefix = format!("{case}/param/bert.encoder.layer.0.output.");
        let p = |n: &str| {
            g.tensors
                .get(&format!("{prefix}{n}"))
                .map(Tensor::shallow_clone)
        };
        let need = |n: &str| p(n).unwrap_or_else(|| panic!("{case}: no `{prefix}{n}`"));
        let w = GluWeights {
            gated_weight: need("gated_layer.weight"),
            gated_bias: p("gated_layer.bias"),
            non_gated_weight: need("non_gated_layer.weight"),
            non_gated_bias: p("non_gated_layer.bias"),
            wo_weight: need("wo.weight"),
            wo_bias: need("wo.bias"),
        };
        let kwargs = &r["kwargs"];
        let flag = |k: &str| kwargs.get(k).and_then(Value::as_bool).unwrap_or(false);
        assert_eq!(w.gated_bias.is_some(), flag("gated_layer_bias"), "{case}");
        assert_eq!(
            w.non_gated_bias.is_some(),
            flag("non_gated_layer_bias"),
            "{case}"
        );
        let act = activation(r["act_fn"].as_str().expect("act_fn"));
        let eps = r["layernorm_eps"].as_f64().expect("layernorm_eps");
        let dropout = r["dropout_p"].as_f64().expect("dropout_p");
        let (ln_w, ln_b) = (need("layernorm.weight"), need("layernorm.bias"));
        let input = g.tensor(&format!("{case}/layer0_glu_input"));
        let want = g.tensor(&format!("{case}/layer0_glu_output"));
        let got = bert_glu_block(input, &w, act, (&ln_w, &ln_b, eps), dropout, false)
            .expect("bert_glu_block");
        check(&format!("{case}/layer0_glu_output"), &got, want);

        // The GPT-2 variant is the same gated feed-forward, without the post-LN residual.
        let mlp = gpt2_glu_mlp(input, &w, act, 0.0, false).expect("gpt2_glu_mlp");
        let d = input.size()[2];
        let post_ln = (mlp + input).layer_norm([d], Some(&ln_w), Some(&ln_b), eps, false);
        check(&format!("{case}: LN(gpt2_glu_mlp(x) + x)"), &post_ln, want);

        // Composer's parameter count for this setting (the LayerNorm's 2d included).
        let d_ff = w.gated_weight.size()[0];
        let count = 3 * d * d_ff
            + d
            + 2 * d
            + d_ff
                * (i64::from(flag("gated_layer_bias")) + i64::from(flag("non_gated_layer_bias")));
        assert_eq!(
            count,
            r["ffn_params_after"].as_i64().expect("ffn_params_after"),
            "{case}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The surgery over a stand-in GPT-2.

/// `layers` GPT-2 MLPs (`transformer.h.{i}.mlp`, `gpt2_mlp`) of width `d` and inner width
/// `d_ff` with random trainable tensors, in a stand-in model drawing from SplitMix64 seeded
/// with 7.
fn fake_gpt2(layers: usize, d: i64, d_ff: i64) -> StandIn {
    let mut model = StandIn::new(7);
    let opts = (Kind::Float, Device::Cpu);
    for i in 0..layers {
        let tensors = [
            ("c_fc.weight", vec![d, d_ff]),
            ("c_fc.bias", vec![d_ff]),
            ("c_proj.weight", vec![d_ff, d]),
            ("c_proj.bias", vec![d]),
        ]
        .into_iter()
        .map(|(n, shape)| (n, Tensor::randn(shape, opts).set_requires_grad(true)))
        .collect();
        model.add_module(
            &format!("transformer.h.{i}.mlp"),
            GPT2_MLP,
            &[
                ("n_embd", d as f64),
                ("n_inner", d_ff as f64),
                ("resid_pdrop", 0.1),
            ],
            tensors,
        );
    }
    model
}

#[test]
fn surgery_replaces_every_gpt2_mlp_with_fresh_gated_weights() {
    let (d, d_ff) = (16, 64);
    for (gated_bias, non_gated_bias) in [(false, false), (true, true)] {
        let mut fake = fake_gpt2(2, d, d_ff);
        let s = GluSettings {
            act_fn: None,
            gated_layer_bias: gated_bias,
            non_gated_layer_bias: non_gated_bias,
        };
        let replaced = apply_gated_linear_units(&mut fake, &s).expect("surgery");
        assert_eq!(replaced, ["transformer.h.0.mlp", "transformer.h.1.mlp"]);
        let mut names: Vec<&str> = fake.tensors().keys().map(String::as_str).collect();
        names.retain(|n| n.starts_with("transformer.h.0.mlp."));
        let mut want = vec![
            "gated_layer.weight",
            "non_gated_layer.weight",
            "wo.bias",
            "wo.weight",
        ];
        if gated_bias {
            want.push("gated_layer.bias");
        }
        if non_gated_bias {
            want.push("non_gated_layer.bias");
        }
        let mut want: Vec<String> = want
            .iter()
            .map(|n| format!("transformer.h.0.mlp.{n}"))
            .collect();
        want.sort();
        assert_eq!(names, want);
        let count: i64 = fake
            .tensors()
            .iter()
            .filter(|(n, _)| n.starts_with("transformer.h.0.mlp."))
            .map(|(_, t)| {
                assert!(t.requires_grad());
                t.numel() as i64
            })
            .sum();
        let biases = d_ff * (i64::from(gated_bias) + i64::from(non_gated_bias));
        assert_eq!(count, 3 * d * d_ff + d + biases);
        // Fresh weights within PyTorch's default bound, different per layer.
        let bound = 1.0 / (d as f64).sqrt();
        let g0 = &fake.tensors()["transformer.h.0.mlp.gated_layer.weight"];
        let g1 = &fake.tensors()["transformer.h.1.mlp.gated_layer.weight"];
        assert!(g0.abs().max().double_value(&[]) <= bound);
        assert!(!g0.equal(g1));
        let Some(GluModule::Gpt2(m)) = fake.replaced_as::<GluModule>("transformer.h.0.mlp") else {
            panic!("a gpt2_mlp becomes a gated MLP");
        };
        assert_eq!(
            m.activation(),
            Activation::GeluNew,
            "the model's own activation"
        );
        assert!(m.export().expect("export").is_none(), "kept at export");
        let attrs: BTreeMap<String, f64> = m.attrs().into_iter().collect();
        assert_eq!(attrs["n_inner"], d_ff as f64);
        assert_eq!(attrs["gated_layer_bias"], f64::from(u8::from(gated_bias)));
        assert_eq!(attrs["act_fn"], Activation::GeluNew.code() as f64);
        assert_eq!(attrs["resid_pdrop"], 0.1);
        // Evaluation output = the functional form over the registered tensors.
        let x = Tensor::randn([2, 5, d], (Kind::Float, Device::Cpu));
        let p = |n: &str| {
            fake.tensor(&format!("transformer.h.0.mlp.{n}"))
                .map(Tensor::shallow_clone)
        };
        let w = GluWeights {
            gated_weight: p("gated_layer.weight").expect("gated"),
            gated_bias: p("gated_layer.bias"),
            non_gated_weight: p("non_gated_layer.weight").expect("non-gated"),
            non_gated_bias: p("non_gated_layer.bias"),
            wo_weight: p("wo.weight").expect("wo"),
            wo_bias: p("wo.bias").expect("wo bias"),
        };
        let want = gpt2_glu_mlp(&x, &w, Activation::GeluNew, 0.0, false).expect("functional");
        assert!(m.forward(&x, false).expect("module").equal(&want));
        // Training applies resid dropout.
        assert!(!m.forward(&x, true).expect("train").equal(&want));

        // Idempotence.
        let nodes = fake.modules().expect("modules");
        assert!(apply_gated_linear_units(&mut fake, &s)
            .expect("again")
            .is_empty());
        let after = fake.modules().expect("modules");
        assert_eq!(after, nodes);
        assert!(after.iter().all(|n| n.kind.as_str() == GLU_MLP));
    }
}

#[test]
fn the_same_seed_draws_the_same_weights() {
    let draw = || {
        let mut fake = fake_gpt2(1, 8, 32);
        apply_gated_linear_units(&mut fake, &GluSettings::default()).expect("surgery");
        fake.tensors()["transformer.h.0.mlp.wo.weight"].copy()
    };
    assert!(draw().equal(&draw()));
}

#[test]
fn settings_defaults_and_errors() {
    let m = GatedLinearUnits::create(&settings(&default_settings_json(
        GatedLinearUnits::DEFAULT_SETTINGS,
    )))
    .expect("defaults");
    assert_eq!(m.settings(), GluSettings::default());
    let m = GatedLinearUnits::create(&settings_for::<GatedLinearUnits>(
        r#"{"act_fn": "relu", "gated_layer_bias": true}"#,
    ))
    .expect("relu");
    assert_eq!(m.settings().act_fn, Some(Activation::Relu));
    assert!(m.settings().gated_layer_bias);
    for (json, key) in [
        (r#"{"act_fn": "mish"}"#, "act_fn"),
        (r#"{"act_fn": 3}"#, "act_fn"),
        (r#"{"gated_layer_bias": "no"}"#, "gated_layer_bias"),
        (r#"{"non_gated_layer_bias": 0}"#, "non_gated_layer_bias"),
    ] {
        let e = GatedLinearUnits::create(&settings_for::<GatedLinearUnits>(json))
            .expect_err(json)
            .to_string();
        assert!(e.contains(key), "{json}: {e}");
    }
    let e = boxed_method::<GatedLinearUnits>(&settings(r#"{"activation": "relu"}"#))
        .err()
        .expect("unknown key")
        .to_string();
    assert!(e.contains("activation"), "{e}");
    for a in Activation::ALL {
        assert_eq!(Activation::parse(a.name()), Some(a));
        assert_eq!(Activation::ALL[a.code()], a);
    }
}
