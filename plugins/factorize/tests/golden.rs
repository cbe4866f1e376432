//! Factorize against Composer's golden case (`tests/golden/factorize.*`).
//!
//! - Surgery: the golden net (`net/param/<layer>.weight`: three convs, three linear layers) is
//!   rebuilt as a stand-in module tree; for every settings case of `results.surgery` the
//!   plugin's own `apply_factorization` must make Composer's decision for every layer (latent
//!   size, max rank, wide enough, could speed up, replaced or not) with Composer's tensor names
//!   and shapes; with the golden's freshly initialised weights loaded into our modules the net
//!   must compute `<case>/out`; a second application changes nothing.
//! - Solvers (`factorize_matrix`, `factorize_conv2d`, `set_rank`): first what the data
//!   determine uniquely, the prediction `ŷ` (the layer's output after `set_rank`), the bias,
//!   `Wa·Wb` and both nmse values; then `Wa` and `Wb` themselves, which are unique only up to the
//!   sign of each latent column (SVD), after aligning those signs. Each tolerance is derived
//!   from the golden problem's own conditioning (`conditioning/mod.rs`: `κ(X)`, how far the
//!   target is from `X`'s span, the singular-value gaps of the operator), not a fixed number:
//!   the two sides are different float32 roundings of the same operations, and some problems
//!   amplify rounding a thousandfold. `--nocapture` prints each comparison's margin.

use std::collections::BTreeMap;

use factorize::{
    apply_factorization, factorize_conv2d, factorize_matrix, max_rank, plan, ConvGeometry,
    ConvSpec, Factorize, FactorizeSettings, Factorized, FactorizedConv2d, FactorizedLinear,
    LowRankSolution, CONV2D, DEFAULT_N_ITERS, FACTORIZED_CONV2D, FACTORIZED_LINEAR, LINEAR,
};
use serde_json::Value;
use tessera_plugin_api::abi::ModuleInfo;
use tessera_plugin_api::kit::{OwnTensors, StandIn, SurgeryModel};
use tessera_plugin_api::tch::{self, Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, parse_params, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings};
use tessera_plugin_api::{boxed_method, ErrorKind, Module, Plugin};

mod conditioning;

use conditioning::{
    assert_abs, assert_rel, conv_matrix, flip, latent_signs, max_abs, module_product,
    nmse_tolerance, patches, variance, within_abs, Conditioning,
};

const CASE: &str = "factorize";
/// Forward passes through recorded weights (not solver outputs), relative to the scale.
const FORWARD_TOL: f64 = 1e-5;

/// The seed of the stand-in's stream of fresh weights.
const SEED: u64 = 7;

/// The golden net as a module tree with its tensors, as the host would show it, in a stand-in
/// model drawing from SplitMix64 seeded with `seed`. Layers in order: a conv where
/// `net/param/<layer>.weight` is 4-d, a linear layer where it is 2-d (`hyperparameters.net`:
/// ReLU after every layer but the last conv, which is averaged over H and W, and the last
/// linear layer).
fn build_net(g: &Golden, seed: u64) -> StandIn {
    let mut params = BTreeMap::new();
    for name in g.names_with_role("param") {
        if let Some(rest) = name.strip_prefix("net/param/") {
            params.insert(rest.to_owned(), g.tensor(&name).copy());
        }
    }
    let mut net = StandIn::new(seed).module("", "factor_net", &[], vec![]);
    let mut layers: Vec<&String> = params.keys().filter(|k| k.ends_with(".weight")).collect();
    // Convs before linear layers, each in name order (conv_a, conv_b, ...): the net's order.
    layers.sort_by_key(|k| (params[*k].dim() != 4, (*k).clone()));
    for weight_name in layers {
        let path = weight_name.trim_end_matches(".weight");
        let s = params[weight_name].size();
        let tensors = ["weight", "bias"]
            .into_iter()
            .filter_map(|leaf| Some((leaf, params.get(&format!("{path}.{leaf}"))?.shallow_clone())))
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
        let attrs: Vec<(&str, f64)> = attrs.into_iter().map(|(k, v)| (k, v as f64)).collect();
        net.add_module(path, kind, &attrs, tensors);
    }
    net
}

/// The layers of the net in order: the module tree below the root.
fn layers(net: &StandIn) -> Vec<ModuleInfo> {
    let mut modules = net.modules().unwrap();
    modules.retain(|m| !m.path.is_empty());
    modules
}

