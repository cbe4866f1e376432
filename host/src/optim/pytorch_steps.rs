//! Several steps of [`Optimizer`], with both implementations, against PyTorch: every case of
//! `pytorch_steps.json` (written by `scripts/optim_goldens.py` with the torch wheel) is replayed
//! on the same float32 parameters, parameter groups, learning rates and gradients, and the
//! parameters after every step must match each of PyTorch's implementations (`for_loop`,
//! `foreach`, `fused`) of torch.optim's SGD, Adam and AdamW, and the script's references for Lion
//! and Composer's decoupled SGD. Cases are read generically: a new case in the script is tested
//! without a change here.

use serde_json::Value;
use tch::nn::Init;
use tch::{Device, Kind, Tensor};

use super::schedule::Schedule;
use super::{Adam, AdamW, GroupSpec, Implementation, Lion, Optimizer, OptimizerConfig, Rule, Sgd};
use crate::model::ParamStore;

/// Relative and absolute tolerance: the same float32 operations, fused or ordered differently.
/// The parameters are of order 1; PyTorch's own three implementations differ from each other
/// by up to 1.2e-7 on these cases, Tessera from them by up to about 3e-7.
const RTOL: f64 = 1e-6;
const ATOL: f64 = 1e-6;

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
        .unwrap_or_else(|| panic!("{case}: `{key}` is not a number"))
}

fn pair(v: &Value, key: &str, case: &str) -> (f64, f64) {
    let b = floats(&v[key], &format!("{case}: {key}"));
    assert_eq!(b.len(), 2, "{case}: {key}");
    // The JSON holds the decimal the script used; read it back as that double.
    let exact = |i: usize| v[key][i].as_f64().unwrap_or(f64::from(b[i]));
    (exact(0), exact(1))
}

fn rule(case: &Value, name: &str) -> Rule {
    let h = &case["hyperparameters"];
    let lr = case["lr"][0].as_f64().expect("lr");
    let sgd = |decoupled| {
        Rule::Sgd(Sgd {
            lr,
            momentum: number(h, "momentum", name),
            dampening: number(h, "dampening", name),
            nesterov: h["nesterov"]
                .as_bool()
                .unwrap_or_else(|| panic!("{name}: nesterov")),
            weight_decay: number(h, "weight_decay", name),
            decoupled_weight_decay: decoupled,
        })
    };
    match case["optimizer"].as_str() {
        Some("adamw") => Rule::AdamW(AdamW {
            lr,
            betas: pair(h, "betas", name),
            eps: number(h, "eps", name),
            weight_decay: number(h, "weight_decay", name),
        }),
        Some("adam") => Rule::Adam(Adam {
            lr,
            betas: pair(h, "betas", name),
            eps: number(h, "eps", name),
            weight_decay: number(h, "weight_decay", name),
        }),
        Some("lion") => Rule::Lion(Lion {
            lr,
            betas: pair(h, "betas", name),
            weight_decay: number(h, "weight_decay", name),
        }),
        Some("sgd") => sgd(false),
        Some("sgdw") => sgd(true),
        other => panic!("{name}: unknown optimizer {other:?}"),
    }
}

fn groups(case: &Value, name: &str) -> Vec<GroupSpec> {
    case["groups"]
        .as_array()
        .unwrap_or_else(|| panic!("{name}: groups"))
        .iter()
        .map(|g| GroupSpec {
            params: g["params"]
                .as_array()
                .expect("group params")
                .iter()
                .map(|p| p.as_str().expect("a parameter name").to_owned())
                .collect(),
            lr_multiplier: number(g, "lr_multiplier", name),
            weight_decay: Some(number(g, "weight_decay", name)),
            ..GroupSpec::named(g["name"].as_str().expect("a group name"))
        })
        .collect()
}

