//! Learning curves of a group: one chart per measure (the quality against wall time, the
//! training loss against batches), every run of the group on it, coloured by recipe; points of
//! one recipe that differ in other settings are told apart by their dash. The legend gives each
//! point's number (as on the frontier chart), label and number of runs.

use super::axes::{draw_axes, Axis};
use super::canvas::{fit_text, Anchor, Canvas, Font, Item, Meta, Rgb, Shape, Stroke};
use super::frontier_chart::{point_meta, point_title, quality_title};
use super::{recipe_colour, titled_chart, LEGEND_WIDTH};
use crate::explore::group::Group;
use crate::explore::load::Run;

/// Which learning curve a chart shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Curve {
    /// The group's quality measure at each evaluation, against wall seconds (against batches
    /// when some record has no evaluation times).
    Quality,
    /// The training loss of `metrics.jsonl`, against batches.
    TrainingLoss,
}

const MIN_HEIGHT: f64 = 340.0;
const ENTRY_HEIGHT: f64 = 22.0;
/// Dash lengths of the first, second, ... point of one recipe.
const DASHES: [Option<f64>; 4] = [None, Some(7.0), Some(2.5), Some(12.0)];

impl Curve {
    /// What it measures: `accuracy`, `perplexity` or `training loss`.
    pub fn name(self, group: &Group) -> String {
        match self {
            Curve::Quality => group.metric.name(),
            Curve::TrainingLoss => "training loss".to_owned(),
        }
    }

    /// The part of the chart's id naming the measure: `quality` or `training-loss`.
    pub fn slug(self) -> &'static str {
        match self {
            Curve::Quality => "quality",
            Curve::TrainingLoss => "training-loss",
        }
    }
}

/// One run's line.
struct Series<'a> {
    run: &'a Run,
    point: usize,
    data: Vec<(f64, f64)>,
}

/// The `curve` chart of `group` (`<svg id="curves-<curve slug>-<group slug>">`), or `None` when
/// no run has that curve (records without `metrics.jsonl` have no training loss).
pub fn curve_canvas(group: &Group, curve: Curve) -> Option<Canvas> {
    let by_time = group.runs().all(|r| !r.eval_times.is_empty());
    let x_title = match (curve, by_time) {
        (Curve::Quality, true) => "wall seconds",
        _ => "batch",
    };
    let series: Vec<Series> = group
        .points
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.runs.iter().map(move |r| (i, r)))
        .map(|(point, run)| Series {
            run,
            point,
            data: curve_data(run, group, curve, by_time),
        })
        .filter(|s| !s.data.is_empty())
        .collect();
    if series.is_empty() {
        return None;
    }
    let mut shown: Vec<usize> = series.iter().map(|s| s.point).collect();
    shown.dedup();
    let name = curve.name(group);
    let height = (44.0 + shown.len() as f64 * ENTRY_HEIGHT + 80.0)
        .max(MIN_HEIGHT)
        .round();
    let (mut canvas, frame) = titled_chart(
        format!("curves-{}-{}", curve.slug(), group.slug),
        Meta::class("chart curves")
            .data("metric", &name)
            .data("x", x_title),
        format!("{name} against {x_title}, every run"),
        height,
    );
    let all = || series.iter().flat_map(|s| s.data.iter());
    let x = Axis::fit(all().map(|p| p.0), frame.left, frame.right);
    let y = Axis::fit(all().map(|p| p.1), frame.bottom, frame.top);
    let y_title = match curve {
        Curve::Quality => quality_title(group.metric),
        Curve::TrainingLoss => "training loss".to_owned(),
    };
    draw_axes(&mut canvas, frame, &x, &y, x_title, &y_title);
    let dashes = dash_of_points(group);
    for s in &series {
        let p = &group.points[s.point];
        let colour = recipe_colour(group, &p.recipe);
        let pixels: Vec<(f64, f64)> = s
            .data
            .iter()
            .map(|(a, b)| (x.pixel(*a), y.pixel(*b)))
            .collect();
        let mut shapes = vec![Item {
            shape: Shape::Path {
                points: pixels.clone(),
                stroke: Stroke {
                    colour,
                    width: 1.8,
                    dash: dashes[s.point],
                },
            },
            meta: Meta::default(),
        }];
        if curve == Curve::Quality {
            // A dot per evaluation, each with its own hover text.
            shapes.extend(
                s.data
                    .iter()
                    .zip(&pixels)
                    .map(|((at, value), centre)| Item {
                        shape: Shape::Circle {
                            centre: *centre,
                            radius: 2.8,
                            fill: Some(colour),
                            stroke: None,
                        },
                        meta: Meta::default().title(format!(
                            "{}: {name} {value:.d$} at {at:.1} {x_title}",
                            s.run.run_name,
                            d = group.metric.decimals()
                        )),
                    }),
            );
        }
        let meta = Meta::class("curve")
            .data("run", &s.run.run_name)
            .data("recipe", &s.run.recipe)
            .data("point", s.point + 1)
            .title(series_title(s, &p.label, &name, x_title));
        canvas.draw_with(Shape::Group(shapes), meta);
    }
    draw_legend(
        &mut canvas,
        group,
        &shown,
        &dashes,
        curve,
        frame.right + 28.0,
        frame.top,
    );
    Some(canvas)
}