/// Runs the net: a layer the surgery replaced runs the module it put in.
fn forward(net: &StandIn, x: &Tensor) -> Tensor {
    let layers = layers(net);
    let last_conv = layers
        .iter()
        .rposition(|n| matches!(n.kind.as_str(), CONV2D | FACTORIZED_CONV2D))
        .unwrap();
    let mut y = x.shallow_clone();
    for (i, n) in layers.iter().enumerate() {
        let p = n.path.as_str();
        let tensor = |leaf: &str| net.tensor(&format!("{p}.{leaf}"));
        y = match net.replaced(p) {
            Some(m) => m.forward(&y, false).unwrap(),
            None if n.kind.as_str() == CONV2D => ConvSpec::of(n)
                .unwrap()
                .conv2d(&y, tensor("weight").unwrap(), tensor("bias"))
                .unwrap(),
            None => y.linear(tensor("weight").unwrap(), tensor("bias")),
        };
        y = if i == last_conv {
            y.mean_dim(&[2i64, 3][..], false, Kind::Float)
        } else if i + 1 < layers.len() {
            y.relu()
        } else {
            y
        };
    }
    y
}

fn kinds(net: &StandIn) -> Vec<(String, String)> {
    layers(net)
        .iter()
        .map(|n| (n.path.to_string(), n.kind.to_string()))
        .collect()
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
        let mut net = build_net(&g, SEED);
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
            let kind = net.kind(&d.path).unwrap();
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
                let t = &net.tensors()[&format!("{}.{leaf}", d.path)];
                assert_eq!(t.size(), shape, "{what}: {leaf}");
                assert!(t.requires_grad(), "{what}: {leaf} is trainable");
            }
            assert!(want["module0_bias"].is_null());
            assert!(!net
                .tensors()
                .contains_key(&format!("{}.module0.bias", d.path)));
            assert!(!net.tensors().contains_key(&format!("{}.weight", d.path)));
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
            .tensors()
            .keys()
            .filter(|k| k.contains(".module"))
            .cloned()
            .collect();
        assert_eq!(ours, golden_names, "{case}: factorized tensors");
        assert_eq!(golden_names.len(), 3 * replaced, "{case}");

        // Fresh weights: PyTorch's default bound, 1/sqrt(fan_in).
        for (name, t) in net.tensors().iter().filter(|(k, _)| k.contains(".module")) {
            let fan_in = if name.contains("module1.") {
                let w = &net.tensors()[&name.replace("module1.bias", "module1.weight")];
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
                net.tensors()[leaf]
                    .shallow_clone()
                    .copy_(g.tensor(&format!("{prefix}{leaf}")));
            }
        });
        let out = tch::no_grad(|| forward(&net, g.tensor("net/input")));
        let key = format!("{case}/out");
        assert_close(&key, &out, g.tensor(&key), 1e-5, 1e-6);
        if replaced == 0 {
            // Nothing replaced: Composer's output is the original net's.
            assert_close(&key, g.tensor(&key), g.tensor("net/original_out"), 0.0, 0.0);
        }

        // Idempotent: a second application replaces nothing.
        let kinds_before = kinds(&net);
        let again = apply_factorization(&mut net, &s).unwrap();
        assert_eq!(
            (again.convs_replaced, again.linears_replaced),
            (0, 0),
            "{case}"
        );
        assert_eq!(again.factorized_convs, outcome.factorized_convs);
        assert_eq!(again.factorized_linears, outcome.factorized_linears);
        assert_eq!(kinds(&net), kinds_before);
        let out2 = tch::no_grad(|| forward(&net, g.tensor("net/input")));
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

    let net = build_net(&g, SEED);
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
        let mut net = build_net(&g, seed);
        apply_factorization(&mut net, &s).unwrap();
        forward(&net, g.tensor("net/input"))
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

/// A forward pass of Composer's recorded modules (not a solver output): float32 rounding of a
/// few dozen products per element, relative to the tensor's largest value.
fn close_forward(what: &str, got: &Tensor, want: &Tensor) {
    let scale = max_abs(want).max(1.0);
    assert_close(what, got, want, FORWARD_TOL, FORWARD_TOL * scale);
}

