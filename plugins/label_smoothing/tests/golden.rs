//! Label smoothing against Composer's golden outputs (`tests/golden/label_smoothing.*`).
//!
//! Every case is read from the JSON and safetensors files: output tensors are named
//! `<what>[_<variant>]/s=<smoothing>` (`smoothed/s=0.1`, `loss_kdim/s=0.1`, ...); their inputs
//! are `logits[_<variant>]` and `target[_<variant>]` (or `<variant>_target`).

use label_smoothing::{smooth_labels, LabelSmoothing};
use tessera_plugin_api::tch::{Kind, Reduction, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings, settings_for};
use tessera_plugin_api::testing::{RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, keys, ErrorKind, Event, Hook, Plugin};

const CASE: &str = "label_smoothing";
const RTOL: f64 = 1e-6;
const ATOL: f64 = 1e-7;

/// The loss of `logits` against the smoothed probability targets: PyTorch's cross-entropy with
/// probability targets (mean of `−Σ_c t·log_softmax(x, 1)`). The host's training loss
/// (`host/src/model/loss.rs`, tested against these golden losses in `tests/trainer/loss.rs`) divides the
/// sum by `Σ t` as Composer's `soft_cross_entropy` does, which is this mean here: smoothed rows sum
/// to one (checked below).
fn soft_cross_entropy(logits: &Tensor, target: &Tensor) -> Tensor {
    assert_eq!(logits.size(), target.size(), "soft CE needs dense targets");
    logits.cross_entropy_loss::<Tensor>(target, None, Reduction::Mean, -100, 0.0)
}

/// An output key split into (kind, variant, smoothing): `loss_kdim/s=0.1` → (loss, kdim, 0.1).
fn parse_key(key: &str) -> (String, Option<String>, f64) {
    let (head, params) = key
        .split_once('/')
        .unwrap_or_else(|| panic!("output `{key}` has no `/s=<smoothing>` part"));
    let params = tessera_plugin_api::testing::golden::parse_params(params);
    let s = params
        .get("s")
        .unwrap_or_else(|| panic!("output `{key}` names no smoothing `s=`"))
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("output `{key}`: smoothing: {e}"));
    match head.split_once('_') {
        Some((what, variant)) => (what.to_owned(), Some(variant.to_owned()), s),
        None => (head.to_owned(), None, s),
    }
}

/// The (logits, target) inputs of a variant.
fn inputs<'g>(g: &'g Golden, variant: Option<&str>) -> (&'g Tensor, &'g Tensor) {
    let Some(v) = variant else {
        return (g.tensor("logits"), g.tensor("target"));
    };
    let pick = |candidates: &[String]| -> &'g Tensor {
        let name = candidates
            .iter()
            .find(|n| g.tensors.contains_key(n.as_str()))
            .unwrap_or_else(|| panic!("variant `{v}`: none of {candidates:?} is a golden tensor"));
        assert_eq!(g.role(name), "input", "{name} should be an input");
        g.tensor(name)
    };
    let logits = pick(&[format!("logits_{v}"), "logits".to_owned()]);
    let target = pick(&[format!("target_{v}"), format!("{v}_target")]);
    (logits, target)
}

#[test]
fn every_golden_output_is_reproduced() {
    let g = Golden::load(CASE);
    let outputs = g.names_with_role("output");
    assert!(!outputs.is_empty(), "the golden file has no outputs");
    let (mut smoothed, mut losses) = (0, 0);
    for key in &outputs {
        let (what, variant, s) = parse_key(key);
        let (logits, target) = inputs(&g, variant.as_deref());
        let ours = smooth_labels(logits, target, s)
            .unwrap_or_else(|e| panic!("{key}: smooth_labels failed: {e}"));
        assert_eq!(
            ours.kind(),
            Kind::Float,
            "{key}: smoothed targets are float32"
        );
        let want = g.tensor(key);
        match what.as_str() {
            "smoothed" => {
                assert_close(key, &ours, want, RTOL, ATOL);
                smoothed += 1;
            }
            "loss" => {
                assert_close(key, &soft_cross_entropy(logits, &ours), want, RTOL, ATOL);
                losses += 1;
            }
            other => panic!("{key}: unknown output kind `{other}` (expected smoothed or loss)"),
        }
    }
    eprintln!("checked {smoothed} smoothed-target and {losses} loss outputs");
    // Every smoothing value of the hyperparameters has both outputs for the plain case.
    let values = g.json["hyperparameters"]["smoothing_values"]
        .as_array()
        .expect("hyperparameters.smoothing_values");
    assert!(!values.is_empty());
    for v in values {
        let v = v.as_f64().expect("smoothing value");
        for what in ["smoothed", "loss"] {
            assert!(
                outputs.iter().any(|k| {
                    let (w, variant, s) = parse_key(k);
                    w == what && variant.is_none() && s == v
                }),
                "no `{what}/s={v}` output"
            );
        }
    }
    // The dense-target and (N, C, H, W) variants are there.
    for variant in ["dense", "kdim"] {
        assert!(
            outputs
                .iter()
                .any(|k| parse_key(k).1.as_deref() == Some(variant)),
            "no `_{variant}` output"
        );
    }
}

