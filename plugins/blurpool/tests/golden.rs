//! BlurPool against Composer's golden outputs (`tests/golden/blurpool.*`).
//!
//! Everything is read from the JSON and safetensors files: the filter, `blur_2d` at each stride
//! named in the tensor keys, the BlurMaxPool outputs (kernel/stride/padding read from the keys),
//! and the small net of `hyperparameters.net`, rebuilt from that description with the golden
//! weights as a stand-in model that the plugin's own surgery (`apply_blurpool`) operates on. The
//! replacement decisions, outputs, per-layer activations, filter buffers and strides must match
//! what Composer did. The surgery is then applied again to show it is idempotent.

use std::collections::BTreeMap;

use blurpool::{
    apply_blurpool, blur_2d, blur_max_pool2d, default_filter, plan, BlurLayer, BlurPool, Options,
    Replacement, BLUR_CONV2D, BLUR_MAX_POOL2D, METRIC_BLURCONV_LAYERS, METRIC_BLURPOOL_LAYERS,
};
use serde_json::Value;
use tessera_plugin_api::abi::ModuleInfo;
use tessera_plugin_api::kit::{StandIn, SurgeryModel};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings};
use tessera_plugin_api::testing::{RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, ErrorKind, Event, Hook, Plugin};

const CASE: &str = "blurpool";
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-6;

/// `letters digits` pairs of a key such as `k3s2p1` or `stride2`.
fn key_numbers(key: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let mut chars = key.chars().peekable();
    while chars.peek().is_some() {
        let name: String =
            std::iter::from_fn(|| chars.next_if(|c| c.is_ascii_alphabetic())).collect();
        let digits: String = std::iter::from_fn(|| chars.next_if(|c| c.is_ascii_digit())).collect();
        assert!(
            !name.is_empty() && !digits.is_empty(),
            "key `{key}` is not letters-digits pairs"
        );
        out.insert(name, digits.parse().expect("digits"));
    }
    out
}

#[test]
fn default_filter_matches() {
    let g = Golden::load(CASE);
    let want = g.tensor("filter");
    let got = default_filter(Kind::Float, Device::Cpu).unwrap();
    assert_close("filter", &got, want, 0.0, 0.0);
}

#[test]
fn blur_2d_matches_at_every_stride() {
    let g = Golden::load(CASE);
    let input = g.tensor("blur_2d/input");
    let filter = default_filter(Kind::Float, Device::Cpu).unwrap();
    let mut checked = 0;
    for name in g.names_with_role("output") {
        let Some(key) = name.strip_prefix("blur_2d/") else {
            continue;
        };
        let stride = key_numbers(key)["stride"];
        let got = blur_2d(input, stride, &filter).unwrap();
        assert_close(&name, &got, g.tensor(&name), RTOL, ATOL);
        // A filter already repeated over the channels gives the same result.
        let full = filter.repeat([input.size()[1], 1, 1, 1]);
        assert_close(
            &name,
            &blur_2d(input, stride, &full).unwrap(),
            &got,
            0.0,
            0.0,
        );
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} blur_2d outputs");
}

#[test]
fn blur_max_pool_matches() {
    let g = Golden::load(CASE);
    let input = g.tensor("blurmax/input");
    let filter = default_filter(Kind::Float, Device::Cpu).unwrap();
    let mut checked = 0;
    for name in g.names_with_role("output") {
        let Some(key) = name.strip_prefix("blurmax/") else {
            continue;
        };
        let p = key_numbers(key);
        let got = blur_max_pool2d(
            input,
            p["k"],
            p["s"],
            p.get("p").copied().unwrap_or(0),
            &filter,
        )
        .unwrap();
        assert_close(&name, &got, g.tensor(&name), RTOL, ATOL);
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} blurmax outputs");
}

#[test]
fn blur_2d_passes_empty_inputs_and_rejects_even_filters() {
    let filter = default_filter(Kind::Float, Device::Cpu).unwrap();
    // Composer returns the input when `H + 2·pad < kH`; with an odd filter and "same" padding
    // that means an empty side.
    let x = Tensor::zeros([1, 2, 0, 4], (Kind::Float, Device::Cpu));
    assert_eq!(blur_2d(&x, 2, &filter).unwrap().size(), x.size());
    let x = Tensor::randn([1, 2, 4, 4], (Kind::Float, Device::Cpu));
    let even = Tensor::ones([1, 1, 2, 2], (Kind::Float, Device::Cpu));
    assert!(blur_2d(&x, 1, &even).is_err());
    assert!(blur_2d(&x, 0, &filter).is_err());
    assert!(blur_2d(&x.view([2, 4, 4]), 1, &filter).is_err());
}

