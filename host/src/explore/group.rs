//! Grouping runs: by dataset and model (a model of another width is another model), then into
//! points (the same recipe and config, apart from the seed and the run's own name and folder).

use std::collections::BTreeMap;

use serde_json::Value;

use super::frontier;
use super::load::{Run, Skipped};
use super::point::{Point, Stats, TimeToBaseline};
use super::quality::QualityMetric;
use super::Pricing;

/// The runs of one dataset and model.
#[derive(Debug, Clone)]
pub struct Group {
    /// `config.data.dataset`.
    pub dataset: String,
    /// `config.model` (of the first run: with [`GroupBy::Dataset`] the runs may differ).
    pub model: Value,
    /// `fashion-mnist, cnn width=8`; with [`GroupBy::Dataset`] the models' names, sorted and
    /// joined by ` / `, and how many model tables the group holds: `fashion-mnist, airbench /
    /// resnet20 (2 model configurations)`.
    pub title: String,
    /// A file-name-safe form of the title, unique among the groups.
    pub slug: String,
    /// What quality means here.
    pub metric: QualityMetric,
    /// Points, by mean wall time.
    pub points: Vec<Point>,
    /// The index in `points` of the baseline (recipe `baseline`; the longest-trained one when
    /// there are several), if any.
    pub baseline: Option<usize>,
}

/// What makes two runs comparable in one group (`tessera explore --group-by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupBy {
    /// The dataset and the whole `[model]` table (the default): a recipe's speed-up is measured
    /// against the baseline of the same model.
    #[default]
    Model,
    /// The dataset only: runs of different models share one group (points of one recipe on two
    /// models are labelled by the model settings that differ), and a recipe that changes the
    /// model (a speedrun's own network) is measured against the baseline of another.
    Dataset,
}

/// Groups `runs` by dataset and model and analyses each group: points, frontiers, speed-ups.
/// `metric` forces the quality measure (else it is chosen per group); runs without a value for
/// it are returned as skipped.
pub fn group_runs(
    runs: Vec<Run>,
    metric: Option<QualityMetric>,
    pricing: &Pricing,
) -> (Vec<Group>, Vec<Skipped>) {
    group_runs_by(runs, metric, pricing, GroupBy::Model)
}

impl std::str::FromStr for GroupBy {
    type Err = String;

    fn from_str(s: &str) -> Result<GroupBy, String> {
        match s {
            "model" => Ok(GroupBy::Model),
            "dataset" => Ok(GroupBy::Dataset),
            other => Err(format!(
                "unknown grouping `{other}`: expected `model` (dataset and model, the default) or `dataset`"
            )),
        }
    }
}

/// [`group_runs`], grouping as `by` says.
pub fn group_runs_by(
    runs: Vec<Run>,
    metric: Option<QualityMetric>,
    pricing: &Pricing,
    by: GroupBy,
) -> (Vec<Group>, Vec<Skipped>) {
    let mut by_model: BTreeMap<String, Vec<Run>> = BTreeMap::new();
    for run in runs {
        let key = match by {
            GroupBy::Model => group_key(&run),
            GroupBy::Dataset => dataset_of(&run),
        };
        by_model.entry(key).or_default().push(run);
    }
    let mut groups = Vec::new();
    let mut skipped = Vec::new();
    for runs in by_model.into_values() {
        let metric = metric.unwrap_or_else(|| QualityMetric::for_runs(&runs));
        let (usable, unusable): (Vec<Run>, Vec<Run>) = runs
            .into_iter()
            .partition(|r| metric.final_of(r).is_some_and(f64::is_finite));
        skipped.extend(unusable.into_iter().map(|r| Skipped {
            reason: format!("its last evaluation has no finite {metric}"),
            source: r.source,
        }));
        if let Some(group) = Group::new(usable, metric, pricing, by) {
            groups.push(group);
        }
    }
    make_slugs_unique(&mut groups);
    (groups, skipped)
}

