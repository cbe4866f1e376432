//! `tessera explore`: real short runs explored end to end, and the report opened in a real
//! headless Chromium (Debian's package; `scripts/ensure-chromium.sh` installs it and
//! `scripts/test.sh` names it in `TESSERA_CHROMIUM`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use tessera_tests::*;

/// Three short real runs (baseline with seeds 1 and 2, label smoothing) in one runs folder:
/// the table names both recipes and the plots and report are written beside them.
#[test]
fn real_runs_are_explored() {
    let dir = TempDir::new("explore-real");
    let recipes = [
        ("base-1", 1, TrainerToml::new("base-1")),
        ("base-2", 2, TrainerToml::new("base-2")),
        (
            "smooth-1",
            1,
            TrainerToml::new("smooth-1").algorithm("label_smoothing", "smoothing = 0.1"),
        ),
    ];
    for (_, seed, toml) in recipes {
        let mut toml = toml;
        toml.seed = seed;
        toml.max_duration = "4ba".to_owned();
        toml.write_to(&dir);
        train(&dir, &["train.eval_interval=2ba"], &[]).assert_success();
    }
    let runs = dir.join("runs");
    let table = explore_at(&dir, &[runs.to_str().expect("UTF-8")], "3.6");
    assert!(table.contains("fashion-mnist, cnn"), "{table}");
    assert!(
        row(&table, "baseline").contains("  2  "),
        "two seeds: {table}"
    );
    assert!(row(&table, "label_smoothing").contains("  1  "), "{table}");
    assert!(
        row(&table, "baseline").contains("1.00x"),
        "the reference: {table}"
    );
    let explore = runs.join("explore");
    // The group is named by the dataset and the whole model table (`num_classes` included).
    let slug = "fashion-mnist-cnn-num-classes-10-width-8";
    for file in [
        format!("frontier-{slug}.svg"),
        format!("frontier-{slug}.png"),
        "report.html".to_owned(),
    ] {
        let path = explore.join(file);
        let len = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .len();
        assert!(len > 1000, "{} is {len} bytes", path.display());
    }
    let html = std::fs::read_to_string(explore.join("report.html")).expect("report");
    assert_eq!(html.matches("class=\"run-point\"").count(), 3);
    // Real runs write metrics.jsonl: both learning-curve charts, each with every run.
    for curve in ["quality", "training-loss"] {
        let chart = element(&html, &format!("<svg id=\"curves-{curve}-{slug}\""));
        assert_eq!(chart.matches("class=\"curve\"").count(), 3, "{curve}");
    }
    assert!(only_svg_namespace(&html), "the report refers to no address");
    assert!(!html.contains("<script"), "the report runs no script");
}

/// A data-parallel run over two nodes (two ranks, one per node, on the loopback) pays for both
/// nodes: its record says `nodes: 2` and its cost is wall time x 2 x the price; the explorer's
/// re-pricing counts both too.
#[test]
fn a_two_node_run_costs_every_node() {
    let dir = TempDir::new("explore-nodes");
    let mut toml = TrainerToml::new("two-nodes");
    toml.max_duration = "2ba".to_owned();
    toml.write_to(&dir);
    let outputs = tessera_tests::dist::train_ranks_with_env(
        &dir,
        2,
        &["usd_per_hour=3.6"],
        &[("LOCAL_WORLD_SIZE", "1")],
    );
    tessera_tests::dist::assert_all_succeeded(&outputs);
    let record = read_json(&run_dir(&dir, "two-nodes").join("run.json"));
    assert_eq!(record["nodes"], 2, "{record:#}");
    let wall = record["wall_seconds"].as_f64().expect("wall_seconds");
    let cost = record["estimated_cost_usd"].as_f64().expect("a cost");
    assert!(
        (cost - wall * 2.0 / 1000.0).abs() < 1e-9,
        "{cost} for {wall} s on 2 nodes at $3.6/h"
    );

    let runs = dir.join("runs");
    let table = explore_at(&dir, &[runs.to_str().expect("UTF-8")], "7.2");
    let expected = format!("{:.4}", wall * 4.0 / 1000.0);
    let row = row(&table, "baseline");
    assert!(
        row.contains(&expected),
        "cost {expected} expected in: {row}"
    );
}

