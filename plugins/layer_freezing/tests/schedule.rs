//! Properties of the schedule and of the layer list, and the settings.

use layer_freezing::{freeze_depth, freeze_schedule, layers, LayerFreezing};
use tessera_plugin_api::abi::{ModuleInfo, ParamInfo};
use tessera_plugin_api::testing::{default_settings_json, settings};
use tessera_plugin_api::{boxed_method, ErrorKind, Event, Hook, Plugin};

#[test]
fn the_depth_grows_with_time_and_never_reaches_the_last_layer() {
    for &(start, level) in &[(0.5, 1.0), (0.0, 1.0), (0.2, 0.8), (0.9, 0.3), (1.0, 1.0)] {
        for n in 0..12usize {
            let mut previous = 0;
            for step in 0..=1000 {
                let t = f64::from(step) / 1000.0;
                let pct = freeze_schedule(t, start, level);
                assert!((0.0..=level).contains(&pct), "{pct} at {t}");
                if t <= start {
                    assert_eq!(pct, 0.0);
                }
                let depth = freeze_depth(pct, n);
                assert!(depth >= previous, "start {start} level {level} n {n} t {t}");
                assert!(depth < n.max(1), "the last layer is never frozen");
                previous = depth;
            }
            if level == 1.0 && start < 1.0 && n > 0 {
                assert_eq!(previous, n - 1, "everything but the last at the end");
            }
        }
    }
}

#[test]
fn the_depth_truncates_as_python_int() {
    // (0.6 - 0.5) / 0.5 = 0.19999999999999996 in floating point: int(0.99999...) = 0.
    let pct = freeze_schedule(0.6, 0.5, 1.0);
    assert_eq!(pct, 0.19999999999999996);
    assert_eq!(freeze_depth(pct, 6), 0);
    assert_eq!(freeze_depth(0.2, 6), 1);
    assert_eq!(freeze_depth(5.0, 6), 5, "capped below the last layer");
    assert_eq!(freeze_depth(-1.0, 6), 0);
}

fn node(path: &str, tensors: &[&str]) -> ModuleInfo {
    ModuleInfo {
        path: path.into(),
        kind: "any".into(),
        attrs: Default::default(),
        params: tensors.iter().map(|t| (*t).into()).collect(),
    }
}

fn param(name: &str, buffer: bool, trainable: bool) -> ParamInfo {
    ParamInfo {
        name: name.into(),
        shape: Default::default(),
        buffer,
        trainable,
    }
}

#[test]
fn layers_are_leaves_with_parameters_frozen_or_not() {
    let modules = [
        node("", &[]),
        // A module with its own tensor and children: not a layer (Composer recurses into it).
        node("stem", &["stem.scale"]),
        node("stem.conv", &["stem.conv.weight"]),
        node("stem.pool", &[]),
        // A leaf with only buffers: not a layer.
        node("stats", &["stats.count"]),
        node("stemmed", &["stemmed.weight"]),
        node("head", &["head.weight", "head.bias"]),
    ];
    let params = [
        param("stem.scale", false, true),
        param("stem.conv.weight", false, false),
        param("stats.count", true, false),
        param("stemmed.weight", false, true),
        param("head.weight", false, true),
        param("head.bias", false, true),
    ];
    let got: Vec<(String, Vec<String>)> = layers(&modules, &params)
        .into_iter()
        .map(|l| (l.path, l.params))
        .collect();
    let want: Vec<(String, Vec<String>)> = vec![
        ("stem.conv".into(), vec!["stem.conv.weight".into()]),
        // `stemmed` shares a prefix with `stem` but is not below it.
        ("stemmed".into(), vec!["stemmed.weight".into()]),
        (
            "head".into(),
            vec!["head.weight".into(), "head.bias".into()],
        ),
    ];
    assert_eq!(got, want);
    // A model that is one module.
    let single = [node("", &["w"])];
    assert_eq!(layers(&single, &[param("w", false, true)]).len(), 1);
}

#[test]
fn settings_defaults_and_errors() {
    let m = LayerFreezing::create(&settings(&default_settings_json(
        LayerFreezing::DEFAULT_SETTINGS,
    )))
    .unwrap();
    assert_eq!(
        m,
        LayerFreezing {
            freeze_start: 0.5,
            freeze_level: 1.0
        }
    );
    assert_eq!(LayerFreezing::create(&settings("{}")).unwrap(), m);
    for (json, key) in [
        (r#"{"freeze_start": 1.5}"#, "freeze_start"),
        (r#"{"freeze_start": -0.1}"#, "freeze_start"),
        (r#"{"freeze_level": 2}"#, "freeze_level"),
        (r#"{"freeze_level": "all"}"#, "freeze_level"),
        (r#"{"freeze_depth": 2}"#, "freeze_depth"),
    ] {
        let e = boxed_method::<LayerFreezing>(&settings(json))
            .err()
            .unwrap_or_else(|| panic!("{json} accepted"));
        assert_eq!(e.kind(), ErrorKind::CONFIG, "{json}");
        assert!(e.message().contains(key), "{json}: {}", e.message());
    }
    assert_eq!(LayerFreezing::hooks(), vec![Hook::at(Event::EPOCH_END)]);
}
