//! The method driven through its events by the test host: settings, the schedule of
//! synchronisations and the end, which tensors (frozen parameters, buffers, integer buffers),
//! the state round trip and bad states.

use lookahead::{airbench_decay, Lookahead, LookaheadConfig, Variant, SYNC_PRIORITY};
use tessera_plugin_api::abi::{MethodBox, MethodState};
use tessera_plugin_api::tch::{self, Kind, Tensor};
use tessera_plugin_api::testing::{
    default_settings_json, settings, settings_for, RandomSource, TestHost,
};
use tessera_plugin_api::{boxed_method, ErrorKind, Event, Hook, Plugin, State};

fn config(json: &str) -> LookaheadConfig {
    LookaheadConfig::from_settings(&settings_for::<Lookahead>(json))
        .unwrap_or_else(|e| panic!("{json}: {e}"))
}

fn method(json: &str) -> MethodBox {
    boxed_method::<Lookahead>(&settings(json)).unwrap_or_else(|e| panic!("{json}: {e}"))
}

/// A host with a trainable weight and bias, a frozen parameter, a float buffer and an integer
/// buffer.
fn host() -> TestHost {
    let mut host = TestHost::new(RandomSource::Seeded(0));
    let p = |v: &[f32]| Tensor::from_slice(v).set_requires_grad(true);
    host.params
        .insert("fc.weight".into(), p(&[1.0, -2.0, 3.0, 0.5]).view([2, 2]));
    host.params.insert("fc.bias".into(), p(&[0.25, -0.75]));
    host.params
        .insert("frozen.weight".into(), Tensor::from_slice(&[4.0f32, 4.0]));
    host.params
        .insert("bn.running_mean".into(), Tensor::from_slice(&[0.0f32, 1.0]));
    host.buffers.insert("bn.running_mean".into());
    host.params.insert(
        "bn.num_batches_tracked".into(),
        Tensor::from_slice(&[3i64]).view([]),
    );
    host.buffers.insert("bn.num_batches_tracked".into());
    host
}

/// Adds `delta` to every floating tensor and 1 to the integer one, as a step (and a batch-norm
/// forward) would.
fn train_step(host: &TestHost, delta: f64) {
    let _g = tch::no_grad_guard();
    for t in host.params.values() {
        let _ = if t.is_floating_point() {
            t.shallow_clone().f_add_scalar_(delta).unwrap()
        } else {
            t.shallow_clone().f_add_scalar_(1i64).unwrap()
        };
    }
}

fn value(host: &TestHost, name: &str) -> Vec<f64> {
    let t = host.params[name].to_kind(Kind::Double).flatten(0, -1);
    Vec::<f64>::try_from(&t).unwrap()
}

fn fire(host: &mut TestHost, m: &mut MethodBox, event: Event) {
    host.fire(m, event)
        .unwrap_or_else(|e| panic!("{}: {e}", event.name()));
}

/// One training step as the host makes it: `batch_start`, the step, `batch_end`.
fn step(host: &mut TestHost, m: &mut MethodBox, delta: f64) {
    fire(host, m, Event::BATCH_START);
    train_step(host, delta);
    fire(host, m, Event::BATCH_END);
}

fn state(m: &MethodBox) -> State {
    State::from(m.state().into_result().expect("state"))
}

fn slow_names(state: &State) -> Vec<String> {
    let mut v: Vec<String> = state.tensors.iter().map(|(n, _)| n.clone()).collect();
    v.sort();
    v
}