/// `tessera explore ARGS... --usd-per-hour USD` in `dir`, which must succeed; its table.
fn explore_at(dir: &TempDir, args: &[&str], usd_per_hour: &str) -> String {
    let mut all = vec!["explore"];
    all.extend_from_slice(args);
    all.extend(["--usd-per-hour", usd_per_hour]);
    let out = tessera(&all, dir.path(), &[]);
    out.assert_success();
    out.stdout
}

/// The line of `table` for `recipe`.
fn row(table: &str, recipe: &str) -> String {
    table
        .lines()
        .find(|l| l.starts_with(&format!("{recipe} ")))
        .unwrap_or_else(|| panic!("no row for {recipe} in:\n{table}"))
        .to_owned()
}

/// The text from `start` (which must be in `html`) to the end of its element.
fn element<'a>(html: &'a str, start: &str) -> &'a str {
    let at = html
        .find(start)
        .unwrap_or_else(|| panic!("no {start} in the report"));
    let tag = start[1..].split([' ', '>']).next().unwrap_or("");
    let end = html[at..]
        .find(&format!("</{tag}>"))
        .map_or(html.len(), |e| at + e);
    &html[at..end]
}

/// The only addresses in the report are XML namespace names (never fetched).
fn only_svg_namespace(html: &str) -> bool {
    html.match_indices("http")
        .all(|(i, _)| html[i..].starts_with("http://www.w3.org/2000/svg"))
}

/// No record: a clear error naming where it looked.
#[test]
fn an_empty_folder_is_an_error_naming_it() {
    let dir = TempDir::new("explore-empty");
    let out = tessera(&["explore", "."], dir.path(), &[]);
    assert!(!out.status.success());
    assert!(
        out.stderr
            .contains("no run records (run.json) found under ."),
        "{}",
        out.stderr
    );
    // A broken record is skipped with a warning naming it; with nothing else, that fails.
    dir.write("runs/broken/run.json", "{ not json");
    let out = tessera(&["explore", "runs"], dir.path(), &[]);
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("broken/run.json: not JSON"),
        "{}",
        out.stderr
    );
}

/// A hand-written run record: Fashion-MNIST CNN, `recipe`, evaluated at `(wall, accuracy)`,
/// over `nodes` machines.
fn record(name: &str, recipe: &str, seed: u64, evals: &[(f64, f64)], nodes: u64) -> Value {
    let wall = evals.last().expect("an evaluation").0;
    json!({
        "run_name": name,
        "recipe": recipe,
        "config": {
            "run_name": name, "seed": seed, "output_dir": "/runs",
            "data": {"dataset": "fashion-mnist"},
            "model": {"name": "cnn", "width": 8},
        },
        "evals": evals.iter().enumerate().map(|(i, (_, acc))| json!({
            "epoch": 1, "batch": (i + 1) * 100, "accuracy": acc, "cross_entropy": 0.5,
            "samples": 500,
        })).collect::<Vec<_>>(),
        "eval_times": evals.iter().enumerate().map(|(i, (t, _))| json!({
            "batch": (i + 1) * 100, "train_seconds": t, "wall_seconds": t,
        })).collect::<Vec<_>>(),
        "wall_seconds": wall,
        "train_seconds": wall,
        "nodes": nodes,
        "estimated_cost_usd": null,
        "target_reached": null,
    })
}

/// The training-loss lines of a `metrics.jsonl`: a loss falling from `start` over 200 batches.
fn metrics(start: f64) -> String {
    (1..=20)
        .map(|i| {
            let batch = i * 10;
            let loss = start * 0.9f64.powi(i);
            format!(
                "{}\n",
                json!({"kind": "train", "data": {"batch": batch, "loss": loss}})
            )
        })
        .collect()
}

