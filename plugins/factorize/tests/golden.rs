//! Factorize against Composer's golden case (`shared/golden/factorize.*`).
//!
//! - Surgery: the golden net (`net/param/<layer>.weight`: three convs, three linear layers) is
//!   rebuilt as a stand-in module tree; for every settings case of `results.surgery` the
//!   plugin's own `apply_factorization` must make Composer's decision for every layer (latent
//!   size, max rank, wide enough, could speed up, replaced or not) with Composer's tensor names
//!   and shapes; with the golden's freshly initialised weights loaded into our modules the net
//!   must compute `<case>/out`; a second application changes nothing.
//! - Solvers: every `factorize_matrix` and `factorize_conv2d` result of the file (`Wa·Wb`, the
//!   bias, `ŷ`, both nmse values, `Wa`/`Wb` up to the sign of each latent column).
//! - `set_rank` on a factorized linear layer and conv: weights and outputs after.

use std::collections::BTreeMap;

use factorize::{
    apply_factorization, factorize_conv2d, factorize_matrix, max_rank, plan, ConvGeometry,
    ConvSpec, Factorize, FactorizeSettings, Factorized, FactorizedConv2d, FactorizedLinear,
    LowRankSolution, Model, CONV2D, DEFAULT_N_ITERS, FACTORIZED_CONV2D, FACTORIZED_LINEAR, LINEAR,
};
use serde_json::Value;
use tessera_plugin_api::abi::{Attribute, ModuleInfo};
use tessera_plugin_api::tch::{self, Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, parse_params, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings, splitmix64};
use tessera_plugin_api::{boxed_method, Error, ErrorKind, Module, Plugin};

const CASE: &str = "factorize";
/// Solutions: least squares and SVD in another libtorch/LAPACK build (golden quirk 18).
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-5;

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

enum Layer {
    Plain,
    Factorized(Factorized),
}

struct Node {
    info: ModuleInfo,
    layer: Layer,
}

/// The golden net as a module tree with its tensors, as the host would show it.
struct FakeModel {
    nodes: Vec<Node>,
    params: BTreeMap<String, Tensor>,
    rng: u64,
}

/// Layers of the golden net in order: a conv where `net/param/<layer>.weight` is 4-d, a linear
/// layer where it is 2-d (`hyperparameters.net`: ReLU after every layer but the last conv,
/// which is averaged over H and W, and the last linear layer).
fn build_net(g: &Golden) -> FakeModel {
    let mut params = BTreeMap::new();
    for name in g.names_with_role("param") {
        if let Some(rest) = name.strip_prefix("net/param/") {
            params.insert(rest.to_owned(), g.tensor(&name).copy());
        }
    }
    let mut nodes = Vec::new();
    let mut layers: Vec<&String> = params.keys().filter(|k| k.ends_with(".weight")).collect();
    // Convs before linear layers, each in name order (conv_a, conv_b, ...): the net's order.
    layers.sort_by_key(|k| (params[*k].dim() != 4, (*k).clone()));
    for weight_name in layers {
        let path = weight_name.trim_end_matches(".weight").to_owned();
        let s = params[weight_name].size();
        let names: Vec<String> = [weight_name.clone(), format!("{path}.bias")]
            .into_iter()
            .filter(|n| params.contains_key(n))
            .collect();
        let (kind, attrs): (&str, Vec<(&str, i64)>) = if s.len() == 4 {
            let attrs = vec![
                ("in_channels", s[1]),
                ("out_channels", s[0]),
                ("kernel_size", s[2]),
                ("stride", 1),
                ("padding", s[2] / 2),
                ("groups", 1),
            ];
            (CONV2D, attrs)
        } else {
            (LINEAR, vec![("in_features", s[1]), ("out_features", s[0])])
        };
        let attrs = attrs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v as f64))
            .collect();
        nodes.push(Node {
            info: info(&path, kind, attrs, names),
            layer: Layer::Plain,
        });
    }
    FakeModel {
        nodes,
        params,
        rng: 7,
    }
}