#[test]
fn defaults_are_the_papers_and_airbenchs() {
    let d = config(&default_settings_json(Lookahead::DEFAULT_SETTINGS));
    assert_eq!(d, LookaheadConfig::default());
    assert_eq!(config("{}"), d);
    assert_eq!(d.variant, Variant::Lookahead);
    assert_eq!(
        (d.k, d.alpha, d.buffers, d.final_copy),
        (5, 0.5, false, true)
    );
    assert_eq!(d.total_steps, None);
    let e = config(r#"{"variant": "ema"}"#);
    assert_eq!(e.variant, Variant::Ema);
    assert_eq!((e.k, e.decay_base, e.decay_power), (5, 0.95, 3.0));
    assert!(e.buffers, "airbench averages the whole state_dict");
    assert_eq!(config(r#"{"variant": "airbench"}"#), e);
    let e = config(r#"{"variant": "ema", "buffers": false, "k": 4, "total_steps": 100}"#);
    assert_eq!((e.k, e.buffers, e.total_steps), (4, false, Some(100)));
}

#[test]
fn bad_settings_are_config_errors_naming_the_setting() {
    for (json, fragment) in [
        (r#"{"variant": "slow"}"#, "setting `variant`"),
        (r#"{"variant": 1}"#, "setting `variant` must be a string"),
        (r#"{"k": 0}"#, "setting `k` must be a whole number"),
        (r#"{"k": 2.5}"#, "setting `k` must be a whole number"),
        (r#"{"alpha": 0}"#, "setting `alpha` must be in (0, 1]"),
        (r#"{"alpha": 1.5}"#, "setting `alpha` must be in (0, 1]"),
        (r#"{"alpha": "half"}"#, "setting `alpha` must be a number"),
        (
            r#"{"variant": "ema", "alpha": 0.5}"#,
            "setting `alpha` applies only to variant = \"lookahead\"",
        ),
        (
            r#"{"decay_base": 0.9}"#,
            "setting `decay_base` applies only to variant = \"ema\"",
        ),
        (
            r#"{"decay_power": 2}"#,
            "setting `decay_power` applies only to variant = \"ema\"",
        ),
        (
            r#"{"variant": "ema", "decay_base": 1.5}"#,
            "setting `decay_base` must be in (0, 1]",
        ),
        (
            r#"{"variant": "ema", "decay_power": -1}"#,
            "setting `decay_power` must be a finite number ≥ 0",
        ),
        (r#"{"total_steps": 0}"#, "setting `total_steps`"),
        (
            r#"{"buffers": 1}"#,
            "setting `buffers` must be true or false",
        ),
        (r#"{"final_copy": "yes"}"#, "setting `final_copy`"),
        (r#"{"alhpa": 0.5}"#, "unknown setting `alhpa`"),
    ] {
        let err = match boxed_method::<Lookahead>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{json}: {err}");
        assert!(err.message().contains(fragment), "{json}: {err}");
    }
}

#[test]
fn hooks_and_name() {
    assert_eq!(Lookahead::NAME, "lookahead");
    let hooks = Lookahead::hooks();
    assert!(hooks.contains(&Hook::at(Event::BATCH_START)));
    assert!(hooks.contains(&Hook {
        event: Event::BATCH_END,
        priority: SYNC_PRIORITY
    }));
    assert!(hooks.contains(&Hook::at(Event::FIT_END)));
    const { assert!(SYNC_PRIORITY > 0, "before EMA and SWA at batch_end") };
}

#[test]
fn the_schedule_syncs_every_k_and_copies_at_t() {
    // k = 2, T = 5: syncs at 2 and 4, the slow weights go in at 5, nothing after.
    let mut h = host();
    let mut m = method(r#"{"k": 2, "alpha": 0.5, "total_steps": 5}"#);
    // w: 1 → +1 → 2 (step 1) → 3 (step 2; sync: φ = 1 + 0.5·2 = 2, θ = 2) → 3 → 4 (sync:
    // φ = 2 + 0.5·2 = 3, θ = 3) → 4 (step 5: θ ← φ = 3).
    let mut seen = Vec::new();
    for _ in 0..5 {
        step(&mut h, &mut m, 1.0);
        seen.push(value(&h, "fc.bias")[0] - 0.25);
    }
    assert_eq!(seen, [1.0, 1.0, 2.0, 2.0, 2.0]);
    assert_eq!(h.metric("lookahead/syncs"), [1.0, 2.0]);
    assert_eq!(h.metric("lookahead/final_copy"), [1.0]);
    assert!(h.metric("lookahead/decay").is_empty());
    // Ended: no more changes, no slow weights kept.
    step(&mut h, &mut m, 1.0);
    assert_eq!(value(&h, "fc.bias")[0] - 0.25, 3.0);
    let s = state(&m);
    assert!(s.tensors.is_empty(), "{:?}", slow_names(&s));
    fire(&mut h, &mut m, Event::FIT_END);
    assert_eq!(value(&h, "fc.bias")[0] - 0.25, 3.0);
}

#[test]
fn frozen_parameters_and_integer_buffers_are_left_alone() {
    for json in [r#"{"k": 1}"#, r#"{"k": 1, "buffers": true}"#] {
        let mut h = host();
        let mut m = method(json);
        for _ in 0..3 {
            step(&mut h, &mut m, 1.0);
        }
        // θ moves by 1 per step, φ by α = 0.5 of the way: the model moves by 0.5 per step.
        assert_eq!(value(&h, "fc.weight")[0], 1.0 + 1.5);
        // The frozen parameter and the integer buffer move as the "optimizer" moved them.
        assert_eq!(value(&h, "frozen.weight"), [7.0, 7.0], "{json}");
        assert_eq!(value(&h, "bn.num_batches_tracked"), [6.0], "{json}");
        let buffers = json.contains("buffers");
        let want = if buffers { 1.5 } else { 3.0 };
        assert_eq!(value(&h, "bn.running_mean")[0], want, "{json}");
        let mut names = vec!["slow/fc.bias", "slow/fc.weight"];
        if buffers {
            names.insert(0, "slow/bn.running_mean");
        }
        assert_eq!(slow_names(&state(&m)), names, "{json}");
    }
}

fn set_trainable(h: &TestHost, name: &str, on: bool) {
    let _ = h.params[name].set_requires_grad(on);
}

#[test]
fn a_parameter_frozen_later_is_dropped_and_restarts_when_unfrozen() {
    let mut h = host();
    let mut m = method(r#"{"k": 2}"#);
    step(&mut h, &mut m, 1.0);
    step(&mut h, &mut m, 1.0); // sync: bias 0.25 + 1
    assert_eq!(value(&h, "fc.bias")[0], 1.25);
    // Frozen (as layer_freezing does at an epoch end): the optimizer no longer moves it and
    // the next sync leaves it as it is, then forgets its slow weights.
    set_trainable(&h, "fc.bias", false);
    fire(&mut h, &mut m, Event::BATCH_START);
    {
        let _g = tch::no_grad_guard();
        let _ = h.params["fc.weight"].shallow_clone().f_add_scalar_(1.0);
    }
    fire(&mut h, &mut m, Event::BATCH_END);
    step(&mut h, &mut m, 0.0); // sync at 4
    assert_eq!(value(&h, "fc.bias")[0], 1.25);
    assert_eq!(slow_names(&state(&m)), ["slow/fc.weight"]);
    // Unfrozen: its slow weights start again at its value (the sync does not move it back).
    set_trainable(&h, "fc.bias", true);
    step(&mut h, &mut m, 1.0); // 5: bias 2.25
    step(&mut h, &mut m, 1.0); // 6: sync, new slow weights = 3.25
    assert_eq!(value(&h, "fc.bias")[0], 3.25);
    assert_eq!(slow_names(&state(&m)), ["slow/fc.bias", "slow/fc.weight"]);
    step(&mut h, &mut m, 1.0); // 7
    step(&mut h, &mut m, 1.0); // 8: sync: 3.25 + 0.5 · 2
    assert_eq!(value(&h, "fc.bias")[0], 4.25);
}

#[test]
fn the_ema_variant_follows_airbenchs_decay() {
    let mut h = host();
    let mut m = method(r#"{"variant": "ema", "k": 2, "total_steps": 6}"#);
    // fc.bias[0] in float64 next to the method's float32 (tests/reference.rs checks the bits).
    let mut phi = 0.25f64;
    let mut theta = 0.25f64;
    for t in 1..=6u64 {
        step(&mut h, &mut m, 1.0);
        theta += 1.0;
        if t % 2 == 0 {
            let d = airbench_decay(0.95, 2, 3.0, t, 6);
            phi += (1.0 - d) * (theta - phi);
            theta = phi;
        }
        let got = value(&h, "fc.bias")[0];
        assert!((got - theta).abs() < 1e-5, "step {t}: {got} vs {theta}");
    }
    let decays = h.metric("lookahead/decay");
    assert_eq!(decays.len(), 3);
    for (i, t) in [2u64, 4, 6].iter().enumerate() {
        assert_eq!(decays[i], airbench_decay(0.95, 2, 3.0, *t, 6));
    }
    // At T the decay is 0.95^k: the last update is also the final copy.
    assert_eq!(decays[2], f64::from(0.95f64.powi(2) as f32));
    assert_eq!(h.metric("lookahead/final_copy"), [1.0]);
    // Buffers too (airbench's state_dict), but not the integer one.
    assert!(slow_names(&state(&m)).is_empty());
    assert_ne!(value(&h, "bn.running_mean")[0], 6.0);
    assert_eq!(value(&h, "bn.num_batches_tracked"), [9.0]);
}

#[test]
fn the_ema_variant_needs_the_runs_length() {
    // The test host reports no run length (max_batches 0), as a run in tokens does.
    let mut h = host();
    let mut m = method(r#"{"variant": "ema"}"#);
    fire(&mut h, &mut m, Event::BATCH_START);
    let err = h.fire(&mut m, Event::BATCH_END).unwrap_err();
    assert!(err.contains("set `total_steps`"), "{err}");
}

#[test]
fn the_end_of_training_before_t_copies_the_slow_weights() {
    // No T known: the final copy comes at fit_end.
    let mut h = host();
    let mut m = method(r#"{"k": 2}"#);
    for _ in 0..3 {
        step(&mut h, &mut m, 1.0);
    }
    // Step 2 synced bias to 0.25 + 1; step 3 moved it to 2.25.
    assert_eq!(value(&h, "fc.bias")[0], 2.25);
    fire(&mut h, &mut m, Event::FIT_END);
    assert_eq!(value(&h, "fc.bias")[0], 1.25);
    assert_eq!(h.metric("lookahead/final_copy"), [1.0]);
    // final_copy = false leaves the model's weights.
    let mut h = host();
    let mut m = method(r#"{"k": 2, "final_copy": false}"#);
    for _ in 0..3 {
        step(&mut h, &mut m, 1.0);
    }
    fire(&mut h, &mut m, Event::FIT_END);
    assert_eq!(value(&h, "fc.bias")[0], 2.25);
    assert!(h.metric("lookahead/final_copy").is_empty());
    // final_copy = false with T: the method just stops at T.
    let mut h = host();
    let mut m = method(r#"{"k": 2, "final_copy": false, "total_steps": 3}"#);
    for _ in 0..5 {
        step(&mut h, &mut m, 1.0);
    }
    assert_eq!(value(&h, "fc.bias")[0], 4.25);
    assert_eq!(h.metric("lookahead/syncs"), [1.0]);
}

#[test]
fn the_slow_weights_are_the_first_steps_weights() {
    // Taken at the first batch_start, before the first optimizer step.
    let mut h = host();
    let mut m = method(r#"{"k": 3}"#);
    fire(&mut h, &mut m, Event::BATCH_START);
    let s = state(&m);
    let bias = s
        .tensors
        .iter()
        .find(|(n, _)| n == "slow/fc.bias")
        .map(|(_, t)| t.copy())
        .expect("slow bias");
    assert!(bias.equal(&h.params["fc.bias"].detach()));
    // A copy, not the model's tensor.
    train_step(&h, 1.0);
    assert!(!bias.equal(&h.params["fc.bias"].detach()));
    // Later batch_starts do not take them again.
    fire(&mut h, &mut m, Event::BATCH_END);
    step(&mut h, &mut m, 1.0);
    step(&mut h, &mut m, 1.0); // sync at 3: 0.25 + 0.5 · 3
    assert_eq!(value(&h, "fc.bias")[0], 1.75);
}

#[test]
fn state_round_trips_mid_run() {
    let json = r#"{"k": 3, "alpha": 0.25, "total_steps": 8, "buffers": true}"#;
    let mut straight_host = host();
    let mut straight = method(json);
    let mut h = host();
    let mut m = method(json);
    for t in 1..=8 {
        step(&mut straight_host, &mut straight, 0.5 * t as f64);
        step(&mut h, &mut m, 0.5 * t as f64);
        if t == 4 {
            let saved = state(&m);
            assert_eq!(saved.format_version, lookahead::STATE_FORMAT_VERSION);
            let counters: serde_json::Value = serde_json::from_slice(&saved.bytes).unwrap();
            assert_eq!(
                counters,
                serde_json::json!({"started": true, "steps": 4, "syncs": 1, "done": false})
            );
            m = method(json);
            m.load_state(MethodState::from(saved))
                .into_result()
                .unwrap();
        }
    }
    for (name, t) in &straight_host.params {
        assert!(t.equal(&h.params[name]), "{name}");
    }
    assert_eq!(straight_host.metric("lookahead/syncs"), [1.0, 2.0]);
    assert_eq!(h.metric("lookahead/syncs"), [1.0, 2.0]);
}

#[test]
fn bad_state_is_refused() {
    let load = |s: State| {
        let mut m = method("{}");
        m.load_state(MethodState::from(s))
            .into_result()
            .map_err(|e| e.message.into_string())
    };
    let counters = |started: bool, done: bool| {
        serde_json::to_vec(&serde_json::json!({
            "started": started, "steps": 2, "syncs": 0, "done": done
        }))
        .unwrap()
    };
    let t = || Tensor::from_slice(&[1.0f32]);
    for (s, fragment) in [
        (
            State {
                format_version: 2,
                bytes: counters(true, false),
                tensors: vec![],
            },
            "format 2 is unknown",
        ),
        (
            State {
                format_version: 1,
                bytes: b"{".to_vec(),
                tensors: vec![],
            },
            "bad counters",
        ),
        (
            State {
                format_version: 1,
                bytes: counters(true, false),
                tensors: vec![("ema/w".into(), t())],
            },
            "unexpected tensor `ema/w`",
        ),
        (
            State {
                format_version: 1,
                bytes: counters(false, false),
                tensors: vec![("slow/w".into(), t())],
            },
            "had not started",
        ),
        (
            State {
                format_version: 1,
                bytes: counters(true, true),
                tensors: vec![("slow/w".into(), t())],
            },
            "had ended",
        ),
    ] {
        let err = load(s).unwrap_err();
        assert!(err.contains(fragment), "{err}");
    }
}

#[test]
fn slow_weights_that_do_not_fit_the_model_stop_the_run_naming_the_tensor() {
    let mut h = host();
    let mut m = method(r#"{"k": 1}"#);
    let state = State {
        format_version: 1,
        bytes: serde_json::to_vec(&serde_json::json!({
            "started": true, "steps": 2, "syncs": 2, "done": false
        }))
        .unwrap(),
        tensors: vec![("slow/fc.bias".into(), Tensor::from_slice(&[1.0f32; 3]))],
    };
    m.load_state(MethodState::from(state))
        .into_result()
        .unwrap();
    fire(&mut h, &mut m, Event::BATCH_START);
    let err = h.fire(&mut m, Event::BATCH_END).unwrap_err();
    assert!(err.contains("`fc.bias` has shape [2]"), "{err}");
}