/// The browser named by `TESSERA_CHROMIUM` or found on PATH; `None` (with a notice) when
/// there is none, a failure when `TESSERA_REQUIRE_CHROMIUM=1`.
fn chromium() -> Option<PathBuf> {
    let named = std::env::var_os("TESSERA_CHROMIUM")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let found = named.or_else(|| {
        let path = std::env::var_os("PATH").unwrap_or_default();
        ["chromium", "chromium-browser"].iter().find_map(|name| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
    });
    if let Some(path) = found.filter(|p| p.is_file()) {
        return Some(path);
    }
    let notice = "NOTICE: skipping the browser test of report.html: no chromium (set \
                  TESSERA_CHROMIUM, or run scripts/ensure-chromium.sh)";
    assert!(
        std::env::var_os("TESSERA_REQUIRE_CHROMIUM").is_none_or(|v| v != "1"),
        "{notice} and TESSERA_REQUIRE_CHROMIUM=1"
    );
    eprintln!("{notice}");
    None
}

/// The window both the layout and the screenshot are taken in (wider than the report, so its
/// charts are drawn at their own size).
const WINDOW: &str = "--window-size=1200,1000";

/// Runs headless Chromium on `url` with `args`; returns its stdout. A browser still running
/// after [`BROWSER_TIMEOUT`] is killed and fails the test.
fn run_chromium(browser: &Path, profile: &Path, args: &[&str], url: &str) -> String {
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--force-device-scale-factor=1",
        WINDOW,
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .arg(url);
    let command = format!("{} --headless {} {url}", browser.display(), args.join(" "));
    let out = run_with_timeout(cmd, &command, BROWSER_TIMEOUT);
    assert!(out.status.success(), "{}", out.dump());
    out.stdout
}

/// The start tags of `class` elements in `html`, in document order.
fn tags<'a>(html: &'a str, class: &str) -> Vec<&'a str> {
    html.match_indices(&format!("class=\"{class}\""))
        .map(|(i, _)| {
            let start = html[..i].rfind('<').expect("an opening <");
            &html[start..i + html[i..].find('>').expect("a closed tag")]
        })
        .collect()
}

/// The value of attribute `name` in the start tag `tag`.
fn attr(tag: &str, name: &str) -> String {
    let key = format!(" {name}=\"");
    let start = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + key.len();
    tag[start..].split('"').next().unwrap_or("").to_owned()
}

/// Appended to a copy of the report (the report itself has no script): writes where the
/// browser laid out the frontier's labels and means into a `<pre id="layout">` as JSON.
const LAYOUT_SCRIPT: &str = r#"<script>
const boxes = (selector) => [...document.querySelectorAll(selector)].map((e) => {
  const r = e.getBoundingClientRect();
  const g = e.closest('[data-point]');
  return {point: g.dataset.point, recipe: g.dataset.recipe, fill: e.getAttribute('fill'),
          left: r.left, top: r.top, right: r.right, bottom: r.bottom};
});
const pre = document.createElement('pre');
pre.id = 'layout';
pre.textContent = JSON.stringify({
  labels: boxes('svg.frontier .point-label text'),
  means: boxes('svg.frontier .point-mean'),
});
document.body.appendChild(pre);
</script>"#;

/// Whether two boxes of the layout overlap by more than a pixel's rounding.
fn overlap(a: &Value, b: &Value) -> bool {
    let f = |v: &Value, k: &str| v[k].as_f64().expect("a number");
    let w = f(a, "right").min(f(b, "right")) - f(a, "left").max(f(b, "left"));
    let h = f(a, "bottom").min(f(b, "bottom")) - f(a, "top").max(f(b, "top"));
    w > 0.5 && h > 0.5
}

