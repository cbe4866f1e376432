//! `step_masked`, parameter groups (errors, membership, checkpoints) and the operator count of
//! the fused path.

use tch::nn::Init;
use tch::{Device, Kind, Tensor};

use super::schedule::Schedule;
use super::*;
use crate::model::ParamStore;

/// A store with a matrix, a bias, a norm scale and an embedding table, filled with distinct
/// values.
fn model() -> (ParamStore, Vec<Tensor>) {
    let mut store = ParamStore::new(Device::Cpu);
    let mut out = Vec::new();
    for (i, (name, shape)) in [
        ("fc.weight", &[3i64, 4][..]),
        ("fc.bias", &[3][..]),
        ("ln.weight", &[4][..]),
        ("wte.weight", &[5, 2][..]),
    ]
    .into_iter()
    .enumerate()
    {
        let t = store
            .parameter(name.to_owned(), shape, Init::Const(0.0))
            .unwrap();
        let n: i64 = shape.iter().product();
        let values = Tensor::arange(n, (Kind::Float, Device::Cpu))
            .f_mul_scalar(0.1)
            .unwrap()
            .f_add_scalar(i as f64 - 1.5)
            .unwrap()
            .view(shape);
        tch::no_grad(|| t.shallow_clone().copy_(&values));
        out.push(t);
    }
    (store, out)
}

/// Sets gradients that depend on the step, so that state matters.
fn backward(params: &[Tensor], step: usize) {
    let mut loss = Tensor::zeros([] as [i64; 0], (Kind::Float, Device::Cpu));
    for (i, p) in params.iter().enumerate() {
        let w = (p * (0.3 + 0.2 * (i + step) as f64)).sin();
        loss += (w * p).sum(Kind::Float);
    }
    loss.backward();
}

fn rules() -> Vec<Rule> {
    vec![
        Rule::Sgd(Sgd {
            weight_decay: 0.01,
            ..Sgd::default()
        }),
        Rule::Sgd(Sgd {
            weight_decay: 0.01,
            decoupled_weight_decay: true,
            dampening: 0.1,
            ..Sgd::default()
        }),
        Rule::Sgd(Sgd {
            momentum: 0.0,
            weight_decay: 0.1,
            ..Sgd::default()
        }),
        Rule::AdamW(AdamW::default()),
        Rule::Adam(Adam {
            weight_decay: 0.1,
            ..Adam::default()
        }),
        Rule::Lion(Lion {
            weight_decay: 0.5,
            ..Lion::default()
        }),
    ]
}

fn gpt_groups() -> Vec<GroupSpec> {
    vec![GroupSpec {
        kinds: vec![ParamKind::Bias, ParamKind::Norm, ParamKind::Embedding],
        weight_decay: Some(0.0),
        lr_multiplier: 0.5,
        ..GroupSpec::named("no_decay")
    }]
}

fn optimizer(rule: &Rule, implementation: Implementation, store: &ParamStore) -> Optimizer {
    let config = OptimizerConfig {
        rule: rule.clone(),
        groups: gpt_groups(),
        implementation,
    };
    Optimizer::new(config, Schedule::default(), 1.0, store, &[]).unwrap()
}

fn copies(ts: impl IntoIterator<Item = Tensor>) -> Vec<Tensor> {
    ts.into_iter().map(|t| t.detach().copy()).collect()
}

fn state(opt: &Optimizer) -> Vec<(String, Tensor)> {
    opt.snapshot()
        .tensors
        .into_iter()
        .map(|(n, t)| (n, t.detach().copy()))
        .collect()
}

fn flag(v: f32) -> Tensor {
    Tensor::from_slice(&[v]).view([] as [i64; 0])
}

