//! The SWA method: settings and their errors, the timing of updates and replacement, the
//! learning-rate modes, and the state round trip (through the ABI, with the test host).

use swa::{AnnealStrategy, Swa, SwaConfig, SwaLrMode, Time};
use tessera_plugin_api::abi::{MethodBox, MethodState};
use tessera_plugin_api::tch::{self, Tensor};
use tessera_plugin_api::testing::{default_settings_json, settings, settings_for};
use tessera_plugin_api::testing::{RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, ErrorKind, Event, Plugin, State, TimeInfo, TimeUnit};

fn config(json: &str) -> SwaConfig {
    SwaConfig::from_settings(&settings_for::<Swa>(json)).unwrap_or_else(|e| panic!("{json}: {e}"))
}

fn method(json: &str) -> MethodBox {
    boxed_method::<Swa>(&settings(json)).unwrap_or_else(|e| panic!("{json}: {e}"))
}

#[test]
fn defaults_are_composers() {
    let d = config("{}");
    assert_eq!(d, SwaConfig::default());
    assert_eq!(d.swa_start, Time::dur(0.7));
    assert_eq!(d.swa_end, Time::dur(0.97));
    assert_eq!(d.update_interval, Time::new(1, TimeUnit::Epoch));
    assert!(!d.schedule_swa_lr);
    assert_eq!(d.anneal_strategy, AnnealStrategy::Linear);
    assert_eq!(d.anneal_steps, 10);
    assert_eq!(d.swa_lr, None);
    assert_eq!(d.swa_lr_mode, SwaLrMode::Composer);
    // The documented defaults are the defaults.
    assert_eq!(config(&default_settings_json(Swa::DEFAULT_SETTINGS)), d);
    assert_eq!(d.update_event(), Event::EPOCH_END);
    assert_eq!(
        config(r#"{"update_interval": "5ba"}"#).update_event(),
        Event::BATCH_END
    );
    assert_eq!(
        config(r#"{"anneal_strategy": "COSINE"}"#).anneal_strategy,
        AnnealStrategy::Cos
    );
    assert_eq!(
        config(r#"{"anneal_strategy": "lin"}"#).anneal_strategy,
        AnnealStrategy::Linear
    );
}

#[test]
fn bad_settings_are_config_errors_naming_the_setting() {
    for (json, fragment) in [
        (r#"{"swa_start": "0.7xx"}"#, "setting `swa_start`"),
        (
            r#"{"swa_start": "100ba", "swa_end": "200ba"}"#,
            "setting `swa_start` must be in epochs (ep) or a fraction",
        ),
        (
            r#"{"swa_end": "1.5dur"}"#,
            "setting `swa_end`: a duration must be in [0, 1]",
        ),
        (r#"{"swa_start": "2ep"}"#, "must use the same unit"),
        (
            r#"{"swa_start": "0.9dur", "swa_end": "0.5dur"}"#,
            "`swa_end` (0.5dur) must be later than `swa_start` (0.9dur)",
        ),
        (r#"{"swa_start": "3ep", "swa_end": "3ep"}"#, "must be later"),
        (
            r#"{"update_interval": "0ba"}"#,
            "setting `update_interval` must be positive",
        ),
        (
            r#"{"update_interval": "0.5dur"}"#,
            "setting `update_interval` must be in batches (ba) or epochs (ep)",
        ),
        (
            r#"{"update_interval": 3}"#,
            "setting `update_interval` must be a string",
        ),
        (r#"{"anneal_strategy": "exp"}"#, "setting `anneal_strategy`"),
        (r#"{"anneal_steps": 0}"#, "setting `anneal_steps`"),
        (r#"{"anneal_steps": 2.5}"#, "setting `anneal_steps`"),
        (r#"{"swa_lr": -1}"#, "setting `swa_lr`"),
        (r#"{"swa_lr": "big"}"#, "setting `swa_lr`"),
        (r#"{"swa_lr_mode": "pytorch"}"#, "setting `swa_lr_mode`"),
        (
            r#"{"schedule_swa_lr": true, "swa_lr_mode": "hold"}"#,
            "setting `swa_lr` is required",
        ),
        (r#"{"schedule_swa_lr": "yes"}"#, "schedule_swa_lr"),
    ] {
        let err = match boxed_method::<Swa>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{json}: {}", err.message());
        assert!(
            err.message().contains(fragment),
            "{json}: {}",
            err.message()
        );
    }
    let err = boxed_method::<Swa>(&settings(r#"{"swa_strat": "0.5dur"}"#))
        .err()
        .expect("an unknown key is refused");
    assert!(err.message().contains("swa_strat"), "{}", err.message());
}

/// A model of one weight, one bias and one buffer.
fn model(w: f32) -> Vec<swa::ModelTensor> {
    vec![
        swa::ModelTensor {
            name: "fc.weight".into(),
            tensor: Tensor::from_slice(&[w, 2.0 * w]).set_requires_grad(true),
            buffer: false,
        },
        swa::ModelTensor {
            name: "bn.running_mean".into(),
            tensor: Tensor::from_slice(&[w]),
            buffer: true,
        },
    ]
}

fn at_batch(batch: u64, max_batches: u64) -> TimeInfo {
    TimeInfo {
        batch,
        epoch: batch / 4,
        batches_per_epoch: 4,
        max_batches,
        elapsed_fraction: batch as f64 / max_batches as f64,
        training: true,
        ..TimeInfo::default()
    }
}

/// Sets every model tensor to `w` in place, as training would.
fn set(model: &[swa::ModelTensor], w: f32) {
    let _g = tch::no_grad_guard();
    for m in model {
        let _ = m.tensor.shallow_clone().f_fill_(w as f64).unwrap();
    }
}

#[test]
fn averages_from_start_and_replaces_at_end() {
    // 10 batches; start at 0.3 (batch 3), every 2 batches, end at 0.8 (batch 8).
    let mut swa = Swa::new(config(
        r#"{"swa_start": "0.3dur", "swa_end": "0.8dur", "update_interval": "2ba"}"#,
    ));
    let m = model(0.0);
    let mut replaced = None;
    for batch in 1..=10u64 {
        set(&m, batch as f32);
        let out = swa
            .train_event(Event::BATCH_END, &at_batch(batch, 10), 0.1, &m)
            .unwrap();
        assert_eq!(out.matched, (3..=8).contains(&batch), "batch {batch}");
        assert_eq!(out.updated, [3, 5, 7].contains(&batch), "batch {batch}");
        assert_eq!(out.next_lr, None, "no learning-rate schedule");
        // epoch_end is not this interval's event.
        let e = swa
            .train_event(Event::EPOCH_END, &at_batch(batch, 10), 0.1, &m)
            .unwrap();
        assert!(!e.matched);
        if out.replaced {
            replaced = Some(batch);
            // Parameters: the mean of 3, 5, 7; the buffer: as at the last update (7).
            assert_eq!(Vec::<f32>::try_from(&m[0].tensor).unwrap(), vec![5.0, 5.0]);
            assert_eq!(Vec::<f32>::try_from(&m[1].tensor).unwrap(), vec![7.0]);
        }
    }
    assert_eq!(replaced, Some(8));
    assert_eq!(swa.n_averaged(), 3);
    assert_eq!(swa.step_counter(), 6);
    assert!(swa.completed());
    // Nothing to do at the end: already replaced.
    assert!(!swa.finish(&m).unwrap());
}

#[test]
fn the_end_of_training_replaces_when_swa_end_never_matched() {
    // Batch updates with max_duration in epochs: the elapsed fraction reaches 1.0 only at the
    // last epoch_end, which is not an update event, so `swa_end = "1.0dur"` never matches.
    let mut swa = Swa::new(config(
        r#"{"swa_start": "0.5dur", "swa_end": "1.0dur", "update_interval": "1ba"}"#,
    ));
    let m = model(0.0);
    for batch in 1..=8u64 {
        set(&m, batch as f32);
        let mut t = at_batch(batch, 8);
        // max_duration "2ep": at batch_end the epoch is not counted yet, and the fraction
        // moves at epoch ends only.
        t.epoch = (batch - 1) / 4;
        t.elapsed_fraction = t.epoch as f64 / 2.0;
        swa.train_event(Event::BATCH_END, &t, 0.1, &m).unwrap();
    }
    assert!(swa.started() && !swa.completed());
    assert!(swa.finish(&m).unwrap());
    assert!(swa.completed());
}

#[test]
fn composer_mode_sets_one_step_and_hold_mode_every_step() {
    let json = |mode: &str| {
        format!(
            r#"{{"swa_start": "0.2dur", "swa_end": "0.9dur", "update_interval": "1ba",
                "schedule_swa_lr": true, "anneal_steps": 2, "swa_lr": 0.5, "swa_lr_mode": "{mode}"}}"#
        )
    };
    // Composer: the target is the host's rate at the start (0.1): annealing 0.1 → 0.1, and
    // the rate is set at updates only.
    let mut composer = Swa::new(config(&json("composer")));
    let m = model(1.0);
    let out = composer
        .train_event(Event::BATCH_END, &at_batch(1, 10), 0.1, &m)
        .unwrap();
    assert_eq!(out.next_lr, None);
    let out = composer
        .train_event(Event::BATCH_END, &at_batch(2, 10), 0.1, &m)
        .unwrap();
    assert_eq!(out.swalr_lr, Some(0.1));
    assert_eq!(composer.swalr().unwrap().swa_lr, 0.1, "swa_lr ignored");
    // A schedule that moved the rate to 0.08: half-way back-solves base = 0.06.
    let out = composer
        .train_event(Event::BATCH_END, &at_batch(3, 10), 0.08, &m)
        .unwrap();
    assert!((out.next_lr.unwrap() - 0.1).abs() < 1e-15);

    // Hold: 0.1 → 0.3 → 0.5, then 0.5 at every batch_end, also after the replacement.
    let mut hold = Swa::new(config(&json("hold")));
    let mut rates = Vec::new();
    for batch in 1..=10 {
        let out = hold
            .train_event(Event::BATCH_END, &at_batch(batch, 10), 0.1, &m)
            .unwrap();
        rates.push(out.next_lr);
    }
    let r = |x: f64| Some(x);
    assert_eq!(rates[0], None);
    assert!((rates[1].unwrap() - 0.3).abs() < 1e-15, "{rates:?}");
    assert_eq!(&rates[2..], &[r(0.5); 8], "{rates:?}");
    assert!(hold.completed());
}

/// A test host with a weight and a buffer; the test host's clock is batch 0, elapsed 0.
fn host() -> TestHost {
    let mut host = TestHost::new(RandomSource::Seeded(0));
    host.params.insert(
        "fc.weight".into(),
        Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true),
    );
    host.lr = 0.2;
    host
}

fn state(m: &MethodBox) -> State {
    State::from(
        m.state()
            .into_result()
            .unwrap_or_else(|e| panic!("{}", e.message)),
    )
}

#[test]
fn through_the_abi_metrics_rate_and_state_round_trip() {
    let json = r#"{"swa_start": "0.0dur", "swa_end": "0.5dur", "update_interval": "1ba",
                   "schedule_swa_lr": true, "anneal_steps": 4, "swa_lr": 0.1, "swa_lr_mode": "hold"}"#;
    let mut m = method(json);
    let mut h = host();
    h.fire(&mut m, Event::BATCH_END).unwrap();
    assert_eq!(h.metric("swa/n_averaged"), vec![1.0]);
    // 0.2 → 0.1 over 4 updates: 0.175 after the first.
    let lr = h.metric("swa/lr");
    assert!((lr[0] - 0.175).abs() < 1e-15, "{lr:?}");
    assert!((h.lr - 0.175).abs() < 1e-15, "{}", h.lr);
    {
        let _g = tch::no_grad_guard();
        let _ = h.params["fc.weight"].shallow_clone().f_fill_(3.0).unwrap();
    }
    h.fire(&mut m, Event::BATCH_END).unwrap();
    let saved = state(&m);
    assert_eq!(saved.format_version, swa::STATE_FORMAT_VERSION);
    let names: Vec<&str> = saved.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["average/fc.weight"]);
    // (1, −2) and (3, 3) averaged.
    assert_eq!(
        Vec::<f32>::try_from(&saved.tensors[0].1).unwrap(),
        vec![2.0, 0.5]
    );

    // A fresh method restored from the state continues exactly as the first one.
    let mut restored = method(json);
    let bytes = saved.bytes.clone();
    let copy = State {
        format_version: saved.format_version,
        bytes,
        tensors: saved
            .tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.copy()))
            .collect(),
    };
    restored
        .load_state(MethodState::from(copy))
        .into_result()
        .unwrap_or_else(|e| panic!("{}", e.message));
    let mut h2 = host();
    h2.lr = h.lr;
    h2.params = h
        .params
        .iter()
        .map(|(n, t)| (n.clone(), t.detach().copy()))
        .collect();
    h.fire(&mut m, Event::BATCH_END).unwrap();
    h2.fire(&mut restored, Event::BATCH_END).unwrap();
    assert_eq!(h.lr, h2.lr);
    let a = state(&m);
    let b = state(&restored);
    assert_eq!(a.bytes, b.bytes);
    assert!(a.tensors[0].1.equal(&b.tensors[0].1));

    // A state of another format, or with foreign tensors, is refused.
    let mut fresh = method(json);
    let bad = State {
        format_version: 99,
        bytes: a.bytes.clone(),
        tensors: Vec::new(),
    };
    let err = fresh
        .load_state(MethodState::from(bad))
        .into_result()
        .unwrap_err();
    assert!(err.message.contains("format 99"), "{}", err.message);
    let bad = State {
        format_version: swa::STATE_FORMAT_VERSION,
        bytes: a.bytes.clone(),
        tensors: vec![("ema/fc.weight".into(), Tensor::from_slice(&[1.0f32]))],
    };
    let err = fresh
        .load_state(MethodState::from(bad))
        .into_result()
        .unwrap_err();
    assert!(err.message.contains("unexpected tensor"), "{}", err.message);
}

#[test]
fn hooks_and_name() {
    assert_eq!(Swa::NAME, "swa");
    let events: Vec<Event> = Swa::hooks().into_iter().map(|h| h.event).collect();
    // The checkpoint events: under sharding the average is gathered whole for the save.
    assert_eq!(
        events,
        [
            Event::BATCH_END,
            Event::EPOCH_END,
            Event::FIT_END,
            Event::BATCH_CHECKPOINT,
            Event::EPOCH_CHECKPOINT,
            Event::ITERATION_CHECKPOINT
        ]
    );
}
