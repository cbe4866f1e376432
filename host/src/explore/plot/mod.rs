//! The charts of a group: the frontier (wall time against quality, each point the mean over its
//! seeds, numbered, with a legend that gives each point's mean ± half range) and the learning
//! curves (one chart per measure, every run of the group on it, coloured by recipe).
//!
//! Each chart is drawn once on a [`canvas::Canvas`] (shapes in pixels, see there) and written
//! as SVG for the report (with classes, data attributes and hover titles) or as PNG.

pub mod axes;
pub mod canvas;
mod curve_chart;
mod frontier_chart;
pub mod labels;

pub use canvas::{escape, text_available, Rgb, FONT_ENV};
pub use curve_chart::{curve_canvas, Curve};
pub use frontier_chart::frontier_canvas;

use super::group::Group;
use axes::Frame;
use canvas::{Anchor, Canvas, Font, Meta, Shape};

/// Width of every chart, pixels.
pub const CHART_WIDTH: u32 = 980;
/// Width of a chart's legend column, right of its plot.
const LEGEND_WIDTH: f64 = 330.0;

/// Distinct colours for recipes, in the order of [`recipe_colour`] (Tableau's ten without its
/// grey, which the frontier line uses, and three darker ones); a group of more recipes reuses
/// them, and the points' numbers still tell them apart.
const PALETTE: [Rgb; 12] = [
    Rgb(31, 119, 180),
    Rgb(214, 39, 40),
    Rgb(44, 160, 44),
    Rgb(255, 127, 14),
    Rgb(148, 103, 189),
    Rgb(23, 190, 207),
    Rgb(227, 119, 194),
    Rgb(140, 86, 75),
    Rgb(188, 189, 34),
    Rgb(0, 92, 102),
    Rgb(57, 59, 121),
    Rgb(173, 73, 74),
];

/// The colour of `recipe` in `group`: recipes take the palette in sorted order.
pub fn recipe_colour(group: &Group, recipe: &str) -> Rgb {
    let mut recipes: Vec<&str> = group.points.iter().map(|p| p.recipe.as_str()).collect();
    recipes.sort_unstable();
    recipes.dedup();
    let index = recipes.iter().position(|r| *r == recipe).unwrap_or(0);
    PALETTE[index % PALETTE.len()]
}

/// A chart `height` pixels high with `title` at its top, its plot on the left and room for a
/// legend on the right: the canvas and the plot's frame.
fn titled_chart(id: String, root: Meta, title: String, height: f64) -> (Canvas, Frame) {
    let mut canvas = Canvas::new(CHART_WIDTH, height as u32, id, root);
    let frame = Frame {
        left: 80.0,
        top: 44.0,
        right: f64::from(CHART_WIDTH) - LEGEND_WIDTH - 24.0,
        bottom: height - 58.0,
    };
    canvas.draw(Shape::text(
        (frame.left, 22.0),
        title,
        Font::new(16.0, Rgb::INK).bold(),
        Anchor::Start,
    ));
    (canvas, frame)
}

/// The frontier plot of `group` as SVG: the root is `<svg id="frontier-<slug>">`; each run is a
/// `<circle class="run-point" data-run=... data-recipe=...>`, each point's mean a
/// `class="point-mean"` circle, its number a `class="point-label"` text and its legend entry a
/// `class="legend-entry"` group, all with `data-point` (the number).
pub fn frontier_svg(group: &Group) -> String {
    frontier_canvas(group).svg()
}

/// The frontier plot of `group` as a PNG file's bytes (text only when `text`).
pub fn frontier_png(group: &Group, text: bool) -> Result<Vec<u8>, String> {
    frontier_canvas(group).png(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explore::group::group_runs;
    use crate::explore::test_support::run;
    use crate::explore::Pricing;

    /// Baseline (1 seed, 10 s), label smoothing (2 seeds, 4 and 6 s), accuracy 0.6 to 0.74.
    pub(super) fn group() -> Group {
        let mut runs = vec![
            run("b1", "baseline", 1, &[(5.0, 0.6), (10.0, 0.7)], 10.0),
            run("l1", "label_smoothing", 1, &[(4.0, 0.72)], 4.0),
            run("l2", "label_smoothing", 2, &[(6.0, 0.74)], 6.0),
        ];
        runs[0].train_loss = vec![(1, 2.0), (2, 1.5)];
        group_runs(runs, None, &Pricing::Recorded).0.remove(0)
    }

    fn count(svg: &str, needle: &str) -> usize {
        svg.matches(needle).count()
    }

    #[test]
    fn the_frontier_svg_has_a_dot_per_run_and_one_label_per_point() {
        let g = group();
        let svg = frontier_svg(&g);
        assert!(svg.contains(&format!("id=\"frontier-{}\"", g.slug)));
        assert_eq!(count(&svg, "class=\"run-point\""), 3, "{svg}");
        assert_eq!(count(&svg, "class=\"run-point\" data-run=\"l"), 2);
        assert!(svg.contains("data-run=\"b1\""));
        assert_eq!(count(&svg, "class=\"point-mean\""), 2);
        assert_eq!(count(&svg, "class=\"point-label\""), 2);
        assert_eq!(count(&svg, "class=\"legend-entry\""), 2);
        assert!(
            svg.contains("0.7300 ± 0.0100"),
            "label smoothing's mean ± half range"
        );
        assert!(svg.contains("<title>"), "hover details");
    }

    #[test]
    fn the_frontier_axes_fit_the_data() {
        let svg = frontier_svg(&group());
        let attr = |name: &str| -> f64 {
            let key = format!("data-{name}=\"");
            let start = svg.find(&key).expect(name) + key.len();
            svg[start..].split('"').next().unwrap().parse().unwrap()
        };
        // Walls 4 to 10 s, accuracies 0.70 to 0.74: neither axis starts at zero.
        assert!(
            attr("x-min") > 3.0 && attr("x-min") < 4.0,
            "{}",
            attr("x-min")
        );
        assert!(attr("x-max") > 10.0 && attr("x-max") < 11.0);
        assert!(attr("y-min") > 0.69 && attr("y-max") < 0.75);
    }

    #[test]
    fn the_png_is_drawn_with_the_recipe_colours() {
        let g = group();
        let png = frontier_png(&g, false).expect("drawn");
        let image = image::load_from_memory(&png).expect("a PNG").to_rgb8();
        assert_eq!(image.width(), CHART_WIDTH);
        let colour = recipe_colour(&g, "label_smoothing");
        let pixels = image
            .pixels()
            .filter(|p| p.0 == [colour.0, colour.1, colour.2])
            .count();
        assert!(pixels > 100, "{pixels} pixels of the recipe's colour");
        assert!(frontier_png(&g, text_available()).is_ok());
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
