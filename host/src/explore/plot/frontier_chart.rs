//! The frontier chart of a group: wall seconds against quality. Each point (a recipe and
//! config) is drawn at its mean over seeds, with bars from its seeds' smallest to largest
//! values and its seeds as faint dots; the time frontier joins the means of the points on it;
//! the baseline's mean is ringed. Each point carries one label, its number, placed clear of the
//! other labels and markers; the legend beside the plot gives each number's recipe and its mean
//! ± half range.

use super::axes::{draw_axes, Axis, Frame};
use super::canvas::{fit_text, text_size, Anchor, Canvas, Font, Item, Meta, Rgb, Shape, Stroke};
use super::labels::{place_labels, Area};
use super::{recipe_colour, titled_chart, LEGEND_WIDTH};
use crate::explore::group::Group;
use crate::explore::point::Point;
use crate::explore::quality::QualityMetric;
use crate::explore::table;

const MIN_HEIGHT: f64 = 480.0;
/// Radius of a point's mean marker.
const MEAN_RADIUS: f64 = 6.5;
/// Radius of one run's dot.
const SEED_RADIUS: f64 = 3.5;
/// Height of one point's legend entry (two lines).
const ENTRY_HEIGHT: f64 = 40.0;
/// The neutral colour of the frontier line and the legend's key.
const NEUTRAL: Rgb = Rgb(125, 125, 125);

/// The frontier chart of `group`.
pub fn frontier_canvas(group: &Group) -> Canvas {
    let metric = group.metric;
    let legend_height = 30.0 + group.points.len() as f64 * ENTRY_HEIGHT + 20.0 + 4.0 * 20.0;
    let height = (legend_height + 70.0).max(MIN_HEIGHT).round();
    let (mut canvas, frame) = titled_chart(
        format!("frontier-{}", group.slug),
        Meta::class("chart frontier").data("metric", metric.name()),
        format!("{}: {metric} against wall time", group.title),
        height,
    );
    let x = Axis::fit(
        group.runs().map(|r| r.wall_seconds),
        frame.left,
        frame.right,
    );
    let y = Axis::fit(
        group
            .points
            .iter()
            .flat_map(|p| p.quality.values.iter().copied()),
        frame.bottom,
        frame.top,
    );
    draw_axes(
        &mut canvas,
        frame,
        &x,
        &y,
        "wall seconds",
        &quality_title(metric),
    );
    let at = |wall: f64, quality: f64| (x.pixel(wall), y.pixel(quality));
    let means: Vec<(f64, f64)> = group
        .points
        .iter()
        .map(|p| at(p.wall_seconds.mean(), p.quality.mean()))
        .collect();

    draw_frontier_line(&mut canvas, group, &means);
    for i in 0..group.points.len() {
        draw_ranges(&mut canvas, group, i, &at);
    }
    for (i, p) in group.points.iter().enumerate() {
        let colour = recipe_colour(group, &p.recipe);
        for (j, (run, quality)) in p.runs.iter().zip(&p.quality.values).enumerate() {
            canvas.draw_with(
                Shape::Circle {
                    centre: at(run.wall_seconds, *quality),
                    radius: SEED_RADIUS,
                    fill: Some(colour.towards_white(0.55)),
                    stroke: Some(Stroke::solid(colour, 1.0)),
                },
                Meta::class("run-point")
                    .data("run", &run.run_name)
                    .data("recipe", &run.recipe)
                    .data("point", i + 1)
                    .title(run_title(group, p, j)),
            );
        }
    }
    if let Some(b) = group.baseline {
        canvas.draw_with(
            Shape::Circle {
                centre: means[b],
                radius: MEAN_RADIUS + 5.0,
                fill: None,
                stroke: Some(Stroke::solid(Rgb::INK, 2.0)),
            },
            Meta::class("baseline-ring")
                .title("the baseline's mean: speed-ups are measured against it"),
        );
    }
    for (i, p) in group.points.iter().enumerate() {
        canvas.draw_with(
            mean_marker(means[i], recipe_colour(group, &p.recipe)),
            point_meta("point-mean", p, i).title(point_title(group, p, i)),
        );
    }
    draw_point_labels(&mut canvas, group, frame, &means, &at);
    draw_legend(&mut canvas, group, frame.right + 28.0, frame.top);
    canvas
}

