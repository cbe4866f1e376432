//! The plugin against PyTorch: `tests/reference.py` trains a tiny model with plain SGD and
//! Lookahead written out (two cases) or airbench's `LookaheadState` loop copied verbatim, and
//! records the weights after every optimizer step and after the method. The method, driven
//! through the test host, must turn every step's pre-method weights into PyTorch's
//! post-method weights bit for bit, with and without a state round trip in the middle; and a
//! run that trains the same model with the same SGD step in Rust ends where PyTorch's did.
//!
//! The script runs with the torch wheel of `scripts/ensure-libtorch.sh` (the libtorch this crate
//! links, so both sides run the same kernels): `$TESSERA_TORCH_PYTHONPATH`, else the folder
//! above `$LIBTORCH`, else `~/.cache/tessera/torch-2.13.0`. Without a working `import torch` the
//! tests print a notice and pass, unless `TESSERA_REQUIRE_PYTORCH=1` (as `scripts/test.sh` sets).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use lookahead::{airbench_decay, Lookahead};
use serde_json::Value;
use tessera_plugin_api::abi::{MethodBox, MethodState};
use tessera_plugin_api::tch::{self, Kind, Tensor};
use tessera_plugin_api::testing::{settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, Event, State};

fn torch_pythonpath() -> PathBuf {
    if let Some(dir) = std::env::var_os("TESSERA_TORCH_PYTHONPATH").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(lib) = std::env::var_os("LIBTORCH").filter(|v| !v.is_empty()) {
        let lib = PathBuf::from(lib);
        return lib.parent().map(Path::to_owned).unwrap_or(lib);
    }
    let cache = std::env::var_os("TESSERA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache")
                .join("tessera")
        });
    cache.join("torch-2.13.0")
}

/// The folder of the reference files, written once per test binary; `None` (after a notice)
/// when PyTorch cannot be imported and it is not required.
fn reference_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("lookahead-reference-{}", std::process::id()));
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/reference.py");
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
        let run = Command::new(&python)
            .arg(script)
            .arg(&out)
            .env("PYTHONPATH", torch_pythonpath())
            .env("PYTHONWARNINGS", "ignore")
            .output();
        let why = match run {
            Ok(o) if o.status.success() => return Some(out),
            Ok(o) => format!(
                "{}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => format!("cannot start {python}: {e}"),
        };
        let notice = format!(
            "NOTICE: skipping the PyTorch comparison of lookahead: {script} failed with \
             PYTHONPATH={} ({why})",
            torch_pythonpath().display()
        );
        if std::env::var_os("TESSERA_REQUIRE_PYTORCH").is_some_and(|v| v == "1") {
            panic!("{notice} and TESSERA_REQUIRE_PYTORCH=1");
        }
        eprintln!("{notice}");
        None
    })
    .as_deref()
}

/// One reference case: its description and tensors.
struct Case {
    meta: Value,
    tensors: BTreeMap<String, Tensor>,
}

impl Case {
    fn load(dir: &Path, case: &str) -> Case {
        let text = std::fs::read_to_string(dir.join(format!("{case}.json"))).expect(case);
        let meta: Value = serde_json::from_str(&text).expect(case);
        let tensors = Tensor::read_safetensors(dir.join(format!("{case}.safetensors")))
            .unwrap_or_else(|e| panic!("{case}: {e}"))
            .into_iter()
            .collect();
        Case { meta, tensors }
    }

    fn tensor(&self, name: &str) -> &Tensor {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("reference tensor `{name}` is missing"))
    }

    fn steps(&self) -> u64 {
        self.meta["steps"].as_u64().expect("steps")
    }

    /// The state_dict's entries: (name, buffer, trainable).
    fn entries(&self) -> Vec<(String, bool, bool)> {
        self.meta["entries"]
            .as_object()
            .expect("entries")
            .iter()
            .map(|(n, e)| {
                (
                    n.clone(),
                    e["buffer"].as_bool().expect("buffer"),
                    e["trainable"].as_bool().expect("trainable"),
                )
            })
            .collect()
    }

    fn method(&self) -> MethodBox {
        let json = self.meta["settings"].to_string();
        boxed_method::<Lookahead>(&settings(&json)).unwrap_or_else(|e| panic!("{json}: {e}"))
    }

    /// A test host holding the model's initial state_dict (frozen parameters without
    /// `requires_grad`, buffers marked).
    fn host(&self) -> TestHost {
        let mut host = TestHost::new(RandomSource::Seeded(0));
        for (name, buffer, trainable) in self.entries() {
            let t = self.tensor(&format!("init/{name}")).copy();
            let t = if trainable {
                t.set_requires_grad(true)
            } else {
                t
            };
            host.params.insert(name.clone(), t);
            if buffer {
                host.buffers.insert(name);
            }
        }
        host
    }
}

fn load(case: &str) -> Option<Case> {
    reference_dir().map(|dir| Case::load(dir, case))
}

fn set(dst: &Tensor, src: &Tensor) {
    let _g = tch::no_grad_guard();
    dst.shallow_clone().f_copy_(src).expect("copy");
}

fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    let bytes = |t: &Tensor| {
        let t = t.detach().contiguous();
        let mut v = vec![0u8; t.numel() * t.kind().elt_size_in_bytes()];
        t.copy_data_u8(&mut v, t.numel());
        v
    };
    a.kind() == b.kind() && a.size() == b.size() && bytes(a) == bytes(b)
}

fn assert_model_is(host: &TestHost, case: &Case, prefix: &str, what: &str) {
    for (name, _, _) in case.entries() {
        let want = case.tensor(&format!("{prefix}/{name}"));
        let got = &host.params[&name];
        assert!(
            same_bits(got, want),
            "{what}: `{name}` differs from PyTorch's {prefix}\ngot  {got}\nwant {want}"
        );
    }
}

