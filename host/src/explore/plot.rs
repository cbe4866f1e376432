//! Plots with plotters: the frontier of a group (SVG and PNG) and each run's learning curves
//! (SVG).
//!
//! Text needs a font: plotters lays it out with ab_glyph from a TrueType file found at run time
//! (`TESSERA_FONT`, else Debian's `fonts-dejavu-core`). Without one the plots are drawn without
//! text, with a warning.

use std::path::PathBuf;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::group::Group;
use super::load::Run;
use super::quality::QualityMetric;

/// Size of a frontier plot, pixels.
pub const FRONTIER_SIZE: (u32, u32) = (800, 500);
/// Size of one run's learning curves (two charts side by side), pixels.
const CURVES_SIZE: (u32, u32) = (760, 260);
/// Radius of a run's point on the frontier plot; no other filled circle there has it, which
/// is how [`frontier_svg`] finds the points to label.
const POINT_RADIUS: u32 = 7;
/// The environment variable naming a TrueType font file for the plots' text.
pub const FONT_ENV: &str = "TESSERA_FONT";
/// Where Debian's `fonts-dejavu-core` puts its sans-serif font.
const DEJAVU_SANS: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Distinct, saturated colours for recipes, in the order of [`recipe_colour`].
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
];
const FRONTIER_LINE: RGBColor = RGBColor(120, 120, 120);

/// Whether plots can have text: registers the font once; warns once when there is none.
pub fn text_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let path = std::env::var_os(FONT_ENV)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(DEJAVU_SANS), PathBuf::from);
        let registered = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                // plotters keeps fonts for the whole process, by reference.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                    .map_err(|_| "not a TrueType or OpenType font".to_owned())
            });
        if let Err(e) = &registered {
            tracing::warn!(
                "plots are drawn without text: no font at {} ({e}); install Debian's \
                 fonts-dejavu-core or set {FONT_ENV} to a .ttf file",
                path.display()
            );
        }
        registered.is_ok()
    })
}

/// The colour of `recipe` in `group`: recipes take the palette in sorted order.
pub fn recipe_colour(group: &Group, recipe: &str) -> RGBColor {
    let mut recipes: Vec<&str> = group.points.iter().map(|p| p.recipe.as_str()).collect();
    recipes.sort_unstable();
    recipes.dedup();
    let index = recipes.iter().position(|r| *r == recipe).unwrap_or(0);
    PALETTE[index % PALETTE.len()]
}

/// `#rrggbb`.
pub fn hex_colour(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

fn drawing_error(e: impl std::fmt::Display) -> String {
    format!("drawing a plot: {e}")
}

/// The frontier plot of `group` as SVG: the root has id `frontier-<slug>`, each run's point is
/// a `<circle class="run-point" data-run=... data-recipe=...>`.
pub fn frontier_svg(group: &Group, text: bool) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, FRONTIER_SIZE).into_drawing_area();
        draw_frontier(&root, group, text)?;
        root.present().map_err(drawing_error)?;
    }
    label_points(&svg, group)
}

/// The frontier plot of `group` as a PNG file's bytes.
pub fn frontier_png(group: &Group, text: bool) -> Result<Vec<u8>, String> {
    let (w, h) = FRONTIER_SIZE;
    let mut pixels = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area();
        draw_frontier(&root, group, text)?;
        root.present().map_err(drawing_error)?;
    }
    let image = image::RgbImage::from_raw(w, h, pixels)
        .ok_or_else(|| "the bitmap has the wrong size".to_owned())?;
    let mut png = Vec::new();
    image
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .map_err(|e| format!("encoding a PNG: {e}"))?;
    Ok(png)
}

/// Quality axis range with a margin, whichever way is better.
fn padded_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = ((hi - lo) * 0.1).max(1e-3);
    (lo - pad)..(hi + pad)
}

fn quality_label(metric: QualityMetric) -> String {
    match metric {
        QualityMetric::Accuracy => "accuracy (higher is better)".to_owned(),
        QualityMetric::Perplexity => "perplexity (lower is better)".to_owned(),
    }
}

