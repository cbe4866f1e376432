//! A chart as shapes in pixels, written as SVG (with classes, data attributes and hover
//! titles, for the report) or drawn into a PNG with plotters. One drawing, two outputs.
//!
//! PNG text needs a font: plotters lays it out with ab_glyph from a TrueType file found at run
//! time (`TESSERA_FONT`, else Debian's `fonts-dejavu-core`). Without one the PNGs are drawn
//! without text, with a warning; the SVGs always have their text (the browser draws it).

mod png;
mod svg;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::OnceLock;

use plotters::prelude::*;

use png::{drawing_error, png_shape};
use svg::svg_item;

/// The environment variable naming a TrueType font file for the PNG plots' text.
pub const FONT_ENV: &str = "TESSERA_FONT";
/// Where Debian's `fonts-dejavu-core` puts its sans-serif font.
const DEJAVU_SANS: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// The SVG's fonts: the PNG's first, then fonts of about its width.
const SVG_FONTS: &str = "DejaVu Sans, Verdana, sans-serif";

/// Whether PNG plots can have text: registers the font once; warns once when there is none.
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
                "PNG plots are drawn without text: no font at {} ({e}); install Debian's \
                 fonts-dejavu-core or set {FONT_ENV} to a .ttf file",
                path.display()
            );
        }
        registered.is_ok()
    })
}

/// An opaque colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    /// Text and the baseline's ring.
    pub const INK: Rgb = Rgb(34, 34, 34);
    /// Secondary text.
    pub const GREY: Rgb = Rgb(85, 85, 85);
    /// Grid lines.
    pub const GRID: Rgb = Rgb(232, 232, 232);
    /// The plot frame and ticks.
    pub const FRAME: Rgb = Rgb(150, 150, 150);
    /// The background.
    pub const WHITE: Rgb = Rgb(255, 255, 255);

    /// `#rrggbb`.
    pub fn hex(self) -> String {
        format!("#{:02X}{:02X}{:02X}", self.0, self.1, self.2)
    }

    /// This colour mixed with white: `amount` 0 keeps it, 1 is white.
    pub fn towards_white(self, amount: f64) -> Rgb {
        let mix = |c: u8| (f64::from(c) + (255.0 - f64::from(c)) * amount).round() as u8;
        Rgb(mix(self.0), mix(self.1), mix(self.2))
    }

    fn plotters(self) -> RGBColor {
        RGBColor(self.0, self.1, self.2)
    }
}

/// How a line is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stroke {
    /// Its colour.
    pub colour: Rgb,
    /// Its width, pixels.
    pub width: f64,
    /// Dash and gap length, pixels; `None` for a solid line.
    pub dash: Option<f64>,
}

impl Stroke {
    /// A solid line.
    pub fn solid(colour: Rgb, width: f64) -> Stroke {
        Stroke {
            colour,
            width,
            dash: None,
        }
    }
}

/// Where a text's `at` point is, horizontally (vertically it is always the middle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// At the text's start.
    Start,
    /// At its middle.
    Middle,
    /// At its end.
    End,
}

/// A text's size, colour and weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Font {
    /// Size, pixels.
    pub size: f64,
    /// Colour.
    pub colour: Rgb,
    /// Bold (in the SVG; the PNG has one weight).
    pub bold: bool,
}

impl Font {
    /// Regular text of `size` in `colour`.
    pub fn new(size: f64, colour: Rgb) -> Font {
        Font {
            size,
            colour,
            bold: false,
        }
    }

    /// The same, bold.
    pub fn bold(self) -> Font {
        Font { bold: true, ..self }
    }
}

/// Something drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// A line through `points`.
    Path {
        /// Its points, in order.
        points: Vec<(f64, f64)>,
        /// How it is drawn.
        stroke: Stroke,
    },
    /// A circle.
    Circle {
        /// Its centre.
        centre: (f64, f64),
        /// Its radius.
        radius: f64,
        /// Its inside.
        fill: Option<Rgb>,
        /// Its outline.
        stroke: Option<Stroke>,
    },
    /// An upright rectangle.
    Rect {
        /// Its top-left corner.
        corner: (f64, f64),
        /// Width and height.
        size: (f64, f64),
        /// Its inside.
        fill: Option<Rgb>,
        /// Its outline.
        stroke: Option<Stroke>,
    },
    /// One line of text, vertically centred on `at`.
    Text {
        /// The anchor point.
        at: (f64, f64),
        /// The text.
        text: String,
        /// How it looks.
        font: Font,
        /// Which part of the text is at `at`.
        anchor: Anchor,
        /// Read bottom to top (a y axis title).
        vertical: bool,
    },
    /// Shapes that belong together (an SVG `<g>`): one hover title, one class.
    Group(Vec<Item>),
}

