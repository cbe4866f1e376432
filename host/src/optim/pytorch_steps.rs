//! Several steps of [`Optimizer`] against `torch.optim.AdamW` and `torch.optim.SGD`: the
//! parameter after every step must match PyTorch's, which `scripts/optim_goldens.py` wrote into
//! `pytorch_steps.json` with the torch wheel (weight decay, momentum, dampening, Nesterov, and a
//! learning rate changed between steps).

use serde_json::Value;
use tch::nn::Init;
use tch::{Device, Kind, Tensor};

use super::schedule::Schedule;
use super::{AdamW, Optimizer, Rule, Sgd};
use crate::model::ParamStore;

/// Relative and absolute tolerance: the same float32 operations, possibly fused or ordered
/// differently (e.g. `addcdiv` with a value vs a pre-scaled numerator).
const RTOL: f64 = 1e-6;
const ATOL: f64 = 1e-7;

fn floats(v: &Value, what: &str) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("{what} is not an array"))
        .iter()
        .map(|x| {
            x.as_f64()
                .unwrap_or_else(|| panic!("{what}: {x} is not a number")) as f32
        })
        .collect()
}

fn number(v: &Value, key: &str, case: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{case}: hyperparameter `{key}` is not a number"))
}

fn algorithm(case: &Value, name: &str) -> Rule {
    let h = &case["hyperparameters"];
    match case["optimizer"].as_str() {
        Some("adamw") => {
            let betas = h["betas"].as_array().expect("betas");
            assert_eq!(betas.len(), 2, "{name}: betas");
            Rule::AdamW(AdamW {
                lr: case["lr"][0].as_f64().expect("lr"),
                betas: (
                    betas[0].as_f64().expect("beta1"),
                    betas[1].as_f64().expect("beta2"),
                ),
                eps: number(h, "eps", name),
                weight_decay: number(h, "weight_decay", name),
            })
        }
        Some("sgd") => Rule::Sgd(Sgd {
            lr: case["lr"][0].as_f64().expect("lr"),
            momentum: number(h, "momentum", name),
            dampening: number(h, "dampening", name),
            nesterov: h["nesterov"]
                .as_bool()
                .unwrap_or_else(|| panic!("{name}: nesterov")),
            weight_decay: number(h, "weight_decay", name),
            decoupled_weight_decay: false,
        }),
        other => panic!("{name}: unknown optimizer {other:?}"),
    }
}

#[test]
fn several_steps_match_pytorch() {
    let text = include_str!("pytorch_steps.json");
    let doc: Value = serde_json::from_str(text).expect("pytorch_steps.json is JSON");
    let initial = floats(&doc["initial"], "initial");
    let grads: Vec<Vec<f32>> = doc["grads"]
        .as_array()
        .expect("grads")
        .iter()
        .map(|g| floats(g, "grads[i]"))
        .collect();
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 2, "too few cases");
    let mut optimizers = Vec::new();
    for case in cases {
        let name = case["name"].as_str().expect("a case name");
        let lrs = case["lr"].as_array().expect("lr");
        let want: Vec<Vec<f32>> = case["params"]
            .as_array()
            .expect("params")
            .iter()
            .map(|p| floats(p, "params[i]"))
            .collect();
        assert_eq!(want.len(), lrs.len(), "{name}: one result per step");
        assert!(want.len() >= 3, "{name}: several steps");

        let mut store = ParamStore::new(Device::Cpu);
        let p = store
            .parameter("w".into(), &[initial.len() as i64], Init::Const(0.0))
            .unwrap();
        tch::no_grad(|| p.shallow_clone().copy_(&Tensor::from_slice(&initial)));
        let lr_of = |i: usize| case["lr"][i].as_f64().expect("lr");
        let mut opt = Optimizer::new(algorithm(case, name), Schedule::default(), 1.0, &store);
        for (i, want) in want.iter().enumerate() {
            opt.zero_grad();
            // d(Σ p·g)/dp = g exactly.
            (&p * Tensor::from_slice(&grads[i]))
                .sum(Kind::Float)
                .backward();
            // The case's rate for this step, as a method would set it.
            opt.scale_lr(lr_of(i) / opt.lr());
            opt.step().unwrap();
            let got = Vec::<f32>::try_from(p.detach()).unwrap();
            for (j, (g, w)) in got.iter().zip(want).enumerate() {
                let (g, w) = (f64::from(*g), f64::from(*w));
                assert!(
                    (g - w).abs() <= ATOL + RTOL * w.abs(),
                    "{name}: step {}, element {j}: Tessera {g}, PyTorch {w}",
                    i + 1
                );
            }
        }
        assert_eq!(opt.steps(), want.len() as u64);
        optimizers.push(case["optimizer"].as_str().unwrap_or_default().to_owned());
    }
    // Both optimizers are covered, AdamW with weight decay.
    for o in ["adamw", "sgd"] {
        assert!(optimizers.iter().any(|x| x == o), "no {o} case");
    }
    assert!(cases
        .iter()
        .any(|c| c["optimizer"] == "adamw"
            && c["hyperparameters"]["weight_decay"].as_f64() > Some(0.0)));
}