fn draw_frontier<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    group: &Group,
    text: bool,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(drawing_error)?;
    let metric = group.metric;
    let max_wall = group.runs().map(|r| r.wall_seconds).fold(0.0, f64::max);
    let y_range = padded_range(group.runs().filter_map(|r| metric.final_of(r)));
    let mut builder = ChartBuilder::on(root);
    builder.margin(20);
    if text {
        builder
            .caption(&group.title, ("sans-serif", 20))
            .x_label_area_size(45)
            .y_label_area_size(70);
    }
    let mut chart = builder
        .build_cartesian_2d(0.0..(max_wall * 1.15).max(1e-3), y_range)
        .map_err(drawing_error)?;
    if text {
        chart
            .configure_mesh()
            .x_desc("wall seconds")
            .y_desc(quality_label(metric))
            .draw()
            .map_err(drawing_error)?;
    }
    let mut frontier: Vec<(f64, f64)> = group
        .points
        .iter()
        .filter(|p| p.on_time_frontier)
        .map(|p| (p.wall_seconds.mean(), p.quality.mean()))
        .collect();
    frontier.sort_by(|a, b| a.0.total_cmp(&b.0));
    chart
        .draw_series(LineSeries::new(frontier, FRONTIER_LINE.stroke_width(2)))
        .map_err(drawing_error)?;
    if let Some(b) = group.baseline_point() {
        let centre = (b.wall_seconds.mean(), b.quality.mean());
        chart
            .draw_series([Circle::new(centre, POINT_RADIUS + 5, BLACK.stroke_width(2))])
            .map_err(drawing_error)?;
        if text {
            chart
                .draw_series([EmptyElement::at(centre)
                    + Text::new(
                        "baseline mean",
                        (-40, 14),
                        ("sans-serif", 13).into_font().color(&BLACK),
                    )])
                .map_err(drawing_error)?;
        }
    }
    for p in &group.points {
        let colour = recipe_colour(group, &p.recipe);
        let at: Vec<(f64, f64)> = p
            .runs
            .iter()
            .zip(&p.quality.values)
            .map(|(r, q)| (r.wall_seconds, *q))
            .collect();
        chart
            .draw_series(
                at.iter()
                    .map(|c| Circle::new(*c, POINT_RADIUS, colour.filled())),
            )
            .map_err(drawing_error)?;
        if text {
            let style = ("sans-serif", 14).into_font().color(&BLACK);
            chart
                .draw_series(at.iter().map(|c| {
                    EmptyElement::at(*c) + Text::new(p.label.clone(), (10, -18), style.clone())
                }))
                .map_err(drawing_error)?;
        }
    }
    Ok(())
}

/// Adds `class`, `data-run` and `data-recipe` to each run's point (the filled circles of
/// [`POINT_RADIUS`], drawn in [`Group::runs`] order) and the id to the root.
fn label_points(svg: &str, group: &Group) -> Result<String, String> {
    let radius = format!("r=\"{POINT_RADIUS}\"");
    let mut runs = group.runs();
    let mut out = String::with_capacity(svg.len() + 4096);
    let mut rest = svg;
    while let Some(start) = rest.find("<circle ") {
        let end = rest[start..]
            .find("/>")
            .map_or(rest.len(), |e| start + e + 2);
        let tag = &rest[start..end];
        out.push_str(&rest[..start]);
        if tag.contains(&radius) && !tag.contains("fill=\"none\"") {
            let run = runs
                .next()
                .ok_or_else(|| "the frontier plot has more points than runs".to_owned())?;
            out.push_str(&format!(
                "<circle class=\"run-point\" data-run=\"{}\" data-recipe=\"{}\" ",
                escape(&run.run_name),
                escape(&run.recipe)
            ));
            out.push_str(&tag["<circle ".len()..]);
        } else {
            out.push_str(tag);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    if runs.next().is_some() {
        return Err("the frontier plot has fewer points than runs".to_owned());
    }
    Ok(out.replacen("<svg ", &format!("<svg id=\"frontier-{}\" ", group.slug), 1))
}

/// `text` escaped for HTML and XML text and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A run's learning curves as SVG: quality against wall seconds (against batches for records
/// without evaluation times), and training loss against batches (from `metrics.jsonl`).
pub fn curves_svg(
    run: &Run,
    metric: QualityMetric,
    colour: RGBColor,
    text: bool,
) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, CURVES_SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(drawing_error)?;
        let (left, right) = root.split_horizontally(CURVES_SIZE.0 / 2);
        let (quality, x_desc) = quality_curve(run, metric);
        line_chart(&left, &quality, x_desc, metric.name(), colour, text)?;
        let loss: Vec<(f64, f64)> = run
            .train_loss
            .iter()
            .map(|(b, l)| (*b as f64, *l))
            .collect();
        line_chart(&right, &loss, "batch", "training loss", colour, text)?;
        root.present().map_err(drawing_error)?;
    }
    Ok(svg)
}