// ------------------------------------------------------------------------------------------
// The net of `hyperparameters.net`, as a stand-in model
// ------------------------------------------------------------------------------------------

/// One layer of the stand-in net, as the test runs it while the surgery leaves it in place.
enum Layer {
    Conv { stride: i64, padding: i64 },
    Relu,
    MaxPool { kernel: i64, stride: i64 },
}

/// A sequential net: its module tree and named tensors, like the host's, in a stand-in model
/// (which keeps the modules the surgery puts in), and its layers in order.
struct Net {
    model: StandIn,
    layers: Vec<(String, Layer)>,
}

fn attrs<'a>(pairs: &[(&'a str, i64)]) -> Vec<(&'a str, f64)> {
    pairs.iter().map(|(k, v)| (*k, *v as f64)).collect()
}

/// Parses `c1 Conv(3->16,k3,s2,p1); relu; ...; mp MaxPool2d(2); ...` and takes each conv's
/// weights from `net/param/<name>.weight|bias`. Unnamed layers get `_<index>` paths.
fn build_net(g: &Golden) -> Net {
    let text = g.json["hyperparameters"]["net"]
        .as_str()
        .expect("hyperparameters.net");
    let mut model = StandIn::new(0).module("", "sequential", &[], vec![]);
    let mut layers = Vec::new();
    for (i, item) in text.split(';').map(str::trim).enumerate() {
        let (name, spec) = match item.split_once(' ') {
            Some((n, s)) => (n.to_owned(), s.trim()),
            None => (format!("_{i}"), item),
        };
        let (op, args) = match spec.split_once('(') {
            Some((op, rest)) => (op, rest.trim_end_matches(')')),
            None => (spec, ""),
        };
        match op.to_ascii_lowercase().as_str() {
            "relu" => {
                model.add_module(&name, "relu", &[], vec![]);
                layers.push((name, Layer::Relu));
            }
            "conv" => {
                let mut parts = args.split(',');
                let (cin, cout) = parts
                    .next()
                    .and_then(|c| c.split_once("->"))
                    .unwrap_or_else(|| panic!("`{item}`: no channels"));
                let (cin, cout): (i64, i64) = (cin.parse().unwrap(), cout.parse().unwrap());
                let mut p: BTreeMap<String, i64> = BTreeMap::new();
                for part in parts {
                    p.extend(key_numbers(part.trim()));
                }
                let (k, s, pad) = (
                    p["k"],
                    p.get("s").copied().unwrap_or(1),
                    p.get("p").copied().unwrap_or(0),
                );
                let weight = g
                    .tensor(&format!("net/param/{name}.weight"))
                    .copy()
                    .set_requires_grad(true);
                assert_eq!(weight.size(), [cout, cin, k, k], "{item}");
                let bias = g
                    .tensors
                    .get(&format!("net/param/{name}.bias"))
                    .map(|t| t.copy().set_requires_grad(true));
                let tensors = std::iter::once(("weight", weight))
                    .chain(bias.map(|t| ("bias", t)))
                    .collect();
                model.add_module(
                    &name,
                    "conv2d",
                    &attrs(&[
                        ("in_channels", cin),
                        ("out_channels", cout),
                        ("kernel_size", k),
                        ("stride", s),
                        ("padding", pad),
                        ("groups", 1),
                    ]),
                    tensors,
                );
                layers.push((
                    name,
                    Layer::Conv {
                        stride: s,
                        padding: pad,
                    },
                ));
            }
            "maxpool2d" => {
                let mut nums = args.split(',').map(|a| a.trim().parse::<i64>().unwrap());
                let kernel = nums.next().unwrap_or_else(|| panic!("`{item}`: no kernel"));
                let stride = nums.next().unwrap_or(kernel); // nn.MaxPool2d's default
                model.add_module(
                    &name,
                    "max_pool2d",
                    &attrs(&[("kernel_size", kernel), ("stride", stride)]),
                    vec![],
                );
                layers.push((name, Layer::MaxPool { kernel, stride }));
            }
            other => panic!("unknown layer `{other}` in `{text}`"),
        }
    }
    Net { model, layers }
}

