//! EMA against Composer's golden outputs (`tests/golden/ema.*`).
//!
//! Everything is read from the JSON and safetensors files: the model and EMA state dicts
//! (`model/<name>`, `ema_before/<name>`), every recorded result `ema_after[_<k>x]/s=<s>/<name>`
//! (`k` updates with smoothing `s`, one when there is no `_<k>x`), the integer-buffer values in
//! `results.num_batches_tracked`, and the smoothing Composer derived for each settings object in
//! `results.smoothing_from_half_life`.

use std::collections::BTreeMap;

use ema::{compute_ema, smoothing_from_half_life, Ema, EmaConfig, Time};
use tessera_plugin_api::abi::MethodState;
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::golden::Golden;
use tessera_plugin_api::testing::{settings, settings_for};
use tessera_plugin_api::testing::{RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, Event, State};

const CASE: &str = "ema";

/// The tensors under `prefix`, by the name after it, in name order.
fn state_dict(g: &Golden, prefix: &str) -> Vec<(String, Tensor)> {
    let dict: Vec<(String, Tensor)> = g
        .tensors
        .iter()
        .filter_map(|(k, t)| k.strip_prefix(prefix).map(|n| (n.to_owned(), t.copy())))
        .collect();
    assert!(!dict.is_empty(), "no golden tensors under `{prefix}`");
    dict
}

/// One recorded result: `updates` updates of `ema_before` towards `model` with `smoothing`.
struct Run {
    prefix: String,
    updates: usize,
    smoothing: f64,
    smoothing_text: String,
}

/// Every output group `<tag>/s=<s>/`, where `<tag>` is `ema_after` (one update) or
/// `ema_after_<k>x` (`k` updates).
fn runs(g: &Golden) -> Vec<Run> {
    let mut prefixes = std::collections::BTreeSet::new();
    for name in g.names_with_role("output") {
        let (prefix, _) = name
            .split_once("/s=")
            .and_then(|(tag, rest)| rest.split_once('/').map(|(s, p)| ((tag, s), p)))
            .unwrap_or_else(|| panic!("output `{name}` is not <tag>/s=<s>/<param>"));
        prefixes.insert((prefix.0.to_owned(), prefix.1.to_owned()));
    }
    assert!(!prefixes.is_empty(), "no outputs");
    prefixes
        .into_iter()
        .map(|(tag, s)| {
            let updates = match tag.strip_prefix("ema_after") {
                Some("") => 1,
                Some(rest) => rest
                    .strip_prefix('_')
                    .and_then(|r| r.strip_suffix('x'))
                    .and_then(|k| k.parse().ok())
                    .unwrap_or_else(|| panic!("cannot read an update count from `{tag}`")),
                None => panic!("unknown output group `{tag}`"),
            };
            Run {
                prefix: format!("{tag}/s={s}/"),
                updates,
                smoothing: s.parse().unwrap_or_else(|e| panic!("s={s}: {e}")),
                smoothing_text: s,
            }
        })
        .collect()
}

#[test]
fn compute_ema_reproduces_composer_exactly() {
    let g = Golden::load(CASE);
    let model = state_dict(&g, "model/");
    let before = state_dict(&g, "ema_before/");
    let names = |d: &[(String, Tensor)]| d.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&model),
        names(&before),
        "model and EMA list other tensors"
    );
    assert!(
        model.iter().any(|(_, t)| t.kind() == Kind::Int64),
        "the case has no integer buffer"
    );
    let runs = runs(&g);
    assert!(
        runs.iter().any(|r| r.updates > 1),
        "no repeated update recorded"
    );
    for run in &runs {
        let ema: Vec<(String, Tensor)> =
            before.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
        for _ in 0..run.updates {
            compute_ema(&ema, &model, run.smoothing).unwrap();
        }
        let want = state_dict(&g, &run.prefix);
        assert_eq!(names(&ema), names(&want), "{}: tensors", run.prefix);
        for ((name, got), (_, want)) in ema.iter().zip(&want) {
            let what = format!("{}{name} after {} update(s)", run.prefix, run.updates);
            assert_eq!(got.kind(), want.kind(), "{what}: kind");
            assert!(got.equal(want), "{what}:\nours {got}\nwant {want}");
        }
        // The model is untouched.
        for (name, t) in &model {
            assert!(
                t.equal(g.tensor(&format!("model/{name}"))),
                "model {name} changed"
            );
        }
    }
}

