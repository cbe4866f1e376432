//! WeightStandardization against Composer's golden case (`tests/golden/weight_standardization.*`):
//! a 3-conv net (`param/<index>.<name>`: conv 3×3, ReLU, conv 3×3 without bias, ReLU, conv 1×1),
//! rebuilt as a stand-in model from the golden weights, on which the plugin's own surgery
//! (`apply_weight_standardization`) runs for every `n_last_layers_ignore` the file has results
//! for (`results."ignore=N"`). The convs replaced, the count returned, each standardized weight
//! and the outputs must match Composer's; applying the surgery again must change nothing; the
//! replaced convs keep training their raw weights.

use std::collections::BTreeMap;

use tessera_plugin_api::kit::{ConvSpec, StandIn, SurgeryModel};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings};
use tessera_plugin_api::{boxed_method, ErrorKind, Plugin};
use weight_standardization::{
    apply_weight_standardization, plan, standardize_weight, StandardizedConv2d,
    WeightStandardization, CONV2D, WS_CONV2D,
};

const CASE: &str = "weight_standardization";
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-6;

/// The golden net as a module tree with its tensors, as the host would show it. Module
/// indices: a conv where the file has `param/<i>.weight`, a ReLU between.
fn build_net(g: &Golden) -> StandIn {
    let mut params = BTreeMap::new();
    for name in g.names_with_role("param") {
        params.insert(name["param/".len()..].to_owned(), g.tensor(&name).copy());
    }
    let last = params
        .keys()
        .filter_map(|k| k.split('.').next()?.parse::<usize>().ok())
        .max()
        .expect("golden parameters");
    let mut net = StandIn::new(0).module("", "sequential", &[], vec![]);
    for i in 0..=last {
        let path = i.to_string();
        match params.get(&format!("{path}.weight")) {
            Some(w) => {
                let s = w.size();
                let attrs = ConvSpec {
                    in_channels: s[1],
                    out_channels: s[0],
                    kernel_size: s[2],
                    stride: 1,
                    padding: s[2] / 2,
                    groups: 1,
                }
                .attrs();
                let attrs: Vec<(&str, f64)> = attrs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                let tensors: Vec<(&str, Tensor)> = ["weight", "bias"]
                    .into_iter()
                    .filter_map(|n| Some((n, params.get(&format!("{path}.{n}"))?.shallow_clone())))
                    .collect();
                net.add_module(&path, CONV2D, &attrs, tensors);
            }
            None => net.add_module(&path, "relu", &[], vec![]),
        }
    }
    net
}

/// The golden net's forward: ReLUs, plain convs over the model's tensors, and the
/// standardized convs the surgery put in.
fn forward(net: &StandIn, x: &Tensor) -> Tensor {
    let mut y = x.shallow_clone();
    for m in net.modules().unwrap().iter().filter(|m| !m.path.is_empty()) {
        let p = m.path.as_str();
        y = match m.kind.as_str() {
            "relu" => y.relu(),
            CONV2D => ConvSpec::of(m)
                .unwrap()
                .conv2d(
                    &y,
                    net.tensor(&format!("{p}.weight")).unwrap(),
                    net.tensor(&format!("{p}.bias")),
                )
                .unwrap(),
            WS_CONV2D => net
                .replaced_as::<StandardizedConv2d>(p)
                .unwrap()
                .run(&y)
                .unwrap(),
            kind => panic!("`{p}`: unexpected {kind}"),
        };
    }
    y
}

fn kinds(net: &StandIn) -> Vec<(String, String)> {
    net.modules()
        .unwrap()
        .iter()
        .filter(|m| !m.path.is_empty())
        .map(|m| (m.path.to_string(), m.kind.to_string()))
        .collect()
}

/// The standardized convs by module index.
fn standardized(net: &StandIn) -> Vec<(usize, &StandardizedConv2d)> {
    net.modules()
        .unwrap()
        .iter()
        .filter(|m| m.kind.as_str() == WS_CONV2D)
        .map(|m| {
            let p = m.path.as_str();
            (p.parse().unwrap(), net.replaced_as(p).unwrap())
        })
        .collect()
}

