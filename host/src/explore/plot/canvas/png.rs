//! A canvas's shapes drawn into a PNG with plotters (text only with a font).

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;

use super::{Anchor, Shape};

pub(super) fn drawing_error(e: impl std::fmt::Display) -> String {
    format!("drawing a plot: {e}")
}

fn pixel(p: (f64, f64)) -> (i32, i32) {
    (p.0.round() as i32, p.1.round() as i32)
}

fn width_px(w: f64) -> u32 {
    w.round().max(1.0) as u32
}

/// `points` cut into the dashes of a dashed line, each `dash` long with `dash` gaps.
pub(super) fn dashes(points: &[(f64, f64)], dash: f64) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut current = Vec::new();
    // Distance left in the current dash (drawing) or gap (not drawing).
    let (mut left, mut drawing) = (dash, true);
    for pair in points.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let length = (b.0 - a.0).hypot(b.1 - a.1);
        let mut done = 0.0;
        if drawing && current.is_empty() {
            current.push(a);
        }
        while length - done > left {
            done += left;
            let t = done / length;
            let at = (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t);
            if drawing {
                current.push(at);
                out.push(std::mem::take(&mut current));
            } else {
                current.push(at);
            }
            drawing = !drawing;
            left = dash;
        }
        left -= length - done;
        if drawing {
            current.push(b);
        }
    }
    if current.len() > 1 {
        out.push(current);
    }
    out
}

pub(super) fn png_shape<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    shape: &Shape,
    text: bool,
) -> Result<(), String> {
    match shape {
        Shape::Path { points, stroke } => {
            let style = stroke
                .colour
                .plotters()
                .stroke_width(width_px(stroke.width));
            let pieces = match stroke.dash {
                Some(d) => dashes(points, d),
                None => vec![points.clone()],
            };
            for piece in pieces {
                let piece: Vec<(i32, i32)> = piece.into_iter().map(pixel).collect();
                root.draw(&PathElement::new(piece, style))
                    .map_err(drawing_error)?;
            }
        }
        Shape::Circle {
            centre,
            radius,
            fill,
            stroke,
        } => {
            let c = pixel(*centre);
            match (fill, stroke) {
                (Some(f), Some(s)) => {
                    let outer = (radius + s.width / 2.0).round() as u32;
                    let inner = (radius - s.width / 2.0).round().max(0.0) as u32;
                    root.draw(&Circle::new(c, outer, s.colour.plotters().filled()))
                        .map_err(drawing_error)?;
                    root.draw(&Circle::new(c, inner, f.plotters().filled()))
                        .map_err(drawing_error)?;
                }
                (Some(f), None) => root
                    .draw(&Circle::new(
                        c,
                        radius.round() as u32,
                        f.plotters().filled(),
                    ))
                    .map_err(drawing_error)?,
                (None, Some(s)) => {
                    let style = s.colour.plotters().stroke_width(width_px(s.width));
                    root.draw(&Circle::new(c, radius.round() as u32, style))
                        .map_err(drawing_error)?;
                }
                (None, None) => {}
            }
        }
        Shape::Rect {
            corner,
            size,
            fill,
            stroke,
        } => {
            let corners = [
                pixel(*corner),
                pixel((corner.0 + size.0, corner.1 + size.1)),
            ];
            if let Some(f) = fill {
                root.draw(&Rectangle::new(corners, f.plotters().filled()))
                    .map_err(drawing_error)?;
            }
            if let Some(s) = stroke {
                let style = s.colour.plotters().stroke_width(width_px(s.width));
                root.draw(&Rectangle::new(corners, style))
                    .map_err(drawing_error)?;
            }
        }
        Shape::Text {
            at,
            text: content,
            font,
            anchor,
            vertical,
        } => {
            if !text {
                return Ok(());
            }
            let h = match anchor {
                Anchor::Start => HPos::Left,
                Anchor::Middle => HPos::Center,
                Anchor::End => HPos::Right,
            };
            let mut desc = ("sans-serif", font.size).into_font();
            if *vertical {
                desc = desc.transform(FontTransform::Rotate270);
            }
            let colour = font.colour.plotters();
            let style = desc.color(&colour).pos(Pos::new(h, VPos::Center));
            root.draw(&Text::new(content.clone(), pixel(*at), style))
                .map_err(drawing_error)?;
        }
        Shape::Group(items) => {
            for item in items {
                png_shape(root, &item.shape, text)?;
            }
        }
    }
    Ok(())
}
