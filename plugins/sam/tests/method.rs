//! The SAM method through `testing::TestHost`: settings, hooks, the two passes of a SAM step
//! (perturb, then restore), which parameters take part, interval counting and checkpointed state.

use std::collections::HashMap;

use sam::{sam_perturbation, Sam, PRIORITY};
use tessera_plugin_api::abi::MethodBox;
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::testing::golden::assert_close;
use tessera_plugin_api::testing::settings;
use tessera_plugin_api::testing::{RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, ErrorKind, Event, Hook, Plugin};

fn method(json: &str) -> MethodBox {
    boxed_method::<Sam>(&settings(json)).expect("valid settings")
}

/// A host with three trainable parameters and one frozen one.
fn host() -> TestHost {
    let mut host = TestHost::new(RandomSource::Scripted(Default::default()));
    let make = |values: &[f32], shape: &[i64], grad: bool| {
        Tensor::from_slice(values)
            .view(shape)
            .set_requires_grad(grad)
    };
    host.params = HashMap::from([
        (
            "a.weight".to_owned(),
            make(&[1.0, -2.0, 0.5, 3.0], &[2, 2], true),
        ),
        ("a.bias".to_owned(), make(&[0.25, -0.75], &[2], true)),
        ("b.weight".to_owned(), make(&[2.0, 1.5], &[1, 2], true)),
        ("frozen".to_owned(), make(&[4.0, 5.0], &[2], false)),
    ]);
    host
}

/// A loss whose gradient depends on the weights, so the second pass sees other gradients.
/// `b.weight` takes part only when `with_b` (otherwise it has no gradient).
fn backward(host: &mut TestHost, with_b: bool) {
    for p in host.params.values_mut() {
        if p.requires_grad() {
            p.zero_grad();
        }
    }
    let p = &host.params;
    let mut loss = (&p["a.weight"] * &p["a.weight"]).sum(None) * 0.5
        + (&p["a.bias"] * &p["frozen"]).sum(None)
        + p["a.weight"].sin().sum(None);
    if with_b {
        loss += (&p["b.weight"] * &p["b.weight"] * &p["b.weight"]).sum(None);
    }
    loss.backward();
}

fn snapshot(host: &TestHost) -> HashMap<String, Tensor> {
    host.params
        .iter()
        .map(|(k, v)| (k.clone(), v.detach().copy()))
        .collect()
}

fn grads(host: &TestHost, names: &[&str]) -> Vec<Tensor> {
    names
        .iter()
        .map(|n| host.params[*n].grad().copy())
        .collect()
}

/// Fires `after_train_batch` at pass `pass`; returns whether another pass was asked for.
fn fire(host: &mut TestHost, m: &mut MethodBox, pass: u32) -> bool {
    host.pass_index = pass;
    host.extra_pass_requested = false;
    host.fire(m, Event::AFTER_TRAIN_BATCH)
        .expect("after_train_batch");
    host.extra_pass_requested
}

fn assert_same(what: &str, a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) {
    for (name, t) in a {
        assert_close(&format!("{what}: {name}"), &b[name], t, 0.0, 1e-7);
    }
}

#[test]
fn hooks_after_train_batch_after_every_other_method() {
    assert_eq!(
        Sam::hooks(),
        vec![Hook {
            event: Event::AFTER_TRAIN_BATCH,
            priority: PRIORITY
        }]
    );
    // SAM runs after methods at the default priority 0 (gradient clipping).
    let clipping = Hook::at(Event::AFTER_TRAIN_BATCH);
    assert!(Sam::hooks()[0].priority < clipping.priority);
}

