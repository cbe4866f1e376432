//! Short real training runs: the `tessera` binary, the real plugins, Fashion-MNIST.

use serde_json::Value;
use tessera_tests::*;

fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks run.json and metrics.jsonl of a finished run; returns run.json.
fn check_run(dir: &TempDir, run_name: &str, batches: u64, plugins: &[&str]) -> Value {
    let run = run_dir(dir, run_name);
    let record = read_json(&run.join("run.json"));
    assert_eq!(record["run_name"], run_name, "{record:#}");
    assert_eq!(record["tessera_version"], VERSION, "{record:#}");
    assert_eq!(
        record["libtorch_version"],
        tessera_plugin_api::LIBTORCH_VERSION,
        "{record:#}"
    );
    assert_eq!(record["batches"], batches, "{record:#}");
    assert_eq!(record["samples"], batches * 64, "{record:#}");

    let recorded: Vec<&Value> = record["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .collect();
    assert_eq!(recorded.len(), plugins.len(), "{record:#}");
    for (p, name) in recorded.iter().zip(plugins) {
        let so = plugin_path(name);
        assert_eq!(p["name"], *name, "{p:#}");
        assert_eq!(p["version"], VERSION, "{p:#}");
        let sha = p["sha256"].as_str().expect("sha256 is a string");
        assert!(is_sha256(sha), "not 64 lower-case hex digits: {sha}");
        assert_eq!(sha, sha256_hex(&so), "sha256 of {}", so.display());
        assert_eq!(
            std::fs::canonicalize(p["path"].as_str().expect("path")).expect("recorded path"),
            std::fs::canonicalize(&so).expect("plugin path"),
        );
    }

    let evals = record["evals"].as_array().expect("evals");
    assert!(!evals.is_empty(), "no evaluation in {record:#}");
    let last = evals.last().expect("an eval");
    let accuracy = last["accuracy"].as_f64().expect("accuracy");
    let ce = last["cross_entropy"].as_f64().expect("cross_entropy");
    assert!(ce.is_finite() && ce > 0.0, "cross-entropy {ce}");
    assert_eq!(last["batch"], batches, "{last:#}");
    // eval_subset_batches = 1 with eval_batch_size = 500.
    assert_eq!(last["samples"], 500, "{last:#}");
    assert_eq!(record["final_accuracy"].as_f64(), Some(accuracy));

    let lines = read_jsonl(&run.join("metrics.jsonl"));
    let train = lines_of_kind(&lines, "train");
    // log_interval = 1ba: one line per batch.
    assert!(train.len() as u64 >= batches, "train lines: {train:?}");
    for l in &train {
        let loss = l["data"]["loss"].as_f64().expect("a loss");
        assert!(loss.is_finite() && loss > 0.0, "{l}");
    }
    assert_eq!(
        train.last().expect("a train line")["data"]["batch"],
        batches
    );
    let eval = lines_of_kind(&lines, "eval");
    assert_eq!(eval.len(), evals.len(), "{lines:?}");
    assert_eq!(eval.last().expect("an eval line")["data"], *last);

    // When each evaluation ran: one entry per evaluation, batches matching, times growing and
    // within the run's; the metrics lines carry the same times.
    let times = record["eval_times"].as_array().expect("eval_times");
    assert_eq!(times.len(), evals.len(), "{record:#}");
    let (train_total, wall_total) = (
        record["train_seconds"].as_f64().expect("train_seconds"),
        record["wall_seconds"].as_f64().expect("wall_seconds"),
    );
    let mut previous = (0.0, 0.0);
    for ((t, e), line) in times.iter().zip(evals).zip(&eval) {
        assert_eq!(t["batch"], e["batch"], "{t} {e}");
        let (ts, ws) = (
            t["train_seconds"].as_f64().expect("train_seconds"),
            t["wall_seconds"].as_f64().expect("wall_seconds"),
        );
        assert!(
            ts >= previous.0 && ws >= previous.1 && ts <= ws,
            "{times:?}"
        );
        assert!(ts <= train_total && ws <= wall_total, "{t} vs {record:#}");
        assert_eq!(line["train_seconds"], t["train_seconds"], "{line}");
        assert_eq!(line["wall_seconds"], t["wall_seconds"], "{line}");
        previous = (ts, ws);
    }
    let label = if plugins.is_empty() {
        "baseline".to_owned()
    } else {
        plugins.join("+")
    };
    assert_eq!(record["recipe"], label.as_str(), "{record:#}");
    record
}

#[test]
fn trains_and_learns_with_both_plugins() {
    let dir = TempDir::new("train");
    // Pinning the right sha256 must load the plugin.
    let sha = sha256_hex(&plugin_path("label_smoothing"));
    let mut toml = TrainerToml::new("both")
        .algorithm(
            "label_smoothing",
            &format!("sha256 = \"{sha}\"\nsmoothing = 0.1"),
        )
        .algorithm("cutout", "num_holes = 1\nlength = 0.25");
    toml.max_duration = "20ba".to_owned();
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("loaded plugin label_smoothing")
            && out.stderr.contains("loaded plugin cutout"),
        "{}",
        out.dump()
    );
    assert!(out.stderr.contains("run both: acc "), "{}", out.dump());
    let record = check_run(&dir, "both", 20, &["label_smoothing", "cutout"]);
    // Measured: 0.736 after 20 batches; 0.090 with a learning rate of 1e-9 (a step that does
    // nothing).
    assert_learned(&record, 0.5);
    assert_eq!(record["plugins"][0]["settings"]["smoothing"], 0.1);
    assert_eq!(record["plugins"][1]["settings"]["length"], 0.25);
}

