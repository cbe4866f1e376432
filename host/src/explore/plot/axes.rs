//! Axes that fit the data: the range shown is the data's with a small margin (not from zero),
//! ticks at round numbers, and the frame, grid and labels of a chart.

use super::canvas::{Anchor, Canvas, Font, Meta, Rgb, Shape, Stroke};

/// Margin on each side of the data, as a fraction of its range.
const MARGIN: f64 = 0.06;

/// The plot area of a chart, pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Frame {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Right edge.
    pub right: f64,
    /// Bottom edge.
    pub bottom: f64,
}

/// One axis: the values it shows and the pixels they span.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Axis {
    /// The smallest value shown.
    pub min: f64,
    /// The largest value shown.
    pub max: f64,
    /// The pixel of `min`.
    from_pixel: f64,
    /// The pixel of `max`.
    to_pixel: f64,
}

impl Axis {
    /// An axis showing `values` (see [`data_range`]) from `from_pixel` to `to_pixel`.
    pub fn fit(values: impl IntoIterator<Item = f64>, from_pixel: f64, to_pixel: f64) -> Axis {
        let (min, max) = data_range(values);
        Axis {
            min,
            max,
            from_pixel,
            to_pixel,
        }
    }

    /// The pixel of `value`.
    pub fn pixel(&self, value: f64) -> f64 {
        self.from_pixel
            + (value - self.min) / (self.max - self.min) * (self.to_pixel - self.from_pixel)
    }

    /// Round values inside the axis, about six of them, and the decimals to print them with.
    pub fn ticks(&self) -> (Vec<f64>, usize) {
        let step = nice_step((self.max - self.min) / 6.0);
        let first = (self.min / step).ceil() as i64;
        let last = (self.max / step).floor() as i64;
        let ticks = (first..=last).map(|i| i as f64 * step).collect();
        // Enough decimals to tell the ticks apart: 0.025 needs 3.
        let decimals = (0..=9)
            .find(|d| {
                let scale = 10f64.powi(*d);
                ((step * scale).round() - step * scale).abs() < 1e-6 * scale.max(1.0)
            })
            .unwrap_or(9) as usize;
        (ticks, decimals)
    }
}

/// The range an axis shows for `values`: theirs, widened by a margin on each side; not below
/// zero when no value is; `(0, 1)` without values.
pub fn data_range(values: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    // One value (or all equal): a span of a tenth of it, so the axis still has a scale.
    let span = if hi > lo {
        hi - lo
    } else {
        (lo.abs() * 0.1).max(1e-3)
    };
    let pad = if hi > lo { span * MARGIN } else { span / 2.0 };
    let min = lo - pad;
    let min = if lo >= 0.0 { min.max(0.0) } else { min };
    (min, hi + pad)
}

/// The round step nearest `rough` (by ratio): 1, 2, 2.5 or 5 times a power of ten.
pub fn nice_step(rough: f64) -> f64 {
    if !(rough.is_finite() && rough > 0.0) {
        return 1.0;
    }
    let power = 10f64.powf(rough.log10().floor());
    let distance = |m: &f64| (m * power / rough).ln().abs();
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .min_by(|a, b| distance(a).total_cmp(&distance(b)))
        .unwrap_or(1.0)
        * power
}

