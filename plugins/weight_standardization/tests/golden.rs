//! WeightStandardization against Composer's golden case (`tests/golden/weight_standardization.*`):
//! a 3-conv net (`param/<index>.<name>`: conv 3×3, ReLU, conv 3×3 without bias, ReLU, conv 1×1),
//! rebuilt as a stand-in model from the golden weights, on which the plugin's own surgery
//! (`apply_weight_standardization`) runs for every `n_last_layers_ignore` the file has results
//! for (`results."ignore=N"`). The convs replaced, the count returned, each standardized weight
//! and the outputs must match Composer's; applying the surgery again must change nothing; the
//! replaced convs keep training their raw weights.

use std::collections::BTreeMap;

use tessera_plugin_api::abi::{Attribute, ModuleInfo};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings};
use tessera_plugin_api::{boxed_method, Error, ErrorKind, Plugin};
use weight_standardization::{
    apply_weight_standardization, conv_spec, plan, standardize_weight, Model, StandardizedConv2d,
    WeightStandardization, CONV2D, WS_CONV2D,
};

const CASE: &str = "weight_standardization";
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-6;

enum Layer {
    Conv,
    Relu,
    Standardized(StandardizedConv2d),
}

struct Node {
    info: ModuleInfo,
    layer: Layer,
}

/// The golden net as a module tree with its tensors, as the host would show it.
struct FakeModel {
    nodes: Vec<Node>,
    params: BTreeMap<String, Tensor>,
}

fn info(path: &str, kind: &str, attrs: Vec<(String, f64)>, params: Vec<String>) -> ModuleInfo {
    ModuleInfo {
        path: path.into(),
        kind: kind.into(),
        attrs: attrs
            .into_iter()
            .map(|(key, value)| Attribute {
                key: key.into(),
                value,
            })
            .collect(),
        params: params.into_iter().map(Into::into).collect(),
    }
}

/// Module indices of the golden net: a conv where the file has `param/<i>.weight`, a ReLU
/// between.
fn build_net(g: &Golden) -> FakeModel {
    let mut params = BTreeMap::new();
    for name in g.names_with_role("param") {
        params.insert(name["param/".len()..].to_owned(), g.tensor(&name).copy());
    }
    let last = params
        .keys()
        .filter_map(|k| k.split('.').next()?.parse::<usize>().ok())
        .max()
        .expect("golden parameters");
    let mut nodes = Vec::new();
    for i in 0..=last {
        let path = i.to_string();
        let weight_name = format!("{path}.weight");
        let node = match params.get(&weight_name) {
            Some(w) => {
                let s = w.size();
                let names: Vec<String> = [weight_name.clone(), format!("{path}.bias")]
                    .into_iter()
                    .filter(|n| params.contains_key(n))
                    .collect();
                let attrs = [
                    ("in_channels", s[1]),
                    ("out_channels", s[0]),
                    ("kernel_size", s[2]),
                    ("stride", 1),
                    ("padding", s[2] / 2),
                    ("groups", 1),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v as f64))
                .collect();
                Node {
                    info: info(&path, CONV2D, attrs, names),
                    layer: Layer::Conv,
                }
            }
            None => Node {
                info: info(&path, "relu", vec![], vec![]),
                layer: Layer::Relu,
            },
        };
        nodes.push(node);
    }
    FakeModel { nodes, params }
}

impl FakeModel {
    fn forward(&self, x: &Tensor) -> Tensor {
        let mut y = x.shallow_clone();
        for n in &self.nodes {
            y = match &n.layer {
                Layer::Relu => y.relu(),
                Layer::Conv => {
                    let s = conv_spec(&n.info).unwrap();
                    let p = n.info.path.as_str();
                    y.conv2d(
                        &self.params[&format!("{p}.weight")],
                        self.params.get(&format!("{p}.bias")),
                        [s.stride, s.stride],
                        [s.padding, s.padding],
                        [1, 1],
                        s.groups,
                    )
                }
                Layer::Standardized(c) => c.run(&y).unwrap(),
            };
        }
        y
    }

    fn kinds(&self) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .map(|n| (n.info.path.to_string(), n.info.kind.to_string()))
            .collect()
    }

    fn standardized(&self) -> Vec<(usize, &StandardizedConv2d)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| match &n.layer {
                Layer::Standardized(c) => Some((i, c)),
                _ => None,
            })
            .collect()
    }
}

impl Model for FakeModel {
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        let root = info("", "sequential", vec![], vec![]);
        Ok(std::iter::once(root)
            .chain(self.nodes.iter().map(|n| n.info.clone()))
            .collect())
    }

    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error> {
        Ok(self.params.get(name).map(Tensor::shallow_clone))
    }

    fn replace(&mut self, path: &str, conv: StandardizedConv2d) -> Result<(), Error> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.info.path.as_str() == path)
            .ok_or_else(|| Error::new(ErrorKind::HOST, format!("no module `{path}`")))?;
        for old in node.info.params.iter() {
            self.params.remove(old.as_str());
        }
        let mut names = Vec::new();
        for (name, t) in conv.tensors() {
            let full = format!("{path}.{name}");
            assert!(
                self.params.insert(full.clone(), t).is_none(),
                "{full} twice"
            );
            names.push(full);
        }
        use tessera_plugin_api::Module;
        node.info = info(path, conv.kind(), conv.attrs(), names);
        node.layer = Layer::Standardized(conv);
        Ok(())
    }
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
    let convs = net.kinds().iter().filter(|(_, k)| k == CONV2D).count();
    assert_eq!(convs, 3);
    // Without surgery the net computes something else than either golden output.
    let plain = tch::no_grad(|| net.forward(g.tensor("input")));
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
            .params
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
        let indices: Vec<usize> = net.standardized().iter().map(|(i, _)| *i).collect();
        let want: Vec<usize> =
            serde_json::from_value(result["parametrized_module_indices"].clone()).unwrap();
        assert_eq!(indices, want, "ignore={n}: the convs standardized");
        for (i, conv) in net.standardized() {
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
            net.params.keys().collect::<Vec<_>>(),
            originals.keys().collect::<Vec<_>>()
        );
        for (name, t) in &net.params {
            assert_eq!(t.data_ptr(), originals[name].data_ptr(), "{name}");
        }
        let out = tch::no_grad(|| net.forward(g.tensor("input")));
        let key = format!("ignore={n}/out");
        // Standardized weights make outputs of up to ~100: an element near zero carries the
        // rounding of that scale, so the absolute tolerance is relative to the largest output.
        let want = g.tensor(&key);
        let scale = want.abs().max().double_value(&[]).max(1.0);
        assert_close(&key, &out, want, RTOL, ATOL * scale);

        // Idempotent: applying it again replaces nothing and computes the same.
        let kinds = net.kinds();
        let again = apply_weight_standardization(&mut net, n).unwrap();
        assert_eq!(again.replaced, 0, "ignore={n}");
        assert_eq!(again.standardized, outcome.standardized);
        assert_eq!(net.kinds(), kinds);
        let out2 = tch::no_grad(|| net.forward(g.tensor("input")));
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
        .params
        .iter()
        .map(|(k, t)| (k.clone(), t.set_requires_grad(true)))
        .collect();
    net.forward(g.tensor("input"))
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
    let (_, conv) = net.standardized()[0];
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
