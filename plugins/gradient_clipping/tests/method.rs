//! Properties of each clipping mode on random gradients, the method through
//! `testing::TestHost` (which parameters it clips, in place) and its settings.

use std::collections::HashMap;

use gradient_clipping::{
    agc_coefficient, apply_gradient_clipping, total_norm, unitwise_norm, ClippingType,
    GradientClipping, PRIORITY,
};
use tessera_plugin_api::abi::MethodBox;
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::{default_settings_json, settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, ErrorKind, Event, Hook, Plugin};

const F32: (Kind, Device) = (Kind::Float, Device::Cpu);

/// Parameters of several shapes (0-D to 4-D) with random gradients of scale `grad_scale`.
fn random_params(seed: i64, grad_scale: f64) -> Vec<Tensor> {
    tessera_plugin_api::tch::manual_seed(seed);
    let shapes: [&[i64]; 5] = [&[], &[7], &[5, 3], &[2, 3, 4], &[4, 3, 3, 3]];
    let params: Vec<Tensor> = shapes
        .iter()
        .map(|s| Tensor::randn(*s, F32).set_requires_grad(true))
        .collect();
    let mut objective = Tensor::zeros([], F32);
    for p in &params {
        objective += (p * (Tensor::randn(p.size(), F32) * grad_scale)).sum(Kind::Float);
    }
    objective.backward();
    params
}

fn grads(params: &[Tensor]) -> Vec<Tensor> {
    params.iter().map(|p| p.grad().copy()).collect()
}

fn norm_of(grads: &[Tensor]) -> f64 {
    total_norm(grads).unwrap().unwrap().double_value(&[])
}

#[test]
fn norm_caps_the_global_norm_and_keeps_the_direction() {
    let params = random_params(1, 3.0);
    let before = grads(&params);
    let total = norm_of(&before);
    assert!(total > 1.0);
    let reported = apply_gradient_clipping(&params, ClippingType::Norm, 1.0)
        .unwrap()
        .unwrap()
        .double_value(&[]);
    assert!((reported - total).abs() <= 1e-6 * total);
    let after = grads(&params);
    let clipped = norm_of(&after);
    assert!((clipped - 1.0).abs() < 1e-5, "{clipped}");
    for (b, a) in before.iter().zip(&after) {
        let expected = b * (1.0 / (total + 1e-6));
        assert!(a.allclose(&expected, 1e-5, 1e-7, false));
    }
}

#[test]
fn norm_below_the_threshold_leaves_gradients_bit_for_bit() {
    let params = random_params(2, 1e-3);
    let before = grads(&params);
    apply_gradient_clipping(&params, ClippingType::Norm, 10.0).unwrap();
    for (b, a) in before.iter().zip(grads(&params)) {
        assert!(b.equal(&a));
    }
}

#[test]
fn value_clamps_every_element() {
    let params = random_params(3, 1.0);
    let before = grads(&params);
    apply_gradient_clipping(&params, ClippingType::Value, 0.3).unwrap();
    for (b, a) in before.iter().zip(grads(&params)) {
        assert!(a.abs().max().double_value(&[]) <= f64::from(0.3f32));
        assert!(a.equal(&b.clamp(-0.3, 0.3)));
    }
}

#[test]
fn adaptive_bounds_each_units_ratio_and_spares_small_units() {
    let threshold = 0.05;
    let params = random_params(4, 1.0);
    let before = grads(&params);
    apply_gradient_clipping(&params, ClippingType::Adaptive, threshold).unwrap();
    for ((p, b), a) in params.iter().zip(&before).zip(grads(&params)) {
        let w = unitwise_norm(&p.detach()).unwrap();
        let ratio = unitwise_norm(&a).unwrap() / &w;
        assert!(ratio.max().double_value(&[]) <= threshold * (1.0 + 1e-5));
        // Units under the threshold are untouched; the others scaled, not redirected.
        let coefficient = agc_coefficient(&p.detach(), b, threshold).unwrap();
        assert!(a.allclose(&(b * &coefficient), 1e-6, 1e-8, false));
    }
    // A threshold no unit reaches changes nothing.
    let params = random_params(4, 1e-6);
    let before = grads(&params);
    apply_gradient_clipping(&params, ClippingType::Adaptive, 1.0).unwrap();
    for (b, a) in before.iter().zip(grads(&params)) {
        assert!(b.equal(&a));
    }
}

