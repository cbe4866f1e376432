//! LowPrecisionLayerNorm against Composer's own outputs (`tests/golden/low_precision_layernorm.*`):
//! the fp32 layer norm, Composer's CPU no-op under bf16 autocast (quirk 8), the bf16 branch
//! Composer runs under CUDA autocast (forced), and the whole Linear-LPLayerNorm-Linear model
//! under CPU autocast.

use low_precision_layernorm::{
    autocast_dtype, low_precision_layer_norm, LowPrecisionLayerNormMethod,
};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, Event};

const CASE: &str = "low_precision_layernorm";

fn ln(g: &Golden, x: &Tensor, dtype: Option<Kind>) -> Tensor {
    let shape = [*x.size().last().expect("a feature dimension")];
    low_precision_layer_norm(
        x,
        &shape,
        Some(g.tensor("param/1.weight")),
        Some(g.tensor("param/1.bias")),
        1e-5,
        dtype,
    )
    .expect("layer norm")
}

#[test]
fn without_autocast_it_is_the_fp32_layer_norm() {
    let g = Golden::load(CASE);
    let out = ln(&g, g.tensor("h"), None);
    for name in ["ln_fp32", "lp_no_autocast", "lp_cpu_autocast_bf16"] {
        assert_eq!(g.tensor(name).kind(), Kind::Float, "{name}");
        assert_close(name, &out, g.tensor(name), 1e-6, 1e-6);
    }
}

#[test]
fn the_low_precision_branch_matches_composers_bf16_bit_for_bit() {
    let g = Golden::load(CASE);
    let want = g.tensor("lp_forced_bf16");
    assert_eq!(want.kind(), Kind::BFloat16);
    let got = ln(&g, g.tensor("h"), autocast_dtype("amp_bf16"));
    assert_eq!(got.kind(), Kind::BFloat16);
    assert!(got.equal(want), "bf16 layer norm differs from Composer's");
}

/// Composer's model under CPU bf16 autocast: the linears run in bf16 (autocast), the
/// LPLayerNorm casts nothing (quirk 8), so `layer_norm` gets a bf16 activation with fp32
/// weight and bias.
#[test]
fn composers_model_under_cpu_autocast_is_reproduced() {
    let g = Golden::load(CASE);
    let bf = |name: &str| g.tensor(name).to_kind(Kind::BFloat16);
    let h = bf("x").linear(&bf("param/0.weight"), Some(&bf("param/0.bias")));
    let n = ln(&g, &h, None);
    assert_eq!(n.kind(), Kind::BFloat16);
    let out = n.linear(&bf("param/2.weight"), Some(&bf("param/2.bias")));
    let want = g.tensor("model_cpu_autocast_bf16");
    assert_eq!(want.kind(), Kind::BFloat16);
    assert!(out.equal(want), "model output differs from Composer's");
}

#[test]
fn with_fp32_the_method_does_nothing_and_says_so() {
    let mut host = TestHost::new(RandomSource::Seeded(0));
    let mut method = boxed_method::<LowPrecisionLayerNormMethod>(&settings("{}")).expect("method");
    host.fire(&mut method, Event::INIT).expect("init");
    assert_eq!(
        host.metrics,
        [("low_precision_layernorm/num_layers".to_owned(), 0.0)]
    );
    assert_eq!(autocast_dtype("fp32"), None);
}

#[test]
fn unknown_settings_are_refused() {
    let e = boxed_method::<LowPrecisionLayerNormMethod>(&settings(r#"{"precision": "amp_bf16"}"#))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("precision"), "{e}");
}
