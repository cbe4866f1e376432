//! Time-to-target (`train.target`) through the real binary on Fashion-MNIST (CPU): an MLP
//! evaluated every 5 batches (on 500 test images) reaches `accuracy >= 0.7` within a few
//! evaluations; the run stops there (final checkpoint, status naming the target) or, with
//! `stop_at_target = false`, trains on while keeping the first time; `accuracy >= 0.999` is
//! never met and the run says so; a resumed run keeps the first time.

use serde_json::Value;
use tessera_tests::*;

const REACHABLE: &str = "train.target=accuracy >= 0.7";
const UNREACHABLE: &str = "train.target=accuracy >= 0.999";

/// An MLP for `batches` batches, evaluated every 5 batches.
fn mlp(run_name: &str, batches: u64) -> TrainerToml {
    let mut toml = TrainerToml::new(run_name);
    toml.model = "name = \"mlp\"\nhidden = [64]".to_owned();
    toml.max_duration = format!("{batches}ba");
    toml.device = Some("cpu".to_owned());
    toml
}

/// Trains `toml` in `dir` with evaluations every 5 batches and `overrides`; returns run.json.
fn run(dir: &TempDir, toml: &TrainerToml, overrides: &[&str]) -> (Value, Output) {
    toml.write_to(dir);
    let mut all = vec!["train.eval_interval=5ba"];
    all.extend_from_slice(overrides);
    let out = train(dir, &all, &[]);
    out.assert_success();
    let record = read_json(&run_dir(dir, &toml.run_name).join("run.json"));
    (record, out)
}