/// Runs `case` with `implementation`; returns the parameters after each step.
fn replay(case: &Value, name: &str, implementation: Implementation) -> Vec<Vec<Vec<f32>>> {
    let mut store = ParamStore::new(Device::Cpu);
    let mut params = Vec::new();
    for p in case["params"].as_array().expect("params") {
        let shape: Vec<i64> = p["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_i64().expect("a dimension"))
            .collect();
        let t = store
            .parameter(
                p["name"].as_str().expect("name").to_owned(),
                &shape,
                Init::Const(0.0),
            )
            .unwrap();
        let initial = Tensor::from_slice(&floats(&p["initial"], "initial")).view(&shape[..]);
        tch::no_grad(|| t.shallow_clone().copy_(&initial));
        params.push(t);
    }
    let config = OptimizerConfig {
        rule: rule(case, name),
        groups: groups(case, name),
        implementation,
    };
    let mut opt = Optimizer::new(config, Schedule::default(), 1.0, &store, &[])
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let steps = case["lr"].as_array().expect("lr");
    // Masked steps (amp's overflow check): their gradients are non-finite and the flag says so;
    // in a case with any, every step gets the flag (0 or 1) on the device, as under amp_fp16.
    let masked: Vec<usize> = case["masked"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(Value::as_u64)
                .map(|i| i as usize)
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    for (i, lr) in steps.iter().enumerate() {
        opt.zero_grad();
        let mut loss: Option<Tensor> = None;
        for (j, p) in params.iter().enumerate() {
            let g = &case["grads"][i][j];
            if g.is_null() {
                continue;
            }
            let mut g = floats(g, "grad");
            if masked.contains(&i) {
                g[0] = f32::INFINITY;
                if g.len() > 1 {
                    g[1] = f32::NAN;
                }
            }
            let g = Tensor::from_slice(&g).view(p.size().as_slice());
            // d(Σ p·g)/dp = g exactly.
            let term = (p * g).sum(Kind::Float);
            loss = Some(match loss {
                None => term,
                Some(l) => l + term,
            });
        }
        if let Some(loss) = loss {
            loss.backward();
        }
        // The case's rate for this step, as a schedule would set it.
        opt.scale_lr(lr.as_f64().expect("lr") / opt.lr());
        if masked.is_empty() {
            opt.step().unwrap();
        } else {
            let flag = f32::from(u8::from(masked.contains(&i)));
            let flag = Tensor::from_slice(&[flag]).view([] as [i64; 0]);
            opt.step_masked(Some(&flag)).unwrap();
        }
        out.push(
            params
                .iter()
                .map(|p| Vec::<f32>::try_from(p.detach().flatten(0, -1)).unwrap())
                .collect(),
        );
    }
    assert_eq!(opt.steps(), (steps.len() - masked.len()) as u64);
    out
}

fn compare(name: &str, what: &str, got: &[Vec<Vec<f32>>], want: &Value) {
    let want = want.as_array().expect("expected steps");
    assert_eq!(got.len(), want.len(), "{name}: one result per step");
    for (i, (g_step, w_step)) in got.iter().zip(want).enumerate() {
        for (j, g_param) in g_step.iter().enumerate() {
            let w_param = floats(&w_step[j], "expected param");
            assert_eq!(g_param.len(), w_param.len());
            for (k, (g, w)) in g_param.iter().zip(&w_param).enumerate() {
                let (g, w) = (f64::from(*g), f64::from(*w));
                assert!(
                    (g - w).abs() <= ATOL + RTOL * w.abs(),
                    "{name}: {what}: step {}, parameter {j}, element {k}: Tessera {g}, expected {w}",
                    i + 1
                );
            }
        }
    }
}

#[test]
fn several_steps_with_groups_match_pytorch() {
    let text = include_str!("pytorch_steps.json");
    let doc: Value = serde_json::from_str(text).expect("pytorch_steps.json is JSON");
    let cases = doc["cases"].as_array().expect("cases");
    let mut seen = Vec::new();
    let (mut masked_rules, mut late_rules) = (Vec::new(), Vec::new());
    for case in cases {
        let name = case["name"].as_str().expect("a case name");
        assert!(
            case["lr"].as_array().expect("lr").len() >= 3,
            "{name}: several steps"
        );
        let expected = case["expected"].as_object().expect("expected");
        assert!(!expected.is_empty(), "{name}: nothing to compare with");
        let fused = replay(case, name, Implementation::Fused);
        let per_param = replay(case, name, Implementation::PerParam);
        for (what, want) in expected {
            compare(name, &format!("fused vs {what}"), &fused, want);
            compare(name, &format!("per_param vs {what}"), &per_param, want);
        }
        // The two implementations agree with each other as closely.
        let as_json = serde_json::to_value(&per_param).expect("floats serialize");
        compare(name, "fused vs per_param", &fused, &as_json);
        seen.push((
            case["optimizer"].as_str().unwrap_or_default().to_owned(),
            !case["groups"].as_array().is_none_or(Vec::is_empty),
            case["grads"].to_string().contains("null"),
        ));
        if case["masked"].as_array().is_some_and(|m| !m.is_empty()) {
            masked_rules.push(case["optimizer"].as_str().unwrap_or_default().to_owned());
        }
        if late_joiner(case) {
            late_rules.push(case["optimizer"].as_str().unwrap_or_default().to_owned());
        }
    }
    // Masked steps (amp_fp16's overflow check, read on the device only) and parameters that
    // join late (Adam's per-parameter step counts) are covered for every rule torch.optim has
    // and Lion.
    for o in ["adamw", "adam", "sgd", "lion"] {
        assert!(
            masked_rules.iter().any(|x| x == o),
            "no {o} case with masked steps"
        );
        assert!(
            late_rules.iter().any(|x| x == o),
            "no {o} case with a late joiner"
        );
    }
    // Every rule is covered with groups; missing gradients are covered.
    for o in ["adamw", "adam", "sgd", "sgdw", "lion"] {
        assert!(
            seen.iter().any(|(x, g, _)| x == o && *g),
            "no {o} case with groups"
        );
    }
    assert!(
        seen.iter().any(|(_, _, missing)| *missing),
        "no missing gradient"
    );
}

/// Whether a parameter of `case` has no gradient in its first steps and one later.
fn late_joiner(case: &Value) -> bool {
    let steps = case["grads"].as_array().map_or(&[][..], Vec::as_slice);
    let params = steps.first().and_then(Value::as_array).map_or(0, Vec::len);
    (0..params).any(|j| {
        steps.first().is_some_and(|s| s[j].is_null()) && steps.iter().any(|s| !s[j].is_null())
    })
}
