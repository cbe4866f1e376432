//! `tessera explore`: real short runs explored end to end, and the report opened in a real
//! headless Chromium (Debian's package; `scripts/ensure-chromium.sh` installs it and
//! `scripts/test.sh` names it in `TESSERA_CHROMIUM`).

use std::collections::BTreeMap;
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
    let out = tessera(
        &[
            "explore",
            runs.to_str().expect("UTF-8"),
            "--usd-per-hour",
            "3.6",
        ],
        dir.path(),
        &[],
    );
    out.assert_success();
    let table = &out.stdout;
    assert!(table.contains("fashion-mnist, cnn"), "{table}");
    let row = |recipe: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{recipe} ")))
            .unwrap_or_else(|| panic!("no row for {recipe} in:\n{table}"))
            .to_owned()
    };
    assert!(row("baseline").contains("  2  "), "two seeds: {table}");
    assert!(row("label_smoothing").contains("  1  "), "{table}");
    assert!(row("baseline").contains("1.00x"), "the reference: {table}");
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
    assert!(only_svg_namespace(&html), "the report refers to no address");
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

/// A hand-written run record: Fashion-MNIST CNN, `recipe`, evaluated at `(wall, accuracy)`.
fn record(name: &str, recipe: &str, seed: u64, evals: &[(f64, f64)]) -> Value {
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
        "estimated_cost_usd": null,
        "target_reached": null,
    })
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
        "--force-device-scale-factor=1",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .arg(url);
    let command = format!("{} --headless {} {url}", browser.display(), args.join(" "));
    let out = run_with_timeout(cmd, &command, BROWSER_TIMEOUT);
    assert!(out.status.success(), "{}", out.dump());
    out.stdout
}

/// `(run, recipe, fill)` of each run's point in the DOM, in document order.
fn points_in_dom(dom: &str) -> Vec<(String, String, String)> {
    let attr = |tag: &str, name: &str| {
        let key = format!("{name}=\"");
        let start = tag
            .find(&key)
            .unwrap_or_else(|| panic!("no {name} in {tag}"))
            + key.len();
        tag[start..].split('"').next().unwrap_or("").to_owned()
    };
    dom.match_indices("<circle class=\"run-point\"")
        .map(|(i, _)| {
            let tag = &dom[i..i + dom[i..].find('>').expect("a closed tag")];
            (
                attr(tag, "data-run"),
                attr(tag, "data-recipe"),
                attr(tag, "fill"),
            )
        })
        .collect()
}

/// Clusters (4-connected) of at least `min_pixels` pixels of colour `rgb` in `image`; their
/// centroids' x.
fn clusters(image: &image::RgbImage, rgb: [u8; 3], min_pixels: usize) -> Vec<f64> {
    let (w, h) = image.dimensions();
    let matches = |x: u32, y: u32| {
        let p = image.get_pixel(x, y).0;
        p.iter().zip(rgb).all(|(a, b)| a.abs_diff(b) <= 3)
    };
    let mut seen = vec![false; (w * h) as usize];
    let mut centroids = Vec::new();
    for y in 0..h {
        for x in 0..w {
            if seen[(y * w + x) as usize] || !matches(x, y) {
                continue;
            }
            let (mut stack, mut n, mut sum_x) = (vec![(x, y)], 0usize, 0f64);
            seen[(y * w + x) as usize] = true;
            while let Some((cx, cy)) = stack.pop() {
                n += 1;
                sum_x += f64::from(cx);
                let neighbours = [
                    (cx.wrapping_sub(1), cy),
                    (cx + 1, cy),
                    (cx, cy.wrapping_sub(1)),
                    (cx, cy + 1),
                ];
                for (nx, ny) in neighbours {
                    if nx < w && ny < h && !seen[(ny * w + nx) as usize] && matches(nx, ny) {
                        seen[(ny * w + nx) as usize] = true;
                        stack.push((nx, ny));
                    }
                }
            }
            if n >= min_pixels {
                centroids.push(sum_x / n as f64);
            }
        }
    }
    centroids
}

