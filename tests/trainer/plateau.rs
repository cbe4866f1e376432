//! `[scheduler] name = "reduce_on_plateau"`: PyTorch's `ReduceLROnPlateau`, stepped after each
//! evaluation with the monitored metric.
//!
//! - In process: the schedule's state gives PyTorch's rates to the bit, for sequences of
//!   values under every mode, threshold mode, cooldown, `min_lr` and `eps`.
//! - Through the binary: a run's rate after each evaluation is the rate PyTorch's scheduler
//!   gives for that run's own evaluations; a run killed (`kill -9`) and resumed continues the
//!   schedule's state bit for bit; bad settings are refused naming the key.

use serde_json::{json, Value};
use tessera::optim::schedule::{Plateau, PlateauMode, PlateauState, ThresholdMode};
use tessera_tests::resume::assert_killed_and_resumed_is_exact;
use tessera_tests::*;

/// Runs PyTorch's `ReduceLROnPlateau` over each case (`lr`, the scheduler's keyword arguments,
/// `values`): the rate after each step, per case.
fn torch_rates(cases: &Value) -> Vec<Vec<f64>> {
    let script = format!(
        "import json, torch\n\
         out = []\n\
         for case in json.loads({cases:?}):\n\
         \x20   p = torch.nn.Parameter(torch.zeros(1))\n\
         \x20   opt = torch.optim.SGD([p], lr=case['lr'])\n\
         \x20   s = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, **case['kwargs'])\n\
         \x20   rates = []\n\
         \x20   for v in case['values']:\n\
         \x20       s.step(v)\n\
         \x20       rates.append(opt.param_groups[0]['lr'])\n\
         \x20   out.append(rates)\n\
         print(json.dumps(out))",
        cases = cases.to_string()
    );
    let out = python(&["-c", &script]).unwrap_or_else(|e| panic!("python: {e}"));
    assert!(
        out.status.success(),
        "the ReduceLROnPlateau reference failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the reference prints JSON")
}

/// The keyword arguments of `p` for PyTorch.
fn kwargs(p: &Plateau) -> Value {
    json!({
        "mode": match p.mode { PlateauMode::Min => "min", PlateauMode::Max => "max" },
        "factor": p.factor,
        "patience": p.patience,
        "threshold": p.threshold,
        "threshold_mode": match p.threshold_mode { ThresholdMode::Rel => "rel", ThresholdMode::Abs => "abs" },
        "cooldown": p.cooldown,
        "min_lr": p.min_lr,
        "eps": p.eps,
    })
}

#[test]
fn the_schedules_rates_are_pytorchs_to_the_bit() {
    if !python_can_import("torch", "ReduceLROnPlateau") {
        return;
    }
    let torch_defaults = Plateau {
        mode: PlateauMode::Min,
        factor: 0.1,
        patience: 10,
        threshold: 1e-4,
        threshold_mode: ThresholdMode::Rel,
        cooldown: 0,
        min_lr: 0.0,
        eps: 1e-8,
    };
    // Falling, flat, noisy and rising stretches, values within the threshold of the best.
    let losses: Vec<f64> = (0..40)
        .map(|i| {
            let i = f64::from(i);
            2.0 / (1.0 + 0.3 * i).min(4.0) + 0.01 * (1.7 * i).sin() + 0.00005 * i
        })
        .collect();
    let accuracies: Vec<f64> = losses.iter().map(|l| 1.0 - l / 3.0).collect();
    let settings = [
        (torch_defaults, &losses, 0.1),
        (
            Plateau {
                patience: 2,
                factor: 0.5,
                ..torch_defaults
            },
            &losses,
            0.05,
        ),
        (
            Plateau {
                patience: 1,
                factor: 0.3,
                cooldown: 3,
                threshold: 0.01,
                ..torch_defaults
            },
            &losses,
            1.0,
        ),
        (
            Plateau {
                patience: 0,
                factor: 0.5,
                threshold_mode: ThresholdMode::Abs,
                threshold: 0.002,
                min_lr: 0.004,
                ..torch_defaults
            },
            &losses,
            0.1,
        ),
        (
            Plateau {
                mode: PlateauMode::Max,
                patience: 1,
                factor: 0.7,
                ..torch_defaults
            },
            &accuracies,
            0.02,
        ),
        (
            Plateau {
                mode: PlateauMode::Max,
                patience: 0,
                threshold_mode: ThresholdMode::Abs,
                threshold: 0.0,
                factor: 0.9,
                eps: 1e-3,
                ..torch_defaults
            },
            &accuracies,
            0.01,
        ),
    ];
    let cases: Vec<Value> = settings
        .iter()
        .map(|(p, values, lr)| json!({"lr": lr, "kwargs": kwargs(p), "values": values}))
        .collect();
    let want = torch_rates(&Value::Array(cases));
    let mut reductions = 0;
    for ((p, values, lr), want) in settings.iter().zip(want) {
        let mut state = PlateauState::new(*lr);
        let got: Vec<f64> = values
            .iter()
            .map(|v| {
                reductions += usize::from(state.step(p, *v).is_some());
                state.lr
            })
            .collect();
        assert_eq!(got, want, "{p:?}");
    }
    // The cases reach reductions (and the floor, the cooldown and eps), not only the start.
    assert!(reductions >= 10, "only {reductions} reductions");
}

