//! The EMA method driven through its events by the test host: settings, time strings, the
//! update schedule, the swap protocol for evaluation and checkpoints, and the state round trip.

use ema::{Ema, EmaConfig, Time};
use tessera_plugin_api::abi::{MethodBox, MethodState};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::testing::{default_settings_json, settings, settings_for};
use tessera_plugin_api::testing::{RandomSource, TestHost};
use tessera_plugin_api::TimeUnit;
use tessera_plugin_api::{boxed_method, ErrorKind, Event, Hook, Plugin, State, TimeInfo};

fn config(json: &str) -> EmaConfig {
    EmaConfig::from_settings(&settings_for::<Ema>(json)).unwrap_or_else(|e| panic!("{json}: {e}"))
}

fn method(json: &str) -> MethodBox {
    boxed_method::<Ema>(&settings(json)).unwrap_or_else(|e| panic!("{json}: {e}"))
}

/// A host with a trainable weight, a bias and a float buffer.
fn host() -> TestHost {
    let mut host = TestHost::new(RandomSource::Seeded(0));
    host.params.insert(
        "fc.weight".into(),
        Tensor::from_slice(&[1.0f32, -2.0, 3.0, 0.5])
            .view([2, 2])
            .set_requires_grad(true),
    );
    host.params.insert(
        "fc.bias".into(),
        Tensor::from_slice(&[0.25f32, -0.75]).set_requires_grad(true),
    );
    host.params
        .insert("bn.running_mean".into(), Tensor::from_slice(&[0.0f32, 1.0]));
    host.buffers.insert("bn.running_mean".into());
    host
}

/// Adds `delta` to every model tensor in place, as an optimizer step would.
fn train_step(host: &mut TestHost, delta: f64) {
    let _g = tch::no_grad_guard();
    for t in host.params.values() {
        let _ = t.shallow_clone().f_add_scalar_(delta).unwrap();
    }
}

