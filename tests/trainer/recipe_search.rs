//! `tessera recipe search`: short runs of the recipes at growing lengths within the budget,
//! then the fastest (recipe, length) meeting the target, with its evidence; resumable.

use serde_json::Value;
use tessera_tests::*;

/// An MLP on Fashion-MNIST, 8 batches at full length; two recipe files.
fn search_dir(label: &str) -> TempDir {
    let dir = TempDir::new(label);
    let mut base = TrainerToml::new("mlp");
    base.model = "name = \"mlp\"\nhidden = [32]".into();
    base.max_duration = "8ba".into();
    base.write_to(&dir);
    dir.write(
        "smooth.toml",
        "recipe = \"smooth\"\n[[algorithms]]\nplugin = \"label_smoothing\"\nsmoothing = 0.1\n",
    );
    dir.write(
        "mixed.toml",
        "recipe = \"mixed\"\n[[algorithms]]\nplugin = \"mixup\"\nalpha = 0.2\n",
    );
    dir
}

fn search(dir: &TempDir, extra: &[&str]) -> Output {
    require_fashion_mnist();
    let mut args = vec![
        "recipe",
        "search",
        "trainer.toml",
        "--recipe",
        "smooth.toml",
        "--recipe",
        "mixed.toml",
    ];
    args.extend_from_slice(extra);
    tessera(&args, dir.path(), &[])
}

fn recommendation(dir: &TempDir) -> Value {
    read_json(&run_dir(dir, "mlp-recipe-search").join("recommendation.json"))
}

#[test]
fn the_search_tries_every_recipe_at_every_length_and_recommends_the_fastest_meeting_the_target() {
    let dir = search_dir("recipe-search");
    let out = search(&dir, &["--budget", "1h"]);
    out.assert_success();
    let rec = recommendation(&dir);
    let points = rec["points"].as_array().expect("points");
    // The baseline is added to the user's recipes; every length of the ladder was tried.
    assert_eq!(points.len(), 3 * 4, "{rec:#}");
    for recipe in ["baseline", "smooth", "mixed"] {
        let lengths: Vec<f64> = points
            .iter()
            .filter(|p| p["recipe"] == recipe)
            .filter_map(|p| p["scale_schedule_ratio"].as_f64())
            .collect();
        assert_eq!(lengths, [0.125, 0.25, 0.5, 1.0], "{recipe}: {rec:#}");
    }
    // The default target is the baseline's final accuracy at full length...
    let baseline_full = points
        .iter()
        .find(|p| p["recipe"] == "baseline" && p["scale_schedule_ratio"] == 1.0)
        .expect("the baseline at full length");
    let quality = baseline_full["quality"].as_f64().expect("quality");
    assert_eq!(rec["target"], format!("accuracy >= {quality}"), "{rec:#}");
    let record = read_json(
        &run_dir(&dir, "mlp-recipe-search")
            .join("baseline-ssr1")
            .join("run.json"),
    );
    assert_eq!(record["final_accuracy"].as_f64(), Some(quality));
    // ...and the recommendation is the fastest point meeting it.
    let meeting: Vec<&Value> = points
        .iter()
        .filter(|p| p["quality"].as_f64().expect("quality") >= quality)
        .collect();
    for p in points {
        let meets = p["quality"].as_f64().expect("quality") >= quality;
        assert_eq!(p["meets_target"], meets, "{p}");
    }
    let fastest = meeting
        .iter()
        .min_by(|a, b| {
            a["wall_seconds"]
                .as_f64()
                .expect("wall")
                .total_cmp(&b["wall_seconds"].as_f64().expect("wall"))
        })
        .expect("the baseline at full length meets its own quality");
    assert_eq!(&rec["recommended"], *fastest, "{rec:#}");
    assert!(out.stdout.contains("recommended: recipe"), "{}", out.dump());
    // The evidence: the Explorer's report over the search's runs, every run a point in it.
    let report = rec["report"].as_str().expect("a report");
    let html = std::fs::read_to_string(report).expect("report.html");
    assert_eq!(html.matches("class=\"run-point\"").count(), 12, "{report}");

    // The recommended command trains the recipe (its file reads back) at that length.
    let command = rec["command"].as_str().expect("a command");
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    let trained = tessera(&args, dir.path(), &[]);
    trained.assert_success();
    let again = read_json(&run_dir(&dir, "mlp").join("run.json"));
    assert_eq!(again["recipe"], rec["recommended"]["recipe"], "{again:#}");
    assert_eq!(
        again["config"]["train"]["scale_schedule_ratio"],
        rec["recommended"]["scale_schedule_ratio"]
    );

    // Run again: nothing is trained twice.
    let resumed = search(&dir, &["--budget", "1h"]);
    resumed.assert_success();
    assert!(
        resumed.stderr.contains("3 of 3 runs already done"),
        "{}",
        resumed.dump()
    );
    assert_eq!(recommendation(&dir)["points"], rec["points"]);
}

#[test]
fn a_small_budget_stops_the_ladder_and_an_unreachable_target_is_said_so() {
    let dir = search_dir("recipe-search-budget");
    let out = search(&dir, &["--budget", "100ms", "--target", "accuracy >= 0.99"]);
    out.assert_success();
    let rec = recommendation(&dir);
    // The first length always runs (three processes take longer than 100 ms); then the
    // budget is spent.
    let lengths: Vec<f64> = rec["points"]
        .as_array()
        .expect("points")
        .iter()
        .filter_map(|p| p["scale_schedule_ratio"].as_f64())
        .collect();
    assert_eq!(lengths, [0.125, 0.125, 0.125], "{rec:#}");
    assert!(
        rec["stopped_because"]
            .as_str()
            .is_some_and(|s| s.contains("budget")),
        "{rec:#}"
    );
    assert_eq!(rec["target"], "accuracy >= 0.99");
    assert_eq!(rec["target_source"], "--target");
    assert!(rec["recommended"].is_null(), "{rec:#}");
    assert!(
        out.stdout
            .contains("no recipe met the target within the budget"),
        "{}",
        out.dump()
    );
}