/// `accuracy (higher is better)`.
pub(super) fn quality_title(metric: QualityMetric) -> String {
    let direction = if metric.higher_is_better() {
        "higher"
    } else {
        "lower"
    };
    format!("{metric} ({direction} is better)")
}

/// The point's class, recipe and number.
pub(super) fn point_meta(class: &str, p: &Point, index: usize) -> Meta {
    Meta::class(class)
        .data("recipe", &p.recipe)
        .data("point", index + 1)
}

fn mean_marker(centre: (f64, f64), colour: Rgb) -> Shape {
    Shape::Circle {
        centre,
        radius: MEAN_RADIUS,
        fill: Some(colour),
        stroke: Some(Stroke::solid(Rgb::WHITE, 1.5)),
    }
}

fn item(shape: Shape) -> Item {
    Item {
        shape,
        meta: Meta::default(),
    }
}

/// The grey line through the means of the points on the time frontier, fastest first.
fn draw_frontier_line(canvas: &mut Canvas, group: &Group, means: &[(f64, f64)]) {
    let mut on: Vec<(usize, (f64, f64))> = group
        .points
        .iter()
        .enumerate()
        .filter(|(_, p)| p.on_time_frontier)
        .map(|(i, _)| (i, means[i]))
        .collect();
    if on.len() < 2 {
        return;
    }
    on.sort_by(|a, b| a.1 .0.total_cmp(&b.1 .0));
    let keys: Vec<String> = on.iter().map(|(i, _)| (i + 1).to_string()).collect();
    canvas.draw_with(
        Shape::Path {
            points: on.iter().map(|(_, m)| *m).collect(),
            stroke: Stroke::solid(NEUTRAL, 2.5),
        },
        Meta::class("frontier-line").title(format!(
            "time frontier through points {}: no other point is both faster and better",
            keys.join(", ")
        )),
    );
}

/// The bars through a point's mean from its seeds' smallest to largest wall time
/// (horizontal) and quality (vertical), in pixels; `None` for one seed.
fn range_bars(p: &Point, at: &dyn Fn(f64, f64) -> (f64, f64)) -> Option<[[(f64, f64); 2]; 2]> {
    if p.runs.len() < 2 {
        return None;
    }
    let (wall, quality) = (p.wall_seconds.mean(), p.quality.mean());
    let (w_lo, w_hi) = p.wall_seconds.min_max();
    let (q_lo, q_hi) = p.quality.min_max();
    Some([
        [at(w_lo, quality), at(w_hi, quality)],
        [at(wall, q_lo), at(wall, q_hi)],
    ])
}

/// Half the length of the caps at the ends of a range bar.
const CAP: f64 = 3.5;

/// Point `index`'s range bars, with caps.
fn draw_ranges(
    canvas: &mut Canvas,
    group: &Group,
    index: usize,
    at: &dyn Fn(f64, f64) -> (f64, f64),
) {
    let p = &group.points[index];
    let Some([[left, right], [low, high]]) = range_bars(p, at) else {
        return;
    };
    let stroke = Stroke::solid(recipe_colour(group, &p.recipe), 1.5);
    let line = |a: (f64, f64), b: (f64, f64)| {
        item(Shape::Path {
            points: vec![a, b],
            stroke,
        })
    };
    let shapes = vec![
        line(left, right),
        line((left.0, left.1 - CAP), (left.0, left.1 + CAP)),
        line((right.0, right.1 - CAP), (right.0, right.1 + CAP)),
        line(low, high),
        line((low.0 - CAP, low.1), (low.0 + CAP, low.1)),
        line((high.0 - CAP, high.1), (high.0 + CAP, high.1)),
    ];
    canvas.draw_with(Shape::Group(shapes), point_meta("range", p, index));
}

