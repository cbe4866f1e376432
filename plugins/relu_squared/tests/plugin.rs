//! relu_squared's block and its surgery over the stand-in GPT-2.

use gpt_surgery::kinds::{GLU_MLP, RELU_SQUARED_MLP};
use gpt_surgery::{conv1d, gpt2, Sizes};
use relu_squared::{apply_relu_squared, relu_squared, ReluSquared};
use tessera_plugin_api::abi_stable::std_types::RString;
use tessera_plugin_api::boxed_method;
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::testing::settings;

#[test]
fn squared_relu_values() {
    let x = Tensor::from_slice(&[-2.0f32, -0.5, 0.0, 0.5, 3.0]);
    let y = relu_squared(&x).unwrap();
    let want = Tensor::from_slice(&[0.0f32, 0.0, 0.0, 0.25, 9.0]);
    assert!(y.equal(&want));
}

#[test]
fn every_mlp_is_replaced_over_its_tensors_and_computes_relu_squared() {
    let mut model = gpt2(Sizes::default(), 1);
    let before = model
        .tensor("transformer.h.0.mlp.c_fc.weight")
        .unwrap()
        .data_ptr();
    let replaced = apply_relu_squared(&mut model).unwrap();
    assert_eq!(replaced, ["transformer.h.0.mlp", "transformer.h.1.mlp"]);
    assert_eq!(model.kind("transformer.h.0.mlp"), Some(RELU_SQUARED_MLP));
    assert_eq!(
        model
            .tensor("transformer.h.0.mlp.c_fc.weight")
            .unwrap()
            .data_ptr(),
        before
    );
    let info = model.info("transformer.h.0.mlp").unwrap();
    let attr = |k: &str| info.attr(k).unwrap();
    assert_eq!(
        (attr("n_embd"), attr("n_inner"), attr("resid_pdrop")),
        (16.0, 64.0, 0.0)
    );
    tch::manual_seed(2);
    let x = Tensor::randn([2, 5, 16], (Kind::Float, Device::Cpu));
    let got = model
        .replaced("transformer.h.0.mlp")
        .unwrap()
        .forward(&x, false)
        .unwrap();
    let t = |n: &str| model.tensor(&format!("transformer.h.0.mlp.{n}")).unwrap();
    let h = conv1d(&x, t("c_fc.weight"), t("c_fc.bias")).unwrap();
    let want = conv1d(&(h.relu() * h.relu()), t("c_proj.weight"), t("c_proj.bias")).unwrap();
    assert!((got - want).abs().max().double_value(&[]) < 1e-6);
    // A second application changes nothing; a wrong width is an error.
    assert!(apply_relu_squared(&mut model).unwrap().is_empty());
    let wrong = Tensor::randn([2, 5, 8], (Kind::Float, Device::Cpu));
    assert!(model
        .replaced("transformer.h.0.mlp")
        .unwrap()
        .forward(&wrong, false)
        .is_err());
}

#[test]
fn gated_mlps_and_settings_are_refused() {
    let mut model = gpt2(Sizes::default(), 2);
    let mlp = model.info_mut("transformer.h.1.mlp").unwrap();
    mlp.kind = RString::from(GLU_MLP);
    let e = apply_relu_squared(&mut model).unwrap_err().to_string();
    assert!(
        e.contains("relu_squared cannot be combined with gated_linear_units")
            && e.contains("transformer.h.1.mlp"),
        "{e}"
    );
    // Nothing was half-done.
    assert_eq!(model.kind("transformer.h.0.mlp"), Some("gpt2_mlp"));
    let e = boxed_method::<ReluSquared>(&settings(r#"{"power": 3}"#))
        .err()
        .expect("an unknown key is refused")
        .to_string();
    assert!(e.contains("power"), "{e}");
}