#[test]
fn a_masked_step_changes_nothing_and_an_unmasked_one_is_a_step() {
    for implementation in [Implementation::Fused, Implementation::PerParam] {
        for rule in rules() {
            let what = format!("{rule:?} {implementation:?}");
            let (store_a, a) = model();
            let (store_b, b) = model();
            let mut opt_a = optimizer(&rule, implementation, &store_a);
            let mut opt_b = optimizer(&rule, implementation, &store_b);
            // A masked first step (no state yet), then steps with state.
            for step in 0..4 {
                for (opt, params) in [(&mut opt_a, &a), (&mut opt_b, &b)] {
                    opt.zero_grad();
                    backward(params, step);
                    opt.scale_lr(0.5);
                }
                let before = copies(a.iter().map(Tensor::shallow_clone));
                let state_before = state(&opt_a);
                let steps_before = opt_a.steps();
                // A skips with a flag that holds 1; B does not step at all.
                opt_a.step_masked(Some(&flag(1.0))).unwrap();
                opt_b.skip_step();
                for (x, y) in a.iter().zip(&before) {
                    assert!(x.equal(y), "{what}: step {step}: a parameter changed");
                }
                assert_eq!(opt_a.steps(), steps_before, "{what}: the step count moved");
                assert_eq!(
                    opt_a.lr(),
                    opt_a.initial_lr(),
                    "{what}: the scale is used up"
                );
                let state_after = state(&opt_a);
                let nonzero: Vec<_> = state_after
                    .iter()
                    .filter(|(n, t)| {
                        let was = state_before.iter().find(|(m, _)| m == n);
                        match was {
                            Some((_, w)) => !t.equal(w),
                            // A buffer made by a masked first step must be all zeros.
                            None => t.abs().sum(Kind::Float).double_value(&[]) != 0.0,
                        }
                    })
                    .map(|(n, _)| n.clone())
                    .collect();
                assert!(nonzero.is_empty(), "{what}: state changed: {nonzero:?}");
                // Then a real step: A with a flag holding 0, B with `step`.
                for (opt, params) in [(&mut opt_a, &a), (&mut opt_b, &b)] {
                    opt.zero_grad();
                    backward(params, step);
                }
                opt_a.step_masked(Some(&flag(0.0))).unwrap();
                opt_b.step().unwrap();
                for (j, (x, y)) in a.iter().zip(&b).enumerate() {
                    let diff = (x - y).abs().max().double_value(&[]);
                    assert!(
                        diff <= 1e-6,
                        "{what}: step {step}: parameter {j}: masked(0) vs step: {diff}"
                    );
                }
                assert_eq!(opt_a.steps(), opt_b.steps(), "{what}");
                assert_eq!(opt_a.steps(), step as u64 + 1, "{what}");
            }
        }
    }
}

#[test]
fn the_gpt_rule_groups_biases_norms_and_embeddings() {
    let (store, _) = model();
    let opt = optimizer(
        &Rule::AdamW(AdamW::default()),
        Implementation::Fused,
        &store,
    );
    let groups = opt.group_positions();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0].name, "no_decay");
    assert_eq!(groups[0].members, ["fc.bias", "ln.weight", "wte.weight"]);
    assert_eq!(groups[0].weight_decay, 0.0);
    assert_eq!(groups[0].lr_multiplier, 0.5);
    assert_eq!(groups[1].name, "default");
    assert_eq!(groups[1].members, ["fc.weight"]);
    assert_eq!(groups[1].weight_decay, AdamW::default().weight_decay);
}

#[test]
fn a_group_matching_nothing_and_a_parameter_in_two_groups_are_errors() {
    let (store, _) = model();
    let build = |groups: Vec<GroupSpec>| {
        let config = OptimizerConfig {
            groups,
            ..OptimizerConfig::default()
        };
        Optimizer::new(config, Schedule::default(), 1.0, &store, &[]).map(|_| ())
    };
    let e = build(vec![GroupSpec {
        params: vec!["encoder.*".into()],
        ..GroupSpec::named("enc")
    }])
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "optimizer.groups[0] (enc) matches no parameter of the model"
    );
    // Selectors are AND-ed: a bias that is 2-dimensional does not exist.
    let e = build(vec![GroupSpec {
        kinds: vec![ParamKind::Bias],
        ndim: Some(2),
        ..GroupSpec::named("b2")
    }])
    .unwrap_err();
    assert!(e.to_string().contains("(b2) matches no parameter"), "{e}");
    let e = build(vec![
        GroupSpec {
            params: vec!["fc.*".into()],
            ..GroupSpec::named("head")
        },
        GroupSpec {
            kinds: vec![ParamKind::Bias],
            ..GroupSpec::named("biases")
        },
    ])
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "parameter `fc.bias` is matched by two groups: optimizer.groups[0] (head) and optimizer.groups[1] (biases)"
    );
    // A group that matches only a frozen parameter is fine: it may be unfrozen later.
    let frozen = store.get("wte.weight").unwrap().tensor.shallow_clone();
    let _ = frozen.set_requires_grad(false);
    build(vec![GroupSpec {
        kinds: vec![ParamKind::Embedding],
        ..GroupSpec::named("emb")
    }])
    .unwrap();
}