fn snapshot(host: &TestHost) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = host
        .params
        .iter()
        .map(|(n, t)| (n.clone(), t.detach().copy()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn assert_model(host: &TestHost, want: &[(String, Tensor)], what: &str) {
    for (name, w) in want {
        assert!(
            host.params[name].equal(w),
            "{what}: {name}\nmodel {}\nwant {w}",
            host.params[name]
        );
    }
}

fn state(m: &MethodBox) -> State {
    State::from(m.state().into_result().expect("state"))
}

fn ema_of(state: &State) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = state
        .tensors
        .iter()
        .filter_map(|(n, t)| n.strip_prefix("ema/").map(|n| (n.to_owned(), t.copy())))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// `s·a + (1 − s)·b` for every tensor, as Composer computes it.
fn mix(a: &[(String, Tensor)], b: &[(String, Tensor)], s: f64) -> Vec<(String, Tensor)> {
    a.iter()
        .zip(b)
        .map(|((n, x), (_, y))| (n.clone(), x * s + y * (1.0 - s)))
        .collect()
}

#[test]
fn time_settings_take_the_hosts_grammar() {
    // Whatever `Time::parse` (the host's grammar, tested in plugin-api) accepts; the setting
    // decides which units make sense.
    let c = config(r#"{"half_life": "1_000ba", "ema_start": "2e3sp"}"#);
    assert_eq!(c.smoothing, 2f64.powf(-1.0 / 1000.0));
    assert_eq!(c.ema_start, Time::new(2000, TimeUnit::Sample));
    assert_eq!(
        config(r#"{"ema_start": "10tok"}"#).ema_start,
        Time::new(10, TimeUnit::Token)
    );
    assert_eq!(
        config(r#"{"ema_start": ".25dur"}"#).ema_start,
        Time::dur(0.25)
    );
    assert_eq!(
        config(r#"{"ema_start": "3EP"}"#).ema_start,
        Time::new(3, TimeUnit::Epoch)
    );
    for (text, needle) in [
        ("", "empty time string"),
        ("100", "does not end in a known unit"),
        ("ba", "number before the unit is missing"),
        ("-1ba", "cannot be negative"),
        ("1.5ba", "batches must be a whole number"),
        ("1.5dur", "a duration must be in [0, 1]"),
        (
            "2iter",
            "must be in epochs (ep), batches (ba), samples (sp), tokens (tok)",
        ),
        (
            "30sec",
            "must be in epochs (ep), batches (ba), samples (sp), tokens (tok)",
        ),
    ] {
        let json = serde_json::json!({ "ema_start": text }).to_string();
        let err = EmaConfig::from_settings(&settings_for::<Ema>(&json)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{text}");
        assert!(err.message().contains("setting `ema_start`"), "{err}");
        assert!(err.message().contains(needle), "{text}: {err}");
    }
}

#[test]
fn defaults_are_composers() {
    let c = config("{}");
    assert_eq!(c.smoothing, 2f64.powf(-1.0 / 1000.0));
    assert_eq!(c.update_interval, Time::new(1, TimeUnit::Batch));
    assert_eq!(c.ema_start, Time::dur(0.0));
    assert_eq!(c.update_event(), Event::BATCH_END);
    assert_eq!(config(&default_settings_json(Ema::DEFAULT_SETTINGS)), c);
    // Epoch half-lives update at epoch ends, once per epoch by default.
    let e = config(r#"{"half_life": "4ep"}"#);
    assert_eq!(e.update_interval, Time::new(1, TimeUnit::Epoch));
    assert_eq!(e.update_event(), Event::EPOCH_END);
    assert_eq!(e.smoothing, 2f64.powf(-0.25));
    // Smoothing replaces the default half-life; its interval defaults to one batch.
    let s = config(r#"{"smoothing": 0.9}"#);
    assert_eq!(
        (s.smoothing, s.update_interval),
        (0.9, Time::new(1, TimeUnit::Batch))
    );
    let s = config(r#"{"smoothing": 0.9, "update_interval": "3ep"}"#);
    assert_eq!(
        (s.smoothing, s.update_interval),
        (0.9, Time::new(3, TimeUnit::Epoch))
    );
    let h = config(r#"{"half_life": "2ba", "update_interval": "4ba", "ema_start": "10ba"}"#);
    assert_eq!(h.smoothing, 0.25);
    assert_eq!(h.ema_start, Time::new(10, TimeUnit::Batch));
}

#[test]
fn bad_settings_are_config_errors_naming_the_setting() {
    for (bad, needle) in [
        (
            r#"{"half_life": "10ba", "smoothing": 0.9}"#,
            "either `half_life` or `smoothing`",
        ),
        (
            r#"{"half_life": 10}"#,
            "setting `half_life` must be a time string",
        ),
        (r#"{"half_life": "0ba"}"#, "`half_life` must be positive"),
        (
            r#"{"half_life": "0.5dur"}"#,
            "`half_life` must be in batches (ba) or epochs (ep)",
        ),
        (
            r#"{"half_life": "10"}"#,
            "setting `half_life`: invalid time \"10\"",
        ),
        (r#"{"smoothing": 1.0}"#, "`smoothing` must be in (0, 1)"),
        (r#"{"smoothing": 0}"#, "`smoothing` must be in (0, 1)"),
        (r#"{"smoothing": -0.5}"#, "`smoothing` must be in (0, 1)"),
        (r#"{"smoothing": "0.9"}"#, "`smoothing` must be a number"),
        (
            r#"{"update_interval": "0ba"}"#,
            "`update_interval` must be positive",
        ),
        (
            r#"{"update_interval": "0.5dur"}"#,
            "`update_interval` must be in batches",
        ),
        (r#"{"update_interval": "1ep"}"#, "must use the same unit"),
        (
            r#"{"half_life": "3ep", "update_interval": "1ba"}"#,
            "must use the same unit",
        ),
        (r#"{"ema_start": "soon"}"#, "setting `ema_start`"),
        (
            r#"{"ema_start": 5}"#,
            "setting `ema_start` must be a string",
        ),
        (r#"{"ema_start": "2dur"}"#, "a duration must be in [0, 1]"),
    ] {
        let err = Ema::create(&settings_for::<Ema>(bad))
            .err()
            .unwrap_or_else(|| panic!("{bad} was accepted"));
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{bad}: {err}");
        assert!(err.message().contains(needle), "{bad}: {err}");
    }
    let err = boxed_method::<Ema>(&settings(r#"{"halflife": "10ba"}"#))
        .err()
        .expect("unknown key accepted");
    assert!(err.message().contains("`halflife`"), "{err}");
}

fn at(batch: u64, epoch: u64, elapsed: f64) -> TimeInfo {
    TimeInfo {
        batch,
        epoch,
        elapsed_fraction: elapsed,
        training: true,
        ..TimeInfo::default()
    }
}

#[test]
fn schedule_follows_the_counts() {
    let c = config(r#"{"half_life": "10ba", "update_interval": "3ba"}"#);
    let due: Vec<u64> = (0..10).filter(|&b| c.update_due(&at(b, 0, 0.0))).collect();
    assert_eq!(due, vec![0, 3, 6, 9]);
    let c = config(r#"{"half_life": "3ep", "update_interval": "2ep"}"#);
    let due: Vec<u64> = (0..6).filter(|&e| c.update_due(&at(99, e, 0.0))).collect();
    assert_eq!(due, vec![0, 2, 4]);
}

#[test]
fn hooks_and_name() {
    assert_eq!(Ema::NAME, "ema");
    let hooks = Ema::hooks();
    let events: Vec<Event> = hooks.iter().map(|h| h.event).collect();
    for e in [
        Event::INIT,
        Event::FIT_START,
        Event::BATCH_START,
        Event::BATCH_END,
        Event::EPOCH_END,
        Event::EVAL_START,
        Event::EVAL_END,
        Event::BATCH_CHECKPOINT,
        Event::EPOCH_CHECKPOINT,
    ] {
        assert!(events.contains(&e), "{e} not hooked");
    }
    let prio = |e: Event| hooks.iter().find(|h| h.event == e).map(|h| h.priority);
    // Swaps happen before other methods look at the model; init after their surgery.
    assert!(prio(Event::EVAL_START) > Some(0));
    assert!(prio(Event::BATCH_START) > Some(0));
    assert!(prio(Event::EVAL_END) < Some(0));
    assert!(prio(Event::INIT) < Some(0));
    assert!(hooks.contains(&Hook::at(Event::BATCH_END)));
}

fn assert_same(got: &[(String, Tensor)], want: &[(String, Tensor)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: tensor count");
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        assert_eq!(gn, wn, "{what}: names");
        assert!(g.equal(w), "{what}: {gn}\ngot {g}\nwant {w}");
    }
}

/// The test host's clock always reads batch 0 / epoch 0 / elapsed 0, so with the default
/// `ema_start = "0.0dur"` every `batch_end` starts (the first time) and updates (0 % n == 0).
#[test]
fn updates_and_eval_swap() {
    let s = 0.5;
    let mut m = method(r#"{"smoothing": 0.5}"#);
    let mut h = host();
    let weight_ptr = h.params["fc.weight"].data_ptr();
    h.fire(&mut m, Event::INIT).unwrap();
    h.fire(&mut m, Event::FIT_START).unwrap();
    let w0 = snapshot(&h);
    assert_same(&ema_of(&state(&m)), &w0, "shadow at init");

    // Before averaging has started, evaluation uses the training weights.
    h.fire(&mut m, Event::EVAL_START).unwrap();
    assert_model(&h, &w0, "eval before start");
    h.fire(&mut m, Event::EVAL_END).unwrap();
    assert_eq!(h.metric("ema/swapped_in"), vec![0.0, 0.0]);

    // Training moves the weights; the first batch_end restarts the average from the model.
    train_step(&mut h, 1.0);
    let w1 = snapshot(&h);
    h.fire(&mut m, Event::BATCH_END).unwrap();
    let e1 = mix(&w1, &w1, s);
    assert_same(&ema_of(&state(&m)), &e1, "after the first update");
    train_step(&mut h, 2.0);
    let w2 = snapshot(&h);
    h.fire(&mut m, Event::BATCH_END).unwrap();
    let e2 = mix(&e1, &w2, s);
    assert_same(&ema_of(&state(&m)), &e2, "after the second update");
    assert_model(&h, &w2, "updates leave the model alone");

    h.metrics.clear();
    h.fire(&mut m, Event::EVAL_START).unwrap();
    assert_model(&h, &e2, "eval_start swaps the EMA weights in");
    assert_eq!(h.metric("ema/swapped_in"), vec![1.0]);
    assert_eq!(h.metric("ema/updates"), vec![2.0]);
    let dist = h.metric("ema/distance")[0];
    let want: f64 = e2
        .iter()
        .zip(&w2)
        .map(|((_, a), (_, b))| {
            (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
                .square()
                .sum(Kind::Double)
                .double_value(&[])
        })
        .sum::<f64>()
        .sqrt();
    assert!((dist - want).abs() < 1e-9 && dist > 0.0, "{dist} vs {want}");
    // In place: the host's tensors keep their storage and their gradient flag.
    assert_eq!(h.params["fc.weight"].data_ptr(), weight_ptr);
    assert!(h.params["fc.weight"].requires_grad());
    assert!(!h.params["bn.running_mean"].requires_grad());
    let st = state(&m);
    assert!(
        st.tensors.iter().any(|(n, _)| n == "training/fc.weight"),
        "the state holds the training weights while swapped"
    );
    h.fire(&mut m, Event::EVAL_END).unwrap();
    assert_model(&h, &w2, "eval_end restores the training weights");
    assert_eq!(h.metric("ema/swapped_in"), vec![1.0, 0.0]);
    assert_eq!(h.params["fc.weight"].data_ptr(), weight_ptr);
    assert!(state(&m).tensors.iter().all(|(n, _)| n.starts_with("ema/")));

    // batch_start with nothing swapped changes nothing.
    h.fire(&mut m, Event::BATCH_START).unwrap();
    assert_model(&h, &w2, "batch_start");
}

#[test]
fn checkpoint_swap_protocol() {
    let mut m = method(r#"{"smoothing": 0.75}"#);
    let mut h = host();
    h.fire(&mut m, Event::INIT).unwrap();
    h.fire(&mut m, Event::FIT_START).unwrap();
    // Not started yet: even a pending checkpoint keeps the training weights.
    h.checkpoint_pending = true;
    let w0 = snapshot(&h);
    h.fire(&mut m, Event::BATCH_CHECKPOINT).unwrap();
    assert_model(&h, &w0, "checkpoint before start");
    h.checkpoint_pending = false;

    h.fire(&mut m, Event::BATCH_END).unwrap();
    train_step(&mut h, 0.5);
    h.fire(&mut m, Event::BATCH_END).unwrap();
    let w = snapshot(&h);
    let e = ema_of(&state(&m));
    assert!(!e[0].1.equal(&w[0].1), "the average should lag the weights");

    // No checkpoint due: nothing happens.
    for event in [
        Event::BATCH_CHECKPOINT,
        Event::EPOCH_CHECKPOINT,
        Event::ITERATION_CHECKPOINT,
    ] {
        h.fire(&mut m, event).unwrap();
        assert_model(&h, &w, "no checkpoint pending");
    }
    // A checkpoint is written now: the model holds the EMA weights, the state the training ones.
    for event in [
        Event::BATCH_CHECKPOINT,
        Event::EPOCH_CHECKPOINT,
        Event::ITERATION_CHECKPOINT,
    ] {
        h.checkpoint_pending = true;
        h.fire(&mut m, event).unwrap();
        assert_model(&h, &e, "checkpoint swaps the EMA weights in");
        // A second checkpoint event keeps them (and the saved training weights) as they are.
        h.fire(&mut m, event).unwrap();
        assert_model(&h, &e, "second checkpoint event");
        let st = state(&m);
        let training: Vec<(String, Tensor)> = {
            let mut v: Vec<(String, Tensor)> = st
                .tensors
                .iter()
                .filter_map(|(n, t)| {
                    n.strip_prefix("training/")
                        .map(|n| (n.to_owned(), t.copy()))
                })
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        assert_same(&training, &w, "saved training weights");
        assert_same(&ema_of(&st), &e, "saved EMA weights");
        h.checkpoint_pending = false;
        // Evaluation in between keeps the EMA weights in and restores the training ones after.
        h.fire(&mut m, Event::EVAL_START).unwrap();
        assert_model(&h, &e, "eval after a checkpoint swap");
        h.fire(&mut m, Event::EVAL_END).unwrap();
        assert_model(&h, &w, "eval_end after a checkpoint swap");
        h.checkpoint_pending = true;
        h.fire(&mut m, event).unwrap();
        // The next batch_start puts the training weights back.
        h.fire(&mut m, Event::BATCH_START).unwrap();
        assert_model(&h, &w, "batch_start after a checkpoint");
        // So do the earlier training events of the next batch or epoch, and the end of fit.
        for next in [Event::BEFORE_DATALOADER, Event::EPOCH_START, Event::FIT_END] {
            h.fire(&mut m, event).unwrap();
            assert_model(&h, &e, "checkpoint swap");
            h.fire(&mut m, next).unwrap();
            assert_model(&h, &w, &format!("{next} after a checkpoint"));
        }
        h.checkpoint_pending = false;
    }

    // An update event right after a checkpoint swap averages the training weights (not the
    // EMA weights the model holds) and leaves them in the model.
    h.checkpoint_pending = true;
    h.fire(&mut m, Event::BATCH_CHECKPOINT).unwrap();
    h.fire(&mut m, Event::BATCH_END).unwrap();
    assert_model(&h, &w, "update after a checkpoint swap");
    assert_same(
        &ema_of(&state(&m)),
        &mix(&e, &w, 0.75),
        "update after a checkpoint swap",
    );
}

#[test]
fn epoch_units_update_at_epoch_end_only() {
    let mut m = method(r#"{"half_life": "1ep"}"#);
    let mut h = host();
    h.fire(&mut m, Event::INIT).unwrap();
    h.fire(&mut m, Event::FIT_START).unwrap();
    let w0 = snapshot(&h);
    train_step(&mut h, 1.0);
    h.fire(&mut m, Event::BATCH_END).unwrap();
    assert_same(&ema_of(&state(&m)), &w0, "batch_end with epoch units");
    h.fire(&mut m, Event::EPOCH_END).unwrap();
    // Starts from the model at that epoch end.
    let w1 = snapshot(&h);
    assert_same(&ema_of(&state(&m)), &mix(&w1, &w1, 0.5), "first epoch_end");
    train_step(&mut h, 4.0);
    let w2 = snapshot(&h);
    h.fire(&mut m, Event::EPOCH_END).unwrap();
    assert_same(
        &ema_of(&state(&m)),
        &mix(&mix(&w1, &w1, 0.5), &w2, 0.5),
        "second epoch_end",
    );
}

#[test]
fn a_later_start_never_swaps_before_it() {
    // The test clock stays at batch 0, so "5ba" is never reached.
    let mut m = method(r#"{"half_life": "2ba", "ema_start": "5ba"}"#);
    let mut h = host();
    h.fire(&mut m, Event::INIT).unwrap();
    let w0 = snapshot(&h);
    for _ in 0..3 {
        train_step(&mut h, 1.0);
        h.fire(&mut m, Event::BATCH_END).unwrap();
    }
    assert_same(&ema_of(&state(&m)), &w0, "no update before ema_start");
    let w = snapshot(&h);
    h.fire(&mut m, Event::EVAL_START).unwrap();
    assert_model(&h, &w, "eval before ema_start");
    assert_eq!(h.metric("ema/swapped_in"), vec![0.0]);
    assert!(h.metric("ema/updates").is_empty());
}

/// Builds a method at the state of `source` (on the same model) through the ABI.
fn restored(source: &MethodBox, h: &mut TestHost, settings_json: &str) -> MethodBox {
    let mut m = method(settings_json);
    h.fire(&mut m, Event::INIT).unwrap();
    m.load_state(MethodState::from(state(source)))
        .into_result()
        .unwrap();
    h.fire(&mut m, Event::FIT_START).unwrap();
    m
}

#[test]
fn state_round_trips() {
    let cfg = r#"{"smoothing": 0.9}"#;
    let mut m = method(cfg);
    let mut h = host();
    h.fire(&mut m, Event::INIT).unwrap();
    for step in 0..3 {
        train_step(&mut h, step as f64 + 0.5);
        h.fire(&mut m, Event::BATCH_END).unwrap();
    }
    let saved = state(&m);
    assert_eq!(saved.format_version, ema::STATE_FORMAT_VERSION);
    let flags: serde_json::Value = serde_json::from_slice(&saved.bytes).unwrap();
    assert_eq!(flags["started"], true);
    assert_eq!(flags["swapped_in"], false);
    assert_eq!(flags["updates"], 3);

    let mut r = restored(&m, &mut h, cfg);
    let again = state(&r);
    assert_eq!(again.bytes, saved.bytes);
    assert_same(&ema_of(&again), &ema_of(&saved), "restored EMA weights");
    // The restored method continues exactly like the original.
    train_step(&mut h, 1.0);
    h.fire(&mut m, Event::BATCH_END).unwrap();
    h.fire(&mut r, Event::BATCH_END).unwrap();
    assert_same(
        &ema_of(&state(&r)),
        &ema_of(&state(&m)),
        "after one more update",
    );

    // Saved while swapped in (a checkpoint): the model in the checkpoint holds the EMA weights,
    // the state the training weights; the next batch_start of the restored run puts them back.
    let w = snapshot(&h);
    let e = ema_of(&state(&m));
    h.checkpoint_pending = true;
    h.fire(&mut m, Event::BATCH_CHECKPOINT).unwrap();
    h.checkpoint_pending = false;
    assert_model(&h, &e, "checkpoint swap");
    let mut r = restored(&m, &mut h, cfg);
    let flags: serde_json::Value = serde_json::from_slice(&state(&r).bytes).unwrap();
    assert_eq!(flags["swapped_in"], true);
    h.fire(&mut r, Event::BATCH_START).unwrap();
    assert_model(&h, &w, "restored run swaps the training weights back");

    // State can also be loaded before init; init then checks it against the model.
    let mut early = method(cfg);
    early
        .load_state(MethodState::from(state(&m)))
        .into_result()
        .unwrap();
    let mut h2 = host();
    h2.fire(&mut early, Event::INIT).unwrap();
    h2.fire(&mut early, Event::FIT_START).unwrap();
    assert_same(&ema_of(&state(&early)), &e, "loaded before init");
}

#[test]
fn bad_state_is_refused() {
    let cfg = r#"{"smoothing": 0.9}"#;
    let mut m = method(cfg);
    let mut h = host();
    h.fire(&mut m, Event::INIT).unwrap();
    let good = state(&m);
    let load = |m: &mut MethodBox, s: State| {
        m.load_state(MethodState::from(s))
            .into_result()
            .map_err(|e| e.message.into_string())
    };
    let copy_tensors = |s: &State| -> Vec<(String, Tensor)> {
        s.tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.copy()))
            .collect()
    };
    let cases: Vec<(State, &str)> = vec![
        (
            State {
                format_version: 2,
                bytes: good.bytes.clone(),
                tensors: copy_tensors(&good),
            },
            "format 2 is unknown",
        ),
        (
            State {
                format_version: 1,
                bytes: b"not json".to_vec(),
                tensors: copy_tensors(&good),
            },
            "bad counters",
        ),
        (
            State {
                format_version: 1,
                bytes: good.bytes.clone(),
                tensors: vec![(
                    "ema/other".into(),
                    Tensor::zeros([2], (Kind::Float, Device::Cpu)),
                )],
            },
            "do not match",
        ),
        (
            State {
                format_version: 1,
                bytes: good.bytes.clone(),
                tensors: vec![(
                    "weights".into(),
                    Tensor::zeros([2], (Kind::Float, Device::Cpu)),
                )],
            },
            "unexpected tensor `weights`",
        ),
        (
            State {
                format_version: 1,
                bytes: br#"{"started": true, "swapped_in": true, "updates": 1}"#.to_vec(),
                tensors: copy_tensors(&good),
            },
            "training weights do not match",
        ),
    ];
    for (s, needle) in cases {
        let err = load(&mut m, s).unwrap_err();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    // A model that changed after the average started is an error at fit_start.
    let mut m = method(cfg);
    let mut h = host();
    h.fire(&mut m, Event::INIT).unwrap();
    h.fire(&mut m, Event::BATCH_END).unwrap();
    h.params.remove("fc.bias");
    let err = h.fire(&mut m, Event::FIT_START).unwrap_err();
    assert!(err.contains("fc.bias"), "{err}");
    // Before it started, the shadow weights are simply taken again.
    let mut m = method(r#"{"half_life": "2ba", "ema_start": "9ba"}"#);
    let mut h = host();
    h.fire(&mut m, Event::INIT).unwrap();
    h.params.remove("fc.bias");
    h.fire(&mut m, Event::FIT_START).unwrap();
    assert_eq!(ema_of(&state(&m)).len(), 2);
}

fn names(state: &State) -> Vec<String> {
    ema_of(state).into_iter().map(|(n, _)| n).collect()
}

fn freeze(h: &TestHost, name: &str) {
    let _ = h.params[name].set_requires_grad(false);
}

/// As Composer's `EMAParameters`: the average holds the parameters trainable when averaging
/// starts (and all buffers). A parameter frozen before is left out — at evaluation the model
/// keeps its own value — and the method still attaches and resumes on that model.
#[test]
fn parameters_frozen_before_the_start_are_not_averaged() {
    let mut m = method(r#"{"smoothing": 0.5}"#);
    let mut h = host();
    freeze(&h, "fc.bias");
    h.fire(&mut m, Event::INIT).unwrap();
    h.fire(&mut m, Event::FIT_START).unwrap();
    assert_eq!(names(&state(&m)), ["bn.running_mean", "fc.weight"]);
    train_step(&mut h, 1.0);
    h.fire(&mut m, Event::BATCH_END).unwrap();
    train_step(&mut h, 2.0);
    h.fire(&mut m, Event::BATCH_END).unwrap();
    let trained = snapshot(&h);
    h.fire(&mut m, Event::EVAL_START).unwrap();
    let bias = &trained.iter().find(|(n, _)| n == "fc.bias").unwrap().1;
    assert!(
        h.params["fc.bias"].equal(bias),
        "the frozen bias keeps its value"
    );
    assert!(
        !h.params["fc.weight"].equal(&trained[2].1),
        "the weight is the average"
    );
    h.fire(&mut m, Event::EVAL_END).unwrap();
    assert_model(&h, &trained, "eval_end");
    // Resumed on the same model (the bias frozen again by the host's checkpoint).
    let resumed = restored(&m, &mut h, r#"{"smoothing": 0.5}"#);
    assert_same(&ema_of(&state(&resumed)), &ema_of(&state(&m)), "resumed");
}

#[test]
fn parameters_frozen_between_init_and_the_start_leave_the_average_at_the_start() {
    let mut m = method(r#"{"smoothing": 0.5}"#);
    let mut h = host();
    h.fire(&mut m, Event::INIT).unwrap();
    h.fire(&mut m, Event::FIT_START).unwrap();
    assert_eq!(names(&state(&m)).len(), 3);
    freeze(&h, "fc.bias");
    train_step(&mut h, 1.0);
    let w1 = snapshot(&h);
    // The test clock reads batch 0: averaging starts at this first batch_end.
    h.fire(&mut m, Event::BATCH_END).unwrap();
    let want: Vec<(String, Tensor)> = mix(&w1, &w1, 0.5)
        .into_iter()
        .filter(|(n, _)| n != "fc.bias")
        .collect();
    assert_same(&ema_of(&state(&m)), &want, "the average after the start");
}

#[test]
fn parameters_frozen_after_the_start_stay_in_the_average() {
    let mut m = method(r#"{"smoothing": 0.5}"#);
    let mut h = host();
    h.fire(&mut m, Event::INIT).unwrap();
    h.fire(&mut m, Event::FIT_START).unwrap();
    train_step(&mut h, 1.0);
    let w1 = snapshot(&h);
    h.fire(&mut m, Event::BATCH_END).unwrap();
    let e1 = mix(&w1, &w1, 0.5);
    // Layer freezing at an epoch end: Composer's average keeps the parameter.
    freeze(&h, "fc.bias");
    train_step(&mut h, 2.0);
    let w2 = snapshot(&h);
    h.fire(&mut m, Event::BATCH_END).unwrap();
    assert_same(&ema_of(&state(&m)), &mix(&e1, &w2, 0.5), "still averaged");
}