impl Shape {
    /// A text drawn left to right.
    pub fn text(at: (f64, f64), text: impl Into<String>, font: Font, anchor: Anchor) -> Shape {
        Shape::Text {
            at,
            text: text.into(),
            font,
            anchor,
            vertical: false,
        }
    }
}

/// What the SVG says about a shape besides drawing it: its class, `data-*` attributes and the
/// title a browser shows on hover.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Meta {
    /// The `class` attribute.
    pub class: Option<String>,
    /// `data-<name>` attributes, in order.
    pub data: Vec<(String, String)>,
    /// The hover text (an SVG `<title>`).
    pub title: Option<String>,
}

impl Meta {
    /// Meta with a class.
    pub fn class(class: &str) -> Meta {
        Meta {
            class: Some(class.to_owned()),
            ..Meta::default()
        }
    }

    /// Adds `data-<name>="value"`.
    pub fn data(mut self, name: &str, value: impl ToString) -> Meta {
        self.data.push((name.to_owned(), value.to_string()));
        self
    }

    /// Sets the hover title.
    pub fn title(mut self, title: impl Into<String>) -> Meta {
        self.title = Some(title.into());
        self
    }

    fn attributes(&self) -> String {
        let mut out = String::new();
        if let Some(class) = &self.class {
            let _ = write!(out, " class=\"{}\"", escape(class));
        }
        for (name, value) in &self.data {
            let _ = write!(out, " data-{name}=\"{}\"", escape(value));
        }
        out
    }
}

/// A shape and what the SVG says about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// What is drawn.
    pub shape: Shape,
    /// Class, data attributes, hover title.
    pub meta: Meta,
}

/// A chart: its size, the attributes of its root element, and its shapes in drawing order.
#[derive(Debug, Clone, PartialEq)]
pub struct Canvas {
    /// Width, pixels.
    pub width: u32,
    /// Height, pixels.
    pub height: u32,
    /// The root's `id`.
    pub id: String,
    /// The root's class and data attributes.
    pub root: Meta,
    items: Vec<Item>,
}

impl Canvas {
    /// An empty white canvas.
    pub fn new(width: u32, height: u32, id: impl Into<String>, root: Meta) -> Canvas {
        Canvas {
            width,
            height,
            id: id.into(),
            root,
            items: Vec::new(),
        }
    }

    /// Draws `shape`.
    pub fn draw(&mut self, shape: Shape) {
        self.draw_with(shape, Meta::default());
    }

    /// Draws `shape` with its class, data attributes and hover title.
    pub fn draw_with(&mut self, shape: Shape, meta: Meta) {
        self.items.push(Item { shape, meta });
    }

    /// The chart as an SVG document (inline in the report as it is).
    pub fn svg(&self) -> String {
        let (w, h) = (self.width, self.height);
        let mut out = format!(
            "<svg id=\"{}\"{} xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             viewBox=\"0 0 {w} {h}\" font-family=\"{SVG_FONTS}\">",
            escape(&self.id),
            self.root.attributes()
        );
        if let Some(title) = &self.root.title {
            let _ = write!(out, "<title>{}</title>", escape(title));
        }
        let _ = write!(out, "<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>");
        for item in &self.items {
            svg_item(&mut out, item);
        }
        out.push_str("</svg>");
        out
    }

    /// The chart as a PNG file's bytes; without `text`, texts are left out.
    pub fn png(&self, text: bool) -> Result<Vec<u8>, String> {
        let (w, h) = (self.width, self.height);
        let mut pixels = vec![255u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area();
            for item in &self.items {
                png_shape(&root, &item.shape, text)?;
            }
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
}

/// Width and height of `text` in `font`, pixels: measured with the plots' font when there is
/// one, else estimated from its length.
pub fn text_size(text: &str, font: &Font) -> (f64, f64) {
    let height = font.size * 1.25;
    if text_available() {
        if let Ok((w, _)) = ("sans-serif", font.size).into_font().box_size(text) {
            // Bold text in the SVG is about a tenth wider.
            let bold = if font.bold { 1.1 } else { 1.0 };
            return (f64::from(w) * bold, height);
        }
    }
    (text.chars().count() as f64 * font.size * 0.62, height)
}

/// `text`, shortened with "…" to fit `max_width` pixels in `font`.
pub fn fit_text(text: &str, font: &Font, max_width: f64) -> String {
    if text_size(text, font).0 <= max_width {
        return text.to_owned();
    }
    let chars: Vec<char> = text.chars().collect();
    (1..chars.len())
        .rev()
        .map(|n| format!("{}…", chars[..n].iter().collect::<String>()))
        .find(|t| text_size(t, font).0 <= max_width)
        .unwrap_or_else(|| "…".to_owned())
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

#[cfg(test)]
mod tests;