impl Net {
    /// Runs the net (a module the surgery put in runs in its layer's place); returns the output
    /// and every layer's output by path.
    fn forward(&self, x: &Tensor) -> (Tensor, BTreeMap<String, Tensor>) {
        let mut acts = BTreeMap::new();
        let mut x = x.shallow_clone();
        for (path, layer) in &self.layers {
            x = match (self.model.replaced(path), layer) {
                (Some(m), _) => m.forward(&x, false).unwrap(),
                (None, Layer::Conv { stride, padding }) => x.conv2d(
                    self.tensor(&format!("{path}.weight")),
                    self.model.tensor(&format!("{path}.bias")),
                    [*stride; 2],
                    [*padding; 2],
                    [1, 1],
                    1,
                ),
                (None, Layer::Relu) => x.relu(),
                (None, Layer::MaxPool { kernel, stride }) => {
                    x.max_pool2d([*kernel; 2], [*stride; 2], [0, 0], [1, 1], false)
                }
            };
            acts.insert(path.clone(), x.shallow_clone());
        }
        (x, acts)
    }

    /// The module tree below the root.
    fn nodes(&self) -> Vec<ModuleInfo> {
        let mut modules = self.model.modules().unwrap();
        modules.retain(|m| !m.path.is_empty());
        modules
    }

    fn node(&self, path: &str) -> &ModuleInfo {
        self.model
            .info(path)
            .unwrap_or_else(|| panic!("no module `{path}`"))
    }

    fn tensor(&self, name: &str) -> &Tensor {
        self.model
            .tensor(name)
            .unwrap_or_else(|| panic!("no tensor `{name}`"))
    }

    fn params(&self) -> &BTreeMap<String, Tensor> {
        self.model.tensors()
    }
}

/// Composer's class name for a module of the stand-in net.
fn composer_type(kind: &str) -> &'static str {
    match kind {
        "conv2d" => "Conv2d",
        "relu" => "ReLU",
        "max_pool2d" => "MaxPool2d",
        BLUR_CONV2D => "BlurConv2d",
        BLUR_MAX_POOL2D => "BlurMaxPool2d",
        other => panic!("unexpected kind {other}"),
    }
}

fn options(g: &Golden, blur_first: bool) -> Options {
    let hp = &g.json["hyperparameters"];
    Options {
        replace_convs: hp["replace_convs"].as_bool().expect("replace_convs"),
        replace_maxpools: hp["replace_maxpools"].as_bool().expect("replace_maxpools"),
        blur_first,
        min_channels: hp["min_channels"].as_i64().expect("min_channels"),
    }
}

/// `[s, s]` or `s` in the results' stride tables.
fn stride_value(v: &Value) -> i64 {
    match v {
        Value::Array(a) => {
            let s: Vec<i64> = a.iter().map(|x| x.as_i64().expect("stride")).collect();
            assert!(s.iter().all(|x| *x == s[0]), "non-square stride {v}");
            s[0]
        }
        other => other.as_i64().expect("stride"),
    }
}

#[test]
fn original_net_matches() {
    let g = Golden::load(CASE);
    let net = build_net(&g);
    let (out, _) = net.forward(g.tensor("net/input"));
    assert_close(
        "net/original_out",
        &out,
        g.tensor("net/original_out"),
        RTOL,
        ATOL,
    );
}

