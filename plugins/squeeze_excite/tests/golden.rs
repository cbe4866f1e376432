//! SqueezeExcite against Composer's outputs (`tests/golden/squeeze_excite.*`): the gate on
//! recorded weights, a four-conv net after surgery, and which convolutions four settings
//! change with which gate widths (the case's `results.surgery`, read generically).

use squeeze_excite::{
    apply_squeeze_excite, latent_size, squeeze_excite, targets, SqueezeExcite, KIND,
};
use tessera_plugin_api::kit::{default_init, StandIn, SurgeryModel};
use tessera_plugin_api::tch::{kind::FLOAT_CPU, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::settings;
use tessera_plugin_api::{boxed_method, Attribute, ErrorKind, ModuleInfo};

const CASE: &str = "squeeze_excite";

#[test]
fn the_gate_matches_composer() {
    let g = Golden::load(CASE);
    let out = squeeze_excite(
        g.tensor("se/input"),
        g.tensor("se/param/pool_and_mlp.2.weight"),
        g.tensor("se/param/pool_and_mlp.4.weight"),
    )
    .unwrap();
    assert_close("se/out", &out, g.tensor("se/out"), 1e-5, 1e-6);
}

/// The net's convolutions as the golden case names them: (name, in, out, kernel).
fn convs(g: &Golden) -> Vec<(String, i64, i64, i64)> {
    let mut out: Vec<(String, i64, i64, i64)> = g
        .entries()
        .keys()
        .filter_map(|k| k.strip_prefix("net/param/"))
        .filter(|k| k.ends_with(".weight") && !k.contains(".se."))
        .map(|k| {
            let name = k.split('.').next().unwrap_or_default().to_owned();
            let size = g.tensor(&format!("net/param/{k}")).size();
            (name, size[1], size[0], size[2])
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_net_after_surgery_matches_composer() {
    let g = Golden::load(CASE);
    let mut x = g.tensor("net/input").copy();
    for (name, _, _, k) in convs(&g) {
        let p = |rest: &str| -> Option<&Tensor> {
            let key = format!("net/param/{name}.{rest}");
            g.entries().contains_key(&key).then(|| g.tensor(&key))
        };
        let (w, b) = match p("weight") {
            Some(w) => (w, p("bias")),
            None => (p("conv.weight").unwrap(), p("conv.bias")),
        };
        x = x.conv2d(w, b, [1, 1], [k / 2, k / 2], [1, 1], 1);
        if let (Some(w1), Some(w2)) = (p("se.pool_and_mlp.2.weight"), p("se.pool_and_mlp.4.weight"))
        {
            x = squeeze_excite(&x, w1, w2).unwrap();
        }
    }
    assert_close("net/out", &x, g.tensor("net/out"), 1e-5, 1e-6);
}

fn conv_info(name: &str, cin: i64, cout: i64) -> ModuleInfo {
    let attr = |key: &str, value: i64| Attribute {
        key: key.into(),
        value: value as f64,
    };
    ModuleInfo {
        path: name.into(),
        kind: "conv2d".into(),
        attrs: vec![attr("in_channels", cin), attr("out_channels", cout)].into(),
        params: Vec::new().into(),
    }
}

#[test]
fn surgery_choices_match_every_recorded_setting() {
    let g = Golden::load(CASE);
    let modules: Vec<ModuleInfo> = convs(&g)
        .iter()
        .map(|(n, cin, cout, _)| conv_info(n, *cin, *cout))
        .collect();
    let surgery = g.json["results"]["surgery"].as_object().expect("surgery");
    assert!(surgery.len() >= 3);
    for (key, table) in surgery {
        let mut latent = None;
        let mut min = None;
        for part in key.split(',') {
            let (k, v) = part.split_once('=').expect("key=value");
            match k {
                "latent" => latent = v.parse::<f64>().ok(),
                "min_channels" => min = v.parse::<i64>().ok(),
                _ => panic!("{key}: unknown parameter {k}"),
            }
        }
        let chosen = targets(
            &modules,
            latent.expect("latent"),
            min.expect("min_channels"),
        );
        for (name, info) in table.as_object().expect("per conv") {
            let t = chosen.iter().find(|t| &t.path == name);
            match info["type"].as_str() {
                Some("SqueezeExciteConv2d") => {
                    let t = t.unwrap_or_else(|| panic!("{key}: `{name}` not chosen"));
                    assert_eq!(Some(t.latent), info["latent"].as_i64(), "{key} {name}");
                    assert_eq!(Some(t.out_channels), info["out_channels"].as_i64());
                    let fc1: Vec<i64> = serde_json::from_value(info["fc1"].clone()).unwrap();
                    assert_eq!(fc1, [t.latent, t.out_channels], "{key} {name}");
                }
                _ => assert!(t.is_none(), "{key}: `{name}` chosen"),
            }
        }
    }
    assert_eq!(latent_size(0.25, 32), 8);
    assert_eq!(latent_size(64.0, 32), 64);
}

#[test]
fn a_second_application_finds_nothing_and_settings_are_checked() {
    let mut modules = vec![conv_info("c", 16, 32)];
    modules.push(ModuleInfo {
        path: "d".into(),
        kind: "squeeze_excite_conv2d".into(),
        attrs: Vec::<Attribute>::new().into(),
        params: Vec::new().into(),
    });
    modules.push(conv_info("d.conv", 32, 32));
    let chosen: Vec<String> = targets(&modules, 0.25, 16)
        .into_iter()
        .map(|t| t.path)
        .collect();
    assert_eq!(chosen, ["c"]);
    assert!(boxed_method::<SqueezeExcite>(&settings("{}")).is_ok());
    for (bad, needle) in [
        (r#"{"latent_channels": 0}"#, "`latent_channels`"),
        (r#"{"min_channels": -1}"#, "min_channels"),
        (r#"{"latent": 4}"#, "latent"),
    ] {
        let err = match boxed_method::<SqueezeExcite>(&settings(bad)) {
            Ok(_) => panic!("{bad} accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{bad}: {err}");
        assert!(err.to_string().contains(needle), "{bad}: {err}");
    }
}

#[test]
fn the_surgery_wraps_each_chosen_conv_once_with_gates_from_the_stream() {
    let w = |shape: &[i64]| Tensor::ones(shape, FLOAT_CPU).set_requires_grad(true);
    let conv = |cin: i64, cout: i64| {
        let attrs = [("in_channels", cin as f64), ("out_channels", cout as f64)];
        (
            attrs,
            vec![("weight", w(&[cout, cin, 3, 3])), ("bias", w(&[cout]))],
        )
    };
    let (a1, t1) = conv(3, 16);
    let (a2, t2) = conv(16, 16);
    let mut model = StandIn::new(5)
        .module("", "sequential", &[], vec![])
        .module("stem", "conv2d", &a1, t1)
        .module("block", "sequential", &[], vec![])
        .module("block.conv", "conv2d", &a2, t2);
    let weight = model.tensor("block.conv.weight").unwrap().shallow_clone();
    let chosen = apply_squeeze_excite(&mut model, 0.25, 8).unwrap();
    let paths: Vec<&str> = chosen.iter().map(|t| t.path.as_str()).collect();
    assert_eq!(paths, ["block.conv"]);
    assert_eq!(model.kind("stem"), Some("conv2d"));
    assert_eq!(model.kind("block.conv"), Some(KIND));
    assert_eq!(model.kind("block.conv.conv"), Some("conv2d"));
    let info = model.info("block.conv").unwrap();
    assert_eq!(info.attr("latent_channels"), Some(4.0));
    let names: Vec<String> = model.tensors().keys().cloned().collect();
    assert_eq!(
        names,
        [
            "block.conv.conv.bias",
            "block.conv.conv.weight",
            "block.conv.se.pool_and_mlp.2.weight",
            "block.conv.se.pool_and_mlp.4.weight",
            "stem.bias",
            "stem.weight",
        ]
    );
    // The conv keeps its tensor; the gate's weights are trainable, drawn from the model's
    // stream: (latent, C) first, then (C, latent).
    let moved = model.tensor("block.conv.conv.weight").unwrap();
    assert_eq!(moved.data_ptr(), weight.data_ptr());
    let mut stream = StandIn::new(5);
    let mut uniform = || stream.uniform();
    let w1 = default_init(&[4, 16], 16, &mut uniform, FLOAT_CPU).unwrap();
    let w2 = default_init(&[16, 4], 4, &mut uniform, FLOAT_CPU).unwrap();
    for (name, want) in [("2", w1), ("4", w2)] {
        let name = format!("block.conv.se.pool_and_mlp.{name}.weight");
        assert!(model.tensor(&name).unwrap().equal(&want), "{name}");
        assert!(model.trainable(&name), "{name}");
    }
    assert!(model.wrapper("block.conv").is_some());
    // A second application changes nothing.
    let before = model.modules().unwrap();
    assert!(apply_squeeze_excite(&mut model, 0.25, 8)
        .unwrap()
        .is_empty());
    assert_eq!(model.modules().unwrap(), before);
    let after: Vec<String> = model.tensors().keys().cloned().collect();
    assert_eq!(after, names);
}