#[test]
fn loss_equals_torch_cross_entropy_with_label_smoothing() {
    // The JSON records that Composer's loss equals F.cross_entropy(label_smoothing=s).
    let g = Golden::load(CASE);
    let results = g.json["results"]["loss_equals_torch_cross_entropy_label_smoothing"]
        .as_object()
        .expect("results.loss_equals_torch_cross_entropy_label_smoothing");
    assert!(!results.is_empty());
    let (logits, target) = inputs(&g, None);
    for (s, equal) in results {
        if equal != true {
            continue;
        }
        let s: f64 = s.parse().expect("smoothing value");
        let ours = soft_cross_entropy(logits, &smooth_labels(logits, target, s).unwrap());
        let torch = logits.cross_entropy_loss::<Tensor>(target, None, Reduction::Mean, -100, s);
        assert_close(&format!("cross_entropy(s={s})"), &ours, &torch, 1e-6, 1e-6);
    }
}

#[test]
fn smoothed_rows_are_distributions_with_the_stated_bounds() {
    // Invariant: each smoothed row sums to 1; min s/C, max 1 − s + s/C (index targets).
    let g = Golden::load(CASE);
    for key in g.names_with_role("output") {
        let (what, variant, s) = parse_key(&key);
        if what != "smoothed" {
            continue;
        }
        let (logits, target) = inputs(&g, variant.as_deref());
        let sm = smooth_labels(logits, target, s).unwrap();
        let sums = sm.sum_dim_intlist(1, false, Kind::Double);
        assert_close(
            &format!("{key} row sums"),
            &sums,
            &sums.ones_like(),
            1e-6,
            0.0,
        );
        if target.size() != logits.size() {
            let c = logits.size()[1] as f64;
            let (lo, hi) = (s / c, 1.0 - s + s / c);
            let (min, max) = (sm.min().double_value(&[]), sm.max().double_value(&[]));
            assert!((min - lo).abs() <= 1e-6, "{key}: min {min} != s/C = {lo}");
            assert!(
                (max - hi).abs() <= 1e-6,
                "{key}: max {max} != 1-s+s/C = {hi}"
            );
        }
    }
}

#[test]
fn index_targets_follow_composers_one_hot() {
    // Composer's `_one_hot`: any integer kind; negative indices (ignore_index) give zero rows;
    // an index >= C, float index targets and mismatched ranks are errors.
    let logits = Tensor::zeros([3, 4], (Kind::Float, tessera_plugin_api::tch::Device::Cpu));
    let s = 0.2;
    let idx64 = Tensor::from_slice(&[2i64, -100, 0]);
    let sm = smooth_labels(&logits, &idx64, s).unwrap();
    let want = Tensor::from_slice(&[
        0.05f32, 0.05, 0.85, 0.05, //
        0.05, 0.05, 0.05, 0.05, //
        0.85, 0.05, 0.05, 0.05,
    ])
    .view([3, 4]);
    assert_close("negative index", &sm, &want, 1e-6, 1e-7);
    let idx32 = Tensor::from_slice(&[2i32, 1, 0]);
    let idx8 = Tensor::from_slice(&[2u8, 1, 0]);
    let base = smooth_labels(&logits, &idx32.to_kind(Kind::Int64), s).unwrap();
    assert!(smooth_labels(&logits, &idx32, s).unwrap().equal(&base));
    assert!(smooth_labels(&logits, &idx8, s).unwrap().equal(&base));
    assert!(smooth_labels(&logits, &Tensor::from_slice(&[4i64, 0, 0]), s).is_err());
    assert!(smooth_labels(&logits, &Tensor::from_slice(&[1.0f32, 0.0, 0.0]), s).is_err());
    assert!(smooth_labels(&logits, &Tensor::from_slice(&[1i64, 0]).view([1, 2]), s).is_err());
    assert!(smooth_labels(&Tensor::from_slice(&[1.0f32]), &idx64, s).is_err());
}

// ------------------------------------------------------------------------------------------
// The method, driven through its events
// ------------------------------------------------------------------------------------------

#[test]
fn hooks_are_before_and_after_loss() {
    assert_eq!(
        LabelSmoothing::hooks(),
        vec![Hook::at(Event::BEFORE_LOSS), Hook::at(Event::AFTER_LOSS)]
    );
    assert_eq!(LabelSmoothing::NAME, "label_smoothing");
}

