//! SWA against Composer's golden outputs (`tests/golden/swa.*`).
//!
//! The golden case trains a Linear-BatchNorm-ReLU-Linear net with plain SGD for 12 to 20 steps
//! under Composer's `Trainer` with `SWA`, in several runs (`hyperparameters.runs`). Everything
//! is read from the JSON and safetensors files: the data `X`, `y`, the initial weights `init/`,
//! each run's settings, schedule and `max_duration`, and its recorded results: the rate of
//! every step, the weights after every step (`<run>/traj/`), the event table, the averaged
//! model, the model right after the replacement and at the end.
//!
//! Two levels are checked:
//! - the functional forms alone: `update_average` over the recorded trajectory at the recorded
//!   update batches gives Composer's averaged model, and `swalr_lr` Composer's rates;
//! - a replay: the same training, written here with libtorch, driven through
//!   [`Swa::train_event`] at every `batch_end` and `epoch_end` as Tessera's host drives the
//!   plugin (the schedule stepped before the clock advances, the plugin's rate applied to the
//!   next step), reproduces the rates, the event table, the trajectory, the averaged model and
//!   the replacement. Training amplifies rounding (the golden README allows about 1e-5 there).
//!
//! A run without a Composer scheduler but with `schedule_swa_lr` (Composer's `SWALR` rate then
//! persists, and its target is 1.0) is replayed with `swa_lr_mode = "hold"` and `swa_lr` = the
//! rate Composer used (`results.runs.<run>.swa_lr_used`): Tessera always has a schedule, and
//! that mode is the one that holds the rate.