/// Each point's number, next to its mean where it overlaps no other label or mark, with a
/// thin line to the mean when it had to go further out.
fn draw_point_labels(
    canvas: &mut Canvas,
    group: &Group,
    frame: Frame,
    means: &[(f64, f64)],
    at: &dyn Fn(f64, f64) -> (f64, f64),
) {
    let font = Font::new(12.0, Rgb::INK).bold();
    let keys: Vec<String> = (1..=group.points.len()).map(|k| k.to_string()).collect();
    let sizes: Vec<(f64, f64)> = keys
        .iter()
        .map(|k| {
            let (w, h) = text_size(k, &font);
            (w + 4.0, h)
        })
        .collect();
    let marker = 2.0 * MEAN_RADIUS + 2.0;
    let seed = 2.0 * SEED_RADIUS + 2.0;
    let mut obstacles: Vec<Area> = means
        .iter()
        .map(|m| Area::around(*m, (marker, marker)))
        .collect();
    for p in &group.points {
        obstacles.extend(
            p.runs
                .iter()
                .zip(&p.quality.values)
                .map(|(r, q)| Area::around(at(r.wall_seconds, *q), (seed, seed))),
        );
        if let Some(bars) = range_bars(p, at) {
            obstacles.extend(bars.iter().map(|[a, b]| Area {
                left: a.0.min(b.0) - CAP - 1.0,
                top: a.1.min(b.1) - CAP - 1.0,
                right: a.0.max(b.0) + CAP + 1.0,
                bottom: a.1.max(b.1) + CAP + 1.0,
            }));
        }
    }
    if let Some(b) = group.baseline {
        let ring = 2.0 * (MEAN_RADIUS + 6.0);
        obstacles.push(Area::around(means[b], (ring, ring)));
    }
    let bounds = Area {
        left: frame.left + 2.0,
        top: frame.top + 2.0,
        right: frame.right - 2.0,
        bottom: frame.bottom - 2.0,
    };
    let placed = place_labels(means, &sizes, &obstacles, bounds);
    for (i, (p, place)) in group.points.iter().zip(&placed).enumerate() {
        let centre = place.area.centre();
        let mut shapes = Vec::new();
        if place.leader {
            // From the marker's edge to the nearest point of the label's box.
            let m = means[i];
            let end = (
                m.0.clamp(place.area.left, place.area.right),
                m.1.clamp(place.area.top, place.area.bottom),
            );
            let length = (end.0 - m.0).hypot(end.1 - m.1).max(1e-9);
            let start = (
                m.0 + (end.0 - m.0) / length * (MEAN_RADIUS + 1.0),
                m.1 + (end.1 - m.1) / length * (MEAN_RADIUS + 1.0),
            );
            shapes.push(item(Shape::Path {
                points: vec![start, end],
                stroke: Stroke::solid(NEUTRAL, 1.0),
            }));
        }
        shapes.push(item(Shape::text(
            centre,
            keys[i].clone(),
            font,
            Anchor::Middle,
        )));
        canvas.draw_with(
            Shape::Group(shapes),
            point_meta("point-label", p, i).title(point_title(group, p, i)),
        );
    }
}