/// `(n_last_layers_ignore, its results entry)` for every `ignore=N` in the file.
fn cases(g: &Golden) -> Vec<(usize, serde_json::Value)> {
    let results = g.json["results"].as_object().expect("results");
    let out: Vec<(usize, serde_json::Value)> = results
        .iter()
        .map(|(k, v)| {
            let n = k
                .strip_prefix("ignore=")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("results key `{k}` is not ignore=N"));
            (n, v.clone())
        })
        .collect();
    assert!(out.len() >= 2, "{out:?}");
    out
}

#[test]
fn the_golden_net_is_rebuilt() {
    let g = Golden::load(CASE);
    let net = build_net(&g);
    let convs = kinds(&net).iter().filter(|(_, k)| k == CONV2D).count();
    assert_eq!(convs, 3);
    // Without surgery the net computes something else than either golden output.
    let plain = tch::no_grad(|| forward(&net, g.tensor("input")));
    let diff = (&plain - g.tensor("ignore=0/out"))
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff > 1e-2, "{diff}");
}

#[test]
fn surgery_reproduces_composer_for_every_n_last_layers_ignore() {
    let g = Golden::load(CASE);
    for (n, result) in cases(&g) {
        let mut net = build_net(&g);
        let originals: BTreeMap<String, Tensor> = net
            .tensors()
            .iter()
            .map(|(k, t)| (k.clone(), t.shallow_clone()))
            .collect();
        let outcome = apply_weight_standardization(&mut net, n).unwrap();
        assert_eq!(
            outcome.replaced as u64,
            result["returned_count"].as_u64().unwrap(),
            "ignore={n}"
        );
        assert_eq!(outcome.standardized, outcome.replaced);
        assert_eq!(outcome.convs, 3);
        let indices: Vec<usize> = standardized(&net).iter().map(|(i, _)| *i).collect();
        let want: Vec<usize> =
            serde_json::from_value(result["parametrized_module_indices"].clone()).unwrap();
        assert_eq!(indices, want, "ignore={n}: the convs standardized");
        for (i, conv) in standardized(&net) {
            let key = format!("ignore={n}/standardized_weight/{i}");
            assert_close(
                &key,
                &conv.standardized_weight().unwrap(),
                g.tensor(&key),
                RTOL,
                ATOL,
            );
        }
        // Every standardized weight the file has is one of ours.
        let prefix = format!("ignore={n}/standardized_weight/");
        let golden_count = g.tensors.keys().filter(|k| k.starts_with(&prefix)).count();
        assert_eq!(golden_count, indices.len());
        // The tensors keep their names and storage: the model's parameters are the same.
        assert_eq!(
            net.tensors().keys().collect::<Vec<_>>(),
            originals.keys().collect::<Vec<_>>()
        );
        for (name, t) in net.tensors() {
            assert_eq!(t.data_ptr(), originals[name].data_ptr(), "{name}");
        }
        let out = tch::no_grad(|| forward(&net, g.tensor("input")));
        let key = format!("ignore={n}/out");
        // Standardized weights make outputs of up to ~100: an element near zero carries the
        // rounding of that scale, so the absolute tolerance is relative to the largest output.
        let want = g.tensor(&key);
        let scale = want.abs().max().double_value(&[]).max(1.0);
        assert_close(&key, &out, want, RTOL, ATOL * scale);

        // Idempotent: applying it again replaces nothing and computes the same.
        let before = kinds(&net);
        let again = apply_weight_standardization(&mut net, n).unwrap();
        assert_eq!(again.replaced, 0, "ignore={n}");
        assert_eq!(again.standardized, outcome.standardized);
        assert_eq!(kinds(&net), before);
        let out2 = tch::no_grad(|| forward(&net, g.tensor("input")));
        assert_close(&key, &out2, &out, 0.0, 0.0);
    }
}

#[test]
fn plan_counts_standardized_convs_and_ignores_from_the_end() {
    let g = Golden::load(CASE);
    let mut net = build_net(&g);
    let modules = net.modules().unwrap();
    assert_eq!(plan(&modules, 0).replace, ["0", "2", "4"]);
    assert_eq!(plan(&modules, 2).replace, ["0"]);
    assert!(plan(&modules, 3).replace.is_empty());
    assert!(plan(&modules, 100).replace.is_empty());
    // After ignoring 1, a second application ignoring none standardizes the last conv only;
    // one ignoring 2 keeps the earlier standardized convs (nothing is undone).
    apply_weight_standardization(&mut net, 1).unwrap();
    let modules = net.modules().unwrap();
    assert_eq!(plan(&modules, 0).replace, ["4"]);
    let p = plan(&modules, 2);
    assert!(p.replace.is_empty());
    assert_eq!(p.standardized, 2);
    assert_eq!(
        modules
            .iter()
            .filter(|m| m.kind.as_str() == WS_CONV2D)
            .count(),
        2
    );
}