impl Group {
    fn new(runs: Vec<Run>, metric: QualityMetric, pricing: &Pricing, by: GroupBy) -> Option<Group> {
        let first = runs.first()?;
        let dataset = dataset_of(first);
        let model = first.config_at("model").cloned().unwrap_or(Value::Null);
        let title = match by {
            GroupBy::Model => format!("{dataset}, {}", describe_model(&model)),
            GroupBy::Dataset => {
                // Names only: whole model tables of several models make an unreadable title.
                let mut names: Vec<String> = Vec::new();
                let mut configs = 0;
                let mut seen: Vec<&Value> = Vec::new();
                for run in &runs {
                    let m = run.config_at("model").unwrap_or(&Value::Null);
                    if !seen.contains(&m) {
                        seen.push(m);
                        configs += 1;
                    }
                    let name = m
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown model")
                        .to_owned();
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
                names.sort();
                let plural = if configs == 1 { "" } else { "s" };
                format!(
                    "{dataset}, {} ({configs} model configuration{plural})",
                    names.join(" / ")
                )
            }
        };
        let mut by_point: BTreeMap<String, Vec<Run>> = BTreeMap::new();
        for run in runs {
            by_point.entry(point_key(&run)).or_default().push(run);
        }
        let mut points: Vec<Point> = by_point
            .into_values()
            .map(|runs| Point::new(runs, metric, pricing))
            .collect();
        points.sort_by(|a, b| a.wall_seconds.mean().total_cmp(&b.wall_seconds.mean()));
        label_points(&mut points);
        let mut group = Group {
            slug: slug(&title),
            dataset,
            model,
            title,
            metric,
            points,
            baseline: None,
        };
        group.analyse();
        Some(group)
    }

    /// Marks the frontiers and computes the speed-ups over the baseline.
    fn analyse(&mut self) {
        let metric = self.metric;
        let quality: Vec<f64> = self.points.iter().map(|p| p.quality.mean()).collect();
        let wall: Vec<f64> = self.points.iter().map(|p| p.wall_seconds.mean()).collect();
        for (p, on) in self
            .points
            .iter_mut()
            .zip(frontier::non_dominated(&wall, &quality, metric))
        {
            p.on_time_frontier = on;
        }
        let costs: Option<Vec<f64>> = self
            .points
            .iter()
            .map(|p| p.cost_usd.as_ref().map(Stats::mean))
            .collect();
        if let Some(costs) = costs {
            for (p, on) in self
                .points
                .iter_mut()
                .zip(frontier::non_dominated(&costs, &quality, metric))
            {
                p.on_cost_frontier = on;
            }
        }
        self.baseline = frontier::baseline_index(&self.points);
        if let Some(b) = self.baseline {
            let (target, baseline_seconds) = (quality[b], wall[b]);
            for (i, p) in self.points.iter_mut().enumerate() {
                p.time_to_baseline = if i == b {
                    TimeToBaseline::Reference { baseline_seconds }
                } else {
                    frontier::time_to_baseline(&p.runs, metric, target, baseline_seconds)
                };
            }
        }
    }

    /// The baseline point, if any.
    pub fn baseline_point(&self) -> Option<&Point> {
        self.baseline.map(|b| &self.points[b])
    }

    /// Every run of the group with its point's recipe, by point then seed.
    pub fn runs(&self) -> impl Iterator<Item = &Run> {
        self.points.iter().flat_map(|p| p.runs.iter())
    }
}

fn dataset_of(run: &Run) -> String {
    run.config_at("data.dataset")
        .and_then(Value::as_str)
        .unwrap_or("unknown dataset")
        .to_owned()
}

/// Dataset and the whole model table: a wider model is another model.
fn group_key(run: &Run) -> String {
    let model = run.config_at("model").cloned().unwrap_or(Value::Null);
    format!("{}\u{0}{model}", dataset_of(run))
}

/// The recipe and the config without what differs between seeds of one point: `seed`,
/// `run_name`, `output_dir`, and paths inside the run's own folder (its checkpoints).
fn point_key(run: &Run) -> String {
    let mut config = run.config.clone();
    let run_dir = match (
        config.get("output_dir").and_then(Value::as_str),
        config.get("run_name").and_then(Value::as_str),
    ) {
        (Some(out), Some(name)) => Some(format!("{}/{name}", out.trim_end_matches('/'))),
        _ => None,
    };
    if let Some(map) = config.as_object_mut() {
        for key in ["seed", "run_name", "output_dir"] {
            map.remove(key);
        }
    }
    if let Some(dir) = run_dir {
        blank_paths_under(&mut config, &dir);
    }
    format!("{}\u{0}{config}", run.recipe)
}

/// Labels each point by its recipe plus the settings in which it differs from the other points
/// of that recipe (the first run's config, flattened to dotted keys).
fn label_points(points: &mut [Point]) {
    let flat: Vec<BTreeMap<String, String>> = points
        .iter()
        .map(|p| {
            let mut out = BTreeMap::new();
            if let Some(run) = p.runs.first() {
                let key = point_key(run);
                let config = key.split_once('\u{0}').map_or("", |(_, c)| c);
                if let Ok(value) = serde_json::from_str::<Value>(config) {
                    flatten("", &value, &mut out);
                }
            }
            out
        })
        .collect();
    for i in 0..points.len() {
        let differing: Vec<String> = flat[i]
            .iter()
            .filter(|(key, value)| {
                (0..points.len()).any(|j| {
                    j != i
                        && points[j].recipe == points[i].recipe
                        && flat[j].get(*key) != Some(value)
                })
            })
            .map(|(key, value)| {
                let key = if key == "train.scale_schedule_ratio" {
                    "ssr"
                } else {
                    key
                };
                format!("{key} {value}")
            })
            .collect();
        if !differing.is_empty() {
            points[i].label = format!("{} ({})", points[i].recipe, differing.join(", "));
        }
    }
}

/// `value`'s scalars under dotted keys (`train.max_duration` -> `"936ba"`).
fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}.{i}"), v, out);
            }
        }
        Value::String(s) => {
            out.insert(prefix.to_owned(), s.clone());
        }
        other => {
            out.insert(prefix.to_owned(), other.to_string());
        }
    }
}

