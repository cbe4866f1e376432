//! zero_init_projections over the stand-in GPT-2, with other plugins' MLPs.

use gpt_surgery::{gpt2, Sizes};
use tessera_plugin_api::kit::{StandIn, SurgeryModel};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::{default_settings_json, settings};
use tessera_plugin_api::{boxed_method, Plugin};
use zero_init_projections::{zero_init_projections, ZeroInitProjections, ZeroInitSettings};

fn sum(t: &Tensor) -> f64 {
    t.abs().sum(Kind::Double).double_value(&[])
}

#[test]
fn the_projections_are_zeroed_in_place_and_nothing_else() {
    let sizes = Sizes {
        tied: false,
        ..Sizes::default()
    };
    let mut model = gpt2(sizes, 1);
    let before: Vec<(String, f64)> = model
        .tensors()
        .iter()
        .map(|(n, t)| (n.clone(), sum(t)))
        .collect();
    let names = zero_init_projections(&mut model, &ZeroInitSettings::default()).unwrap();
    assert_eq!(
        names,
        [
            "transformer.h.0.attn.c_proj.weight",
            "transformer.h.0.mlp.c_proj.weight",
            "transformer.h.1.attn.c_proj.weight",
            "transformer.h.1.mlp.c_proj.weight"
        ]
    );
    for (name, s) in before {
        let now = sum(model.tensor(&name).unwrap());
        if names.contains(&name) {
            assert_eq!(now, 0.0, "{name}");
            // Still a trainable parameter.
            assert!(model.tensor(&name).unwrap().requires_grad());
        } else {
            assert_eq!(now, s, "{name} changed");
        }
    }
    let only = ZeroInitSettings {
        attention: false,
        mlp: false,
        lm_head: true,
    };
    let mut model = gpt2(sizes, 1);
    assert_eq!(
        zero_init_projections(&mut model, &only).unwrap(),
        ["lm_head.weight"]
    );
    assert_eq!(sum(model.tensor("lm_head.weight").unwrap()), 0.0);
}

#[test]
fn a_tied_head_is_refused_and_settings_are_checked() {
    let mut model = gpt2(Sizes::default(), 2);
    let s = ZeroInitSettings {
        lm_head: true,
        ..ZeroInitSettings::default()
    };
    let e = zero_init_projections(&mut model, &s)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tied") && e.contains("tie_embeddings = false"),
        "{e}"
    );
    // Refused before anything was zeroed.
    assert!(sum(model.tensor("transformer.h.0.attn.c_proj.weight").unwrap()) > 0.0);
    let d = ZeroInitProjections::create(&settings(&default_settings_json(
        ZeroInitProjections::DEFAULT_SETTINGS,
    )))
    .unwrap();
    assert_eq!(d.settings(), ZeroInitSettings::default());
    let e = boxed_method::<ZeroInitProjections>(&settings(r#"{"wte": true}"#))
        .err()
        .expect("an unknown key is refused")
        .to_string();
    assert!(e.contains("wte"), "{e}");
}

/// A stand-in for another plugin's MLP: its kind and tensors (the names are what the method
/// looks for; gated linear units' and relu_squared's own crates cannot be linked here, every
/// plugin crate exporting the same root symbol: the real plugins are combined in the
/// workspace's tests/methods/zero_init_projections.rs).
struct Other(&'static str);

impl tessera_plugin_api::Module for Other {
    fn kind(&self) -> &str {
        self.0
    }
    fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, tessera_plugin_api::Error> {
        Ok(input.shallow_clone())
    }
}

fn put(model: &mut StandIn, path: &str, kind: &'static str, names: &[(&'static str, [i64; 2])]) {
    let tensors: Vec<(&str, Tensor)> = names
        .iter()
        .map(|(n, s)| {
            (
                *n,
                Tensor::ones(*s, (Kind::Float, tessera_plugin_api::tch::Device::Cpu)),
            )
        })
        .collect();
    model.replace_module(path, Other(kind), tensors).unwrap();
}

#[test]
fn gated_and_squared_relu_mlps_have_their_projection_zeroed() {
    let mut model = gpt2(Sizes::default(), 3);
    for i in 0..2 {
        put(
            &mut model,
            &format!("transformer.h.{i}.mlp"),
            "glu_gpt2_mlp",
            &[
                ("gated_layer.weight", [64, 16]),
                ("non_gated_layer.weight", [64, 16]),
                ("wo.weight", [16, 64]),
            ],
        );
    }
    let names = zero_init_projections(&mut model, &ZeroInitSettings::default()).unwrap();
    assert!(
        names.contains(&"transformer.h.1.mlp.wo.weight".to_owned()),
        "{names:?}"
    );
    assert_eq!(
        sum(model.tensor("transformer.h.1.mlp.wo.weight").unwrap()),
        0.0
    );
    let gated = model.tensor("transformer.h.1.mlp.gated_layer.weight");
    assert!(sum(gated.unwrap()) > 0.0);

    let mut model = gpt2(Sizes::default(), 3);
    put(
        &mut model,
        "transformer.h.0.mlp",
        "relu_squared_gpt2_mlp",
        &[("c_fc.weight", [16, 64]), ("c_proj.weight", [64, 16])],
    );
    let names = zero_init_projections(&mut model, &ZeroInitSettings::default()).unwrap();
    assert_eq!(names.len(), 4);
    assert_eq!(
        sum(model.tensor("transformer.h.0.mlp.c_proj.weight").unwrap()),
        0.0
    );
    // A module without an output projection is an error naming it.
    let mut model = gpt2(Sizes::default(), 3);
    put(
        &mut model,
        "transformer.h.1.attn",
        "mystery_attention",
        &[("w", [2, 2])],
    );
    let e = zero_init_projections(&mut model, &ZeroInitSettings::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mystery_attention") && e.contains("transformer.h.1.attn"),
        "{e}"
    );
}