#[test]
fn surgery_reproduces_composer() {
    let g = Golden::load(CASE);
    let input = g.tensor("net/input");
    let types = g.json["results"]["module_types_after_surgery"]
        .as_object()
        .expect("results.module_types_after_surgery");
    assert!(!types.is_empty());
    for (tag, want_types) in types {
        let blur_first = match tag.as_str() {
            "blur_first" => true,
            "blur_last" => false,
            other => panic!("unknown surgery tag `{other}`"),
        };
        let opts = options(&g, blur_first);
        let mut net = build_net(&g);
        let before: Vec<ModuleInfo> = net.model.modules().unwrap();

        // The decisions, from the same function the plugin uses.
        let planned = plan(&before, &opts).unwrap();
        let outcome = apply_blurpool(&mut net.model, &opts).unwrap();
        assert_eq!(outcome.replaced(), planned.len(), "{tag}");
        let want_types = want_types.as_object().expect("types");
        let mut relus = 0;
        for n in &net.nodes() {
            let kind = n.kind.as_str();
            if kind == "relu" {
                relus += 1;
                continue;
            }
            let path = n.path.as_str();
            assert_eq!(
                want_types[path].as_str(),
                Some(composer_type(kind)),
                "{tag}: module {path}"
            );
            let was_planned = planned.iter().any(|(p, _)| p == path);
            assert_eq!(was_planned, kind.starts_with("blur_"), "{tag}: {path}");
        }
        assert_eq!(
            want_types.values().filter(|v| *v == "ReLU").count(),
            relus,
            "{tag}"
        );
        let count = |ty: &str| want_types.values().filter(|v| *v == ty).count();
        assert_eq!(outcome.num_blurconv_layers, count("BlurConv2d"), "{tag}");
        assert_eq!(outcome.num_blurpool_layers, count("BlurMaxPool2d"), "{tag}");
        assert_eq!(outcome.replaced_convs, count("BlurConv2d"), "{tag}");
        assert_eq!(outcome.replaced_maxpools, count("BlurMaxPool2d"), "{tag}");

        // Outputs and activations.
        let (out, acts) = tessera_plugin_api::tch::no_grad(|| net.forward(input));
        assert_close(
            &format!("{tag}/out"),
            &out,
            g.tensor(&format!("{tag}/out")),
            RTOL,
            ATOL,
        );
        let mut checked = 0;
        for name in g.entries().keys() {
            if let Some(layer) = name.strip_prefix(&format!("{tag}/act/")) {
                assert_close(name, &acts[layer], g.tensor(name), RTOL, ATOL);
                checked += 1;
            }
        }
        assert!(checked >= 3, "{tag}: {checked} activations");

        // Filter buffers, strides, copied weights, as the model sees them.
        let strides = g.json["results"][format!("{tag}_strides")]
            .as_object()
            .unwrap_or_else(|| panic!("results.{tag}_strides"));
        for (path, s) in strides {
            let node = net.node(path);
            let Some(BlurLayer::Conv(m)) = net.model.replaced_as::<BlurLayer>(path) else {
                panic!("{tag}: {path} is not a blur conv");
            };
            let attr = |k: &str| {
                node.attrs
                    .iter()
                    .find(|a| a.key.as_str() == k)
                    .map(|a| a.value as i64)
                    .unwrap_or_else(|| panic!("{path}: no attr {k}"))
            };
            assert_eq!(
                attr("conv_stride"),
                stride_value(&s["conv_stride"]),
                "{tag} {path}"
            );
            assert_eq!(
                attr("blur_stride"),
                stride_value(&s["blur_stride"]),
                "{tag} {path}"
            );
            assert_eq!(m.blur_first, blur_first);

            let filter = net.tensor(&format!("{path}.blur_filter"));
            assert!(!filter.requires_grad(), "{path}.blur_filter is a buffer");
            let want = g.tensor(&format!("{tag}/{path}.blur_filter"));
            assert_close(&format!("{tag}/{path}.blur_filter"), filter, want, 0.0, 0.0);

            for p in ["weight", "bias"] {
                let orig = g.tensor(&format!("net/param/{path}.{p}"));
                let t = net.tensor(&format!("{path}.conv.{p}"));
                assert!(t.requires_grad(), "{path}.conv.{p} is trainable");
                assert!(t.is_leaf(), "{path}.conv.{p} is a leaf");
                assert_close(&format!("{path}.conv.{p}"), t, orig, 0.0, 0.0);
                assert!(
                    !net.params().contains_key(&format!("{path}.{p}")),
                    "{path}.{p} left"
                );
            }
        }
        // Every replaced max-pool registered its filter buffer.
        for n in &net.nodes() {
            if n.kind.as_str() == BLUR_MAX_POOL2D {
                let f = net.tensor(&format!("{}.filt2d", n.path));
                assert_close("filt2d", f, g.tensor("filter"), 0.0, 0.0);
                assert!(!f.requires_grad());
            }
        }

        // Idempotence: a second application finds nothing and changes nothing.
        let names_before: Vec<String> = net.params().keys().cloned().collect();
        let ptrs_before: Vec<usize> = net
            .params()
            .values()
            .map(|t| t.data_ptr() as usize)
            .collect();
        let tree_before = net.model.modules().unwrap();
        assert!(plan(&tree_before, &opts).unwrap().is_empty(), "{tag}");
        let again = apply_blurpool(&mut net.model, &opts).unwrap();
        assert_eq!(again.replaced(), 0, "{tag}");
        assert_eq!(again.num_blurconv_layers, outcome.num_blurconv_layers);
        assert_eq!(again.num_blurpool_layers, outcome.num_blurpool_layers);
        assert_eq!(
            net.model.modules().unwrap(),
            tree_before,
            "{tag}: tree changed"
        );
        assert_eq!(
            net.params().keys().cloned().collect::<Vec<_>>(),
            names_before
        );
        assert_eq!(
            net.params()
                .values()
                .map(|t| t.data_ptr() as usize)
                .collect::<Vec<_>>(),
            ptrs_before
        );
        let (out2, _) = tessera_plugin_api::tch::no_grad(|| net.forward(input));
        assert_close(&format!("{tag}/out again"), &out2, &out, 0.0, 0.0);
    }
}

