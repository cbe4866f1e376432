//! SAM against Composer's golden outputs (`tests/golden/sam.*`).
//!
//! The case is a tiny MLP (`hyperparameters.model`, e.g. `Linear(4,3) - Tanh - Linear(3,2)`)
//! with its weights (`w0/*`, named like an `nn.Sequential`), a batch `X`, `Y`, a mean
//! cross-entropy loss and plain SGD (`hyperparameters.lr`, no momentum) as the base optimizer.
//! The test rebuilds that model with tch from the files, then checks
//! - the pure functions: gradient at `w`, global norm, `e(w)`, gradient at `w + e(w)`, the
//!   weights after one SAM step and after one plain SGD step;
//! - the method itself, driven through `testing::TestHost` the way the host drives it (backward,
//!   `after_train_batch`, a second pass when asked, then the SGD step): one SAM step with
//!   `interval = 1`, and the two steps with `interval = 2`.

use std::collections::HashMap;

use sam::{global_grad_norm, is_sam_step, sam_perturbation, shift_in_place, Sam};
use tessera_plugin_api::abi::MethodBox;
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings};
use tessera_plugin_api::testing::{RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, Event, Plugin};

const CASE: &str = "sam";
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-7;

/// The golden case, read generically.
struct Case {
    g: Golden,
    /// Parameter names (`0.weight`, ...), as listed under `w0/`.
    names: Vec<String>,
    /// Indices of the `Linear` layers, in order (`0`, `2`).
    layers: Vec<String>,
    x: Tensor,
    y: Tensor,
    lr: f64,
    rho: f64,
    epsilon: f64,
}

impl Case {
    fn load() -> Case {
        let g = Golden::load(CASE);
        let hp = &g.json["hyperparameters"];
        let num = |k: &str| {
            hp[k]
                .as_f64()
                .unwrap_or_else(|| panic!("hyperparameters.{k}"))
        };
        assert_eq!(hp["base_optimizer"], "SGD", "{hp}");
        assert_eq!(num("momentum"), 0.0, "the test's SGD has no momentum");
        assert_eq!(hp["loss"], "cross_entropy mean", "{hp}");
        let model = hp["model"].as_str().expect("hyperparameters.model");
        let names: Vec<String> = g
            .names_with_role("param")
            .into_iter()
            .filter_map(|n| n.strip_prefix("w0/").map(str::to_owned))
            .collect();
        let mut layers: Vec<String> = names
            .iter()
            .filter_map(|n| n.strip_suffix(".weight").map(str::to_owned))
            .collect();
        layers.sort_by_key(|l| l.parse::<u32>().expect("nn.Sequential index"));
        // The model string lists Linear layers separated by Tanh.
        let parts: Vec<&str> = model.split(" - ").collect();
        assert_eq!(parts.len(), 2 * layers.len() - 1, "model `{model}`");
        for (i, part) in parts.iter().enumerate() {
            if i % 2 == 0 {
                assert!(part.starts_with("Linear("), "model `{model}`");
            } else {
                assert_eq!(*part, "Tanh", "model `{model}`");
            }
        }
        assert_eq!(
            names.len(),
            2 * layers.len(),
            "weights and biases: {names:?}"
        );
        Case {
            x: g.tensor("X").copy(),
            y: g.tensor("Y").copy(),
            lr: num("lr"),
            rho: num("rho"),
            epsilon: num("epsilon"),
            names,
            layers,
            g,
        }
    }

    /// The starting weights, requiring gradients.
    fn w0(&self) -> HashMap<String, Tensor> {
        self.names
            .iter()
            .map(|n| {
                let t = self
                    .g
                    .tensor(&format!("w0/{n}"))
                    .copy()
                    .set_requires_grad(true);
                (n.clone(), t)
            })
            .collect()
    }

    /// Mean cross-entropy of the MLP with weights `w` on the batch.
    fn loss(&self, w: &HashMap<String, Tensor>) -> Tensor {
        let mut h = self.x.shallow_clone();
        for (i, l) in self.layers.iter().enumerate() {
            if i > 0 {
                h = h.tanh();
            }
            h = h.linear(&w[&format!("{l}.weight")], Some(&w[&format!("{l}.bias")]));
        }
        h.cross_entropy_for_logits(&self.y)
    }

    /// Zeroes the gradients, runs forward and backward; returns the loss.
    fn backward(&self, w: &mut HashMap<String, Tensor>) -> f64 {
        for p in w.values_mut() {
            p.zero_grad();
        }
        let loss = self.loss(w);
        loss.backward();
        loss.double_value(&[])
    }