#[test]
fn a_parameter_unfrozen_again_goes_back_to_its_group() {
    let (store, params) = model();
    let mut opt = optimizer(
        &Rule::AdamW(AdamW::default()),
        Implementation::Fused,
        &store,
    );
    opt.set_member("ln.weight", &params[2], false);
    assert_eq!(opt.group_positions()[0].members, ["fc.bias", "wte.weight"]);
    opt.set_member("ln.weight", &params[2], true);
    assert_eq!(
        opt.group_positions()[0].members,
        ["fc.bias", "wte.weight", "ln.weight"]
    );
    assert_eq!(opt.group_positions()[1].members, ["fc.weight"]);
}

#[test]
fn groups_are_in_checkpoints_and_must_match_on_restore() {
    let (store, params) = model();
    let rule = Rule::AdamW(AdamW::default());
    let mut opt = optimizer(&rule, Implementation::Fused, &store);
    backward(&params, 0);
    opt.step().unwrap();
    let snapshot = opt.snapshot();
    assert_eq!(snapshot.position.groups, opt.group_positions());
    let json = serde_json::to_value(&snapshot.position).unwrap();
    assert_eq!(json["groups"][0]["name"], "no_decay");
    // The same groups restore.
    let mut same = optimizer(&rule, Implementation::PerParam, &store);
    same.restore(&snapshot, &store).unwrap();
    assert_eq!(same.steps(), 1);
    assert_eq!(same.group_positions(), opt.group_positions());
    // Other groups do not.
    let config = OptimizerConfig {
        rule: rule.clone(),
        groups: vec![GroupSpec {
            kinds: vec![ParamKind::Bias],
            ..GroupSpec::named("no_decay")
        }],
        implementation: Implementation::Fused,
    };
    let mut other = Optimizer::new(config, Schedule::default(), 1.0, &store, &[]).unwrap();
    let e = other.restore(&snapshot, &store).unwrap_err();
    assert!(
        e.to_string().starts_with("optimizer group no_decay holds"),
        "{e}"
    );
    // A checkpoint written before groups existed has no `groups`: it loads into a run
    // without groups, and a run with groups says why it does not fit.
    let mut old = json.clone();
    old.as_object_mut().unwrap().remove("groups");
    let old: Position = serde_json::from_value(old).unwrap();
    assert!(old.groups.is_empty());
    let old = Snapshot {
        position: old,
        tensors: state(&opt),
    };
    let mut plain =
        Optimizer::new(rule.clone().into(), Schedule::default(), 1.0, &store, &[]).unwrap();
    plain.restore(&old, &store).unwrap();
    assert_eq!(plain.steps(), 1);
    let e = optimizer(&rule, Implementation::Fused, &store)
        .restore(&old, &store)
        .unwrap_err();
    assert!(e.to_string().contains("has no parameter groups"), "{e}");
}

/// Parameters of `n` layers (a weight and a bias each).
fn layers(n: usize) -> (ParamStore, Vec<Tensor>) {
    let mut store = ParamStore::new(Device::Cpu);
    let mut out = Vec::new();
    for i in 0..n {
        for (name, shape) in [("weight", &[4i64, 4][..]), ("bias", &[4][..])] {
            out.push(
                store
                    .parameter(format!("l{i}.{name}"), shape, Init::Const(0.5))
                    .unwrap(),
            );
        }
    }
    (store, out)
}

fn ops_per_step(rule: &Rule, implementation: Implementation, n: usize) -> i64 {
    let (store, params) = layers(n);
    let mut opt = optimizer_plain(rule, implementation, &store);
    let mut count = 0;
    for step in 0..2 {
        opt.zero_grad();
        backward(&params, step);
        let counter = OpCounter::start().unwrap();
        opt.step().unwrap();
        count = counter.stop().unwrap().top;
    }
    count
}