#[test]
fn standardized_weights_have_zero_mean_unit_variance_per_output_channel() {
    tch::manual_seed(1);
    let w = Tensor::randn([5, 3, 3, 3], (Kind::Float, Device::Cpu)) * 3.0 + 0.7;
    let s = standardize_weight(&w).unwrap();
    let dims: &[i64] = &[1, 2, 3];
    let mean = s.mean_dim(dims, false, Kind::Float);
    let var = s.var_correction(dims, 0, false);
    assert_close(
        "mean",
        &mean,
        &Tensor::zeros([5], (Kind::Float, Device::Cpu)),
        0.0,
        1e-6,
    );
    assert_close(
        "var",
        &var,
        &Tensor::ones([5], (Kind::Float, Device::Cpu)),
        1e-5,
        1e-5,
    );
}

#[test]
fn a_standardized_conv_trains_its_raw_weight() {
    // The gradient reaches the raw weight. As the standardization ignores a per-channel shift
    // and scale of the weight, the gradient sums to zero over each output channel and is
    // orthogonal to the centred weight; an SGD step changes the standardized weight.
    let g = Golden::load(CASE);
    let mut net = build_net(&g);
    apply_weight_standardization(&mut net, 0).unwrap();
    let params: Vec<(String, Tensor)> = net
        .tensors()
        .iter()
        .map(|(k, t)| (k.clone(), t.set_requires_grad(true)))
        .collect();
    forward(&net, g.tensor("input"))
        .square()
        .sum(Kind::Float)
        .backward();
    let dims: &[i64] = &[1, 2, 3];
    for (name, w) in params.iter().filter(|(n, _)| n.ends_with(".weight")) {
        let grad = w.grad();
        assert!(grad.defined(), "{name}: no gradient");
        let scale = grad.abs().max().double_value(&[]);
        assert!(scale > 0.0, "{name}: zero gradient");
        let sums = grad.sum_dim_intlist(dims, false, Kind::Float).abs().max();
        assert!(
            sums.double_value(&[]) <= 1e-4 * scale,
            "{name}: per-channel sums"
        );
        let centred = w - w.mean_dim(dims, true, Kind::Float);
        let dot = (&grad * &centred)
            .sum_dim_intlist(dims, false, Kind::Float)
            .abs()
            .max();
        assert!(
            dot.double_value(&[]) <= 1e-4 * scale,
            "{name}: radial component"
        );
    }
    let (_, conv) = standardized(&net)[0];
    let before = conv.standardized_weight().unwrap().detach();
    tch::no_grad(|| {
        for (_, w) in &params {
            let _ = w.shallow_clone().f_sub_(&(w.grad() * 0.5)).unwrap();
        }
    });
    let after = conv.standardized_weight().unwrap();
    let moved = (&after - &before).abs().max().double_value(&[]);
    assert!(
        moved > 1e-4,
        "the step did not change the standardized weight: {moved}"
    );
}

#[test]
fn settings_default_and_errors_name_the_setting() {
    let defaults = default_settings_json(WeightStandardization::DEFAULT_SETTINGS);
    assert!(boxed_method::<WeightStandardization>(&settings(&defaults)).is_ok());
    for (json, key) in [
        (r#"{"n_last_layers_ignore": -1}"#, "n_last_layers_ignore"),
        (r#"{"n_last_layers_ignore": 1.5}"#, "n_last_layers_ignore"),
        (r#"{"n_last_layers_ignore": "2"}"#, "n_last_layers_ignore"),
        (r#"{"n_last_layer_ignore": 2}"#, "n_last_layer_ignore"),
    ] {
        let err = boxed_method::<WeightStandardization>(&settings(json))
            .err()
            .unwrap_or_else(|| panic!("{json} accepted"));
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{json}");
        assert!(err.message().contains(key), "{json}: {}", err.message());
    }
    let m = WeightStandardization::create(&settings(r#"{"n_last_layers_ignore": 3}"#)).unwrap();
    assert_eq!(m.n_last_layers_ignore(), 3);
}