#[test]
fn set_overrides_change_the_run() {
    let dir = TempDir::new("train-set");
    let mut toml = TrainerToml::new("base").with_both_plugins();
    toml.max_duration = "50ba".to_owned();
    toml.model = "name = \"mlp\"\nhidden = [64]".to_owned();
    toml.write_to(&dir);
    let out = train(
        &dir,
        &[
            "run_name=overridden",
            "train.max_duration=2ba",
            "model.hidden=[32, 16]",
            "optimizer.lr=0.01",
            "algorithms.0.smoothing=0.2",
            "algorithms.1.num_holes=2",
        ],
        &[],
    );
    out.assert_success();
    assert!(
        !run_dir(&dir, "base").exists(),
        "the overridden run_name was ignored"
    );
    let record = check_run(&dir, "overridden", 2, &["label_smoothing", "cutout"]);
    let config = &record["config"];
    assert_eq!(config["train"]["max_duration"], "2ba", "{config:#}");
    assert_eq!(config["model"]["name"], "mlp", "{config:#}");
    assert_eq!(config["model"]["hidden"], serde_json::json!([32, 16]));
    assert_eq!(config["optimizer"]["lr"], 0.01, "{config:#}");
    assert_eq!(record["plugins"][0]["settings"]["smoothing"], 0.2);
    assert_eq!(record["plugins"][1]["settings"]["num_holes"], 2);
    assert_eq!(record["plugins"][1]["settings"]["length"], 0.25);
}

/// The final evaluation of a CPU run with `seed`.
fn final_eval(seed: u64) -> (f64, f64) {
    let dir = TempDir::new("determinism");
    let mut toml = TrainerToml::new("det").with_both_plugins();
    toml.seed = seed;
    toml.device = Some("cpu".to_owned());
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let record = read_json(&run_dir(&dir, "det").join("run.json"));
    let last = record["evals"].as_array().and_then(|e| e.last()).cloned();
    let last = last.unwrap_or_else(|| panic!("no eval in {record:#}"));
    (
        last["cross_entropy"].as_f64().expect("cross_entropy"),
        last["accuracy"].as_f64().expect("accuracy"),
    )
}

#[test]
fn same_seed_gives_the_same_result_on_cpu() {
    let a = final_eval(11);
    let b = final_eval(11);
    assert_eq!(a, b, "two runs with seed 11 differ");
    // And the seed matters (CutOut's holes, the shuffle and the initial weights all change).
    let c = final_eval(12);
    assert_ne!(a, c, "seeds 11 and 12 gave identical results");
}