/// `(batch, accuracy)` of each evaluation in a run record.
fn evals(record: &Value) -> Vec<(u64, f64)> {
    record["evals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| Some((e["batch"].as_u64()?, e["accuracy"].as_f64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// The batch of the first evaluation with accuracy >= 0.7, and that accuracy.
fn first_reaching(record: &Value) -> (u64, f64) {
    evals(record)
        .into_iter()
        .find(|(_, acc)| *acc >= 0.7)
        .unwrap_or_else(|| panic!("no evaluation reached 0.7: {record:#}"))
}

/// Asserts that two run records hold the same `target_reached` (its floats went through a
/// checkpoint's JSON, which need not give back the last bit).
fn assert_same_reach(resumed: &Value, first: &Value) {
    let (a, b) = (&resumed["target_reached"], &first["target_reached"]);
    for key in ["metric", "op", "value", "epoch", "batch", "samples"] {
        assert_eq!(a[key], b[key], "{key}: {resumed:#}\n{first:#}");
    }
    for key in ["reached_value", "train_seconds", "wall_seconds"] {
        let (x, y) = (
            a[key].as_f64().unwrap_or(-1.0),
            b[key].as_f64().unwrap_or(1.0),
        );
        assert!(
            (x - y).abs() <= 1e-12 * y.abs(),
            "{key}: {resumed:#}\n{first:#}"
        );
    }
}

#[test]
fn a_reached_target_stops_the_run_and_records_when_with_its_cost() {
    let dir = TempDir::new("target-stop");
    let toml = mlp("stop", 100);
    let (record, out) = run(&dir, &toml, &[REACHABLE, "usd_per_hour=3.6"]);
    let (batch, accuracy) = first_reaching(&record);
    assert!(batch < 100, "{record:#}");
    // The run stopped at the first evaluation that met the target, without evaluating again.
    assert_eq!(record["batches"], batch, "{record:#}");
    let all = evals(&record);
    assert!(all.len() >= 2, "met at the first evaluation: {record:#}");
    assert_eq!(all.last(), Some(&(batch, accuracy)), "{record:#}");
    assert_eq!(
        record["status"], "stopped early: target accuracy >= 0.7 reached",
        "{record:#}"
    );
    let reached = &record["target_reached"];
    assert_eq!(reached["metric"], "accuracy", "{record:#}");
    assert_eq!(reached["op"], ">=", "{record:#}");
    assert_eq!(reached["value"], 0.7, "{record:#}");
    assert_eq!(reached["reached_value"], accuracy, "{record:#}");
    assert_eq!(reached["batch"], batch, "{record:#}");
    assert_eq!(reached["epoch"], 0, "{record:#}");
    assert_eq!(reached["samples"], batch * 64, "{record:#}");
    assert!(reached.get("tokens").is_none(), "{record:#}");
    let train_seconds = reached["train_seconds"].as_f64().unwrap_or(-1.0);
    let wall_seconds = reached["wall_seconds"].as_f64().unwrap_or(-1.0);
    assert!(
        train_seconds > 0.0 && train_seconds <= wall_seconds,
        "{record:#}"
    );
    assert!(
        wall_seconds <= record["wall_seconds"].as_f64().unwrap_or(0.0),
        "{record:#}"
    );
    // $3.60 an hour is $0.001 a second.
    let cost = reached["estimated_cost_usd"].as_f64().unwrap_or(-1.0);
    assert!((cost - wall_seconds * 0.001).abs() < 1e-12, "{record:#}");
    // The end of a finished run: a final checkpoint at the stop.
    let last = run_dir(&dir, "stop")
        .join("checkpoints")
        .join(format!("ep0-ba{batch}.ckpt"));
    assert!(last.is_file(), "no {}:\n{}", last.display(), out.dump());
    assert!(
        out.stderr.contains(&format!(
            "target accuracy >= 0.7 reached at batch {batch} (epoch 0): {accuracy:.4} after"
        )) && out.stderr.contains(" s wall, $0.0"),
        "{}",
        out.dump()
    );
}

#[test]
fn an_unreachable_target_runs_to_the_end_and_says_so() {
    let dir = TempDir::new("target-missed");
    let (record, out) = run(&dir, &mlp("missed", 10), &[UNREACHABLE]);
    assert_eq!(record["batches"], 10, "{record:#}");
    assert_eq!(record["status"], "completed", "{record:#}");
    assert!(record["target_reached"].is_null(), "{record:#}");
    let best = evals(&record)
        .into_iter()
        .map(|(_, acc)| acc)
        .fold(f64::MIN, f64::max);
    assert!(
        out.stderr.contains(&format!(
            "target accuracy >= 0.999 not reached; best accuracy {best:.4} at batch"
        )),
        "{}",
        out.dump()
    );
    // Without a target there is no record of one.
    let (plain, _) = run(&TempDir::new("target-none"), &mlp("none", 5), &[]);
    assert!(plain["target_reached"].is_null(), "{plain:#}");
    assert!(
        plain["config"]["train"].get("target").is_none(),
        "{plain:#}"
    );
}

#[test]
fn without_stop_at_target_the_run_trains_on_and_keeps_the_first_time_across_a_resume() {
    let dir = TempDir::new("target-go-on");
    let toml = mlp("go-on", 40);
    let (first, _) = run(&dir, &toml, &[REACHABLE, "train.stop_at_target=false"]);
    let (batch, accuracy) = first_reaching(&first);
    assert!(batch < 40, "{first:#}");
    assert_eq!(first["batches"], 40, "{first:#}");
    assert_eq!(first["status"], "completed", "{first:#}");
    assert_eq!(first["target_reached"]["batch"], batch, "{first:#}");
    assert_eq!(
        first["target_reached"]["reached_value"], accuracy,
        "{first:#}"
    );
    // Without a price there is no cost.
    assert!(
        first["target_reached"]["estimated_cost_usd"].is_null(),
        "{first:#}"
    );
    // Continued from its final checkpoint to 50 batches: the first time stays.
    let (resumed, _) = run(
        &dir,
        &toml,
        &[
            REACHABLE,
            "train.stop_at_target=false",
            "checkpoint.autoresume=true",
            "train.max_duration=50ba",
        ],
    );
    assert_eq!(resumed["batches"], 50, "{resumed:#}");
    assert!(resumed["resumed_from"].is_string(), "{resumed:#}");
    assert_same_reach(&resumed, &first);
}

#[test]
fn a_run_resumed_after_stopping_at_its_target_stops_again_at_once() {
    let dir = TempDir::new("target-resume-stop");
    let toml = mlp("again", 100);
    let (first, _) = run(&dir, &toml, &[REACHABLE]);
    let batch = first["target_reached"]["batch"].as_u64().unwrap_or(0);
    assert!(batch > 0 && batch < 100, "{first:#}");
    let (again, out) = run(&dir, &toml, &[REACHABLE, "checkpoint.autoresume=true"]);
    assert_eq!(again["batches"], batch, "{again:#}\n{}", out.dump());
    assert_eq!(
        again["status"],
        format!("stopped early: target accuracy >= 0.7 reached at batch {batch}"),
        "{again:#}"
    );
    assert_same_reach(&again, &first);
}

#[test]
fn a_bad_target_is_refused_naming_the_key() {
    let dir = TempDir::new("target-bad");
    mlp("bad", 5).write_to(&dir);
    train(&dir, &["train.target=acc >= 0.9"], &[]).assert_failure(&[
        "train.target",
        "unknown metric \"acc\"; use accuracy (or top1), top2, top3, ... (topK), f1, cross_entropy or perplexity",
    ]);
    train(&dir, &["train.target=perplexity < 10"], &[])
        .assert_failure(&["train.target", "perplexity exists only for language models"]);
}

#[test]
fn every_rank_of_a_data_parallel_run_stops_at_the_same_evaluation() {
    use tessera_tests::dist::{assert_all_succeeded, train_ranks};
    let dir = TempDir::new("target-ranks");
    mlp("ranks", 100).write_to(&dir);
    let outputs = train_ranks(
        &dir,
        2,
        &[REACHABLE, "train.eval_interval=5ba", "train.threads=1"],
    );
    assert_all_succeeded(&outputs);
    let record = read_json(&run_dir(&dir, "ranks").join("run.json"));
    let (batch, accuracy) = first_reaching(&record);
    assert!(batch < 100, "{record:#}");
    assert_eq!(record["batches"], batch, "{record:#}");
    assert_eq!(record["target_reached"]["batch"], batch, "{record:#}");
    assert_eq!(
        record["target_reached"]["reached_value"], accuracy,
        "{record:#}"
    );
    assert_eq!(
        record["status"], "stopped early: target accuracy >= 0.7 reached",
        "{record:#}"
    );
    // Had one rank trained on, the other's collectives would have failed or hung: both
    // succeeded, having checked at the end that they hold the same model. Rank 0 logs.
    let out = &outputs[0];
    assert!(
        out.stderr
            .contains(&format!("stopping after batch {batch}"))
            && out
                .stderr
                .contains(&format!("target accuracy >= 0.7 reached at batch {batch}")),
        "{}",
        out.dump()
    );
}