    /// Gradients of `w`, in `names` order.
    fn grads(&self, w: &HashMap<String, Tensor>) -> Vec<Tensor> {
        self.names.iter().map(|n| w[n].grad().copy()).collect()
    }

    /// The base optimizer's step: `p ← p − lr · p.grad`.
    fn sgd(&self, w: &mut HashMap<String, Tensor>) {
        for p in w.values_mut() {
            let g = p.grad().copy();
            shift_in_place(p, &g, -self.lr).expect("sgd step");
        }
    }

    fn assert_weights(&self, what: &str, w: &HashMap<String, Tensor>, prefix: &str) {
        for n in &self.names {
            assert_close(
                &format!("{what}: {n}"),
                &w[n],
                self.g.tensor(&format!("{prefix}{n}")),
                RTOL,
                ATOL,
            );
        }
    }

    fn method(&self, interval: u64) -> MethodBox {
        let json = serde_json::json!({
            "rho": self.rho,
            "epsilon": self.epsilon,
            "interval": interval,
            "log_grad_norm": true,
        });
        boxed_method::<Sam>(&settings(&json.to_string())).expect("sam settings")
    }

    /// One training step the way the host runs it: forward/backward, `after_train_batch`,
    /// repeated while the method asks for another pass, then the SGD step. Returns the number
    /// of passes and the first pass's loss.
    fn host_step(&self, host: &mut TestHost, method: &mut MethodBox) -> (u32, f64) {
        let mut pass = 0;
        let mut first_loss = None;
        loop {
            let loss = self.backward(&mut host.params);
            first_loss.get_or_insert(loss);
            host.pass_index = pass;
            host.extra_pass_requested = false;
            host.fire(method, Event::AFTER_TRAIN_BATCH)
                .expect("after_train_batch");
            if !host.extra_pass_requested {
                break;
            }
            pass += 1;
            assert!(pass < 8, "the method keeps asking for passes");
        }
        self.sgd(&mut host.params);
        (pass + 1, first_loss.expect("one pass"))
    }

    fn test_host(&self) -> TestHost {
        let mut host = TestHost::new(RandomSource::Scripted(Default::default()));
        host.params = self.w0().into_iter().collect();
        host
    }

