//! BatchnormTricks through the plugin boundary on a `TestHost`: batch norms found by their
//! running statistics, scales set to 1 and frozen, the group's multiplier and unscaled decay.

use batchnorm_tricks::{unscaled_decay, BatchnormTricks};
use tessera_plugin_api::abi::ParamGroup;
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::{settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, Event, Plugin};

const F: (Kind, Device) = (Kind::Float, Device::Cpu);

fn host() -> TestHost {
    let mut h = TestHost::new(RandomSource::Seeded(5));
    for (name, shape, buffer) in [
        ("layers.1.conv1.weight", vec![4i64, 2, 3, 3], false),
        ("layers.1.norm1.weight", vec![4], false),
        ("layers.1.norm1.bias", vec![4], false),
        ("layers.1.norm1.running_mean", vec![4], true),
        ("layers.1.norm1.running_var", vec![4], true),
        ("layers.1.norm2.weight", vec![4], false),
        ("layers.1.norm2.bias", vec![4], false),
        ("layers.1.norm2.running_mean", vec![4], true),
        // A layer norm: no running statistics, not a batch norm.
        ("ln.weight", vec![4], false),
        ("ln.bias", vec![4], false),
        ("head.weight", vec![10, 4], false),
    ] {
        let t = Tensor::randn(shape, F);
        let t = if buffer { t } else { t.set_requires_grad(true) };
        h.params.insert(name.into(), t);
        if buffer {
            h.buffers.insert(name.into());
        }
    }
    let group = |name: &str, m: f64, wd: f64, params: &[&str]| ParamGroup {
        name: name.into(),
        lr_multiplier: m,
        weight_decay: wd,
        params: params.iter().map(|p| (*p).into()).collect(),
    };
    h.groups = vec![
        group(
            "norm",
            1.0,
            5e-4,
            &[
                "layers.1.norm1.bias",
                "layers.1.norm2.bias",
                "ln.weight",
                "ln.bias",
            ],
        ),
        group(
            "default",
            1.0,
            5e-4,
            &["layers.1.conv1.weight", "head.weight"],
        ),
    ];
    h
}

#[test]
fn scales_are_one_and_frozen_and_nothing_else_changes() {
    let mut h = host();
    let before: Vec<(String, Tensor)> = h
        .params
        .iter()
        .map(|(n, t)| (n.clone(), t.copy()))
        .collect();
    let mut m = boxed_method::<BatchnormTricks>(&settings("{}")).unwrap();
    h.fire(&mut m, Event::INIT).unwrap();
    for (name, old) in before {
        let t = &h.params[&name];
        if name.starts_with("layers.1.norm") && name.ends_with(".weight") {
            assert!(t.equal(&Tensor::ones([4], F)), "{name}");
            assert!(!t.requires_grad(), "{name} frozen");
        } else {
            assert!(t.equal(&old), "{name} changed");
            if !name.contains("running") {
                assert!(t.requires_grad(), "{name} still trains");
            }
        }
    }
    // Without bias_lr_multiplier the groups stay as configured.
    h.fire(&mut m, Event::FIT_START).unwrap();
    assert_eq!(h.groups[0].lr_multiplier, 1.0);
    assert_eq!(h.groups[0].weight_decay, 5e-4);
}

#[test]
fn the_bias_group_gets_the_multiplier_and_an_unscaled_decay() {
    let mut h = host();
    let s = settings(r#"{"bias_lr_multiplier": 64.0, "freeze_scale": false}"#);
    let mut m = boxed_method::<BatchnormTricks>(&s).unwrap();
    h.fire(&mut m, Event::INIT).unwrap();
    assert!(h.params["layers.1.norm1.weight"].requires_grad());
    h.fire(&mut m, Event::FIT_START).unwrap();
    assert_eq!(h.groups[0].lr_multiplier, 64.0);
    assert_eq!(h.groups[0].weight_decay, 5e-4 / 64.0);
    // lr · multiplier · decay: the decay step of the default group.
    assert!((64.0 * h.groups[0].weight_decay - 5e-4).abs() < 1e-18);
    assert_eq!(
        h.groups[1].lr_multiplier, 1.0,
        "the default group is untouched"
    );
    assert_eq!(unscaled_decay(0.1, 0.0), 0.1);

    let mut h = host();
    let s = settings(r#"{"bias_lr_multiplier": 8, "bias_weight_decay": 0.0, "group": "norm"}"#);
    let mut m = boxed_method::<BatchnormTricks>(&s).unwrap();
    h.fire(&mut m, Event::INIT).unwrap();
    h.fire(&mut m, Event::FIT_START).unwrap();
    assert_eq!(
        (h.groups[0].lr_multiplier, h.groups[0].weight_decay),
        (8.0, 0.0)
    );
}

#[test]
fn errors_name_the_setting_or_say_what_is_missing() {
    let mut h = host();
    let s = settings(r#"{"bias_lr_multiplier": 64.0, "group": "bn"}"#);
    let mut m = boxed_method::<BatchnormTricks>(&s).unwrap();
    h.fire(&mut m, Event::INIT).unwrap();
    let err = h.fire(&mut m, Event::FIT_START).unwrap_err();
    assert!(
        err.contains("no parameter group `bn`") && err.contains("kinds = [\"norm\"]"),
        "{err}"
    );

    let mut h = TestHost::new(RandomSource::Seeded(1));
    h.params
        .insert("fc.weight".into(), Tensor::zeros([3, 4], F));
    let mut m = boxed_method::<BatchnormTricks>(&settings("{}")).unwrap();
    let err = h.fire(&mut m, Event::INIT).unwrap_err();
    assert!(err.contains("no batch norm"), "{err}");

    for (json, fragment) in [
        (r#"{"bias_lr_multiplier": -1.0}"#, "bias_lr_multiplier"),
        (r#"{"bias_weight_decay": 0.1}"#, "bias_weight_decay"),
        (r#"{"freeze_scale": 1}"#, "freeze_scale"),
        (r#"{"momentum": 0.6}"#, "momentum"),
    ] {
        let err = match boxed_method::<BatchnormTricks>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e,
        };
        assert!(
            err.message().contains(fragment),
            "{json}: {}",
            err.message()
        );
    }
    assert_eq!(BatchnormTricks::NAME, "batchnorm_tricks");
}