#[test]
fn integer_buffers_are_truncated_as_composer_does() {
    let g = Golden::load(CASE);
    let recorded = g.json["results"]["num_batches_tracked"]
        .as_object()
        .expect("results.num_batches_tracked");
    let int_name = state_dict(&g, "model/")
        .into_iter()
        .find(|(_, t)| t.kind() == Kind::Int64)
        .map(|(n, _)| n)
        .expect("an int64 buffer");
    let value = |name: &str| g.tensor(name).int64_value(&[]);
    assert_eq!(
        recorded["model"].as_i64(),
        Some(value(&format!("model/{int_name}")))
    );
    assert_eq!(
        recorded["ema_before"].as_i64(),
        Some(value(&format!("ema_before/{int_name}")))
    );
    let mut checked = 0;
    for run in runs(&g).iter().filter(|r| r.updates == 1) {
        let key = format!("after_s={}", run.smoothing_text);
        let want = recorded[&key]
            .as_i64()
            .unwrap_or_else(|| panic!("no num_batches_tracked `{key}`"));
        let m = Tensor::from(value(&format!("model/{int_name}")));
        let mut e = Tensor::from(value(&format!("ema_before/{int_name}")));
        ema::ema_update(&mut e, &m, run.smoothing).unwrap();
        assert_eq!(e.kind(), Kind::Int64);
        assert_eq!(e.int64_value(&[]), want, "{key}");
        // Truncation, not rounding: the float mix lies strictly above the stored value here.
        let mixed = value(&format!("ema_before/{int_name}")) as f64 * run.smoothing
            + value(&format!("model/{int_name}")) as f64 * (1.0 - run.smoothing);
        assert_eq!(want, mixed.trunc() as i64, "{key}: {mixed}");
        checked += 1;
    }
    assert!(checked >= 2, "checked {checked} smoothings");
}

#[test]
fn smoothing_and_interval_from_settings_match_composer() {
    let g = Golden::load(CASE);
    let table = g.json["results"]["smoothing_from_half_life"]
        .as_object()
        .expect("results.smoothing_from_half_life");
    assert!(table.len() >= 3, "{table:?}");
    for (kwargs, want) in table {
        let config = EmaConfig::from_settings(&settings_for::<Ema>(kwargs))
            .unwrap_or_else(|e| panic!("{kwargs}: {e}"));
        let s = want["smoothing"].as_f64().expect("smoothing");
        assert!(
            (config.smoothing - s).abs() <= 1e-15,
            "{kwargs}: smoothing {} != {s}",
            config.smoothing
        );
        assert_eq!(
            config.update_interval.to_string(),
            want["update_interval"].as_str().expect("update_interval"),
            "{kwargs}"
        );
        // The invariant the case states: s = 2^(−interval / half_life).
        let kw: serde_json::Value = serde_json::from_str(kwargs).unwrap();
        if let Some(h) = kw["half_life"].as_str() {
            let h = Time::parse(h).unwrap().count().expect(kwargs);
            let i = config.update_interval.count().expect(kwargs);
            assert_eq!(config.smoothing, smoothing_from_half_life(i, h), "{kwargs}");
        }
    }
}

/// The golden run with the most updates, replayed through the method as the host drives it:
/// `init` takes the model, the shadow weights are set to `ema_before` through `load_state`, and
/// each `batch_end` (at batch 0, a multiple of `1ba`) is one update.
#[test]
fn method_reproduces_the_repeated_updates() {
    let g = Golden::load(CASE);
    let run = runs(&g)
        .into_iter()
        .max_by_key(|r| r.updates)
        .expect("a run");
    let model = state_dict(&g, "model/");
    let before = state_dict(&g, "ema_before/");
    let config = format!(
        r#"{{"smoothing": {}, "update_interval": "1ba"}}"#,
        run.smoothing_text
    );
    let mut method = boxed_method::<Ema>(&settings(&config)).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(0));
    // As the host shows the model: BatchNorm statistics as buffers, the rest trainable.
    let is_buffer = |n: &str| n.contains("running_") || n.ends_with("num_batches_tracked");
    host.params = model
        .iter()
        .map(|(n, t)| (n.clone(), t.copy().set_requires_grad(!is_buffer(n))))
        .collect();
    host.buffers = model
        .iter()
        .map(|(n, _)| n.clone())
        .filter(|n| is_buffer(n))
        .collect();
    host.fire(&mut method, Event::INIT).unwrap();
    let saved = State {
        format_version: ema::STATE_FORMAT_VERSION,
        bytes: br#"{"started": true, "swapped_in": false, "updates": 0}"#.to_vec(),
        tensors: before
            .iter()
            .map(|(n, t)| (format!("ema/{n}"), t.copy()))
            .collect(),
    };
    method
        .load_state(MethodState::from(saved))
        .into_result()
        .unwrap();
    host.fire(&mut method, Event::FIT_START).unwrap();
    for _ in 0..run.updates {
        host.fire(&mut method, Event::BATCH_END).unwrap();
    }
    let state = State::from(method.state().into_result().unwrap());
    let got: BTreeMap<String, Tensor> = state
        .tensors
        .into_iter()
        .filter_map(|(n, t)| n.strip_prefix("ema/").map(|n| (n.to_owned(), t)))
        .collect();
    let want = state_dict(&g, &run.prefix);
    assert_eq!(got.len(), want.len());
    for (name, w) in &want {
        assert!(got[name].equal(w), "{}{name}", run.prefix);
    }
    let flags: serde_json::Value = serde_json::from_slice(&state.bytes).unwrap();
    assert_eq!(flags["updates"], run.updates as u64);
    // The model itself was not changed by the updates.
    for (name, t) in &model {
        assert!(host.params[name].equal(t), "{name}");
    }
}
