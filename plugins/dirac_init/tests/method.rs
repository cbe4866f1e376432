//! DiracInit through the plugin boundary on a `TestHost`: the selection by shape and name, the
//! identity filters written in place, the other filters kept, the settings' errors.

use dirac_init::{dirac_rows, DiracInit};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::{settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, Event, Plugin};

fn host() -> TestHost {
    let mut h = TestHost::new(RandomSource::Seeded(1));
    let f = (Kind::Float, Device::Cpu);
    for (name, shape) in [
        ("whiten.weight", vec![8i64, 1, 2, 2]),
        ("layers.1.conv1.weight", vec![16, 8, 3, 3]),
        ("layers.1.conv2.weight", vec![16, 16, 3, 3]),
        ("layers.2.conv1.weight", vec![4, 16, 3, 3]),
        ("layers.1.norm1.weight", vec![16]),
        ("head.weight", vec![10, 16]),
    ] {
        h.params.insert(
            name.to_owned(),
            Tensor::randn(shape, f).set_requires_grad(true),
        );
    }
    h
}

fn snapshot(h: &TestHost) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = h
        .params
        .iter()
        .map(|(n, t)| (n.clone(), t.copy()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The identity rows of `dirac_(w[:in])`, written out element by element.
fn check_identity(w: &Tensor, before: &Tensor) {
    let s = w.size();
    let (out, cin, kh, kw) = (s[0], s[1], s[2], s[3]);
    let rows = out.min(cin);
    for o in 0..out {
        for i in 0..cin {
            for y in 0..kh {
                for x in 0..kw {
                    let v = w.double_value(&[o, i, y, x]);
                    if o < rows {
                        let one = o == i && y == kh / 2 && x == kw / 2;
                        assert_eq!(v, if one { 1.0 } else { 0.0 }, "[{o}, {i}, {y}, {x}]");
                    } else {
                        assert_eq!(v, before.double_value(&[o, i, y, x]), "row {o} kept");
                    }
                }
            }
        }
    }
}

#[test]
fn every_3x3_conv_gets_identity_filters_and_nothing_else_changes() {
    let mut h = host();
    let before = snapshot(&h);
    let mut m = boxed_method::<DiracInit>(&settings("{}")).unwrap();
    h.fire(&mut m, Event::INIT).unwrap();
    for (name, old) in before {
        let now = &h.params[&name];
        if name.starts_with("layers.") && name.contains("conv") {
            check_identity(now, &old);
        } else {
            assert!(now.equal(&old), "{name} changed");
        }
        // Still a trainable leaf.
        assert!(now.requires_grad(), "{name}");
    }
    // out > in: the last 8 filters of layers.1.conv1 keep their init.
    let w = &h.params["layers.1.conv1.weight"];
    assert!(w.narrow(0, 8, 8).abs().sum(Kind::Float).double_value(&[]) > 0.0);
}

#[test]
fn params_select_exact_names_and_kernel_size_selects_by_shape() {
    let mut h = host();
    let before = snapshot(&h);
    let s = settings(r#"{"params": ["layers.1.conv2.weight"]}"#);
    let mut m = boxed_method::<DiracInit>(&s).unwrap();
    h.fire(&mut m, Event::INIT).unwrap();
    for (name, old) in &before {
        let changed = !h.params[name].equal(old);
        assert_eq!(changed, name == "layers.1.conv2.weight", "{name}");
    }
    let mut h = host();
    let mut m = boxed_method::<DiracInit>(&settings(r#"{"kernel_size": 2}"#)).unwrap();
    h.fire(&mut m, Event::INIT).unwrap();
    let w = &h.params["whiten.weight"];
    check_identity(w, &w.copy());
}

#[test]
fn bad_settings_and_models_are_errors_naming_the_setting() {
    for (json, fragment) in [
        (r#"{"kernel_size": 0}"#, "kernel_size"),
        (r#"{"params": []}"#, "params"),
        (r#"{"kernel_size": "3"}"#, "kernel_size"),
        (r#"{"kernels": 3}"#, "kernels"),
    ] {
        let err = match boxed_method::<DiracInit>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e,
        };
        assert!(
            err.message().contains(fragment),
            "{json}: {}",
            err.message()
        );
    }
    for (json, fragment) in [
        (
            r#"{"params": ["nope.weight"]}"#,
            "no parameter `nope.weight`",
        ),
        (r#"{"params": ["head.weight"]}"#, "not a convolution weight"),
        (r#"{"kernel_size": 5}"#, "no 5x5 convolution"),
    ] {
        let mut h = host();
        let mut m = boxed_method::<DiracInit>(&settings(json)).unwrap();
        let err = h.fire(&mut m, Event::INIT).unwrap_err();
        assert!(err.contains(fragment), "{json}: {err}");
    }
    assert_eq!(DiracInit::NAME, "dirac_init");
}

#[test]
fn the_function_refuses_a_weight_that_is_not_4d() {
    let t = Tensor::zeros([3, 3], (Kind::Float, Device::Cpu));
    assert!(dirac_rows(&t).is_err());
}