/// Draws the grid, the frame, tick labels and axis titles of `frame`; the root of `canvas` gets
/// the axes' ranges as `data-x-min`, `data-x-max`, `data-y-min` and `data-y-max`.
pub fn draw_axes(
    canvas: &mut Canvas,
    frame: Frame,
    x: &Axis,
    y: &Axis,
    x_title: &str,
    y_title: &str,
) {
    for (name, value) in [
        ("x-min", x.min),
        ("x-max", x.max),
        ("y-min", y.min),
        ("y-max", y.max),
    ] {
        canvas.root.data.push((name.to_owned(), format!("{value}")));
    }
    let grid = Stroke::solid(Rgb::GRID, 1.0);
    let tick_font = Font::new(11.0, Rgb::GREY);
    let (x_ticks, x_decimals) = x.ticks();
    let (y_ticks, y_decimals) = y.ticks();
    let mut x_axis = Vec::new();
    for t in &x_ticks {
        let px = x.pixel(*t);
        canvas.draw(Shape::Path {
            points: vec![(px, frame.top), (px, frame.bottom)],
            stroke: grid,
        });
        x_axis.push(tick_label(
            (px, frame.bottom + 14.0),
            *t,
            x_decimals,
            tick_font,
            Anchor::Middle,
        ));
    }
    let mut y_axis = Vec::new();
    for t in &y_ticks {
        let py = y.pixel(*t);
        canvas.draw(Shape::Path {
            points: vec![(frame.left, py), (frame.right, py)],
            stroke: grid,
        });
        y_axis.push(tick_label(
            (frame.left - 6.0, py),
            *t,
            y_decimals,
            tick_font,
            Anchor::End,
        ));
    }
    canvas.draw(Shape::Rect {
        corner: (frame.left, frame.top),
        size: (frame.right - frame.left, frame.bottom - frame.top),
        fill: None,
        stroke: Some(Stroke::solid(Rgb::FRAME, 1.0)),
    });
    let title_font = Font::new(13.0, Rgb::INK);
    x_axis.push(item(Shape::text(
        ((frame.left + frame.right) / 2.0, frame.bottom + 36.0),
        x_title,
        title_font,
        Anchor::Middle,
    )));
    y_axis.push(item(Shape::Text {
        at: (frame.left - 58.0, (frame.top + frame.bottom) / 2.0),
        text: y_title.to_owned(),
        font: title_font,
        anchor: Anchor::Middle,
        vertical: true,
    }));
    canvas.draw_with(Shape::Group(x_axis), Meta::class("x-axis"));
    canvas.draw_with(Shape::Group(y_axis), Meta::class("y-axis"));
}

fn item(shape: Shape) -> super::canvas::Item {
    super::canvas::Item {
        shape,
        meta: Meta::default(),
    }
}

fn tick_label(
    at: (f64, f64),
    value: f64,
    decimals: usize,
    font: Font,
    anchor: Anchor,
) -> super::canvas::Item {
    super::canvas::Item {
        shape: Shape::text(at, format!("{value:.decimals$}"), font, anchor),
        meta: Meta::class("tick"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_fits_the_data_with_a_margin() {
        let (lo, hi) = data_range([100.0, 150.0, 200.0]);
        assert!(
            (lo - 94.0).abs() < 1e-9 && (hi - 206.0).abs() < 1e-9,
            "{lo} {hi}"
        );
        // Data near zero does not go below it.
        assert_eq!(data_range([1.0, 101.0]).0, 0.0);
        // Negative data keeps its margin.
        assert!(data_range([-1.0, 1.0]).0 < -1.0);
        let (lo, hi) = data_range([0.85]);
        assert!(lo < 0.85 && hi > 0.85 && lo > 0.7, "{lo} {hi}");
        assert_eq!(data_range(std::iter::empty()), (0.0, 1.0));
        assert_eq!(data_range([f64::NAN, 2.0, 4.0]).0, 2.0 - 0.12);
    }

    #[test]
    fn ticks_are_round_numbers_inside_the_axis() {
        assert_eq!(nice_step(0.0023), 0.0025);
        assert_eq!(nice_step(17.0), 20.0);
        assert_eq!(nice_step(4.0), 5.0);
        let axis = Axis::fit([0.838, 0.857], 0.0, 100.0);
        let (ticks, decimals) = axis.ticks();
        assert!(ticks.len() >= 4, "{ticks:?}");
        assert!(ticks.iter().all(|t| *t >= axis.min && *t <= axis.max));
        assert_eq!(decimals, 3, "step 0.005: {ticks:?}");
        let (ticks, decimals) = Axis::fit([90.0, 175.0], 0.0, 1.0).ticks();
        assert_eq!((ticks[0], decimals), (100.0, 0), "{ticks:?}");
        assert!((axis.pixel(axis.min)).abs() < 1e-9 && (axis.pixel(axis.max) - 100.0).abs() < 1e-9);
    }
}