/// The legend: per point its marker, number, label and mean ± half range of quality and wall
/// time; then what the marks mean.
fn draw_legend(canvas: &mut Canvas, group: &Group, left: f64, top: f64) {
    let grey = Font::new(12.0, Rgb::GREY);
    let label_font = Font::new(13.0, Rgb::INK);
    let text_left = left + 44.0;
    let text_width = LEGEND_WIDTH - 52.0;
    canvas.draw(Shape::text(
        (left, top + 6.0),
        "points: mean ± half range over seeds",
        grey,
        Anchor::Start,
    ));
    let mut y = top + 30.0;
    let decimals = group.metric.decimals();
    for (i, p) in group.points.iter().enumerate() {
        let colour = recipe_colour(group, &p.recipe);
        let seeds = match p.runs.len() {
            1 => "1 seed".to_owned(),
            n => format!("{n} seeds"),
        };
        let values = format!(
            "{} · {} s · {seeds}",
            p.quality.describe(decimals),
            p.wall_seconds.describe(1)
        );
        let shapes = vec![
            item(mean_marker((left + 8.0, y + 7.0), colour)),
            item(Shape::text(
                (left + 19.0, y + 7.0),
                (i + 1).to_string(),
                Font::new(12.0, Rgb::INK).bold(),
                Anchor::Start,
            )),
            item(Shape::text(
                (text_left, y + 7.0),
                fit_text(&p.label, &label_font, text_width),
                label_font,
                Anchor::Start,
            )),
            Item {
                shape: Shape::text(
                    (text_left, y + 25.0),
                    fit_text(&values, &grey, text_width),
                    grey,
                    Anchor::Start,
                ),
                meta: Meta::class("legend-values"),
            },
        ];
        canvas.draw_with(
            Shape::Group(shapes),
            point_meta("legend-entry", p, i).title(point_title(group, p, i)),
        );
        y += ENTRY_HEIGHT;
    }
    y += 10.0;
    let mut key = vec![
        (
            Shape::Circle {
                centre: (left + 8.0, y),
                radius: SEED_RADIUS,
                fill: Some(NEUTRAL.towards_white(0.55)),
                stroke: Some(Stroke::solid(NEUTRAL, 1.0)),
            },
            "one run (one seed)",
        ),
        (
            Shape::Path {
                points: vec![(left + 1.0, y + 20.0), (left + 15.0, y + 20.0)],
                stroke: Stroke::solid(NEUTRAL, 1.5),
            },
            "bars: seeds' smallest to largest value",
        ),
        (
            Shape::Path {
                points: vec![(left, y + 40.0), (left + 16.0, y + 40.0)],
                stroke: Stroke::solid(NEUTRAL, 2.5),
            },
            "time frontier (no point faster and better)",
        ),
    ];
    if group.baseline.is_some() {
        key.push((
            Shape::Circle {
                centre: (left + 8.0, y + 60.0),
                radius: 7.0,
                fill: None,
                stroke: Some(Stroke::solid(Rgb::INK, 2.0)),
            },
            "baseline (speed-ups are against it)",
        ));
    }
    let mut shapes = Vec::new();
    for (row, (sample, text)) in key.into_iter().enumerate() {
        shapes.push(item(sample));
        shapes.push(item(Shape::text(
            (text_left, y + row as f64 * 20.0),
            text,
            grey,
            Anchor::Start,
        )));
    }
    canvas.draw_with(Shape::Group(shapes), Meta::class("key"));
}

/// The hover text of the dot of run `j` of point `p`.
fn run_title(group: &Group, p: &Point, j: usize) -> String {
    let run = &p.runs[j];
    let seed = run
        .seed()
        .map_or_else(String::new, |s| format!(", seed {s}"));
    let nodes = if run.nodes > 1 {
        format!(" on {} nodes", run.nodes)
    } else {
        String::new()
    };
    let cost = p
        .cost_usd
        .as_ref()
        .and_then(|c| c.values.get(j))
        .map_or_else(String::new, |usd| format!(", ${usd:.4}"));
    format!(
        "{} ({}{seed})\n{} {:.d$}, {:.1} s wall{nodes}{cost}\n{}",
        run.run_name,
        p.label,
        group.metric,
        p.quality.values[j],
        run.wall_seconds,
        run.source,
        d = group.metric.decimals()
    )
}

/// The hover text of a point: its number, label and seeds, mean ± half range and extremes of
/// quality, wall time and cost, and where it stands.
pub(super) fn point_title(group: &Group, p: &Point, index: usize) -> String {
    let d = group.metric.decimals();
    let runs: Vec<&str> = p.runs.iter().map(|r| r.run_name.as_str()).collect();
    let (q_lo, q_hi) = p.quality.min_max();
    let (w_lo, w_hi) = p.wall_seconds.min_max();
    let mut lines = vec![
        format!(
            "{}. {} ({} runs: {})",
            index + 1,
            p.label,
            runs.len(),
            runs.join(", ")
        ),
        format!(
            "{}: {} (from {q_lo:.d$} to {q_hi:.d$})",
            group.metric,
            p.quality.describe(d)
        ),
        format!(
            "wall: {} s (from {w_lo:.1} to {w_hi:.1})",
            p.wall_seconds.describe(1)
        ),
    ];
    if let Some(cost) = &p.cost_usd {
        lines.push(format!("cost: ${}", cost.describe(4)));
    }
    let (time, speedup) = table::time_and_speedup(&p.time_to_baseline);
    lines.push(format!(
        "frontier: {}; time to baseline quality: {time}; speed-up: {speedup}",
        table::frontier_cell(p)
    ));
    lines.join("\n")
}