#[test]
fn fake_plugin_with_true_versions_loads_and_runs() {
    let dir = TempDir::new("fake-ok");
    TrainerToml::new("fake")
        .algorithm("fake_plugin", "offset = 100.0")
        .write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("loaded plugin fake_plugin"),
        "{}",
        out.dump()
    );
    check_run(&dir, "fake", 3, &["fake_plugin"]);
    let lines = read_jsonl(&run_dir(&dir, "fake").join("metrics.jsonl"));
    let calls: Vec<(String, f64)> = lines_of_kind(&lines, "method")
        .iter()
        .map(|l| {
            (
                l["name"].as_str().expect("name").to_owned(),
                l["value"].as_f64().expect("value"),
            )
        })
        .collect();
    let expect = |name: &str, value: f64| (format!("fake_plugin/{name}"), value);
    assert_eq!(
        calls,
        vec![
            expect("calls", 1.0),
            expect("batch_end", 101.0),
            expect("calls", 2.0),
            expect("batch_end", 102.0),
            expect("calls", 3.0),
            expect("batch_end", 103.0),
            expect("eval_end", 103.0),
        ],
        "the fake plugin's hooks were not called as expected"
    );
}

/// `[scheduler] name = "warmup_stable_decay"` through the binary: the rate of every step (a
/// train line's `lr` is the next step's rate, the schedule at the batches done before the
/// line's batch, as Composer steps it) follows the definition, `scale_schedule_ratio`
/// stretches the stable phase and the cooldown but not the warmup, and a warmup that runs into
/// the cooldown stops the run before it trains.
#[test]
fn warmup_stable_decay_sets_every_steps_rate() {
    let dir = TempDir::new("wsd");
    let mut toml = TrainerToml::new("wsd");
    toml.model = "name = \"mlp\"\nhidden = [32]".to_owned();
    toml.max_duration = "10ba".to_owned();
    toml.device = Some("cpu".to_owned());
    let schedule = |warmup: &str| {
        format!(
            "\n\n[scheduler]\nname = \"warmup_stable_decay\"\nt_warmup = \"{warmup}\"\n\
             decay_fraction = 0.4\nalpha_f = 0.1\ndecay_shape = \"sqrt\"\n"
        )
    };
    let base = toml.optimizer.clone();
    toml.optimizer = format!("{base}{}", schedule("2ba"));
    toml.write_to(&dir);
    // From the definition: warmup over 2 batches, the cooldown over the last round(0.4·M).
    let alpha = |t: u64, m: u64| {
        if t < 2 {
            return t as f64 / 2.0;
        }
        let d = (0.4 * m as f64).round() as u64;
        if t < m - d {
            return 1.0;
        }
        let p = ((t - (m - d)) as f64 / d as f64).min(1.0);
        0.1 + 0.9 * (1.0 - p.sqrt())
    };
    for (run, ssr, batches) in [("plain", "1.0", 10u64), ("stretched", "2.0", 20)] {
        let set_run = format!("run_name={run}");
        let set_ssr = format!("train.scale_schedule_ratio={ssr}");
        train(&dir, &[&set_run, &set_ssr], &[]).assert_success();
        let lines = read_jsonl(&run_dir(&dir, run).join("metrics.jsonl"));
        let rates: Vec<(u64, f64)> = lines_of_kind(&lines, "train")
            .iter()
            .filter_map(|l| Some((l["data"]["batch"].as_u64()?, l["data"]["lr"].as_f64()?)))
            .collect();
        assert_eq!(
            rates.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
            (1..=batches).collect::<Vec<_>>(),
            "{run}"
        );
        for (b, lr) in rates {
            let want = 0.05 * alpha(b - 1, batches);
            assert!(
                (lr - want).abs() <= 1e-12 * want.max(1e-300),
                "{run}: after batch {b}: lr {lr}, want {want}"
            );
        }
    }
    // Warmup 7 > the cooldown's start 6.
    toml.optimizer = format!("{base}{}", schedule("7ba"));
    toml.write_to(&dir);
    train(&dir, &["run_name=overlap"], &[])
        .assert_failure(&["warmup_stable_decay", "runs into the cooldown"]);
}