impl FakeModel {
    fn forward(&self, x: &Tensor) -> Tensor {
        let last_conv = self
            .nodes
            .iter()
            .rposition(|n| matches!(n.info.kind.as_str(), CONV2D | FACTORIZED_CONV2D))
            .unwrap();
        let mut y = x.shallow_clone();
        for (i, n) in self.nodes.iter().enumerate() {
            let p = n.info.path.as_str();
            y = match &n.layer {
                Layer::Factorized(m) => m.forward(&y, false).unwrap(),
                Layer::Plain if n.info.kind.as_str() == CONV2D => {
                    let s = factorize::conv_spec(&n.info).unwrap();
                    y.conv2d(
                        &self.params[&format!("{p}.weight")],
                        self.params.get(&format!("{p}.bias")),
                        [s.stride, s.stride],
                        [s.padding, s.padding],
                        [1, 1],
                        s.groups,
                    )
                }
                Layer::Plain => y.linear(
                    &self.params[&format!("{p}.weight")],
                    self.params.get(&format!("{p}.bias")),
                ),
            };
            y = if i == last_conv {
                y.mean_dim(&[2i64, 3][..], false, Kind::Float)
            } else if i + 1 < self.nodes.len() {
                y.relu()
            } else {
                y
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
}

impl Model for FakeModel {
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        let root = info("", "factor_net", vec![], vec![]);
        Ok(std::iter::once(root)
            .chain(self.nodes.iter().map(|n| n.info.clone()))
            .collect())
    }

    fn parameter(&self, name: &str) -> Result<Option<Tensor>, Error> {
        Ok(self.params.get(name).map(Tensor::shallow_clone))
    }

    fn uniform(&mut self) -> f64 {
        (splitmix64(&mut self.rng) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn replace(&mut self, path: &str, module: Factorized) -> Result<(), Error> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.info.path.as_str() == path)
            .ok_or_else(|| Error::new(ErrorKind::HOST, format!("no module `{path}`")))?;
        for old in node.info.params.iter() {
            self.params.remove(old.as_str());
        }
        let mut names = Vec::new();
        for (name, t) in module.tensors() {
            let full = format!("{path}.{name}");
            assert!(
                self.params.insert(full.clone(), t).is_none(),
                "{full} twice"
            );
            names.push(full);
        }
        node.info = info(path, module.kind(), module.attrs(), names);
        node.layer = Layer::Factorized(module);
        Ok(())
    }
}

fn settings_of(kwargs: &Value) -> FactorizeSettings {
    let num = |k: &str| kwargs[k].as_f64().unwrap_or_else(|| panic!("kwargs.{k}"));
    FactorizeSettings {
        min_channels: num("min_channels") as i64,
        latent_channels: num("latent_channels"),
        min_features: num("min_features") as i64,
        latent_features: num("latent_features"),
        ..FactorizeSettings::default()
    }
}

fn surgery_cases(g: &Golden) -> Vec<(String, Value)> {
    let cases: Vec<(String, Value)> = g.json["results"]["surgery"]
        .as_object()
        .expect("results.surgery")
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert!(cases.len() >= 2);
    cases
}

#[test]
fn surgery_decides_like_composer_for_every_settings_case() {
    let g = Golden::load(CASE);
    for (case, result) in surgery_cases(&g) {
        let mut net = build_net(&g);
        let s = settings_of(&result["kwargs"]);
        let outcome = apply_factorization(&mut net, &s).unwrap();
        let modules = result["modules"].as_object().unwrap();
        assert_eq!(outcome.decisions.len(), modules.len(), "{case}");
        for d in &outcome.decisions {
            let want = &modules[&d.path];
            let what = format!("{case} {}", d.path);
            assert_eq!(d.latent, want["latent"].as_i64().unwrap(), "{what}: latent");
            assert_eq!(
                d.max_rank,
                want["max_rank"].as_i64().unwrap(),
                "{what}: max_rank"
            );
            assert_eq!(
                d.wide_enough,
                want["wide_enough"].as_bool().unwrap(),
                "{what}"
            );
            assert_eq!(
                d.could_speedup,
                want["could_speedup"].as_bool().unwrap(),
                "{what}"
            );
            let factorized = want["type"].as_str().unwrap().starts_with("Factorized");
            assert_eq!(d.factorize(), factorized, "{what}: replaced");
            let node = net
                .nodes
                .iter()
                .find(|n| n.info.path.as_str() == d.path)
                .unwrap();
            let kind = node.info.kind.as_str();
            if !factorized {
                assert_eq!(kind, d.kind, "{what}");
                continue;
            }
            assert_eq!(
                kind,
                if d.kind == CONV2D {
                    FACTORIZED_CONV2D
                } else {
                    FACTORIZED_LINEAR
                }
            );
            for (leaf, key) in [
                ("module0.weight", "module0_weight"),
                ("module1.weight", "module1_weight"),
                ("module1.bias", "module1_bias"),
            ] {
                let shape: Vec<i64> = serde_json::from_value(want[key].clone()).unwrap();
                let t = &net.params[&format!("{}.{leaf}", d.path)];
                assert_eq!(t.size(), shape, "{what}: {leaf}");
                assert!(t.requires_grad(), "{what}: {leaf} is trainable");
            }
            assert!(want["module0_bias"].is_null());
            assert!(!net.params.contains_key(&format!("{}.module0.bias", d.path)));
            assert!(!net.params.contains_key(&format!("{}.weight", d.path)));
        }
        let replaced = outcome.convs_replaced + outcome.linears_replaced;
        assert_eq!(outcome.factorized_convs, outcome.convs_replaced);
        assert_eq!(outcome.factorized_linears, outcome.linears_replaced);
        // The tensors registered are exactly the golden's `<case>/param/*` (Composer's names).
        let prefix = format!("{case}/param/");
        let golden_names: Vec<String> = g
            .tensors
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
            .collect();
        let ours: Vec<String> = net
            .params
            .keys()
            .filter(|k| k.contains(".module"))
            .cloned()
            .collect();
        assert_eq!(ours, golden_names, "{case}: factorized tensors");
        assert_eq!(golden_names.len(), 3 * replaced, "{case}");

        // Fresh weights: PyTorch's default bound, 1/sqrt(fan_in).
        for (name, t) in net.params.iter().filter(|(k, _)| k.contains(".module")) {
            let fan_in = if name.contains("module1.") {
                let w = &net.params[&name.replace("module1.bias", "module1.weight")];
                w.size()[1]
            } else {
                t.size()[1..].iter().product()
            };
            let bound = 1.0 / (fan_in as f64).sqrt();
            let max = t.abs().max().double_value(&[]);
            assert!(
                max <= bound + 1e-7 && max > 0.5 * bound,
                "{name}: max {max}, bound {bound}"
            );
        }

        // Composer's recorded weights in our modules give Composer's output.
        tch::no_grad(|| {
            for leaf in &golden_names {
                net.params[leaf]
                    .shallow_clone()
                    .copy_(g.tensor(&format!("{prefix}{leaf}")));
            }
        });
        let out = tch::no_grad(|| net.forward(g.tensor("net/input")));
        let key = format!("{case}/out");
        assert_close(&key, &out, g.tensor(&key), 1e-5, 1e-6);
        if replaced == 0 {
            // Nothing replaced: Composer's output is the original net's.
            assert_close(&key, g.tensor(&key), g.tensor("net/original_out"), 0.0, 0.0);
        }

        // Idempotent: a second application replaces nothing.
        let kinds = net.kinds();
        let again = apply_factorization(&mut net, &s).unwrap();
        assert_eq!(
            (again.convs_replaced, again.linears_replaced),
            (0, 0),
            "{case}"
        );
        assert_eq!(again.factorized_convs, outcome.factorized_convs);
        assert_eq!(again.factorized_linears, outcome.factorized_linears);
        assert_eq!(net.kinds(), kinds);
        let out2 = tch::no_grad(|| net.forward(g.tensor("net/input")));
        assert_close(&key, &out2, &out, 0.0, 0.0);
    }
}

#[test]
fn the_functional_defaults_are_composers_and_convs_or_linears_can_be_left_alone() {
    let g = Golden::load(CASE);
    let results = &g.json["results"]["surgery"];
    let defaults_case = results
        .as_object()
        .unwrap()
        .iter()
        .find(|(k, _)| g.json["hyperparameters"]["settings"][k.as_str()] == serde_json::json!({}))
        .map(|(_, v)| v.clone())
        .expect("a case with apply_factorization's defaults");
    assert_eq!(
        settings_of(&defaults_case["kwargs"]),
        FactorizeSettings::functional_defaults()
    );

    let net = build_net(&g);
    let modules = net.modules().unwrap();
    let (_, first) = surgery_cases(&g).into_iter().next().unwrap();
    let s = settings_of(&first["kwargs"]);
    let all = plan(&modules, &s).unwrap();
    let convs_only = plan(
        &modules,
        &FactorizeSettings {
            factorize_linears: false,
            ..s
        },
    )
    .unwrap();
    let linears_only = plan(
        &modules,
        &FactorizeSettings {
            factorize_convs: false,
            ..s
        },
    )
    .unwrap();
    assert!(convs_only.iter().all(|d| d.kind == CONV2D) && !convs_only.is_empty());
    assert!(linears_only.iter().all(|d| d.kind == LINEAR) && !linears_only.is_empty());
    assert_eq!(convs_only.len() + linears_only.len(), all.len());
}

#[test]
fn fresh_weights_come_from_the_seeded_stream() {
    let g = Golden::load(CASE);
    let (_, first) = surgery_cases(&g).into_iter().next().unwrap();
    let s = settings_of(&first["kwargs"]);
    let run = |seed: u64| {
        let mut net = build_net(&g);
        net.rng = seed;
        apply_factorization(&mut net, &s).unwrap();
        net.forward(g.tensor("net/input"))
    };
    assert_close("same seed", &run(3), &run(3), 0.0, 0.0);
    let diff = (run(3) - run(4)).abs().max().double_value(&[]);
    assert!(diff > 0.0);
}

#[test]
fn max_rank_is_the_break_even_latent_size() {
    // ceil(x − 1) for breakeven x = fan_in·out/(fan_in + out): one lower when it divides.
    assert_eq!(max_rank(64, 64, 1), 31);
    assert_eq!(max_rank(3, 16, 3), 10);
    for (i, o, k) in [(16, 32, 3), (7, 9, 1), (256, 512, 3), (100, 100, 1)] {
        let fan_in = (i * k * k) as f64;
        let want = (fan_in * o as f64 / (fan_in + o as f64) - 1.0).ceil() as i64;
        assert_eq!(max_rank(i, o, k), want, "{i} {o} {k}");
    }
}

/// `got` with each latent column's sign flipped to agree with `want` (SVD signs are arbitrary):
/// `dim` is the latent dimension of `got`.
fn sign_aligned(got: &Tensor, want: &Tensor, dim: i64) -> Tensor {
    let k = got.size()[dim as usize];
    let mut parts = Vec::new();
    for j in 0..k {
        let g = got.narrow(dim, j, 1);
        let w = want.narrow(dim, j, 1);
        let dot = (&g * &w).sum(Kind::Double).double_value(&[]);
        parts.push(if dot < 0.0 { -g } else { g });
    }
    Tensor::cat(&parts, dim)
}

/// Tolerances relative to the tensor's scale: an element near zero carries the rounding of
/// the largest.
fn close(what: &str, got: &Tensor, want: &Tensor) {
    let scale = want.abs().max().double_value(&[]).max(1.0);
    assert_close(what, got, want, RTOL, ATOL * scale);
}

fn close_scalar(what: &str, got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 1e-4 * want.abs() + 1e-6,
        "{what}: {got} vs {want}"
    );
}

/// Composer's reported nmse (with its bias quirk) and the nmse against the real target.
fn check_nmse(tag: &str, sol: &LowRankSolution, want: &Value) {
    let reported = want["reported_nmse"].as_f64().unwrap();
    close_scalar(&format!("{tag} reported"), sol.nmse, reported);
    let recomputed = want["recomputed_nmse"].as_f64().unwrap();
    if recomputed < 1e-9 {
        assert!(sol.target_nmse < 1e-9, "{tag}: {}", sol.target_nmse);
    } else {
        close_scalar(&format!("{tag} actual"), sol.target_nmse, recomputed);
    }
}

fn rank_of(tag: &str) -> (f64, usize) {
    let p = parse_params(tag.split_once('/').map(|(_, r)| r).unwrap_or(tag));
    let rank = p["rank"].parse().unwrap();
    let n_iters = p
        .get("n_iters")
        .map_or(DEFAULT_N_ITERS, |n| n.parse().unwrap());
    (rank, n_iters)
}

#[test]
fn factorize_matrix_matches_composer() {
    let g = Golden::load(CASE);
    let (x, y, w, b) = (
        g.tensor("matrix/X"),
        g.tensor("matrix/Y"),
        g.tensor("matrix/W"),
        g.tensor("matrix/bias"),
    );
    let results = g.json["results"]["factorize_matrix"].as_object().unwrap();
    assert!(results.len() >= 3);
    for (tag, want) in results {
        let (rank, n_iters) = rank_of(tag);
        let sol = factorize_matrix(x, y, w, None, Some(b), rank, n_iters).unwrap();
        assert_eq!(sol.rank, want["rank"].as_i64().unwrap(), "{tag}: rank");
        check_nmse(tag, &sol, want);
        close(
            &format!("{tag}/bias"),
            sol.bias.as_ref().unwrap(),
            g.tensor(&format!("{tag}/bias")),
        );
        let y_hat = match &sol.wb {
            Some(wb) => {
                let wawb = sol.wa.matmul(wb);
                close(
                    &format!("{tag}/WaWb"),
                    &wawb,
                    g.tensor(&format!("{tag}/WaWb")),
                );
                let want_wa = g.tensor(&format!("{tag}/Wa"));
                let want_wb = g.tensor(&format!("{tag}/Wb"));
                close(
                    &format!("{tag}/Wa"),
                    &sign_aligned(&sol.wa, want_wa, 1),
                    want_wa,
                );
                close(&format!("{tag}/Wb"), &sign_aligned(wb, want_wb, 0), want_wb);
                x.matmul(&wawb)
            }
            None => {
                assert!(!g.tensors.contains_key(&format!("{tag}/Wb")), "{tag}");
                close(
                    &format!("{tag}/Wa"),
                    &sol.wa,
                    g.tensor(&format!("{tag}/Wa")),
                );
                x.matmul(&sol.wa)
            }
        } + sol.bias.as_ref().unwrap();
        close(
            &format!("{tag}/y_hat"),
            &y_hat,
            g.tensor(&format!("{tag}/y_hat")),
        );
    }
}

#[test]
fn factorize_conv2d_matches_composer() {
    let g = Golden::load(CASE);
    let (x, w, b) = (
        g.tensor("conv/X"),
        g.tensor("conv/W"),
        g.tensor("conv/biasA"),
    );
    let geometry = ConvGeometry {
        stride: 1,
        padding: w.size()[2] / 2,
    };
    let results = g.json["results"]["factorize_conv2d"].as_object().unwrap();
    assert!(results.len() >= 2);
    for (tag, want) in results {
        let (rank, n_iters) = rank_of(tag);
        let sol = factorize_conv2d(x, w, None, Some(b), None, rank, n_iters, geometry).unwrap();
        assert_eq!(sol.rank, want["rank"].as_i64().unwrap(), "{tag}: rank");
        assert_eq!(sol.wb.is_some(), want["has_Wb"].as_bool().unwrap(), "{tag}");
        assert_eq!(
            sol.bias.is_some(),
            want["has_bias"].as_bool().unwrap(),
            "{tag}"
        );
        check_nmse(tag, &sol, want);
        let p = geometry.padding;
        let want_wa = g.tensor(&format!("{tag}/Wa"));
        let y_hat = match &sol.wb {
            Some(wb) => {
                let want_wb = g.tensor(&format!("{tag}/Wb"));
                close(
                    &format!("{tag}/Wa"),
                    &sign_aligned(&sol.wa, want_wa, 0),
                    want_wa,
                );
                close(&format!("{tag}/Wb"), &sign_aligned(wb, want_wb, 1), want_wb);
                close(
                    &format!("{tag}/bias"),
                    sol.bias.as_ref().unwrap(),
                    g.tensor(&format!("{tag}/bias")),
                );
                x.conv2d(&sol.wa, None::<&Tensor>, [1, 1], [p, p], [1, 1], 1)
                    .conv2d(wb, sol.bias.as_ref(), [1, 1], [0, 0], [1, 1], 1)
            }
            None => {
                close(&format!("{tag}/Wa"), &sol.wa, want_wa);
                x.conv2d(&sol.wa, None::<&Tensor>, [1, 1], [p, p], [1, 1], 1)
            }
        };
        close(
            &format!("{tag}/y_hat"),
            &y_hat,
            g.tensor(&format!("{tag}/y_hat")),
        );
    }
}

/// `set_rank/<kind>/*`: the module built from `before/*` computes `out_before`; after
/// `set_rank(input, to)` it has `latent_after` and computes `out_after`, with the golden's
/// weights (up to the sign of each latent channel) and bias.
fn check_set_rank(g: &Golden, kind: &str, module: &mut Factorized) {
    let t = |name: &str| g.tensor(&format!("set_rank/{kind}/{name}"));
    let result = &g.json["results"]["set_rank"][kind];
    let num = |key: &str| result[key].as_i64().unwrap();
    assert_eq!(module.latent(), num("from_latent"), "{kind}");
    let input = t("input");
    let out = |m: &Factorized| m.forward(input, false).unwrap();
    close(&format!("{kind}/out_before"), &out(module), t("out_before"));
    module.set_rank(input, num("to")).unwrap();
    assert_eq!(module.latent(), num("latent_after"), "{kind}");
    close(&format!("{kind}/out_after"), &out(module), t("out_after"));
    let tensors: BTreeMap<&str, Tensor> = module.tensors().into_iter().collect();
    for (leaf, latent_dim) in [("module0.weight", 0), ("module1.weight", 1)] {
        let want = t(&format!("after/{leaf}"));
        let got = sign_aligned(&tensors[leaf], want, latent_dim);
        close(&format!("{kind} {leaf}"), &got, want);
    }
    let bias = "module1.bias";
    close(
        &format!("{kind} {bias}"),
        &tensors[bias],
        t(&format!("after/{bias}")),
    );

    // The current rank changes nothing; a larger one or zero is refused.
    let before = out(module);
    module.set_rank(input, module.latent()).unwrap();
    assert_close(kind, &out(module), &before, 0.0, 0.0);
    assert!(module.set_rank(input, module.latent() + 1).is_err());
    assert!(module.set_rank(input, 0).is_err());
}

#[test]
fn set_rank_matches_composer_on_a_linear_layer_and_a_conv() {
    let g = Golden::load(CASE);
    let t = |name: &str| g.tensor(&format!("set_rank/{name}")).copy();
    let mut linear = Factorized::Linear(
        FactorizedLinear::from_tensors(
            &t("linear/before/module0.weight"),
            &t("linear/before/module1.weight"),
            Some(&t("linear/before/module1.bias")),
        )
        .unwrap(),
    );
    check_set_rank(&g, "linear", &mut linear);

    let w0 = t("conv/before/module0.weight");
    let (k, cin) = (w0.size()[2], w0.size()[1]);
    let spec = ConvSpec {
        in_channels: cin,
        out_channels: t("conv/before/module1.weight").size()[0],
        kernel_size: k,
        stride: 1,
        padding: k / 2,
        groups: 1,
    };
    let mut conv = Factorized::Conv2d(
        FactorizedConv2d::from_tensors(
            spec,
            &w0,
            &t("conv/before/module1.weight"),
            &t("conv/before/module1.bias"),
        )
        .unwrap(),
    );
    check_set_rank(&g, "conv", &mut conv);
}

#[test]
fn settings_default_and_errors_name_the_setting() {
    let defaults = default_settings_json(Factorize::DEFAULT_SETTINGS);
    assert!(boxed_method::<Factorize>(&settings(&defaults)).is_ok());
    let m = Factorize::create(&settings(&defaults)).unwrap();
    assert_eq!(*m.settings(), FactorizeSettings::default());
    for (json, key) in [
        (r#"{"min_channels": -1}"#, "min_channels"),
        (r#"{"min_features": 2.5}"#, "min_features"),
        (r#"{"latent_channels": 0}"#, "latent_channels"),
        (r#"{"latent_features": -3}"#, "latent_features"),
        (r#"{"latent_features": "half"}"#, "latent_features"),
        (r#"{"factorize_convs": 1}"#, "factorize_convs"),
        (r#"{"factorize_linear": false}"#, "factorize_linear"),
    ] {
        let err = boxed_method::<Factorize>(&settings(json))
            .err()
            .unwrap_or_else(|| panic!("{json} accepted"));
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{json}");
        assert!(err.message().contains(key), "{json}: {}", err.message());
    }
}

#[test]
fn solver_errors_are_values() {
    let x = Tensor::ones([4, 3], (Kind::Float, tch::Device::Cpu));
    assert!(factorize_matrix(&x, &x, &x.tr(), None, None, 0.0, 1).is_err());
    assert!(factorize_matrix(&x, &x, &x.tr(), None, None, f64::NAN, 1).is_err());
    let y = Tensor::ones([5, 3], (Kind::Float, tch::Device::Cpu));
    assert!(factorize_matrix(&x, &y, &x.tr(), None, None, 1.0, 1).is_err());
}