fn optimizer_plain(rule: &Rule, implementation: Implementation, store: &ParamStore) -> Optimizer {
    let config = OptimizerConfig {
        rule: rule.clone(),
        groups: vec![GroupSpec {
            kinds: vec![ParamKind::Bias],
            weight_decay: Some(0.0),
            ..GroupSpec::named("biases")
        }],
        implementation,
    };
    Optimizer::new(config, Schedule::default(), 1.0, store, &[]).unwrap()
}

#[test]
fn the_fused_step_makes_a_number_of_calls_independent_of_the_parameter_count() {
    for rule in rules() {
        let fused_small = ops_per_step(&rule, Implementation::Fused, 2);
        let fused_large = ops_per_step(&rule, Implementation::Fused, 20);
        let per_small = ops_per_step(&rule, Implementation::PerParam, 2);
        let per_large = ops_per_step(&rule, Implementation::PerParam, 20);
        let name = rule.name();
        assert!(fused_small > 0, "{name}: the counter saw nothing");
        assert_eq!(
            fused_small, fused_large,
            "{name}: fused calls grow with parameters"
        );
        // The per-parameter path makes the same calls for every parameter: 10× the layers,
        // 10× the calls.
        assert_eq!(per_large, 10 * per_small, "{name}: per-parameter calls");
        assert!(
            fused_large < per_large,
            "{name}: {fused_large} vs {per_large}"
        );
    }
}

/// `train.cuda_graphs` keeps the rates on the device: the fused kernels read them there and
/// give the same bits as with host rates (both round the rate to float32).
#[test]
fn rates_on_the_device_give_the_same_steps() {
    for rule in rules() {
        let what = format!("{rule:?}");
        let (store_a, a) = model();
        let (store_b, b) = model();
        let mut on_device = optimizer(&rule, Implementation::Fused, &store_a);
        let mut on_host = optimizer(&rule, Implementation::Fused, &store_b);
        if on_device.capturable().is_err() {
            continue;
        }
        on_device.keep_lr_on_device(Device::Cpu).unwrap();
        for step in 0..4 {
            for (opt, params) in [(&mut on_device, &a), (&mut on_host, &b)] {
                opt.zero_grad();
                backward(params, step);
                opt.scale_lr(0.5 + step as f64);
                let masked = flag(if step == 2 { 1.0 } else { 0.0 });
                opt.step_masked(Some(&masked)).unwrap();
            }
            for (j, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(x.equal(y), "{what}: step {step}: parameter {j} differs");
            }
        }
        assert_eq!(on_device.steps(), on_host.steps(), "{what}");
    }
}

/// What a captured step cannot do is named; a capture needs every piece of state made first,
/// and a replayed step is counted on the host.
#[test]
fn capture_refusals_name_the_setting_and_replays_count() {
    let (store, params) = model();
    let lion = Rule::Lion(Lion::default());
    let e = optimizer(&lion, Implementation::Fused, &store)
        .capturable()
        .unwrap_err();
    assert!(e.contains("lion"), "{e}");
    let sgd = Rule::Sgd(Sgd::default());
    let e = optimizer(&sgd, Implementation::PerParam, &store)
        .capturable()
        .unwrap_err();
    assert!(e.contains("per_param"), "{e}");
    let decoupled = Rule::Sgd(Sgd {
        weight_decay: 0.01,
        decoupled_weight_decay: true,
        ..Sgd::default()
    });
    let e = optimizer(&decoupled, Implementation::Fused, &store)
        .capturable()
        .unwrap_err();
    assert!(e.contains("decoupled_weight_decay"), "{e}");
    // SGD with momentum: the buffers come from the first (eager) step.
    let mut opt = optimizer(&sgd, Implementation::Fused, &store);
    let e = opt.prepare_capture().unwrap_err();
    assert!(e.contains("`fc.weight` has no momentum buffer yet"), "{e}");
    opt.zero_grad();
    backward(&params, 0);
    opt.step().unwrap();
    opt.prepare_capture().unwrap();
    opt.replayed_step();
    assert_eq!(opt.steps(), 2);
    // Adam's state is made for the capture (zeros and a step count of 0, as a fresh state).
    let mut adam = optimizer(
        &Rule::AdamW(AdamW::default()),
        Implementation::Fused,
        &store,
    );
    adam.prepare_capture().unwrap();
    let names: Vec<String> = state(&adam).into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"fc.weight.step".to_owned()), "{names:?}");
}