fn quality_curve(run: &Run, metric: QualityMetric) -> (Vec<(f64, f64)>, &'static str) {
    let values = run.evals.iter().map(|e| metric.of(e));
    if run.eval_times.is_empty() {
        let at = run.evals.iter().map(|e| e.batch as f64);
        (zip_present(at, values), "batch")
    } else {
        let at = run.eval_times.iter().map(|t| t.wall_seconds);
        (zip_present(at, values), "wall seconds")
    }
}

fn zip_present(
    x: impl Iterator<Item = f64>,
    y: impl Iterator<Item = Option<f64>>,
) -> Vec<(f64, f64)> {
    x.zip(y).filter_map(|(x, y)| Some((x, y?))).collect()
}

fn line_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    data: &[(f64, f64)],
    x_desc: &str,
    y_desc: &str,
    colour: RGBColor,
    text: bool,
) -> Result<(), String> {
    let x_max = data.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-3);
    let y_range = padded_range(data.iter().map(|p| p.1));
    let mut builder = ChartBuilder::on(area);
    builder.margin(12);
    if text {
        builder.x_label_area_size(35).y_label_area_size(55);
    }
    let mut chart = builder
        .build_cartesian_2d(0.0..x_max * 1.05, y_range)
        .map_err(drawing_error)?;
    if text {
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(5)
            .y_labels(5)
            .draw()
            .map_err(drawing_error)?;
    }
    chart
        .draw_series(LineSeries::new(
            data.iter().copied(),
            colour.stroke_width(2),
        ))
        .map_err(drawing_error)?;
    chart
        .draw_series(data.iter().map(|p| Circle::new(*p, 3, colour.filled())))
        .map_err(drawing_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explore::group::group_runs;
    use crate::explore::test_support::run;
    use crate::explore::Pricing;

    fn group() -> Group {
        let runs = vec![
            run("b1", "baseline", 1, &[(5.0, 0.6), (10.0, 0.7)], 10.0),
            run("l1", "label_smoothing", 1, &[(4.0, 0.72)], 4.0),
            run("l2", "label_smoothing", 2, &[(6.0, 0.74)], 6.0),
        ];
        group_runs(runs, None, &Pricing::Recorded).0.remove(0)
    }

    #[test]
    fn the_frontier_svg_labels_one_point_per_run() {
        let g = group();
        for text in [false, text_available()] {
            let svg = frontier_svg(&g, text).expect("drawn");
            assert!(svg.contains(&format!("<svg id=\"frontier-{}\"", g.slug)));
            assert_eq!(svg.matches("class=\"run-point\"").count(), 3, "{svg}");
            assert_eq!(svg.matches("data-recipe=\"label_smoothing\"").count(), 2);
            assert!(svg.contains("data-run=\"b1\""));
        }
    }

    #[test]
    fn the_png_is_drawn_with_the_recipe_colours() {
        let g = group();
        let png = frontier_png(&g, false).expect("drawn");
        let image = image::load_from_memory(&png).expect("a PNG").to_rgb8();
        assert_eq!(image.dimensions(), FRONTIER_SIZE);
        let colour = recipe_colour(&g, "label_smoothing");
        let count = image
            .pixels()
            .filter(|p| p.0 == [colour.0, colour.1, colour.2])
            .count();
        assert!(count > 50, "{count} pixels of the recipe's colour");
    }

    #[test]
    fn curves_are_drawn_with_and_without_times() {
        let g = group();
        let mut r = g.points[0].runs[0].clone();
        r.train_loss = vec![(1, 2.0), (2, 1.5)];
        assert!(curves_svg(&r, g.metric, PALETTE[0], false).is_ok());
        r.eval_times.clear();
        assert!(curves_svg(&r, g.metric, PALETTE[0], text_available()).is_ok());
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