/// The small CNN, 12 batches, evaluated on one batch after every batch, with
/// `reduce_on_plateau` watching `monitor` (its own direction): halving the rate after each
/// evaluation that does not improve on the best by 2 %.
fn plateau_run(run: &str, monitor: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(run);
    toml.max_duration = "12ba".to_owned();
    toml.device = Some("cpu".to_owned());
    toml.train = "eval_interval = \"1ba\"".to_owned();
    toml.optimizer.push_str(&format!(
        "\n\n[scheduler]\nname = \"reduce_on_plateau\"\nmonitor = \"{monitor}\"\n\
         patience = 0\nfactor = 0.5\nthreshold = 0.02\n"
    ));
    toml
}

#[test]
fn a_runs_rate_follows_pytorchs_scheduler_on_its_own_evaluations() {
    if !python_can_import("torch", "ReduceLROnPlateau in a run") {
        return;
    }
    let dir = TempDir::new("plateau-run");
    let mut cases = Vec::new();
    let mut logged = Vec::new();
    for (monitor, mode) in [("cross_entropy", "min"), ("accuracy", "max")] {
        let toml = plateau_run(monitor, monitor);
        toml.write_to(&dir);
        require_fashion_mnist();
        train(&dir, &[], &[]).assert_success();
        let lines = read_jsonl(&run_dir(&dir, monitor).join("metrics.jsonl"));
        // The rate each batch trained with (a train line's `lr`: its step's rate).
        let rates: Vec<f64> = lines_of_kind(&lines, "train")
            .iter()
            .map(|l| l["data"]["lr"].as_f64().expect("lr"))
            .collect();
        let evals: Vec<f64> = lines_of_kind(&lines, "eval")
            .iter()
            .map(|l| l["data"][monitor].as_f64().expect("the metric"))
            .collect();
        assert_eq!((rates.len(), evals.len()), (12, 12), "{monitor}");
        cases.push(json!({
            "lr": 0.05,
            "kwargs": {"mode": mode, "patience": 0, "factor": 0.5, "threshold": 0.02},
            // After the last evaluation no step follows.
            "values": evals[..11],
        }));
        logged.push((monitor, rates));
    }
    let want = torch_rates(&Value::Array(cases));
    for ((monitor, rates), after) in logged.into_iter().zip(want) {
        // The first batch trains at the configured rate, each later one at the rate PyTorch's
        // scheduler gives after the evaluations before it.
        let expected: Vec<f64> = std::iter::once(0.05).chain(after).collect();
        assert_eq!(rates, expected, "{monitor}");
        assert!(
            rates.last() < rates.first(),
            "{monitor}: the rate never fell in 12 evaluations: {rates:?}"
        );
    }
}

#[test]
fn a_killed_and_resumed_run_continues_the_plateau_state_bit_for_bit() {
    assert_killed_and_resumed_is_exact("plateau-resume", |run| {
        let mut toml = plateau_run(run, "cross_entropy");
        toml.max_duration = "8ba".to_owned();
        toml
    });
}

#[test]
fn bad_plateau_settings_are_refused_naming_the_key() {
    let dir = TempDir::new("plateau-bad");
    for (setting, words) in [
        ("factor = 1.0", &["factor", "(0, 1)"][..]),
        (
            "monitor = \"perplexity\"",
            &["monitor", "perplexity exists only"],
        ),
        (
            "monitor = \"loss\"",
            &["monitor", "unknown metric \"loss\""],
        ),
        ("mode = \"median\"", &["mode", "median"]),
        ("patience = -1", &["patience"]),
        (
            "threshold_mode = \"relative\"",
            &["threshold_mode", "relative"],
        ),
    ] {
        let mut toml = TrainerToml::new("bad");
        toml.optimizer.push_str(&format!(
            "\n\n[scheduler]\nname = \"reduce_on_plateau\"\n{setting}\n"
        ));
        toml.write_to(&dir);
        let line = train(&dir, &[], &[]).assert_failure(words);
        assert!(line.contains("scheduler"), "{setting}: {line}");
    }
}