fn blank_paths_under(value: &mut Value, dir: &str) {
    match value {
        Value::String(s) if s.starts_with(dir) => *s = format!("<run>{}", &s[dir.len()..]),
        Value::Array(items) => items.iter_mut().for_each(|v| blank_paths_under(v, dir)),
        Value::Object(map) => map.values_mut().for_each(|v| blank_paths_under(v, dir)),
        _ => {}
    }
}

/// `cnn width=8`: the model's name, then its other settings.
fn describe_model(model: &Value) -> String {
    let Some(map) = model.as_object() else {
        return "unknown model".to_owned();
    };
    let mut parts: Vec<String> = map
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .into_iter()
        .collect();
    parts.extend(
        map.iter()
            .filter(|(k, v)| *k != "name" && !v.is_null())
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            }),
    );
    parts.join(" ")
}

/// The longest slug: file names (`frontier-<slug>.svg`) stay far below the usual 255-byte limit
/// however many models a `--group-by dataset` title lists; groups whose slugs then coincide are
/// told apart by [`make_slugs_unique`].
const MAX_SLUG: usize = 80;

/// Lower-case letters, digits and single dashes, at most [`MAX_SLUG`] of them.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.truncate(MAX_SLUG);
    let out = out.trim_end_matches('-').to_owned();
    if out.is_empty() {
        "group".to_owned()
    } else {
        out
    }
}