/// `(x, y)` of `run`'s curve.
fn curve_data(run: &Run, group: &Group, curve: Curve, by_time: bool) -> Vec<(f64, f64)> {
    match curve {
        Curve::Quality => run
            .evals
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let x = if by_time {
                    run.eval_times.get(i)?.wall_seconds
                } else {
                    e.batch as f64
                };
                Some((x, group.metric.of(e)?))
            })
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect(),
        Curve::TrainingLoss => run
            .train_loss
            .iter()
            .map(|(b, l)| (*b as f64, *l))
            .filter(|(_, l)| l.is_finite())
            .collect(),
    }
}

/// The dash of each point: solid for the first point of its recipe, then dashed, dotted...
fn dash_of_points(group: &Group) -> Vec<Option<f64>> {
    group
        .points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let before = group.points[..i]
                .iter()
                .filter(|q| q.recipe == p.recipe)
                .count();
            DASHES[before % DASHES.len()]
        })
        .collect()
}

fn series_title(s: &Series, label: &str, name: &str, x_title: &str) -> String {
    let seed = s
        .run
        .seed()
        .map_or_else(String::new, |v| format!(", seed {v}"));
    let (first, last) = (s.data[0], s.data[s.data.len() - 1]);
    format!(
        "{} ({label}{seed})\n{name} {:.4} at {:.1} {x_title} to {:.4} at {:.1} {x_title}",
        s.run.run_name, first.1, first.0, last.1, last.0
    )
}

/// Per point shown: a sample of its line, its number, label and runs.
fn draw_legend(
    canvas: &mut Canvas,
    group: &Group,
    shown: &[usize],
    dashes: &[Option<f64>],
    curve: Curve,
    left: f64,
    top: f64,
) {
    let grey = Font::new(12.0, Rgb::GREY);
    let font = Font::new(13.0, Rgb::INK);
    canvas.draw(Shape::text(
        (left, top + 6.0),
        "points (runs)",
        grey,
        Anchor::Start,
    ));
    let mut y = top + 30.0;
    for &i in shown {
        let p = &group.points[i];
        let colour = recipe_colour(group, &p.recipe);
        let mut shapes = vec![Item {
            shape: Shape::Path {
                points: vec![(left, y), (left + 30.0, y)],
                stroke: Stroke {
                    colour,
                    width: 2.5,
                    dash: dashes[i],
                },
            },
            meta: Meta::default(),
        }];
        if curve == Curve::Quality {
            shapes.push(Item {
                shape: Shape::Circle {
                    centre: (left + 15.0, y),
                    radius: 2.8,
                    fill: Some(colour),
                    stroke: None,
                },
                meta: Meta::default(),
            });
        }
        shapes.push(Item {
            shape: Shape::text(
                (left + 38.0, y),
                (i + 1).to_string(),
                Font::new(12.0, Rgb::INK).bold(),
                Anchor::Start,
            ),
            meta: Meta::default(),
        });
        let text = format!("{} ({})", p.label, p.runs.len());
        shapes.push(Item {
            shape: Shape::text(
                (left + 62.0, y),
                fit_text(&text, &font, LEGEND_WIDTH - 70.0),
                font,
                Anchor::Start,
            ),
            meta: Meta::default(),
        });
        canvas.draw_with(
            Shape::Group(shapes),
            point_meta("legend-entry", p, i).title(point_title(group, p, i)),
        );
        y += ENTRY_HEIGHT;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_chart_per_measure_with_every_run_and_a_legend_entry_per_point() {
        let g = super::super::tests::group();
        let quality = curve_canvas(&g, Curve::Quality).expect("evaluations").svg();
        assert!(quality.contains(&format!("id=\"curves-quality-{}\"", g.slug)));
        assert_eq!(quality.matches("class=\"curve\"").count(), 3, "{quality}");
        assert_eq!(quality.matches("class=\"legend-entry\"").count(), 2);
        assert!(quality.contains("data-x=\"wall seconds\""));
        // Only b1 has a training loss.
        let loss = curve_canvas(&g, Curve::TrainingLoss)
            .expect("b1's loss")
            .svg();
        assert_eq!(loss.matches("class=\"curve\"").count(), 1);
        assert_eq!(loss.matches("class=\"legend-entry\"").count(), 1);
        assert!(curve_canvas(&g, Curve::TrainingLoss)
            .unwrap()
            .png(false)
            .is_ok());

        let mut without_times = g.clone();
        without_times.points[0].runs[0].eval_times.clear();
        let svg = curve_canvas(&without_times, Curve::Quality).unwrap().svg();
        assert!(svg.contains("data-x=\"batch\""), "batches for every run");
        let mut without_loss = g;
        without_loss
            .points
            .iter_mut()
            .flat_map(|p| p.runs.iter_mut())
            .for_each(|r| r.train_loss.clear());
        assert!(curve_canvas(&without_loss, Curve::TrainingLoss).is_none());
    }

    #[test]
    fn points_of_one_recipe_get_different_dashes() {
        let mut g = super::super::tests::group();
        g.points[1].recipe = g.points[0].recipe.clone();
        let dashes = dash_of_points(&g);
        assert_ne!(dashes[0], dashes[1]);
    }
}