use serde_json::{json, Value};
use swa::{swalr_lr, update_average, ModelTensor, Swa, SwaConfig};
use tessera_plugin_api::tch::{self, Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::settings_for;
use tessera_plugin_api::{Event, TimeInfo};

const CASE: &str = "swa";
/// Rounding amplified by up to 20 SGD steps (golden README).
const TRAIN_RTOL: f64 = 1e-5;
const TRAIN_ATOL: f64 = 1e-6;

/// One recorded run.
struct Run {
    name: String,
    /// `hyperparameters.runs.<name>`.
    spec: Value,
    /// `results.runs.<name>`.
    results: Value,
}

fn runs(g: &Golden) -> Vec<Run> {
    let specs = g.json["hyperparameters"]["runs"]
        .as_object()
        .expect("hyperparameters.runs");
    assert!(!specs.is_empty());
    specs
        .iter()
        .map(|(name, spec)| Run {
            name: name.clone(),
            spec: spec.clone(),
            results: g.json["results"]["runs"][name].clone(),
        })
        .collect()
}

/// The model's tensor names in state-dict order (those of `init/`, in the JSON's order).
fn model_names(g: &Golden) -> Vec<String> {
    let names: Vec<String> = g
        .entries()
        .keys()
        .filter_map(|k| k.strip_prefix("init/").map(str::to_owned))
        .collect();
    assert!(!names.is_empty(), "no init/ tensors");
    names
}

fn is_buffer(name: &str) -> bool {
    name.contains("running_") || name.ends_with("num_batches_tracked")
}

/// Composer's `LinearScheduler(alpha_i=.., alpha_f=..)` over the whole run, or none.
#[derive(Clone, Copy)]
struct Schedule {
    alpha_i: f64,
    alpha_f: f64,
}

impl Schedule {
    fn read(run: &Run) -> Option<Schedule> {
        let text = run.spec["schedulers"].as_str()?;
        let inner = text
            .strip_prefix("LinearScheduler(")
            .and_then(|t| t.strip_suffix(')'))
            .unwrap_or_else(|| panic!("run {}: unknown scheduler {text}", run.name));
        let params = tessera_plugin_api::testing::golden::parse_params(inner);
        let get = |k: &str| -> f64 { params[k].parse().expect("a number") };
        Some(Schedule {
            alpha_i: get("alpha_i"),
            alpha_f: get("alpha_f"),
        })
    }

    /// The multiplier after `done` of `total` batches.
    fn multiplier(&self, done: u64, total: u64) -> f64 {
        let frac = (done as f64 / total as f64).min(1.0);
        self.alpha_i + (self.alpha_f - self.alpha_i) * frac
    }
}

/// The plugin's settings for a run (see the module documentation for runs without a
/// scheduler).
fn run_settings(run: &Run) -> SwaConfig {
    let mut s = run.spec["swa"].clone();
    let scheduled = s["schedule_swa_lr"].as_bool().unwrap_or(false);
    if scheduled && run.spec["schedulers"].is_null() {
        s["swa_lr_mode"] = json!("hold");
        s["swa_lr"] = run.results["swa_lr_used"].clone();
    }
    SwaConfig::from_settings(&settings_for::<Swa>(&s.to_string()))
        .unwrap_or_else(|e| panic!("run {}: {e}", run.name))
}

/// (batches per epoch, max batches, max_duration in epochs?) of a run.
fn lengths(g: &Golden, run: &Run) -> (u64, u64, bool) {
    let per_epoch = (g.tensor("X").size()[0] / 4) as u64;
    let max = run.spec["max_duration"].as_str().expect("max_duration");
    if let Some(e) = max.strip_suffix("ep") {
        (
            per_epoch,
            e.parse::<u64>().expect("epochs") * per_epoch,
            true,
        )
    } else {
        let b = max.strip_suffix("ba").expect("ba or ep");
        (per_epoch, b.parse().expect("batches"), false)
    }
}

#[test]
fn update_average_reproduces_averaged_model_from_the_trajectory() {
    let g = Golden::load(CASE);
    let names = model_names(&g);
    for run in runs(&g) {
        let updates: Vec<i64> = run.results["updates_after_batch"]
            .as_array()
            .expect("updates_after_batch")
            .iter()
            .map(|b| b.as_i64().expect("batch"))
            .collect();
        let average: Vec<(String, Tensor)> = names
            .iter()
            .map(|n| (n.clone(), g.tensor(&format!("init/{n}")).zeros_like()))
            .collect();
        for (n, batch) in updates.iter().enumerate() {
            let model: Vec<ModelTensor> = names
                .iter()
                .map(|name| ModelTensor {
                    name: name.clone(),
                    tensor: g
                        .tensor(&format!("{}/traj/{name}", run.name))
                        .get(batch - 1),
                    buffer: is_buffer(name),
                })
                .collect();
            update_average(&average, &model, n as u64).expect("update");
        }
        for (name, t) in &average {
            let want = g.tensor(&format!("{}/swa_model/{name}", run.name));
            assert!(
                t.equal(want),
                "run {}: {name} differs from Composer's AveragedModel\n{t}\n{want}",
                run.name
            );
        }
    }
}

#[test]
fn swalr_reproduces_the_rates_without_a_scheduler() {
    let g = Golden::load(CASE);
    let mut checked = 0;
    for run in runs(&g) {
        let scheduled = run.spec["swa"]["schedule_swa_lr"].as_bool() == Some(true);
        if !scheduled || !run.spec["schedulers"].is_null() {
            continue;
        }
        let config = run_settings(&run);
        let want: Vec<f64> = serde_json::from_value(run.results["lr_per_step"].clone()).unwrap();
        let updates: Vec<usize> =
            serde_json::from_value(run.results["updates_after_batch"].clone()).unwrap();
        let swa_lr = run.results["swa_lr_used"].as_f64().expect("swa_lr_used");
        // Nothing else touches the rate: each step back-solves from the previous one.
        let mut lr = want[0];
        for (k, batch) in updates.iter().enumerate() {
            lr = swalr_lr(
                lr,
                swa_lr,
                k as u64 + 1,
                config.anneal_strategy,
                config.anneal_steps,
            );
            // The rate set after batch `b` is used by step `b + 1` (index `b`).
            if *batch < want.len() {
                assert!(
                    (lr - want[*batch]).abs() <= 1e-12 * want[*batch].abs(),
                    "run {}: SWALR step {} gives {lr}, Composer used {}",
                    run.name,
                    k + 1,
                    want[*batch]
                );
            }
        }
        checked += 1;
    }
    assert!(
        checked > 0,
        "no run without a scheduler uses schedule_swa_lr"
    );
}

/// The replayed net: Linear(4, 8), BatchNorm1d(8), ReLU, Linear(8, 3), as named tensors.
struct Net {
    tensors: Vec<(String, Tensor)>,
}

impl Net {
    fn new(g: &Golden, names: &[String]) -> Net {
        Net {
            tensors: names
                .iter()
                .map(|n| {
                    let t = g.tensor(&format!("init/{n}")).copy();
                    let t = if is_buffer(n) {
                        t
                    } else {
                        t.set_requires_grad(true)
                    };
                    (n.clone(), t)
                })
                .collect(),
        }
    }

    fn get(&self, suffix: &str) -> &Tensor {
        &self
            .tensors
            .iter()
            .find(|(n, _)| n == suffix)
            .unwrap_or_else(|| panic!("no `{suffix}`"))
            .1
    }

    /// Composer's training step: forward in training mode (BatchNorm statistics updated),
    /// cross entropy, backward, `p ← p − lr·∇p`.
    fn train_step(&mut self, x: &Tensor, y: &Tensor, lr: f64) {
        let h = x.linear(self.get("0.weight"), Some(self.get("0.bias")));
        let h = Tensor::batch_norm(
            &h,
            Some(self.get("1.weight")),
            Some(self.get("1.bias")),
            Some(self.get("1.running_mean")),
            Some(self.get("1.running_var")),
            true,
            0.1,
            1e-5,
            false,
        );
        {
            let _g = tch::no_grad_guard();
            let _ = self
                .get("1.num_batches_tracked")
                .shallow_clone()
                .f_add_scalar_(1);
        }
        let out = h
            .relu()
            .linear(self.get("3.weight"), Some(self.get("3.bias")));
        let loss = out.cross_entropy_for_logits(y);
        loss.backward();
        let _g = tch::no_grad_guard();
        for (name, p) in &self.tensors {
            if is_buffer(name) {
                continue;
            }
            let mut grad = p.grad();
            let mut p = p.shallow_clone();
            let _ = p.f_sub_(&grad.f_mul_scalar(lr).unwrap()).unwrap();
            let _ = grad.f_zero_().unwrap();
        }
    }

    fn model(&self) -> Vec<ModelTensor> {
        self.tensors
            .iter()
            .map(|(n, t)| ModelTensor {
                name: n.clone(),
                tensor: t.shallow_clone(),
                buffer: is_buffer(n),
            })
            .collect()
    }

    fn assert_matches(&self, what: &str, want: impl Fn(&str) -> Tensor) {
        for (name, t) in &self.tensors {
            let w = want(name);
            if t.kind() == Kind::Int64 {
                assert!(t.equal(&w), "{what}: {name}: {t} vs {w}");
            } else {
                assert_close(&format!("{what}: {name}"), t, &w, TRAIN_RTOL, TRAIN_ATOL);
            }
        }
    }
}

#[test]
fn replayed_training_reproduces_every_run() {
    let g = Golden::load(CASE);
    let names = model_names(&g);
    let x = g.tensor("X");
    let y = g.tensor("y");
    for run in runs(&g) {
        let r = &run.name;
        let config = run_settings(&run);
        let schedule = Schedule::read(&run);
        let (per_epoch, max_batches, in_epochs) = lengths(&g, &run);
        let max_epochs = max_batches / per_epoch;
        let lr0 = 0.1;
        let want_lr: Vec<f64> = serde_json::from_value(run.results["lr_per_step"].clone()).unwrap();
        let events = g.tensor(&format!("{r}/events"));
        let mut net = Net::new(&g, &names);
        let mut swa = Swa::new(config);
        // The host's rate: initial × schedule multiplier × the plugin's one-step scale.
        let mut multiplier = schedule.map_or(1.0, |s| s.multiplier(0, max_batches));
        let mut next_lr: Option<f64> = None;
        let mut row = 0i64;
        let mut replaced_after = None;
        let mut time = TimeInfo {
            batches_per_epoch: per_epoch,
            max_batches,
            training: true,
            ..TimeInfo::default()
        };
        let elapsed = |t: &TimeInfo| {
            if in_epochs {
                t.epoch as f64 / max_epochs as f64
            } else {
                t.batch as f64 / max_batches as f64
            }
        };
        let check_event = |swa: &Swa, t: &TimeInfo, event: Event, lr_after: f64, row: i64| {
            let e = events.get(row);
            let v = |i: i64| e.double_value(&[i]);
            let what = format!("run {r}, event row {row}");
            let code = if event == Event::BATCH_END { 0.0 } else { 1.0 };
            assert_eq!(v(0), code, "{what}: event");
            assert_eq!(v(1), t.epoch as f64, "{what}: epoch");
            assert_eq!(v(2), t.batch as f64, "{what}: batch");
            assert_eq!(v(3), t.elapsed_fraction, "{what}: elapsed");
            assert!(
                (v(4) - lr_after).abs() <= 1e-12 * v(4).abs(),
                "{what}: lr after the event {lr_after}, Composer {}",
                v(4)
            );
            assert_eq!(v(5), swa.started() as u8 as f64, "{what}: started");
            assert_eq!(v(6), swa.step_counter() as f64, "{what}: step_counter");
            assert_eq!(v(7), swa.completed() as u8 as f64, "{what}: completed");
            assert_eq!(v(8), swa.n_averaged() as f64, "{what}: n_averaged");
        };
        for epoch in 0..max_epochs {
            for i in 0..per_epoch {
                let step = (epoch * per_epoch + i) as usize;
                let lr = next_lr.take().unwrap_or(lr0 * multiplier);
                assert!(
                    (lr - want_lr[step]).abs() <= 1e-12 * want_lr[step],
                    "run {r}: step {step} runs at {lr}, Composer's at {}",
                    want_lr[step]
                );
                let rows =
                    Tensor::arange_start((i * 4) as i64, (i * 4 + 4) as i64, tch::kind::INT64_CPU);
                net.train_step(&x.index_select(0, &rows), &y.index_select(0, &rows), lr);
                net.assert_matches(&format!("run {r}, after step {step}"), |n| {
                    g.tensor(&format!("{r}/traj/{n}")).get(step as i64)
                });
                // The schedule steps before the clock advances.
                if let Some(s) = schedule {
                    multiplier = s.multiplier(time.batch, max_batches);
                }
                time.batch += 1;
                time.batch_in_epoch += 1;
                time.elapsed_fraction = elapsed(&time);
                let mut ends = vec![Event::BATCH_END];
                if i + 1 == per_epoch {
                    ends.push(Event::EPOCH_END);
                }
                for event in ends {
                    if event == Event::EPOCH_END {
                        time.epoch += 1;
                        time.batch_in_epoch = 0;
                        time.elapsed_fraction = elapsed(&time);
                    }
                    let host_lr = next_lr.unwrap_or(lr0 * multiplier);
                    let out = swa
                        .train_event(event, &time, host_lr, &net.model())
                        .expect("train_event");
                    if out.next_lr.is_some() {
                        next_lr = out.next_lr;
                    }
                    if out.replaced {
                        replaced_after = Some(time.batch);
                        net.assert_matches(&format!("run {r}, after the replacement"), |n| {
                            g.tensor(&format!("{r}/after_replacement/{n}")).copy()
                        });
                    }
                    let lr_after = next_lr.unwrap_or(lr0 * multiplier);
                    check_event(&swa, &time, event, lr_after, row);
                    row += 1;
                }
            }
        }
        assert_eq!(row, events.size()[0], "run {r}: event rows");
        assert_eq!(
            replaced_after,
            run.results["replaced_after_batch"].as_u64(),
            "run {r}: replacement"
        );
        assert_eq!(
            swa.n_averaged(),
            run.results["n_averaged"].as_u64().expect("n_averaged")
        );
        for (name, t) in swa.average() {
            let want = g.tensor(&format!("{r}/swa_model/{name}"));
            if t.kind() == Kind::Int64 {
                assert!(t.equal(want), "run {r}: average {name}");
            } else {
                assert_close(
                    &format!("run {r}: average {name}"),
                    t,
                    want,
                    TRAIN_RTOL,
                    TRAIN_ATOL,
                );
            }
        }
        net.assert_matches(&format!("run {r}, at the end"), |n| {
            g.tensor(&format!("{r}/final/{n}")).copy()
        });
    }
}
