//! logit_softcap's cap and its surgery over the stand-in GPT-2 (the wrapper's forward through
//! the host is in the workspace's tests/methods/logit_softcap.rs).

use gpt_surgery::kinds::{SOFTCAP_LM_HEAD, TIED_LM_HEAD};
use gpt_surgery::{gpt2, Sizes};
use logit_softcap::{apply_logit_softcap, softcap, LogitSoftcap, Outcome};
use tessera_plugin_api::abi_stable::std_types::RString;
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::{default_settings_json, settings};
use tessera_plugin_api::{boxed_method, Plugin};

#[test]
fn the_cap_bounds_the_logits_and_keeps_small_ones() {
    let x = Tensor::from_slice(&[-1000.0f64, -30.0, -0.01, 0.0, 0.01, 30.0, 1000.0]);
    let y = softcap(&x, 30.0).unwrap();
    let v: Vec<f64> = Vec::try_from(&y).unwrap();
    for (a, b) in v.iter().zip([
        -30.0,
        -30.0 * 1f64.tanh(),
        -0.01,
        0.0,
        0.01,
        30.0 * 1f64.tanh(),
        30.0,
    ]) {
        assert!((a - b).abs() < 1e-9, "{a} vs {b}");
    }
    assert!(y.abs().max().double_value(&[]) <= 30.0);
    // Order kept (monotone), so the arg-max prediction is the uncapped one's.
    assert!(v.windows(2).all(|w| w[0] <= w[1]));
    // bfloat16 logits are capped in float32.
    let b = Tensor::from_slice(&[5.0f32, -40.0]).to_kind(Kind::BFloat16);
    assert_eq!(softcap(&b, 15.0).unwrap().kind(), Kind::Float);
}

#[test]
fn settings_defaults_and_refusals() {
    let m = LogitSoftcap::create(&settings(&default_settings_json(
        LogitSoftcap::DEFAULT_SETTINGS,
    )))
    .unwrap();
    assert_eq!(m.cap(), 30.0);
    for (json, want) in [
        (r#"{"cap": 0}"#, "`cap` must be a positive number"),
        (r#"{"cap": -2}"#, "-2"),
        (r#"{"cap": "x"}"#, "cap"),
    ] {
        let e = LogitSoftcap::create(&settings(json))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{json}: {e}");
    }
    let e = boxed_method::<LogitSoftcap>(&settings(r#"{"softcap": 1}"#))
        .err()
        .expect("an unknown key is refused")
        .to_string();
    assert!(e.contains("softcap"), "{e}");
}

#[test]
fn the_head_is_wrapped_once_tied_or_untied() {
    for tied in [true, false] {
        let sizes = Sizes {
            tied,
            ..Sizes::default()
        };
        let mut model = gpt2(sizes, 1);
        assert_eq!(
            apply_logit_softcap(&mut model, 12.0).unwrap(),
            Outcome::Wrapped { tied }
        );
        let info = model.info("lm_head").unwrap();
        assert_eq!(info.kind.as_str(), SOFTCAP_LM_HEAD);
        assert_eq!(info.attr("cap"), Some(12.0));
        assert_eq!(info.attr("tied"), Some(f64::from(u8::from(tied))));
        // The head keeps its attributes (the wrapper is transparent) and tensors.
        assert_eq!(info.attr("out_features"), Some(40.0));
        assert_eq!(model.tensor("lm_head.weight").is_some(), !tied);
        assert_eq!(
            apply_logit_softcap(&mut model, 12.0).unwrap(),
            Outcome::AlreadyCapped
        );
    }
}

#[test]
fn a_model_without_a_gpt2_head_is_left_alone_and_a_strange_head_refused() {
    let mut model = gpt2(Sizes::default(), 2);
    model.info_mut("").unwrap().kind = RString::from("sequential");
    assert_eq!(
        apply_logit_softcap(&mut model, 30.0).unwrap(),
        Outcome::NoHead
    );
    let mut model = gpt2(Sizes::default(), 2);
    let head = model.info_mut("lm_head").unwrap();
    assert_eq!(head.kind.as_str(), TIED_LM_HEAD);
    head.kind = RString::from("factorized_linear");
    let e = apply_logit_softcap(&mut model, 30.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("factorized_linear"), "{e}");
    let _ = Device::Cpu;
}
