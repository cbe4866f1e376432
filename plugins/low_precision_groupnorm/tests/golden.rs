//! LowPrecisionGroupNorm against Composer's own outputs (`tests/golden/low_precision_groupnorm.*`):
//! the fp32 group norm, Composer's CPU no-op under bf16 autocast (quirk 16), the bf16 branch
//! Composer runs under CUDA autocast (forced, with and without affine), and the whole model in
//! fp32 and under CPU autocast.

use low_precision_groupnorm::{
    autocast_dtype, low_precision_group_norm, LowPrecisionGroupNormMethod,
};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, Event};

const CASE: &str = "low_precision_groupnorm";

fn gn(g: &Golden, x: &Tensor, dtype: Option<Kind>) -> Tensor {
    low_precision_group_norm(
        x,
        4,
        Some(g.tensor("param/1.weight")),
        Some(g.tensor("param/1.bias")),
        1e-5,
        dtype,
    )
    .expect("group norm")
}

#[test]
fn without_autocast_it_is_the_fp32_group_norm() {
    let g = Golden::load(CASE);
    let out = gn(&g, g.tensor("h"), None);
    for name in ["gn_fp32", "lp_no_autocast", "lp_cpu_autocast_bf16"] {
        assert_eq!(g.tensor(name).kind(), Kind::Float, "{name}");
        assert_close(name, &out, g.tensor(name), 1e-6, 1e-6);
    }
}

#[test]
fn the_low_precision_branch_matches_composers_bf16_bit_for_bit() {
    let g = Golden::load(CASE);
    let got = gn(&g, g.tensor("h"), autocast_dtype("amp_bf16"));
    assert_eq!(got.kind(), Kind::BFloat16);
    assert!(got.equal(g.tensor("lp_forced_bf16")), "affine");
    let h4 = g.tensor("h").narrow(1, 0, 4);
    let got = low_precision_group_norm(&h4, 2, None, None, 1e-5, Some(Kind::BFloat16))
        .expect("group norm");
    assert!(
        got.equal(g.tensor("lp_forced_bf16_noaffine")),
        "affine=False"
    );
}

/// `Conv2d(3,8,3,p1) - GroupNorm(4,8) - ReLU - Conv2d(8,4,1) - GroupNorm(2,4,affine=False)`,
/// the convs in `kind` (bf16 under autocast) and the norms given what arrives.
fn model(g: &Golden, kind: Kind) -> Tensor {
    let t = |name: &str| g.tensor(name).to_kind(kind);
    let h = t("x").conv2d(
        &t("param/0.weight"),
        Some(&t("param/0.bias")),
        [1],
        [1],
        [1],
        1,
    );
    let h = gn(g, &h, None).relu();
    let h = h.to_kind(kind).conv2d(
        &t("param/3.weight"),
        Some(&t("param/3.bias")),
        [1],
        [0],
        [1],
        1,
    );
    low_precision_group_norm(&h, 2, None, None, 1e-5, None).expect("group norm")
}

#[test]
fn composers_model_is_reproduced_in_fp32_and_under_cpu_autocast() {
    let g = Golden::load(CASE);
    assert_close(
        "model_fp32",
        &model(&g, Kind::Float),
        g.tensor("model_fp32"),
        1e-5,
        1e-6,
    );
    let got = model(&g, Kind::BFloat16);
    assert_eq!(got.kind(), Kind::BFloat16);
    // Quirk 16: with LPGroupNorm and with the plain GroupNorm, the same bf16 result.
    assert!(g
        .tensor("model_cpu_autocast_bf16")
        .equal(g.tensor("plain_model_cpu_autocast_bf16")));
    assert_close(
        "model_cpu_autocast_bf16",
        &got,
        g.tensor("model_cpu_autocast_bf16"),
        0.0,
        0.0,
    );
}

#[test]
fn with_fp32_the_method_does_nothing_and_says_so() {
    let mut host = TestHost::new(RandomSource::Seeded(0));
    let mut method = boxed_method::<LowPrecisionGroupNormMethod>(&settings("{}")).expect("method");
    host.fire(&mut method, Event::INIT).expect("init");
    assert_eq!(
        host.metrics,
        [("low_precision_groupnorm/num_layers".to_owned(), 0.0)]
    );
}

#[test]
fn unknown_settings_are_refused() {
    let e = boxed_method::<LowPrecisionGroupNormMethod>(&settings(r#"{"groups": 4}"#))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("groups"), "{e}");
}