    fn scalar(&self, name: &str) -> f64 {
        self.g.tensor(name).double_value(&[])
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= ATOL + RTOL * b.abs()
}

#[test]
fn every_golden_tensor_is_used() {
    let case = Case::load();
    let mut expected = vec!["X".to_owned(), "Y".to_owned(), "grad_norm".to_owned()];
    expected.push("loss_at_w".to_owned());
    for prefix in [
        "w0/",
        "grad_w/",
        "e_w/",
        "grad_w_adv/",
        "w_sam/",
        "w_sgd/",
        "interval2/step1/",
        "interval2/step2/",
    ] {
        expected.extend(case.names.iter().map(|n| format!("{prefix}{n}")));
    }
    expected.sort();
    let mut listed: Vec<String> = case.g.entries().keys().cloned().collect();
    listed.sort();
    assert_eq!(
        listed, expected,
        "the case lists tensors this test does not check"
    );
}

#[test]
fn gradient_norm_and_perturbation_match_composer() {
    let case = Case::load();
    let mut w = case.w0();
    let loss = case.backward(&mut w);
    assert!(close(loss, case.scalar("loss_at_w")));
    let grads = case.grads(&w);
    for (n, g) in case.names.iter().zip(&grads) {
        assert_close(
            &format!("grad at w: {n}"),
            g,
            case.g.tensor(&format!("grad_w/{n}")),
            RTOL,
            ATOL,
        );
    }
    let norm = global_grad_norm(&grads).unwrap().expect("a norm");
    assert_close("grad_norm", &norm, case.g.tensor("grad_norm"), RTOL, ATOL);
    let e = sam_perturbation(&grads, case.rho, case.epsilon).unwrap();
    assert_eq!(e.len(), grads.len());
    for (n, e) in case.names.iter().zip(&e) {
        assert_close(
            &format!("e(w): {n}"),
            e,
            case.g.tensor(&format!("e_w/{n}")),
            RTOL,
            ATOL,
        );
    }
    // ‖e(w)‖ = rho (up to epsilon).
    let e_norm = global_grad_norm(&e)
        .unwrap()
        .expect("a norm")
        .double_value(&[]);
    assert!(
        close(e_norm, case.rho),
        "‖e‖ = {e_norm}, rho = {}",
        case.rho
    );
}

#[test]
fn one_sam_step_with_the_functions_matches_composer() {
    let case = Case::load();
    let mut w = case.w0();
    case.backward(&mut w);
    let e = sam_perturbation(&case.grads(&w), case.rho, case.epsilon).unwrap();
    for (n, e) in case.names.iter().zip(&e) {
        shift_in_place(w.get_mut(n).unwrap(), e, 1.0).unwrap();
    }
    case.backward(&mut w);
    for (n, g) in case.names.iter().zip(case.grads(&w)) {
        assert_close(
            &format!("grad at w + e(w): {n}"),
            &g,
            case.g.tensor(&format!("grad_w_adv/{n}")),
            RTOL,
            ATOL,
        );
    }
    for (n, e) in case.names.iter().zip(&e) {
        shift_in_place(w.get_mut(n).unwrap(), e, -1.0).unwrap();
    }
    case.assert_weights("back at w", &w, "w0/");
    case.sgd(&mut w);
    case.assert_weights("one SAM step", &w, "w_sam/");

    // The base step alone reproduces Composer's plain SGD step, and SAM's differs from it.
    let mut plain = case.w0();
    case.backward(&mut plain);
    case.sgd(&mut plain);
    case.assert_weights("one SGD step", &plain, "w_sgd/");
    let moved: f64 = case
        .names
        .iter()
        .map(|n| (&w[n] - &plain[n]).abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    assert!(moved > 1e-6, "SAM and SGD steps agree: {moved}");
}

#[test]
fn one_sam_step_through_the_method_matches_composer() {
    let case = Case::load();
    let mut method = case.method(1);
    let mut host = case.test_host();
    let (passes, loss) = case.host_step(&mut host, &mut method);
    assert_eq!(passes, 2);
    // The step's loss is the first pass's: the loss at w.
    assert!(close(loss, case.scalar("loss_at_w")));
    case.assert_weights("SAM step via the method", &snapshot(&host), "w_sam/");
    let passes: Vec<f64> = host.metric("sam/pass");
    assert_eq!(passes, vec![0.0, 1.0]);
    let norms = host.metric("sam/grad_norm");
    assert_eq!(norms.len(), 1, "{:?}", host.metrics);
    assert!(close(norms[0], case.scalar("grad_norm")), "{norms:?}");
}

#[test]
fn interval_two_through_the_method_matches_composer() {
    let case = Case::load();
    assert!(!is_sam_step(0, 2) && is_sam_step(1, 2));
    let mut method = case.method(2);
    let mut host = case.test_host();
    let (passes, _) = case.host_step(&mut host, &mut method);
    assert_eq!(passes, 1, "step 1 is a plain step");
    let w = snapshot(&host);
    case.assert_weights("interval=2 step 1", &w, "interval2/step1/");
    case.assert_weights("interval=2 step 1 is plain SGD", &w, "w_sgd/");
    let (passes, _) = case.host_step(&mut host, &mut method);
    assert_eq!(passes, 2, "step 2 is a SAM step");
    let w = snapshot(&host);
    case.assert_weights("interval=2 step 2", &w, "interval2/step2/");
    assert_eq!(host.metric("sam/pass"), vec![0.0, 0.0, 1.0]);
    assert_eq!(host.metric("sam/grad_norm").len(), 1);
}

#[test]
fn default_settings_are_composers() {
    let case = Case::load();
    let json: serde_json::Value =
        serde_json::from_str(&default_settings_json(Sam::DEFAULT_SETTINGS)).unwrap();
    assert_eq!(json["rho"].as_f64(), Some(case.rho));
    assert_eq!(json["epsilon"].as_f64(), Some(case.epsilon));
    assert_eq!(json["interval"].as_u64(), Some(1));
    // The defaults reproduce the golden SAM step.
    let mut method =
        boxed_method::<Sam>(&settings(&default_settings_json(Sam::DEFAULT_SETTINGS))).unwrap();
    let mut host = case.test_host();
    assert_eq!(case.host_step(&mut host, &mut method).0, 2);
    case.assert_weights("defaults", &snapshot(&host), "w_sam/");
    // By default the gradient norm is not logged: it would be a read on the host per step.
    assert!(host.metric("sam/grad_norm").is_empty());
}

/// A copy of the host's parameters.
fn snapshot(host: &TestHost) -> HashMap<String, Tensor> {
    host.params
        .iter()
        .map(|(k, v)| (k.clone(), v.detach().copy()))
        .collect()
}
