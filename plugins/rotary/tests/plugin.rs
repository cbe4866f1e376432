//! rotary's settings and its surgery over the stand-in GPT-2 (`gpt_surgery::gpt2`, a
//! `kit::StandIn`).

use gpt_surgery::kinds::{ALIBI_ZERO_POSITIONS, EXT_ATTENTION, ROTARY_ZERO_POSITIONS};
use gpt_surgery::{gpt2, AttentionSpec, Rotary, Sizes};
use rotary::{apply_rotary_embeddings, RotaryMethod, RotarySettings};
use tessera_plugin_api::abi_stable::std_types::RString;
use tessera_plugin_api::tch::Kind;
use tessera_plugin_api::testing::{default_settings_json, settings, settings_for};
use tessera_plugin_api::{boxed_method, Plugin};

fn create(json: &str) -> Result<RotarySettings, String> {
    RotaryMethod::create(&settings_for::<RotaryMethod>(json))
        .map(|m| m.settings())
        .map_err(|e| e.to_string())
}

#[test]
fn settings_defaults_and_refusals() {
    let d = create(&default_settings_json(RotaryMethod::DEFAULT_SETTINGS)).unwrap();
    assert_eq!(d, RotarySettings::default());
    assert_eq!(
        (d.base, d.fraction, d.max_sequence_length),
        (10000.0, 1.0, None)
    );
    let s = create(r#"{"base": 500, "fraction": 0.25, "max_sequence_length": 2048}"#).unwrap();
    assert_eq!(
        (s.base, s.fraction, s.max_sequence_length),
        (500.0, 0.25, Some(2048))
    );
    for (json, want) in [
        (r#"{"base": 0}"#, "`base` must be a positive number"),
        (r#"{"base": -1.5}"#, "-1.5"),
        (r#"{"fraction": 0}"#, "`fraction` must be in (0, 1]"),
        (r#"{"fraction": 1.01}"#, "1.01"),
        (r#"{"max_sequence_length": 0}"#, "positive integer"),
        (r#"{"max_sequence_length": -3}"#, "max_sequence_length"),
    ] {
        let e = create(json).unwrap_err();
        assert!(e.contains(want), "{json}: {e}");
    }
    let e = boxed_method::<RotaryMethod>(&settings(r#"{"theta": 1}"#))
        .err()
        .expect("an unknown key is refused")
        .to_string();
    assert!(e.contains("theta"), "{e}");
}

#[test]
fn every_attention_rotates_and_the_positions_become_a_zero_buffer() {
    let sizes = Sizes {
        n_head: 4,
        n_embd: 48,
        n_positions: 20,
        ..Sizes::default()
    };
    let mut model = gpt2(sizes, 1);
    let settings = RotarySettings {
        base: 321.0,
        fraction: 0.5,
        max_sequence_length: Some(50),
    };
    let out = apply_rotary_embeddings(&mut model, &settings).unwrap();
    assert_eq!(
        out.attention,
        ["transformer.h.0.attn", "transformer.h.1.attn"]
    );
    assert_eq!(out.dims, Some((6, 12)));
    assert_eq!(out.positions, Some(50));
    for path in &out.attention {
        let info = model.info(path).unwrap();
        assert_eq!(info.kind.as_str(), EXT_ATTENTION);
        let spec = AttentionSpec::from_module(info).unwrap().unwrap();
        assert_eq!(
            spec.rotary,
            Some(Rotary {
                base: 321.0,
                dims: 6
            })
        );
        assert!(!spec.qk_norm);
    }
    assert_eq!(model.kind("transformer.wpe"), Some(ROTARY_ZERO_POSITIONS));
    let wpe = model.tensor("transformer.wpe.weight").unwrap();
    assert_eq!(wpe.size(), [50, 48]);
    assert!(!wpe.requires_grad(), "the zero table is trained");
    assert_eq!(wpe.abs().sum(Kind::Double).double_value(&[]), 0.0);
    let positions = model.replaced("transformer.wpe").unwrap();
    let ids = tessera_plugin_api::tch::Tensor::arange(
        50,
        (Kind::Int64, tessera_plugin_api::tch::Device::Cpu),
    )
    .unsqueeze(0);
    assert_eq!(positions.forward(&ids, false).unwrap().size(), [1, 50, 48]);
    let e = positions
        .forward(&ids.repeat([1, 2]), false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_sequence_length 50"), "{e}");
    // Its export is a plain zero embedding.
    let folded = positions.export().unwrap().expect("folds");
    assert_eq!(folded[0].0, "weight");
    assert_eq!(folded[0].1.size(), [50, 48]);

    // A second application changes nothing; the default table has the model's rows.
    let again = apply_rotary_embeddings(&mut model, &settings).unwrap();
    assert!(again.attention.is_empty() && again.positions.is_none());
    let mut plain = gpt2(sizes, 1);
    let out = apply_rotary_embeddings(&mut plain, &RotarySettings::default()).unwrap();
    assert_eq!((out.dims, out.positions), (Some((12, 12)), Some(20)));
}

#[test]
fn alibi_in_the_model_is_refused_and_a_too_small_fraction_names_the_setting() {
    let mut model = gpt2(Sizes::default(), 2);
    let wpe = model.info_mut("transformer.wpe").unwrap();
    wpe.kind = RString::from(ALIBI_ZERO_POSITIONS);
    let e = apply_rotary_embeddings(&mut model, &RotarySettings::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("rotary cannot be combined with alibi"), "{e}");
    // 0.1 of a head width of 8 is no pair.
    let mut model = gpt2(Sizes::default(), 2);
    let settings = RotarySettings {
        fraction: 0.1,
        ..RotarySettings::default()
    };
    let e = apply_rotary_embeddings(&mut model, &settings)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fraction") && e.contains("0 of the 8 features"),
        "{e}"
    );
}