#[test]
fn method_smooths_before_the_loss_and_restores_after() {
    let g = Golden::load(CASE);
    let mut checked = 0;
    for key in g.names_with_role("output") {
        let (what, variant, s) = parse_key(&key);
        if what != "smoothed" {
            continue;
        }
        let (logits, target) = inputs(&g, variant.as_deref());
        let mut method =
            boxed_method::<LabelSmoothing>(&settings(&format!(r#"{{"smoothing": {s}}}"#)))
                .unwrap_or_else(|e| panic!("smoothing {s}: {e}"));
        let mut host = TestHost::new(RandomSource::Seeded(0))
            .with(keys::OUTPUT, logits)
            .with(keys::TARGET, target);
        host.fire(&mut method, Event::BEFORE_LOSS).unwrap();
        assert_close(&key, host.get(keys::TARGET), g.tensor(&key), RTOL, ATOL);
        host.fire(&mut method, Event::AFTER_LOSS).unwrap();
        let restored = host.get(keys::TARGET);
        assert_eq!(restored.kind(), target.kind(), "{key}: restored kind");
        assert!(
            restored.equal(target),
            "{key}: the original target is restored"
        );
        // A second AFTER_LOSS without BEFORE_LOSS leaves the target alone.
        host.fire(&mut method, Event::AFTER_LOSS).unwrap();
        assert!(host.get(keys::TARGET).equal(target));
        assert_eq!(host.draws, 0, "label smoothing draws no random numbers");
        checked += 1;
    }
    assert!(checked > 0);
}

#[test]
fn defaults_match_default_settings_and_the_golden_case() {
    let g = Golden::load(CASE);
    let defaults = default_settings_json(LabelSmoothing::DEFAULT_SETTINGS);
    let smoothing = serde_json::from_str::<serde_json::Value>(&defaults).unwrap()["smoothing"]
        .as_f64()
        .expect("DEFAULT_SETTINGS sets `smoothing`");
    let (logits, target) = inputs(&g, None);
    let run = |json: &str| {
        let mut method = boxed_method::<LabelSmoothing>(&settings(json)).unwrap();
        let mut host = TestHost::new(RandomSource::Seeded(0))
            .with(keys::OUTPUT, logits)
            .with(keys::TARGET, target);
        host.fire(&mut method, Event::BEFORE_LOSS).unwrap();
        host.get(keys::TARGET).copy()
    };
    let empty = run("{}");
    assert!(
        empty.equal(&run(&defaults)),
        "empty settings = DEFAULT_SETTINGS"
    );
    assert!(
        empty.equal(&run("null")),
        "null settings = DEFAULT_SETTINGS"
    );
    assert!(empty.equal(&smooth_labels(logits, target, smoothing).unwrap()));
    if let Some(key) = g
        .names_with_role("output")
        .into_iter()
        .find(|k| parse_key(k) == ("smoothed".to_owned(), None, smoothing))
    {
        assert_close(&key, &empty, g.tensor(&key), RTOL, ATOL);
    }
}

#[test]
fn settings_are_validated() {
    for ok in [
        "{}",
        r#"{"smoothing": 0}"#,
        r#"{"smoothing": 1}"#,
        r#"{"smoothing": 0.5}"#,
    ] {
        LabelSmoothing::create(&settings_for::<LabelSmoothing>(ok))
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
        boxed_method::<LabelSmoothing>(&settings(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for (bad, needle) in [
        (r#"{"smoothing": -0.1}"#, "`smoothing` must be in [0, 1]"),
        (r#"{"smoothing": 1.5}"#, "`smoothing` must be in [0, 1]"),
        (r#"{"smoothing": "high"}"#, "`smoothing` must be a number"),
    ] {
        let err = LabelSmoothing::create(&settings_for::<LabelSmoothing>(bad))
            .err()
            .unwrap_or_else(|| panic!("{bad} was accepted"));
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{bad}: {err}");
        assert!(err.message().contains(needle), "{bad}: {err}");
    }
    // `create` reads only the keys it knows; the host-side wrapper then rejects the rest.
    let typo = settings_for::<LabelSmoothing>(r#"{"smoothing": 0.2, "smoothin": 0.3}"#);
    LabelSmoothing::create(&typo).expect("create ignores unknown keys");
    let err = typo.reject_unused().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CONFIG);
    assert!(err.message().contains("`smoothin`"), "{err}");
    let err = boxed_method::<LabelSmoothing>(&settings(r#"{"target_key": 1}"#))
        .err()
        .expect("unknown key accepted by the wrapper");
    assert!(err.message().contains("`target_key`"), "{err}");
}

#[test]
fn method_reports_missing_tensors() {
    let mut method = boxed_method::<LabelSmoothing>(&settings("{}")).unwrap();
    let logits = Tensor::zeros([2, 3], (Kind::Float, tessera_plugin_api::tch::Device::Cpu));
    let mut host = TestHost::new(RandomSource::Seeded(0)).with(keys::OUTPUT, &logits);
    let err = host.fire(&mut method, Event::BEFORE_LOSS).unwrap_err();
    assert!(err.contains("target"), "{err}");
    let mut method = boxed_method::<LabelSmoothing>(&settings("{}")).unwrap();
    let mut host =
        TestHost::new(RandomSource::Seeded(0)).with(keys::TARGET, &Tensor::from_slice(&[0i64, 1]));
    let err = host.fire(&mut method, Event::BEFORE_LOSS).unwrap_err();
    assert!(err.contains("output"), "{err}");
}