#[test]
fn min_channels_and_switches_drive_the_decisions() {
    let g = Golden::load(CASE);
    let tree = build_net(&g).model.modules().unwrap();
    let convs = |o: &Options| {
        plan(&tree, o)
            .unwrap()
            .iter()
            .filter(|(_, r)| matches!(r, Replacement::Conv(_)))
            .count()
    };
    let pools = |o: &Options| {
        plan(&tree, o)
            .unwrap()
            .iter()
            .filter(|(_, r)| matches!(r, Replacement::MaxPool { .. }))
            .count()
    };
    let base = options(&g, true);
    // With min_channels 0 every strided conv is replaced (also the 3-channel stem).
    let strided = tree
        .iter()
        .filter(|m| m.kind.as_str() == "conv2d")
        .filter(|m| {
            m.attrs
                .iter()
                .any(|a| a.key.as_str() == "stride" && a.value > 1.0)
        })
        .count();
    assert!(
        convs(&Options {
            min_channels: 0,
            ..base
        }) == strided
    );
    assert!(convs(&base) < strided, "min_channels keeps the stem");
    assert_eq!(
        convs(&Options {
            min_channels: i64::MAX,
            ..base
        }),
        0
    );
    assert_eq!(
        convs(&Options {
            replace_convs: false,
            ..base
        }),
        0
    );
    assert_eq!(
        pools(&Options {
            replace_maxpools: false,
            ..base
        }),
        0
    );
    assert!(pools(&base) > 0);
}

#[test]
fn blur_conv_trains_its_copied_weights() {
    let g = Golden::load(CASE);
    let mut net = build_net(&g);
    apply_blurpool(&mut net.model, &options(&g, true)).unwrap();
    let (out, _) = net.forward(g.tensor("net/input"));
    out.sum(Kind::Float).backward();
    let mut trained = 0;
    for (name, t) in net.params() {
        if name.contains(".conv.") {
            let grad = t.grad();
            assert!(grad.defined(), "{name} has no gradient");
            assert!(
                grad.abs().sum(Kind::Float).double_value(&[]) > 0.0,
                "{name}"
            );
            trained += 1;
        }
        if name.ends_with("blur_filter") || name.ends_with("filt2d") {
            assert!(!t.grad().defined(), "{name} is a buffer");
        }
    }
    assert!(trained >= 2);
}

// ------------------------------------------------------------------------------------------
// The method through the ABI
// ------------------------------------------------------------------------------------------

#[test]
fn plugin_description() {
    assert_eq!(BlurPool::NAME, "blurpool");
    assert_eq!(BlurPool::hooks(), vec![Hook::at(Event::INIT)]);
    let defaults = default_settings_json(BlurPool::DEFAULT_SETTINGS);
    let m = BlurPool::create(&settings(&defaults)).unwrap();
    assert_eq!(*m.options(), Options::default());
    let m = BlurPool::create(&settings("{}")).unwrap();
    assert_eq!(*m.options(), Options::default());
}

#[test]
fn bad_settings_name_the_setting() {
    for (json, key) in [
        (r#"{"blur_first": 1}"#, "blur_first"),
        (r#"{"min_channels": -1}"#, "min_channels"),
        (r#"{"replace_convs": "yes"}"#, "replace_convs"),
        (r#"{"min_chanels": 4}"#, "min_chanels"),
    ] {
        let err = match boxed_method::<BlurPool>(&settings(json)) {
            Ok(_) => panic!("{json} accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{json}: {err}");
        assert!(err.message().contains(key), "{json}: {err}");
    }
}

#[test]
fn method_logs_zero_counts_on_a_model_without_candidates() {
    // The test host's model tree is empty: nothing to replace, a warning, zero counts.
    let mut method = boxed_method::<BlurPool>(&settings("{}")).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(0));
    host.fire(&mut method, Event::INIT).unwrap();
    host.fire(&mut method, Event::INIT).unwrap();
    let want = [
        (METRIC_BLURPOOL_LAYERS.to_owned(), 0.0),
        (METRIC_BLURCONV_LAYERS.to_owned(), 0.0),
    ];
    assert_eq!(host.metrics, [want.clone(), want].concat());
}