fn fire(host: &mut TestHost, m: &mut MethodBox, event: Event) {
    host.fire(m, event)
        .unwrap_or_else(|e| panic!("{}: {e}", event.name()));
}

fn round_trip(m: &MethodBox, case: &Case) -> MethodBox {
    let state = State::from(m.state().into_result().expect("state"));
    let mut fresh = case.method();
    fresh
        .load_state(MethodState::from(state))
        .into_result()
        .expect("load_state");
    fresh
}

/// Feeds PyTorch's weights after each optimizer step into the host and checks the method's
/// result against PyTorch's weights after the method, bit for bit; `resume_after`: the
/// method's state goes into a new method after that step.
fn replay(case_name: &str, resume_after: Option<u64>) {
    let Some(case) = load(case_name) else { return };
    let mut host = case.host();
    let mut m = case.method();
    let mut changed = 0;
    for t in 1..=case.steps() {
        fire(&mut host, &mut m, Event::BATCH_START);
        for (name, _, _) in case.entries() {
            set(&host.params[&name], case.tensor(&format!("pre/{t}/{name}")));
        }
        fire(&mut host, &mut m, Event::BATCH_END);
        assert_model_is(
            &host,
            &case,
            &format!("post/{t}"),
            &format!("{case_name} step {t}"),
        );
        if case.entries().iter().any(|(n, _, _)| {
            !case
                .tensor(&format!("pre/{t}/{n}"))
                .equal(case.tensor(&format!("post/{t}/{n}")))
        }) {
            changed += 1;
        }
        if resume_after == Some(t) {
            m = round_trip(&m, &case);
        }
    }
    assert!(
        changed >= 2,
        "{case_name}: the method changed the model at {changed} steps"
    );
    // The run ends at T: nothing more happens at `fit_end`.
    let before: Vec<Tensor> = case
        .entries()
        .iter()
        .map(|(n, _, _)| host.params[n].copy())
        .collect();
    fire(&mut host, &mut m, Event::FIT_END);
    for ((n, _, _), b) in case.entries().iter().zip(&before) {
        assert!(
            host.params[n].equal(b),
            "{case_name}: fit_end changed `{n}`"
        );
    }
}

#[test]
fn lookahead_matches_pytorch_step_by_step() {
    replay("lookahead", None);
}

#[test]
fn lookahead_with_buffers_matches_pytorch_step_by_step() {
    replay("lookahead_buffers", None);
}

#[test]
fn airbench_variant_matches_airbench_step_by_step() {
    replay("airbench", None);
}

#[test]
fn a_state_round_trip_between_steps_changes_nothing() {
    // Mid inner loop (lookahead: k = 3), right after a synchronisation, and between
    // airbench's updates.
    replay("lookahead", Some(4));
    replay("lookahead", Some(6));
    replay("lookahead_buffers", Some(3));
    replay("airbench", Some(7));
    replay("airbench", Some(10));
}

#[test]
fn airbench_decays_are_pytorchs_float32_schedule() {
    let Some(case) = load("airbench") else { return };
    let decays = case.tensor("decays");
    let total = case.steps();
    for t in 0..=total {
        let want = decays.double_value(&[t as i64]);
        let got = airbench_decay(0.95, 5, 3.0, t, total);
        assert_eq!(got.to_bits(), want.to_bits(), "t = {t}: {got} vs {want}");
    }
}

/// The model of `reference.py` in Rust: Linear(4, 6) -> BatchNorm1d(6) -> Tanh -> Linear(6, 3),
/// MSE loss, and the same written-out SGD step, on the host's tensors.
fn sgd_step(host: &TestHost, x: &Tensor, y: &Tensor, lr: f64) {
    let p = |n: &str| host.params[n].shallow_clone();
    {
        let _g = tch::no_grad_guard();
        let _ = p("1.num_batches_tracked").f_add_scalar_(1).expect("count");
    }
    let h = x.linear(&p("0.weight"), Some(&p("0.bias")));
    let h = h.batch_norm(
        Some(&p("1.weight")),
        Some(&p("1.bias")),
        Some(&p("1.running_mean")),
        Some(&p("1.running_var")),
        true,
        0.1,
        1e-5,
        false,
    );
    let out = h.tanh().linear(&p("3.weight"), Some(&p("3.bias")));
    let loss = (out - y).pow_tensor_scalar(2).mean(None::<Kind>);
    for (_, t) in host.params.iter() {
        if t.requires_grad() {
            t.shallow_clone().zero_grad();
        }
    }
    loss.backward();
    let _g = tch::no_grad_guard();
    for (_, t) in host.params.iter() {
        if t.requires_grad() {
            let g = t.grad();
            let _ = t.shallow_clone().f_sub_(&(g * lr)).expect("step");
        }
    }
}

#[test]
fn training_in_rust_through_the_method_ends_where_pytorch_did() {
    tch::set_num_threads(1);
    for case_name in ["lookahead", "lookahead_buffers", "airbench"] {
        let Some(case) = load(case_name) else { return };
        let lr = case.meta["lr"].as_f64().expect("lr");
        let mut host = case.host();
        let mut m = case.method();
        for t in 1..=case.steps() {
            fire(&mut host, &mut m, Event::BATCH_START);
            let (x, y) = (
                case.tensor(&format!("input/{t}")).copy(),
                case.tensor(&format!("target/{t}")).copy(),
            );
            sgd_step(&host, &x, &y, lr);
            fire(&mut host, &mut m, Event::BATCH_END);
        }
        fire(&mut host, &mut m, Event::FIT_END);
        let last = format!("post/{}", case.steps());
        assert_model_is(&host, &case, &last, &format!("{case_name}: free-running"));
    }
}