/// Composer's reported nmse (with its bias quirk) and the nmse against the real target, each
/// within what a prediction that may move by `a` per element allows (`nmse_tolerance`).
fn check_nmse(tag: &str, sol: &LowRankSolution, want: &Value, a: f64, variance: f64) {
    for (what, got, key) in [
        ("reported", sol.nmse, "reported_nmse"),
        ("actual", sol.target_nmse, "recomputed_nmse"),
    ] {
        let want = want[key].as_f64().unwrap();
        let tol = nmse_tolerance(want, a, variance);
        assert!(
            (got - want).abs() <= tol,
            "{tag} {what} nmse: {got} vs Composer's {want} (tolerance {tol:.2e})"
        );
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

/// One line per solution for `--nocapture`: the conditioning, each tolerance and the error.
fn report(tag: &str, c: &Conditioning, errors: &[(&str, f64, f64)]) {
    let parts: Vec<String> = errors
        .iter()
        .map(|(what, err, tol)| format!("{what} {err:.1e} ≤ {tol:.1e}"))
        .collect();
    eprintln!(
        "{tag}: κ(X) {:.1}, tan θ {:.1e}, η {:.1}, s₁/gap {:.1}, s₁/min gap {:.1} | {}",
        c.kappa_x,
        c.tan_theta,
        c.eta,
        c.gap,
        c.min_gap,
        parts.join(", ")
    );
}

/// A factorized pair in module layout (`first` `(k, ...)`, `second` `(out, k, ...)`) against
/// Composer's: the product within `c.product()`, each factor within `c.factors()` once the
/// latent signs are aligned (on `first`, then applied to both: a flipped latent unit flips its
/// row of `first` and its column of `second` together).
fn compare_pair(
    what: &str,
    (first, second): (&Tensor, &Tensor),
    (want_first, want_second): (&Tensor, &Tensor),
    c: &Conditioning,
    errors: &mut Vec<(&'static str, f64, f64)>,
) {
    let product = assert_rel(
        &format!("{what} product"),
        &module_product(first, second),
        &module_product(want_first, want_second),
        c.product(),
    );
    errors.push(("product", product, c.product()));
    let signs = latent_signs(first, want_first, 0);
    let e0 = assert_rel(
        &format!("{what} first factor"),
        &flip(first, &signs, 0),
        want_first,
        c.factors(),
    );
    let e1 = assert_rel(
        &format!("{what} second factor"),
        &flip(second, &signs, 1),
        want_second,
        c.factors(),
    );
    errors.push(("factors", e0.max(e1), c.factors()));
}

/// The golden matrix problem: inputs `X`, targets `Y`, the layer's weight `W` and bias.
fn matrix_problem(g: &Golden) -> (&Tensor, &Tensor, &Tensor, &Tensor) {
    (
        g.tensor("matrix/X"),
        g.tensor("matrix/Y"),
        g.tensor("matrix/W"),
        g.tensor("matrix/bias"),
    )
}

#[test]
fn factorize_matrix_matches_composer() {
    let g = Golden::load(CASE);
    let (x, y, w, b) = matrix_problem(&g);
    let results = g.json["results"]["factorize_matrix"].as_object().unwrap();
    assert!(results.len() >= 3);
    for (tag, want) in results {
        let (rank, n_iters) = rank_of(tag);
        let sol = factorize_matrix(x, y, w, None, Some(b), rank, n_iters).unwrap();
        assert_eq!(sol.rank, want["rank"].as_i64().unwrap(), "{tag}: rank");
        // Composer takes the bias out of the target before solving.
        let c = Conditioning::of(x, &(y - b), w, sol.rank);
        let t = |name: &str| g.tensor(&format!("{tag}/{name}"));
        let bias = sol.bias.as_ref().unwrap();
        let (product, y_hat) = match &sol.wb {
            // As generate.py: X @ Wa @ Wb + bias.
            Some(wb) => (sol.wa.matmul(wb), x.matmul(&sol.wa).matmul(wb) + bias),
            None => (sol.wa.shallow_clone(), x.matmul(&sol.wa) + bias),
        };
        let mut errors = Vec::new();
        let want_y_hat = t("y_hat");
        let scale = max_abs(want_y_hat);
        let e = assert_rel(&format!("{tag}/y_hat"), &y_hat, want_y_hat, c.prediction());
        errors.push(("ŷ", e, c.prediction()));
        let atol = c.prediction() * scale;
        let e = assert_abs(&format!("{tag}/bias"), bias, t("bias"), atol, scale);
        errors.push(("bias", e, c.prediction()));
        match &sol.wb {
            Some(wb) => {
                // Module layout: first = Waᵀ (k, D), second = Wbᵀ (M, k).
                let (want_wa, want_wb) = (t("Wa"), t("Wb"));
                assert_rel(&format!("{tag}/WaWb"), &product, t("WaWb"), c.product());
                compare_pair(
                    tag,
                    (&sol.wa.tr(), &wb.tr()),
                    (&want_wa.tr(), &want_wb.tr()),
                    &c,
                    &mut errors,
                );
            }
            None => {
                assert!(!g.tensors.contains_key(&format!("{tag}/Wb")), "{tag}");
                let e = assert_rel(&format!("{tag}/Wa"), &sol.wa, t("Wa"), c.product());
                errors.push(("operator", e, c.product()));
            }
        }
        check_nmse(tag, &sol, want, atol, variance(y));
        report(tag, &c, &errors);
    }
}

/// The tolerances are tight enough to see a wrong solver: for every golden low-rank matrix case
/// that runs 2 or more alternating steps, a solver stopping after 1 (or after one step fewer than
/// Composer's) gives a product `Wa·Wb` outside the tolerance of Composer's. Without this, a
/// tolerance derived too generously would pass anything.
#[test]
fn a_solver_short_of_its_iterations_fails_the_tolerances() {
    let g = Golden::load(CASE);
    let (x, y, w, b) = matrix_problem(&g);
    let results = g.json["results"]["factorize_matrix"].as_object().unwrap();
    let mut checked = 0;
    for tag in results.keys() {
        let (rank, n_iters) = rank_of(tag);
        // Full rank solves one least-squares operator: no alternating steps.
        let key = format!("{tag}/WaWb");
        if n_iters < 2 || !g.tensors.contains_key(&key) {
            continue;
        }
        let want = g.tensor(&key);
        for short in (1..n_iters).collect::<std::collections::BTreeSet<_>>() {
            let sol = factorize_matrix(x, y, w, None, Some(b), rank, short).unwrap();
            let c = Conditioning::of(x, &(y - b), w, sol.rank);
            let wb = sol.wb.as_ref().expect("a low-rank pair");
            let product = sol.wa.matmul(wb);
            let what = format!("{tag} solved with n_iters = {short}");
            let scale = max_abs(want);
            let verdict = within_abs(&what, &product, want, c.product() * scale, scale);
            let rel =
                conditioning::max_abs(&(conditioning::f64t(&product) - conditioning::f64t(want)))
                    / scale;
            eprintln!(
                "{what}: product {rel:.2e} of the scale against a tolerance of {:.2e}: it would \
                 pass only with C ≥ {:.0}",
                c.product(),
                conditioning::C * rel / c.product()
            );
            assert!(
                verdict.is_err(),
                "{what}: its product passes the tolerance of Composer's {n_iters} steps ({:.2e} of \
                 the scale, tolerance {:.2e}): the tolerances cannot tell a wrong solver",
                verdict.unwrap_or_default(),
                c.product()
            );
            checked += 1;
        }
    }
    assert!(checked >= 2, "the golden file has matrix cases of 2+ steps");
}

#[test]
fn factorize_conv2d_matches_composer() {
    let g = Golden::load(CASE);
    let (x, w, b) = (
        g.tensor("conv/X"),
        g.tensor("conv/W"),
        g.tensor("conv/biasA"),
    );
    let (k, p) = (w.size()[2], w.size()[2] / 2);
    let geometry = ConvGeometry {
        stride: 1,
        padding: p,
    };
    // The matrix problem factorize_conv2d hands to factorize_matrix (the bias is in the
    // target: no bias argument).
    let xm = patches(x, k, p);
    let wm = conv_matrix(w);
    let ym = xm.matmul(&wm) + b;
    let y_original = g.tensor("conv/y_original");
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
        let c = Conditioning::of(&xm, &ym, &wm, sol.rank);
        let t = |name: &str| g.tensor(&format!("{tag}/{name}"));
        let want_y_hat = t("y_hat");
        let scale = max_abs(want_y_hat);
        let atol = c.prediction() * scale;
        let mut errors = Vec::new();
        let y_hat = match &sol.wb {
            Some(wb) => {
                compare_pair(tag, (&sol.wa, wb), (t("Wa"), t("Wb")), &c, &mut errors);
                let bias = sol.bias.as_ref().unwrap();
                let e = assert_abs(&format!("{tag}/bias"), bias, t("bias"), atol, scale);
                errors.push(("bias", e, c.prediction()));
                x.conv2d(&sol.wa, None::<&Tensor>, [1, 1], [p, p], [1, 1], 1)
                    .conv2d(wb, Some(bias), [1, 1], [0, 0], [1, 1], 1)
            }
            None => {
                let e = assert_rel(&format!("{tag}/Wa"), &sol.wa, t("Wa"), c.product());
                errors.push(("operator", e, c.product()));
                x.conv2d(&sol.wa, None::<&Tensor>, [1, 1], [p, p], [1, 1], 1)
            }
        };
        let e = assert_rel(&format!("{tag}/y_hat"), &y_hat, want_y_hat, c.prediction());
        errors.push(("ŷ", e, c.prediction()));
        check_nmse(tag, &sol, want, atol, variance(y_original));
        report(tag, &c, &errors);
    }
}

/// The problem `set_rank` solves on `set_rank/<kind>/*`: its inputs (patches for a conv), its
/// target less the bias Composer subtracts (a linear layer passes its bias; a conv folds it into
/// the target), and `W0 = Wa·Wb`, in float32 as the solver sees them.
fn set_rank_problem(g: &Golden, kind: &str) -> (Tensor, Tensor, Tensor) {
    let t = |name: &str| g.tensor(&format!("set_rank/{kind}/{name}"));
    let (w0, w1, b1) = (
        t("before/module0.weight"),
        t("before/module1.weight"),
        t("before/module1.bias"),
    );
    let (k, out) = (w0.size()[0], w1.size()[0]);
    let a = w0.reshape([k, -1]).tr();
    let bm = w1.reshape([out, k]).tr();
    if kind == "conv" {
        let kernel = w0.size()[2];
        let x = patches(t("input"), kernel, kernel / 2);
        let y = x.matmul(&a).matmul(&bm) + b1;
        (x, y, a.matmul(&bm))
    } else {
        (
            t("input").shallow_clone(),
            t("out_before") - b1,
            a.matmul(&bm),
        )
    }
}

/// `set_rank/<kind>/*`: the module built from `before/*` computes `out_before`; after
/// `set_rank(input, to)` it has `latent_after` and computes `out_after` (unique), with
/// Composer's product of the two weights (unique) and bias, and its weights up to the sign of
/// each latent unit, each within the tolerance the problem's conditioning gives.
fn check_set_rank(g: &Golden, kind: &str, module: &mut Factorized) {
    let t = |name: &str| g.tensor(&format!("set_rank/{kind}/{name}"));
    let result = &g.json["results"]["set_rank"][kind];
    let num = |key: &str| result[key].as_i64().unwrap();
    assert_eq!(module.latent(), num("from_latent"), "{kind}");
    let input = t("input");
    let out = |m: &Factorized| m.forward(input, false).unwrap();
    close_forward(&format!("{kind}/out_before"), &out(module), t("out_before"));
    let (x, y, w0) = set_rank_problem(g, kind);
    let c = Conditioning::of(&x, &y, &w0, num("to"));
    module.set_rank(input, num("to")).unwrap();
    assert_eq!(module.latent(), num("latent_after"), "{kind}");
    let mut errors = Vec::new();
    let want_out = t("out_after");
    let scale = max_abs(want_out);
    let e = assert_rel(
        &format!("{kind}/out_after"),
        &out(module),
        want_out,
        c.prediction(),
    );
    errors.push(("output", e, c.prediction()));
    let tensors: BTreeMap<&str, Tensor> = module.tensors().into_iter().collect();
    compare_pair(
        &format!("set_rank/{kind}"),
        (&tensors["module0.weight"], &tensors["module1.weight"]),
        (t("after/module0.weight"), t("after/module1.weight")),
        &c,
        &mut errors,
    );
    let bias = "module1.bias";
    let e = assert_abs(
        &format!("{kind} {bias}"),
        &tensors[bias],
        t(&format!("after/{bias}")),
        c.prediction() * scale,
        scale,
    );
    errors.push(("bias", e, c.prediction()));
    report(&format!("set_rank/{kind}"), &c, &errors);

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