#[test]
fn bad_settings_are_config_errors_naming_the_setting() {
    for (json, name) in [
        (r#"{"interval": 0}"#, "interval"),
        (r#"{"interval": -1}"#, "interval"),
        (r#"{"interval": 1.5}"#, "interval"),
        (r#"{"rho": -0.1}"#, "rho"),
        (r#"{"rho": "big"}"#, "rho"),
        (r#"{"epsilon": -1e-12}"#, "epsilon"),
        (r#"{"rhoo": 0.1}"#, "rhoo"),
    ] {
        let err = match boxed_method::<Sam>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{json}: {err}");
        assert!(err.message().contains(name), "{json}: {err}");
    }
}

#[test]
fn a_sam_step_perturbs_then_restores_the_trainable_weights() {
    let mut host = host();
    let mut m = method(r#"{"rho": 0.3, "epsilon": 1e-12, "interval": 1, "log_grad_norm": true}"#);
    let w = snapshot(&host);
    backward(&mut host, true);
    let names = ["a.bias", "a.weight", "b.weight"];
    let e = sam_perturbation(&grads(&host, &names), 0.3, 1e-12).unwrap();

    assert!(fire(&mut host, &mut m, 0), "pass 0 asks for a second pass");
    for (n, e) in names.iter().zip(&e) {
        assert_close(
            &format!("w + e: {n}"),
            &host.params[*n],
            &(&w[*n] + e),
            1e-6,
            1e-7,
        );
        assert!(
            e.abs().max().double_value(&[]) > 1e-3,
            "{n}: no perturbation"
        );
    }
    assert_same(
        "frozen",
        &HashMap::from([("frozen".to_owned(), w["frozen"].copy())]),
        &snapshot(&host),
    );

    // The second pass: new gradients at w + e, then back to w; the gradients stay.
    backward(&mut host, true);
    let g_adv = grads(&host, &names);
    assert!(!fire(&mut host, &mut m, 1), "no third pass");
    assert_same("restored", &w, &snapshot(&host));
    for (n, g) in names.iter().zip(&g_adv) {
        assert_close(
            &format!("grad at w + e: {n}"),
            &host.params[*n].grad(),
            g,
            0.0,
            0.0,
        );
    }
    assert_eq!(host.metric("sam/pass"), vec![0.0, 1.0]);
    let norm = host.metric("sam/grad_norm");
    assert_eq!(norm.len(), 1);
    assert!(norm[0] > 0.0 && norm[0].is_finite(), "{norm:?}");
}

#[test]
fn parameters_without_a_gradient_are_left_out() {
    let mut host = host();
    let mut m = method(r#"{"log_grad_norm": true}"#);
    let w = snapshot(&host);
    backward(&mut host, false);
    let names = ["a.bias", "a.weight"];
    let e = sam_perturbation(&grads(&host, &names), 0.05, 1e-12).unwrap();
    assert!(fire(&mut host, &mut m, 0));
    let now = snapshot(&host);
    for (n, e) in names.iter().zip(&e) {
        assert_close(n, &now[*n], &(&w[*n] + e), 1e-6, 1e-7);
    }
    assert_close(
        "b.weight (no grad)",
        &now["b.weight"],
        &w["b.weight"],
        0.0,
        0.0,
    );
    assert_close("frozen", &now["frozen"], &w["frozen"], 0.0, 0.0);
    // The norm is over the two gradients only.
    let expected = Tensor::cat(
        &[
            grads(&host, &names)[0].flatten(0, -1),
            grads(&host, &names)[1].flatten(0, -1),
        ],
        0,
    )
    .norm()
    .double_value(&[]);
    let got = host.metric("sam/grad_norm")[0];
    assert!(
        (got - expected).abs() <= 1e-6 * expected,
        "{got} vs {expected}"
    );
    backward(&mut host, false);
    assert!(!fire(&mut host, &mut m, 1));
    assert_same("restored", &w, &snapshot(&host));
}

#[test]
fn no_gradient_at_all_is_a_plain_step() {
    let mut host = host();
    let mut m = method("{}");
    let w = snapshot(&host);
    assert!(!fire(&mut host, &mut m, 0));
    assert_same("untouched", &w, &snapshot(&host));
    assert!(host.metric("sam/grad_norm").is_empty());
}

#[test]
fn interval_counts_steps_and_ignores_foreign_extra_passes() {
    let mut host = host();
    let mut m = method(r#"{"interval": 3}"#);
    let mut sam_steps = Vec::new();
    for step in 0..7u64 {
        let w = snapshot(&host);
        backward(&mut host, true);
        let extra = fire(&mut host, &mut m, 0);
        if extra {
            sam_steps.push(step);
        } else {
            assert_same("plain step", &w, &snapshot(&host));
        }
        // Another method asks for a second pass on every step: it must neither restore
        // anything on plain steps nor count as a step.
        backward(&mut host, true);
        assert!(!fire(&mut host, &mut m, 1));
        assert_same("after pass 1", &w, &snapshot(&host));
    }
    assert_eq!(sam_steps, vec![2, 5]);
    assert_eq!(host.metric("sam/pass").len(), 14);
}

#[test]
fn a_missing_second_pass_is_undone_at_the_next_step() {
    let mut host = host();
    let mut m = method(r#"{"interval": 2}"#);
    backward(&mut host, true);
    assert!(!fire(&mut host, &mut m, 0));
    let w = snapshot(&host);
    backward(&mut host, true);
    assert!(fire(&mut host, &mut m, 0));
    // No pass 1: the next step (plain, step 2) starts by taking e(w) back off.
    backward(&mut host, true);
    assert!(!fire(&mut host, &mut m, 0));
    assert_same("restored", &w, &snapshot(&host));
}

#[test]
fn the_step_counter_is_checkpointed() {
    let json = r#"{"interval": 3}"#;
    let mut host = host();
    let mut m = method(json);
    for _ in 0..2 {
        backward(&mut host, true);
        assert!(!fire(&mut host, &mut m, 0));
    }
    let state = m.state().into_result().expect("state");
    let mut resumed = method(json);
    resumed.load_state(state).into_result().expect("load_state");
    backward(&mut host, true);
    assert!(
        fire(&mut host, &mut resumed, 0),
        "step 2 of interval 3 is a SAM step"
    );

    // A fresh method would not have run SAM at that step.
    let mut fresh = method(json);
    backward(&mut host, true);
    assert!(!fire(&mut host, &mut fresh, 0));
}

#[test]
fn other_events_do_nothing() {
    let mut host = host();
    let mut m = method("{}");
    let w = snapshot(&host);
    backward(&mut host, true);
    host.fire(&mut m, Event::BEFORE_TRAIN_BATCH).unwrap();
    assert!(!host.extra_pass_requested);
    assert!(host.metrics.is_empty());
    assert_same("untouched", &w, &snapshot(&host));
}