#[test]
fn adaptive_units_are_rows_and_output_channels() {
    // Two rows, the second with a gradient 100x its weight: only that row is scaled.
    let w = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0])
        .view([2, 2])
        .set_requires_grad(true);
    let g = Tensor::from_slice(&[0.001f32, 0.0, 0.0, 100.0]).view([2, 2]);
    (&w * &g).sum(Kind::Float).backward();
    apply_gradient_clipping(&[w.shallow_clone()], ClippingType::Adaptive, 0.1).unwrap();
    let got = w.grad();
    assert!(got.get(0).equal(&g.get(0)));
    assert!((got.double_value(&[1, 1]) - 0.1).abs() < 1e-6);
}

#[test]
fn parameters_without_gradients_are_skipped_and_none_gives_no_norm() {
    let p = Tensor::ones([3], F32).set_requires_grad(true);
    for kind in [
        ClippingType::Norm,
        ClippingType::Value,
        ClippingType::Adaptive,
    ] {
        let norm = apply_gradient_clipping(&[p.shallow_clone()], kind, 1.0).unwrap();
        assert!(norm.is_none());
        assert!(!p.grad().defined());
    }
}

fn method(json: &str) -> MethodBox {
    boxed_method::<GradientClipping>(&settings(json)).expect("valid settings")
}

#[test]
fn the_method_clips_trainable_gradients_in_place_and_skips_frozen_ones() {
    let mut host = TestHost::new(RandomSource::Scripted(Default::default()));
    let a = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
    let frozen = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
    ((&a * 10.0).sum(Kind::Float) + (&frozen * 10.0).sum(Kind::Float)).backward();
    // Frozen after its gradient was computed: a stale gradient, as a frozen layer keeps.
    let frozen = frozen.set_requires_grad(false);
    host.params = HashMap::from([
        ("a".to_owned(), a.shallow_clone()),
        ("frozen".to_owned(), frozen.shallow_clone()),
    ]);
    let mut m = method(r#"{"clipping_type": "value", "clipping_threshold": 0.5}"#);
    for event in [Event::BEFORE_TRAIN_BATCH, Event::AFTER_BACKWARD] {
        host.fire(&mut m, event).unwrap();
        assert_eq!(a.grad().double_value(&[0]), 10.0, "only after_train_batch");
    }
    host.fire(&mut m, Event::AFTER_TRAIN_BATCH).unwrap();
    assert!(a.grad().equal(&Tensor::from_slice(&[0.5f32, 0.5])));
    assert!(frozen.grad().equal(&Tensor::from_slice(&[10.0f32, 10.0])));
}

#[test]
fn hooks_run_before_sam_at_after_train_batch() {
    assert_eq!(
        GradientClipping::hooks(),
        vec![Hook {
            event: Event::AFTER_TRAIN_BATCH,
            priority: PRIORITY
        }]
    );
}

// Above SAM's priority (−1000) at the same event: SAM sees the clipped gradient.
const _: () = assert!(PRIORITY > -1000);

#[test]
fn settings_are_required_and_checked_naming_the_key() {
    let refused = |json: &str, key: &str| {
        let e = boxed_method::<GradientClipping>(&settings(json))
            .err()
            .unwrap_or_else(|| panic!("{json} accepted"));
        assert_eq!(e.kind(), ErrorKind::CONFIG, "{json}");
        assert!(e.message().contains(key), "{json}: {}", e.message());
    };
    refused(r#"{"clipping_threshold": 1.0}"#, "clipping_type");
    refused(r#"{"clipping_type": "norm"}"#, "clipping_threshold");
    refused(
        r#"{"clipping_type": "max", "clipping_threshold": 1.0}"#,
        "clipping_type",
    );
    refused(
        r#"{"clipping_type": 2, "clipping_threshold": 1.0}"#,
        "clipping_type",
    );
    for bad in ["0.0", "-1.0", "\"big\""] {
        refused(
            &format!(r#"{{"clipping_type": "norm", "clipping_threshold": {bad}}}"#),
            "clipping_threshold",
        );
    }
    refused(
        r#"{"clipping_type": "norm", "clipping_threshold": 1.0, "max_norm": 2}"#,
        "max_norm",
    );
    // The documented defaults are comments only: both keys must be given.
    refused(
        &default_settings_json(GradientClipping::DEFAULT_SETTINGS),
        "clipping_type",
    );
    for (name, kind) in [
        ("norm", ClippingType::Norm),
        ("value", ClippingType::Value),
        ("adaptive", ClippingType::Adaptive),
    ] {
        let m = GradientClipping::create(&settings(&format!(
            r#"{{"clipping_type": "{name}", "clipping_threshold": 2}}"#
        )))
        .unwrap();
        assert_eq!(m.clipping_type, kind);
        assert_eq!(m.clipping_threshold, 2.0);
        assert_eq!(kind.to_string(), name);
    }
}
