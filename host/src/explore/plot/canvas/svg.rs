//! A canvas's shapes written as SVG elements: classes, data attributes and hover titles.

use std::fmt::Write as _;

use super::{escape, Anchor, Item, Rgb, Shape, Stroke};

fn n(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_owned)
}

fn paint(fill: Option<Rgb>, stroke: Option<Stroke>) -> String {
    let mut out = format!(
        " fill=\"{}\"",
        fill.map_or_else(|| "none".to_owned(), Rgb::hex)
    );
    if let Some(s) = stroke {
        out.push_str(&stroke_attributes(&s));
    }
    out
}

fn stroke_attributes(s: &Stroke) -> String {
    let mut out = format!(
        " stroke=\"{}\" stroke-width=\"{}\"",
        s.colour.hex(),
        n(s.width)
    );
    if let Some(d) = s.dash {
        let _ = write!(out, " stroke-dasharray=\"{} {}\"", n(d), n(d));
    }
    out
}

pub(super) fn svg_item(out: &mut String, item: &Item) {
    let attributes = item.meta.attributes();
    let (open, close) = match &item.shape {
        Shape::Path { points, stroke } => {
            let points: Vec<String> = points
                .iter()
                .map(|(x, y)| format!("{},{}", n(*x), n(*y)))
                .collect();
            (
                format!(
                    "<polyline{attributes} points=\"{}\" fill=\"none\"{} \
                     stroke-linejoin=\"round\" stroke-linecap=\"round\"",
                    points.join(" "),
                    stroke_attributes(stroke)
                ),
                "polyline",
            )
        }
        Shape::Circle {
            centre,
            radius,
            fill,
            stroke,
        } => (
            format!(
                "<circle{attributes} cx=\"{}\" cy=\"{}\" r=\"{}\"{}",
                n(centre.0),
                n(centre.1),
                n(*radius),
                paint(*fill, *stroke)
            ),
            "circle",
        ),
        Shape::Rect {
            corner,
            size,
            fill,
            stroke,
        } => (
            format!(
                "<rect{attributes} x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"{}",
                n(corner.0),
                n(corner.1),
                n(size.0),
                n(size.1),
                paint(*fill, *stroke)
            ),
            "rect",
        ),
        Shape::Text {
            at,
            text,
            font,
            anchor,
            vertical,
        } => {
            let anchor = match anchor {
                Anchor::Start => "start",
                Anchor::Middle => "middle",
                Anchor::End => "end",
            };
            let mut tag = format!(
                "<text{attributes} x=\"{}\" y=\"{}\" font-size=\"{}\" fill=\"{}\" \
                 text-anchor=\"{anchor}\" dominant-baseline=\"central\"",
                n(at.0),
                n(at.1),
                n(font.size),
                font.colour.hex()
            );
            if font.bold {
                tag.push_str(" font-weight=\"bold\"");
            }
            if *vertical {
                let _ = write!(tag, " transform=\"rotate(-90 {} {})\"", n(at.0), n(at.1));
            }
            let _ = write!(tag, ">{}", escape(text));
            if let Some(title) = &item.meta.title {
                let _ = write!(tag, "<title>{}</title>", escape(title));
            }
            out.push_str(&tag);
            out.push_str("</text>");
            return;
        }
        Shape::Group(items) => {
            let _ = write!(out, "<g{attributes}>");
            if let Some(title) = &item.meta.title {
                let _ = write!(out, "<title>{}</title>", escape(title));
            }
            for child in items {
                svg_item(out, child);
            }
            out.push_str("</g>");
            return;
        }
    };
    out.push_str(&open);
    match &item.meta.title {
        Some(title) => {
            let _ = write!(out, "><title>{}</title></{close}>", escape(title));
        }
        None => out.push_str("/>"),
    }
}