/// The report of hand-written runs, opened in headless Chromium: the frontier has a dot per
/// run, one mean and one label per point, labels that overlap no other label or mean, a legend
/// entry per point with its mean ± half range, and axes fitted to the data (not from zero);
/// the learning curves are one chart per measure with every run and a legend entry per
/// recipe; the screenshot shows each recipe's colour at its mean, left to right in wall-time
/// order. The 2-node record is priced for both nodes.
#[test]
fn the_report_draws_the_frontier_in_a_real_browser() {
    let Some(browser) = chromium() else {
        return;
    };
    let dir = TempDir::new("explore-browser");
    // (name, recipe, seed, evaluations (wall s, accuracy), nodes); walls 40 < 60 < 100 < 130.
    let runs = [
        (
            "base-1",
            "baseline",
            1,
            vec![(50.0, 0.70), (100.0, 0.80)],
            1,
        ),
        (
            "base-2",
            "baseline",
            2,
            vec![(65.0, 0.74), (130.0, 0.84)],
            1,
        ),
        (
            "smooth",
            "label_smoothing",
            1,
            vec![(20.0, 0.79), (40.0, 0.83)],
            1,
        ),
        ("cut", "cutout", 1, vec![(30.0, 0.75), (60.0, 0.78)], 2),
    ];
    for (i, (name, recipe, seed, evals, nodes)) in runs.iter().enumerate() {
        let text = record(name, recipe, *seed, evals, *nodes).to_string();
        dir.write(&format!("runs/{name}/run.json"), &text);
        dir.write(
            &format!("runs/{name}/metrics.jsonl"),
            &metrics(2.0 + i as f64 * 0.1),
        );
    }
    let out_dir = dir.join("out");
    let table = explore_at(
        &dir,
        &["runs", "--out", out_dir.to_str().expect("UTF-8")],
        "3.6",
    );
    // $3.6/h is $0.001/s: 40 s on one node, 60 s on two.
    assert!(row(&table, "label_smoothing").contains("0.0400"), "{table}");
    assert!(
        row(&table, "cutout").contains("0.1200"),
        "two nodes: {table}"
    );

    let report = std::fs::read_to_string(out_dir.join("report.html")).expect("report");
    assert!(
        only_svg_namespace(&report),
        "the report refers to no address"
    );
    assert!(!report.contains("<script"), "the report runs no script");
    let instrumented = dir.join("out/report-layout.html");
    std::fs::write(
        &instrumented,
        report.replace("</body>", &format!("{LAYOUT_SCRIPT}</body>")),
    )
    .expect("write the instrumented copy");
    let profile = dir.join("chromium-profile");
    let url = |path: &Path| format!("file://{}", path.display());
    let dom = run_chromium(&browser, &profile, &["--dump-dom"], &url(&instrumented));

    // One frontier chart for the group, with one dot per run.
    let slug = "fashion-mnist-cnn-width-8";
    assert_eq!(dom.matches("class=\"chart frontier\"").count(), 1);
    let frontier = element(&dom, &format!("<svg id=\"frontier-{slug}\""));
    let mut in_dom: Vec<(String, String)> = tags(frontier, "run-point")
        .iter()
        .map(|t| (attr(t, "data-run"), attr(t, "data-recipe")))
        .collect();
    in_dom.sort();
    let mut expected: Vec<(String, String)> = runs
        .iter()
        .map(|(n, r, ..)| ((*n).to_owned(), (*r).to_owned()))
        .collect();
    expected.sort();
    assert_eq!(in_dom, expected, "one dot per run, with its recipe");

    // One mean, one label and one legend entry per point (3: baseline has two seeds).
    for class in ["point-mean", "point-label", "legend-entry"] {
        let mut points: Vec<String> = tags(frontier, class)
            .iter()
            .map(|t| attr(t, "data-point"))
            .collect();
        points.sort();
        assert_eq!(points, ["1", "2", "3"], "one {class} per point");
    }
    // The baseline's legend entry gives its mean ± half range over its two seeds.
    let baseline_entry = frontier
        .split("class=\"legend-entry\"")
        .find(|e| e.starts_with(" data-recipe=\"baseline\""))
        .expect("the baseline's legend entry");
    let values = element(baseline_entry, "<text class=\"legend-values\"");
    assert!(
        values.contains(">0.8200 ± 0.0200 · 115.0 ± 15.0 s · 2 seeds"),
        "{values}"
    );

    // Axes fitted to the data: walls 40 to 130 s, accuracies 0.78 to 0.84.
    let root = &frontier[..frontier.find('>').expect("a tag")];
    let axis = |name: &str| attr(root, name).parse::<f64>().expect("a number");
    assert!(
        axis("data-x-min") > 30.0 && axis("data-x-min") < 40.0,
        "{root}"
    );
    assert!(
        axis("data-x-max") > 130.0 && axis("data-x-max") < 140.0,
        "{root}"
    );
    assert!(
        axis("data-y-min") > 0.7 && axis("data-y-min") < 0.78,
        "{root}"
    );
    let ticks = |axis: &str| -> Vec<f64> {
        let group = element(frontier, &format!("<g class=\"{axis}\""));
        group
            .split("class=\"tick\"")
            .skip(1)
            .map(|t| {
                t[t.find('>').expect("tag") + 1..t.find('<').expect("end")]
                    .parse()
                    .expect("a tick")
            })
            .collect()
    };
    let x_ticks = ticks("x-axis");
    assert!(
        x_ticks.len() >= 3 && x_ticks[0] >= 40.0,
        "x ticks {x_ticks:?}"
    );
    assert!(ticks("y-axis")[0] >= 0.75, "y ticks {:?}", ticks("y-axis"));

    // One chart per measure for the group, each with every run and a legend entry per recipe.
    assert_eq!(dom.matches("class=\"chart curves\"").count(), 2);
    for (curve, metric) in [("quality", "accuracy"), ("training-loss", "training loss")] {
        let chart = element(&dom, &format!("<svg id=\"curves-{curve}-{slug}\""));
        assert!(
            chart.contains(&format!("data-metric=\"{metric}\"")),
            "{curve}"
        );
        assert_eq!(tags(chart, "curve").len(), runs.len(), "{curve}: every run");
        let mut recipes: Vec<String> = tags(chart, "legend-entry")
            .iter()
            .map(|t| attr(t, "data-recipe"))
            .collect();
        recipes.sort();
        assert_eq!(
            recipes,
            ["baseline", "cutout", "label_smoothing"],
            "{curve}"
        );
    }

    // Where the browser put them: no label overlaps another label or any mean.
    let layout_at =
        dom.find("<pre id=\"layout\">").expect("the layout") + "<pre id=\"layout\">".len();
    let layout: Value = serde_json::from_str(
        &dom[layout_at..layout_at + dom[layout_at..].find("</pre>").expect("end")],
    )
    .expect("layout JSON");
    let labels = layout["labels"].as_array().expect("labels");
    let means = layout["means"].as_array().expect("means");
    assert_eq!((labels.len(), means.len()), (3, 3), "{layout}");
    for (i, a) in labels.iter().enumerate() {
        for b in &labels[i + 1..] {
            assert!(!overlap(a, b), "labels overlap: {a} {b}");
        }
        for m in means {
            assert!(!overlap(a, m), "label {a} covers mean {m}");
        }
    }

    // The screenshot: each mean drawn in its recipe's colour, left to right by wall time.
    let shot = dir.join("shot.png");
    run_chromium(
        &browser,
        &profile,
        &[&format!("--screenshot={}", shot.display())],
        &url(&instrumented),
    );
    let image = image::open(&shot)
        .expect("the screenshot is a PNG")
        .to_rgb8();
    let mut drawn: Vec<(f64, String)> = Vec::new();
    for m in means {
        let f = |k: &str| m[k].as_f64().expect("a number");
        let (x, y) = (
            (f("left") + f("right")) / 2.0,
            (f("top") + f("bottom")) / 2.0,
        );
        let fill = m["fill"].as_str().expect("a fill");
        let rgb = u32::from_str_radix(fill.trim_start_matches('#'), 16).expect("#rrggbb");
        let rgb = [(rgb >> 16) as u8, (rgb >> 8) as u8, rgb as u8];
        let pixel = image.get_pixel(x as u32, y as u32).0;
        let close = pixel.iter().zip(rgb).all(|(a, b)| a.abs_diff(b) <= 3);
        assert!(close, "the mean of {m} is drawn {pixel:?}, not {fill}");
        drawn.push((x, m["recipe"].as_str().expect("recipe").to_owned()));
    }
    drawn.sort_by(|a, b| a.0.total_cmp(&b.0));
    let left_to_right: Vec<&str> = drawn.iter().map(|(_, r)| r.as_str()).collect();
    // By mean wall time: smooth 40, cut 60, baseline 115.
    assert_eq!(left_to_right, ["label_smoothing", "cutout", "baseline"]);
}
