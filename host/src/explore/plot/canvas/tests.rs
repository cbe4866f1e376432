use super::png::dashes;
use super::*;

#[test]
fn the_svg_carries_classes_data_and_titles() {
    let mut c = Canvas::new(100, 50, "c1", Meta::class("chart").data("x-min", 3));
    c.draw_with(
        Shape::Circle {
            centre: (10.0, 10.0),
            radius: 4.0,
            fill: Some(Rgb(1, 2, 3)),
            stroke: None,
        },
        Meta::class("dot").data("run", "a<b").title("run a<b"),
    );
    c.draw(Shape::text(
        (5.0, 5.0),
        "x & y",
        Font::new(12.0, Rgb::INK),
        Anchor::Start,
    ));
    let svg = c.svg();
    assert!(
        svg.starts_with("<svg id=\"c1\" class=\"chart\" data-x-min=\"3\" xmlns="),
        "{svg}"
    );
    assert!(svg.contains("<circle class=\"dot\" data-run=\"a&lt;b\" cx=\"10\" cy=\"10\" r=\"4\" fill=\"#010203\"><title>run a&lt;b</title></circle>"), "{svg}");
    assert!(svg.contains(">x &amp; y</text>"), "{svg}");
}

#[test]
fn the_png_has_the_canvas_size_and_colours() {
    let mut c = Canvas::new(60, 40, "c", Meta::default());
    c.draw(Shape::Path {
        points: vec![(0.0, 20.0), (60.0, 20.0)],
        stroke: Stroke {
            colour: Rgb(200, 0, 0),
            width: 3.0,
            dash: Some(5.0),
        },
    });
    let png = c.png(false).expect("drawn");
    let image = image::load_from_memory(&png).expect("a PNG").to_rgb8();
    assert_eq!(image.dimensions(), (60, 40));
    let red = image.pixels().filter(|p| p.0 == [200, 0, 0]).count();
    // Half the line is gaps.
    assert!((60..=130).contains(&red), "{red} red pixels");
}

#[test]
fn dashes_alternate_along_the_line() {
    let d = dashes(&[(0.0, 0.0), (10.0, 0.0), (10.0, 10.0)], 4.0);
    let lengths: Vec<f64> = d
        .iter()
        .map(|p| {
            p.windows(2)
                .map(|w| (w[1].0 - w[0].0).hypot(w[1].1 - w[0].1))
                .sum()
        })
        .collect();
    assert_eq!(lengths.len(), 3, "{d:?}");
    for l in &lengths[..2] {
        assert!((l - 4.0).abs() < 1e-9, "{lengths:?}");
    }
    assert_eq!(d[1], vec![(8.0, 0.0), (10.0, 0.0), (10.0, 2.0)]);
}

#[test]
fn long_texts_are_shortened_to_fit() {
    let font = Font::new(12.0, Rgb::INK);
    let short = fit_text("a very long recipe label indeed", &font, 80.0);
    assert!(
        short.ends_with('…') && text_size(&short, &font).0 <= 80.0,
        "{short}"
    );
    assert_eq!(fit_text("ok", &font, 80.0), "ok");
    assert_eq!(Rgb(0, 100, 255).towards_white(0.5), Rgb(128, 178, 255));
}
