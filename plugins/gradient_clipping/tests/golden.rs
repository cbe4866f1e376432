//! GradientClipping against Composer's golden case (`tests/golden/gradient_clipping.*`): the
//! parameters `param/<p>` get the gradients `grad_in/<p>` (a parameter without one gets none),
//! then every setting the file has outputs for (`grad_out/<type>=<threshold>/<p>`) is applied
//! with the crate's functional form; each clipped gradient must match Composer's, a parameter
//! without a gradient must keep none, and `norm` must report the file's total norm.

use std::collections::BTreeSet;

use gradient_clipping::{apply_gradient_clipping, ClippingType};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};

const CASE: &str = "gradient_clipping";
const RTOL: f64 = 1e-6;
const ATOL: f64 = 1e-7;

/// Fresh leaf parameters from the file, with the file's gradients set through one backward of
/// `Σ sum(p · g)` (whose gradient is exactly `g`). Returns (name, parameter) in name order.
fn parameters_with_grads(g: &Golden) -> Vec<(String, Tensor)> {
    let mut params = Vec::new();
    let mut objective: Option<Tensor> = None;
    for name in g.tensors.keys() {
        let Some(short) = name.strip_prefix("param/") else {
            continue;
        };
        let p = g.tensor(name).copy().set_requires_grad(true);
        if let Some(grad) = g.tensors.get(&format!("grad_in/{short}")) {
            let term = (&p * grad).sum(Kind::Float);
            objective = Some(match objective {
                None => term,
                Some(o) => o + term,
            });
        }
        params.push((short.to_owned(), p));
    }
    objective.expect("the golden file has gradients").backward();
    for (name, p) in &params {
        if let Some(grad) = g.tensors.get(&format!("grad_in/{name}")) {
            assert!(
                p.grad().equal(grad),
                "{name}: the gradient was not set exactly"
            );
        }
    }
    params
}

/// The settings the file has outputs for: `<type>=<threshold>`, in name order.
fn settings(g: &Golden) -> Vec<String> {
    let set: BTreeSet<String> = g
        .names_with_role("output")
        .iter()
        .filter_map(|n| n.strip_prefix("grad_out/")?.split_once('/'))
        .map(|(setting, _)| setting.to_owned())
        .collect();
    set.into_iter().collect()
}

fn parse_setting(setting: &str) -> (ClippingType, f64) {
    let (kind, threshold) = setting
        .split_once('=')
        .unwrap_or_else(|| panic!("`{setting}` is not type=threshold"));
    let kind = kind.parse().unwrap_or_else(|e| panic!("{setting}: {e}"));
    let threshold = threshold
        .parse()
        .unwrap_or_else(|e| panic!("{setting}: {e}"));
    (kind, threshold)
}

#[test]
fn every_setting_reproduces_composers_gradients() {
    let g = Golden::load(CASE);
    let settings = settings(&g);
    let configs = g.json["hyperparameters"]["configs"]
        .as_array()
        .expect("configs");
    assert_eq!(settings.len(), configs.len(), "{settings:?}");
    let total = g.json["results"]["total_grad_norm"]
        .as_f64()
        .expect("total_grad_norm");
    let mut checked = 0;
    for setting in &settings {
        let (kind, threshold) = parse_setting(setting);
        let params = parameters_with_grads(&g);
        let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
        let norm = apply_gradient_clipping(&tensors, kind, threshold).expect("clipping");
        match (kind, norm) {
            (ClippingType::Norm, Some(norm)) => {
                let got = norm.double_value(&[]);
                assert!(
                    (got - total).abs() <= RTOL * total,
                    "{setting}: total norm {got} vs {total}"
                );
            }
            (ClippingType::Norm, None) => panic!("{setting}: no total norm"),
            (_, norm) => assert!(norm.is_none(), "{setting}"),
        }
        for (name, p) in &params {
            match g.tensors.get(&format!("grad_out/{setting}/{name}")) {
                Some(want) => {
                    assert_close(&format!("{setting}/{name}"), &p.grad(), want, RTOL, ATOL);
                    checked += 1;
                }
                None => assert!(
                    !p.grad().defined(),
                    "{setting}/{name}: no gradient in, none out"
                ),
            }
        }
    }
    assert_eq!(checked, g.names_with_role("output").len());
}

#[test]
fn the_file_has_the_cases_the_quirks_are_about() {
    // Quirk 12: a zero weight zeroes its gradient under AGC; a zero gradient stays zero (NaN
    // coefficient made 1). Read from the outputs, so this checks what the file pins.
    let g = Golden::load(CASE);
    let params = parameters_with_grads(&g);
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    apply_gradient_clipping(&tensors, ClippingType::Adaptive, 0.5).expect("agc");
    for (name, p) in &params {
        let weight_zero = p.abs().max().double_value(&[]) == 0.0;
        let grad = p.grad();
        if weight_zero && grad.defined() {
            assert_eq!(grad.abs().max().double_value(&[]), 0.0, "{name}");
        }
    }
    assert!(params.iter().any(|(_, p)| !p.grad().defined()));
}