fn make_slugs_unique(groups: &mut [Group]) {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for g in groups.iter_mut() {
        let n = seen.entry(g.slug.clone()).or_default();
        *n += 1;
        if *n > 1 {
            g.slug = format!("{}-{n}", g.slug);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_of_one_recipe_are_labelled_by_the_settings_that_differ() {
        use crate::explore::test_support::run;
        let with_ssr = |name: &str, recipe: &str, seed: u64, ssr: f64| {
            let mut r = run(name, recipe, seed, &[(10.0, 0.8)], 10.0);
            r.config["train"] = serde_json::json!({ "scale_schedule_ratio": ssr });
            r
        };
        let runs = vec![
            with_ssr("a", "mild", 1, 0.5),
            with_ssr("b", "mild", 2, 0.5),
            with_ssr("c", "mild", 1, 1.0),
            with_ssr("d", "baseline", 1, 1.0),
        ];
        let (groups, _) = group_runs(runs, None, &Pricing::Recorded);
        let mut labels: Vec<&str> = groups[0].points.iter().map(|p| p.label.as_str()).collect();
        labels.sort_unstable();
        assert_eq!(labels, ["baseline", "mild (ssr 0.5)", "mild (ssr 1.0)"]);
    }

    #[test]
    fn grouping_by_dataset_compares_a_recipe_on_another_model_with_the_baseline() {
        use crate::explore::test_support::run;
        let on = |name: &str, recipe: &str, seed: u64, model: &str, evals: &[(f64, f64)]| {
            let mut r = run(name, recipe, seed, evals, evals[evals.len() - 1].0);
            r.config["model"] = serde_json::json!({ "name": model });
            r
        };
        let runs = || {
            vec![
                on(
                    "b1",
                    "baseline",
                    1,
                    "resnet20",
                    &[(50.0, 0.85), (100.0, 0.90)],
                ),
                on(
                    "b2",
                    "baseline",
                    2,
                    "resnet20",
                    &[(50.0, 0.85), (100.0, 0.90)],
                ),
                on("s1", "speedrun", 1, "airbench", &[(20.0, 0.91)]),
                on("s2", "speedrun", 2, "airbench", &[(30.0, 0.92)]),
            ]
        };
        let (by_model, _) = group_runs(runs(), None, &Pricing::Recorded);
        assert_eq!(by_model.len(), 2);
        let speedrun = by_model.iter().find(|g| g.baseline.is_none()).unwrap();
        assert!(matches!(
            speedrun.points[0].time_to_baseline,
            TimeToBaseline::NoBaseline
        ));
        let (groups, _) = group_runs_by(runs(), None, &Pricing::Recorded, GroupBy::Dataset);
        assert_eq!(groups.len(), 1);
        let g = &groups[0];
        assert_eq!(
            g.title,
            "fashion-mnist, airbench / resnet20 (2 model configurations)"
        );
        let speedrun = g.points.iter().find(|p| p.recipe == "speedrun").unwrap();
        assert_eq!(speedrun.runs.len(), 2);
        match &speedrun.time_to_baseline {
            TimeToBaseline::Reached { seconds, speedup } => {
                assert!((seconds - 25.0).abs() < 1e-9);
                assert!((speedup - 4.0).abs() < 1e-9);
            }
            other => panic!("expected a speed-up, got {other:?}"),
        }
    }

    #[test]
    fn slugs_are_file_names() {
        assert_eq!(
            slug("fashion-mnist, cnn width=8"),
            "fashion-mnist-cnn-width-8"
        );
        assert_eq!(slug("///"), "group");
        let long = slug(&"gpt2 n_embd=256 layer_norm_epsilon=0.00001 / ".repeat(20));
        assert_eq!(long.len(), MAX_SLUG - 1, "{long}");
        assert!(!long.ends_with('-'));
    }

    #[test]
    fn the_spread_is_half_the_range() {
        let s = Stats {
            values: vec![0.5, 0.7],
        };
        assert!((s.mean() - 0.6).abs() < 1e-12);
        assert!((s.spread() - 0.1).abs() < 1e-12);
        assert_eq!(Stats { values: vec![0.5] }.spread(), 0.0);
        assert_eq!(s.describe(2), "0.60 ± 0.10");
        assert_eq!(s.min_max(), (0.5, 0.7));
        assert_eq!(Stats { values: vec![0.5] }.describe(2), "0.50");
    }
}
