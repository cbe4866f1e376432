//! The stopping rule against Composer's `EarlyStopper._update_stopper_state`, and the method
//! driven through the test host: settings, the stop request, state across a checkpoint.

use early_stopping::{update, Best, Comparison, EarlyStopping, Patience};
use tessera_plugin_api::testing::{settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, Event};

/// Feeds `values` (one per epoch, epoch = index + 1) and returns the epoch at which the rule
/// says stop, if any.
fn stop_epoch(values: &[f64], comp: Comparison, min_delta: f64, patience: u64) -> Option<u64> {
    let mut best = None;
    values.iter().enumerate().find_map(|(i, &v)| {
        let epoch = i as u64 + 1;
        update(
            &mut best,
            v,
            epoch,
            epoch * 10,
            comp,
            min_delta,
            Patience::Epochs(patience),
        )
        .then_some(epoch)
    })
}

#[test]
fn patience_counts_epochs_since_the_best_strictly() {
    let g = Comparison::Greater;
    // Improves at 1, 2; flat from 3: with patience 1, epoch 4 is 2 > 1 past the best (2).
    assert_eq!(stop_epoch(&[0.5, 0.6, 0.6, 0.6, 0.6], g, 0.0, 1), Some(4));
    assert_eq!(stop_epoch(&[0.5, 0.6, 0.6, 0.6, 0.6], g, 0.0, 2), Some(5));
    // Always improving: never stops.
    assert_eq!(stop_epoch(&[0.1, 0.2, 0.3, 0.4], g, 0.0, 1), None);
    // patience 0: the first epoch without improvement stops.
    assert_eq!(stop_epoch(&[0.5, 0.6, 0.55], g, 0.0, 0), Some(3));
}

#[test]
fn min_delta_must_be_exceeded_and_comparison_sets_the_direction() {
    // +0.005 is not more than min_delta 0.01: not an improvement.
    assert_eq!(
        stop_epoch(&[0.5, 0.505, 0.508, 0.509], Comparison::Greater, 0.01, 1),
        Some(3)
    );
    // The same values under `less`: the first is the best, nothing later beats it.
    assert_eq!(
        stop_epoch(&[0.5, 0.6, 0.7], Comparison::Less, 0.0, 1),
        Some(3)
    );
    let mut best = None;
    update(
        &mut best,
        2.0,
        1,
        5,
        Comparison::Less,
        0.0,
        Patience::Epochs(1),
    );
    update(
        &mut best,
        1.5,
        2,
        9,
        Comparison::Less,
        0.0,
        Patience::Epochs(1),
    );
    assert_eq!(
        best,
        Some(Best {
            value: 1.5,
            epoch: 2,
            batch: 9
        })
    );
}

#[test]
fn batch_patience_counts_batches() {
    let mut best = None;
    let p = Patience::Batches(100);
    assert!(!update(&mut best, 0.9, 0, 50, Comparison::Greater, 0.0, p));
    assert!(!update(&mut best, 0.8, 0, 150, Comparison::Greater, 0.0, p));
    assert!(update(&mut best, 0.8, 0, 151, Comparison::Greater, 0.0, p));
}

#[test]
fn default_comparison_follows_the_name() {
    assert_eq!(Comparison::default_for("accuracy"), Comparison::Greater);
    assert_eq!(Comparison::default_for("train_loss"), Comparison::Less);
    assert_eq!(Comparison::default_for("Perplexity"), Comparison::Less);
    assert_eq!(Comparison::default_for("cross_entropy"), Comparison::Less);
    assert_eq!(Comparison::parse("GT"), Some(Comparison::Greater));
    assert_eq!(Comparison::parse("lt"), Some(Comparison::Less));
    assert_eq!(Comparison::parse("bigger"), None);
}

#[test]
fn the_method_requests_a_stop_through_the_host_and_keeps_its_best_in_state() {
    let s = settings(r#"{"monitor": "accuracy", "patience": 1}"#);
    let mut method = boxed_method::<EarlyStopping>(&s).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(0));
    // No evaluation yet: nothing happens.
    host.fire(&mut method, Event::EVAL_END).unwrap();
    assert_eq!(host.stop_requested, None);
    for (epoch, acc) in [(1, 0.7), (2, 0.8), (3, 0.8)] {
        host = host.with_eval(epoch * 10, &[("accuracy", acc), ("cross_entropy", 1.0)]);
        if let Some(e) = host.eval_results.as_mut() {
            e.epoch = epoch;
        }
        host.fire(&mut method, Event::EVAL_END).unwrap();
        assert_eq!(host.stop_requested, None, "epoch {epoch}");
    }
    assert_eq!(host.metric("early_stopping/best"), vec![0.7, 0.8, 0.8]);
    // The best (0.8 at epoch 2) survives a checkpoint into a fresh method.
    let state = method.state().unwrap();
    let mut resumed = boxed_method::<EarlyStopping>(&s).unwrap();
    resumed.load_state(state).unwrap();
    host = host.with_eval(40, &[("accuracy", 0.79), ("cross_entropy", 1.0)]);
    if let Some(e) = host.eval_results.as_mut() {
        e.epoch = 4;
    }
    host.fire(&mut resumed, Event::EVAL_END).unwrap();
    let reason = host.stop_requested.clone().expect("a stop request");
    assert!(
        reason.contains("accuracy has not improved on 0.8"),
        "{reason}"
    );
    assert!(reason.contains("since epoch 2"), "{reason}");
}

#[test]
fn a_missing_metric_and_bad_settings_are_errors_naming_the_key() {
    let s = settings(r#"{"monitor": "f1"}"#);
    let mut method = boxed_method::<EarlyStopping>(&s).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(0)).with_eval(10, &[("accuracy", 0.5)]);
    let err = host.fire(&mut method, Event::EVAL_END).unwrap_err();
    assert!(
        err.contains("`monitor`") && err.contains("accuracy"),
        "{err}"
    );
    for (json, key) in [
        (r#"{"patience": "3sp"}"#, "`patience`"),
        (r#"{"patience": -1}"#, "`patience`"),
        (r#"{"comp": "bigger"}"#, "`comp`"),
        (r#"{"dataloader_label": "train"}"#, "`dataloader_label`"),
        (r#"{"min_delta": "x"}"#, "min_delta"),
        (r#"{"monitr": "accuracy"}"#, "monitr"),
    ] {
        let err = match boxed_method::<EarlyStopping>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(key), "{json}: {err}");
    }
}