/// The report of hand-written runs, opened in headless Chromium: the DOM holds one point per
/// run with its recipe, and the screenshot shows each recipe's colour in as many dots as it has
/// runs, left to right in the runs' wall-time order.
#[test]
fn the_report_draws_the_frontier_in_a_real_browser() {
    let Some(browser) = chromium() else {
        return;
    };
    let dir = TempDir::new("explore-browser");
    // (name, recipe, seed, evaluations (wall s, accuracy)); walls 40 < 60 < 100 < 130.
    let runs = [
        ("base-1", "baseline", 1, vec![(50.0, 0.70), (100.0, 0.80)]),
        ("base-2", "baseline", 2, vec![(65.0, 0.74), (130.0, 0.84)]),
        (
            "smooth",
            "label_smoothing",
            1,
            vec![(20.0, 0.79), (40.0, 0.83)],
        ),
        ("cut", "cutout", 1, vec![(30.0, 0.75), (60.0, 0.78)]),
    ];
    for (name, recipe, seed, evals) in &runs {
        let text = record(name, recipe, *seed, evals).to_string();
        dir.write(&format!("runs/{name}/run.json"), &text);
    }
    let out_dir = dir.join("out");
    let out = tessera(
        &["explore", "runs", "--out", out_dir.to_str().expect("UTF-8")],
        dir.path(),
        &[],
    );
    out.assert_success();
    assert!(out.stdout.contains("label_smoothing"), "{}", out.stdout);
    let url = format!("file://{}", out_dir.join("report.html").display());
    let profile = dir.join("chromium-profile");

    let dom = run_chromium(&browser, &profile, &["--dump-dom"], &url);
    assert!(
        dom.contains("<svg id=\"frontier-fashion-mnist-cnn-width-8\""),
        "no frontier plot in the DOM"
    );
    let points = points_in_dom(&dom);
    let mut in_dom: Vec<(String, String)> = points
        .iter()
        .map(|(r, c, _)| (r.clone(), c.clone()))
        .collect();
    in_dom.sort();
    let mut expected: Vec<(String, String)> = runs
        .iter()
        .map(|(n, r, _, _)| ((*n).to_owned(), (*r).to_owned()))
        .collect();
    expected.sort();
    assert_eq!(in_dom, expected, "one point per run, with its recipe");

    let shot = dir.join("shot.png");
    run_chromium(
        &browser,
        &profile,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1000,700",
        ],
        &url,
    );
    let image = image::open(&shot)
        .expect("the screenshot is a PNG")
        .to_rgb8();
    let mut colours: BTreeMap<String, (String, usize)> = BTreeMap::new();
    for (_, recipe, fill) in &points {
        colours.entry(fill.clone()).or_insert((recipe.clone(), 0)).1 += 1;
    }
    assert_eq!(colours.len(), 3, "one colour per recipe: {colours:?}");
    let mut dots: Vec<(f64, String)> = Vec::new();
    for (fill, (recipe, count)) in &colours {
        let rgb = u32::from_str_radix(fill.trim_start_matches('#'), 16).expect("#rrggbb");
        let rgb = [(rgb >> 16) as u8, (rgb >> 8) as u8, rgb as u8];
        let found = clusters(&image, rgb, 60);
        assert_eq!(
            found.len(),
            *count,
            "{recipe} ({fill}) should be drawn as {count} dot(s), found {found:?}"
        );
        dots.extend(found.into_iter().map(|x| (x, recipe.clone())));
    }
    dots.sort_by(|a, b| a.0.total_cmp(&b.0));
    let left_to_right: Vec<&str> = dots.iter().map(|(_, r)| r.as_str()).collect();
    // By wall time: smooth 40, cut 60, base-1 100, base-2 130.
    assert_eq!(
        left_to_right,
        ["label_smoothing", "cutout", "baseline", "baseline"]
    );
}
