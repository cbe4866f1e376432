use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::data::image_augment::{hsv_to_rgb, rgb_to_hsv};

fn png(width: u32, height: u32) -> Vec<u8> {
    let image = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([
            (x * 7 % 256) as u8,
            (y * 5 % 256) as u8,
            ((x + y) % 256) as u8,
        ])
    });
    let mut bytes = Vec::new();
    image::DynamicImage::ImageRgb8(image)
        .write_to(&mut Cursor::new(&mut bytes), image::ImageFormat::Png)
        .unwrap();
    bytes
}

#[test]
fn random_resized_crops_fit_the_image_and_the_ranges() {
    let crop = RandomResizedCrop::default();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for (w, h) in [(500, 375), (64, 480), (17, 9)] {
        for _ in 0..200 {
            let b = random_resized_crop_params(w, h, &crop, &mut || rng.gen::<f64>());
            assert!(
                b.left + b.width <= w && b.top + b.height <= h,
                "{b:?} of {w}x{h}"
            );
            assert!(b.width > 0 && b.height > 0);
        }
    }
}

#[test]
fn the_fallback_is_the_centre_crop_with_the_ratio_clamped() {
    // Every try fails when the area share is above 1 (scale [2, 2]): the fallback remains.
    let crop = RandomResizedCrop {
        scale: [2.0, 2.0],
        ratio: [0.75, 4.0 / 3.0],
    };
    let wide = random_resized_crop_params(400, 100, &crop, &mut || 0.5);
    assert_eq!(
        wide,
        CropBox {
            top: 0,
            left: (400 - 133) / 2,
            height: 100,
            width: 133
        }
    );
    let square = random_resized_crop_params(90, 100, &crop, &mut || 0.5);
    assert_eq!((square.width, square.height), (90, 100));
}

#[test]
fn decoding_is_a_function_of_the_generator() {
    let bytes = png(120, 80);
    let plan = DecodePlan {
        channels: 3,
        size: 32,
        crop: CropPlan::RandomResized(RandomResizedCrop::default()),
        color_jitter: Some(ColorJitter {
            brightness: 0.4,
            contrast: 0.4,
            saturation: 0.4,
            hue: 0.1,
        }),
        jpeg_dct_scale: false,
    };
    let run = |seed| {
        decode_image_drawn(&bytes, "a.png", &plan, &mut ChaCha8Rng::seed_from_u64(seed)).unwrap()
    };
    let (a, drawn) = run(1);
    assert_eq!(a.len(), 3 * 32 * 32);
    assert_eq!(run(1).0, a);
    assert_ne!(run(2).1, drawn);
    assert_eq!(drawn.image, (120, 80));
}

#[test]
fn a_centre_crop_of_an_image_of_the_size_keeps_its_pixels() {
    let bytes = png(8, 8);
    let plan = DecodePlan {
        channels: 3,
        size: 8,
        crop: CropPlan::Centre { resize: 8 },
        color_jitter: None,
        jpeg_dct_scale: false,
    };
    let pixels = decode_image(&bytes, "a.png", &plan, &mut ChaCha8Rng::seed_from_u64(0)).unwrap();
    // Planar: the red plane is x * 7.
    assert_eq!(&pixels[..8], &[0, 7, 14, 21, 28, 35, 42, 49]);
}

#[test]
fn an_undecodable_image_is_named() {
    assert_refused_naming(b"not an image", "cats/1.jpg");
}

/// Decoding `bytes` (as the file `name`) fails with an error naming the file and `on_bad_file`.
fn assert_refused_naming(bytes: &[u8], name: &str) {
    let plan = DecodePlan {
        channels: 3,
        size: 8,
        crop: CropPlan::Centre { resize: 8 },
        color_jitter: None,
        jpeg_dct_scale: false,
    };
    let err = decode_image(bytes, name, &plan, &mut ChaCha8Rng::seed_from_u64(0))
        .unwrap_err()
        .to_string();
    assert!(err.contains(name) && err.contains("on_bad_file"), "{err}");
}

#[test]
fn hsv_round_trips_like_pillow_for_greys_and_primaries() {
    assert_eq!(rgb_to_hsv(255, 0, 0), [0, 255, 255]);
    assert_eq!(hsv_to_rgb(0, 255, 255), [255, 0, 0]);
    assert_eq!(rgb_to_hsv(9, 9, 9), [0, 0, 9]);
    assert_eq!(hsv_to_rgb(85, 255, 200), [0, 200, 0]);
}

/// A textured `width`×`height` JPEG (the `image` crate's baseline encoder, 4:2:0 for colour),
/// RGB or grey.
fn jpeg(width: u32, height: u32, grey: bool) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(u64::from(width * 31 + height));
    let image = image::RgbImage::from_fn(width, height, |x, y| {
        let noise: i32 = rng.gen_range(-30..30);
        let c = |base: u32| (base as i32 + noise).clamp(0, 255) as u8;
        image::Rgb([
            c(x * 255 / width),
            c(y * 255 / height),
            c((x + y) * 3 % 256),
        ])
    });
    let image = if grey {
        image::DynamicImage::ImageLuma8(image::DynamicImage::ImageRgb8(image).into_luma8())
    } else {
        image::DynamicImage::ImageRgb8(image)
    };
    let mut bytes = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 90)
        .encode_image(&image)
        .unwrap();
    bytes
}

#[cfg(tessera_libjpeg)]
#[test]
fn a_region_is_the_same_crop_of_the_whole_decode() {
    for (w, h, grey) in [(123, 77, false), (64, 48, true), (200, 31, false)] {
        let bytes = jpeg(w, h, grey);
        assert!(jpeg::is_jpeg(&bytes));
        assert_eq!(jpeg::info(&bytes).unwrap(), Some((w as usize, h as usize)));
        let (w, h) = (w as usize, h as usize);
        let whole = jpeg::decode_region(&bytes, w, 1, (0, 0, w, h))
            .unwrap()
            .unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        // Boxes at odd places (off the 8/16-pixel blocks), at the edges and one pixel.
        let mut boxes = vec![(0, 0, w, h), (w - 1, h - 1, 1, 1), (0, h - 5, 3, 5)];
        for _ in 0..40 {
            let (x, y) = (rng.gen_range(0..w), rng.gen_range(0..h));
            boxes.push((x, y, rng.gen_range(1..=w - x), rng.gen_range(1..=h - y)));
        }
        for (x, y, bw, bh) in boxes {
            let region = jpeg::decode_region(&bytes, w, 1, (x, y, bw, bh))
                .unwrap()
                .unwrap();
            let cut: Vec<u8> = (y..y + bh)
                .flat_map(|r| whole[(r * w + x) * 3..(r * w + x + bw) * 3].iter().copied())
                .collect();
            assert!(
                region == cut,
                "{w}x{h} grey {grey}: region {bw}x{bh} at ({x}, {y})"
            );
        }
        // Grey JPEGs come out with three equal channels.
        if grey {
            assert!(whole.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]));
        }
    }
}

#[cfg(tessera_libjpeg)]
#[test]
fn a_region_outside_the_image_is_refused() {
    let bytes = jpeg(40, 30, false);
    let err = jpeg::decode_region(&bytes, 40, 1, (30, 0, 11, 5)).unwrap_err();
    assert!(err.contains("outside"), "{err}");
}

/// The largest and the mean absolute difference of two equally long pixel lists.
fn differences(a: &[u8], b: &[u8]) -> (u8, f64) {
    assert_eq!(a.len(), b.len());
    let d: Vec<u8> = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).collect();
    let mean = d.iter().map(|&v| f64::from(v)).sum::<f64>() / d.len() as f64;
    (d.into_iter().max().unwrap_or(0), mean)
}

/// Resizes the `b` crop of a whole interleaved RGB image to `size`×`size` as decode.rs does,
/// planar.
fn resized_crop(whole: &[u8], (w, h): (usize, usize), b: CropBox, size: u32) -> Vec<u8> {
    let source = ImageRef::new(w as u32, h as u32, whole, PixelType::U8x3).unwrap();
    let view = CroppedImage::new(
        &source,
        b.left as u32,
        b.top as u32,
        b.width as u32,
        b.height as u32,
    )
    .unwrap();
    let mut out = Image::new(size, size, PixelType::U8x3);
    let bilinear = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    Resizer::new().resize(&view, &mut out, &bilinear).unwrap();
    planar(&out.into_vec())
}

fn rrc_plan(size: usize, jpeg_dct_scale: bool) -> DecodePlan {
    DecodePlan {
        channels: 3,
        size,
        crop: CropPlan::RandomResized(RandomResizedCrop::default()),
        color_jitter: None,
        jpeg_dct_scale,
    }
}

#[cfg(tessera_libjpeg)]
#[test]
fn random_crops_of_a_jpeg_are_the_crops_of_its_whole_decode() {
    let (w, h) = (160, 120);
    let bytes = jpeg(w as u32, h as u32, false);
    let whole = jpeg::decode_region(&bytes, w, 1, (0, 0, w, h))
        .unwrap()
        .unwrap();
    let plan = rrc_plan(24, false);
    for seed in 0..30 {
        let (pixels, drawn) =
            decode_image_drawn(&bytes, "a.jpg", &plan, &mut ChaCha8Rng::seed_from_u64(seed))
                .unwrap();
        let b = drawn.crop.unwrap();
        assert_eq!((drawn.image, drawn.dct_scale), ((w, h), 1));
        assert!(pixels == resized_crop(&whole, (w, h), b, 24), "{b:?}");
    }
}

#[test]
fn a_dct_scaled_decode_is_near_the_full_size_one() {
    // 960x720 with 48-pixel samples: most crops are at least twice the sample on both sides, so
    // libjpeg-turbo decodes them at 1/2, 1/4 or 1/8 before the resize.
    let bytes = jpeg(960, 720, false);
    let (mut worst, mut means, mut scales) = (0u8, Vec::new(), std::collections::BTreeSet::new());
    for seed in 0..40 {
        let run = |dct| {
            decode_image_drawn(
                &bytes,
                "a.jpg",
                &rrc_plan(48, dct),
                &mut ChaCha8Rng::seed_from_u64(seed),
            )
            .unwrap()
        };
        let ((exact, a), (scaled, b)) = (run(false), run(true));
        // The same draw either way; the scale is the largest that leaves the crop >= 48.
        assert_eq!(a.crop, b.crop);
        let crop = b.crop.unwrap();
        let expected = if cfg!(tessera_libjpeg) {
            dct_scale_for(&crop, 48)
        } else {
            1
        };
        assert_eq!(b.dct_scale, expected, "{crop:?}");
        scales.insert(b.dct_scale);
        let (max, mean) = differences(&exact, &scaled);
        worst = worst.max(max);
        means.push(mean);
    }
    let mean = means.iter().sum::<f64>() / means.len() as f64;
    eprintln!("DCT-scaled vs full-size decode: largest {worst}/255, mean {mean:.3}/255, scales {scales:?}");
    if cfg!(tessera_libjpeg) {
        assert!(scales.iter().filter(|&&s| s > 1).count() >= 2, "{scales:?}");
        // DCT scaling averages the block like a box filter where the bilinear resize weighs
        // a triangle: small differences on average (docs/data.md gives the measured figures).
        assert!(mean < 2.0, "mean difference {mean}/255");
    } else {
        assert_eq!((worst, mean), (0, 0.0));
    }
}

#[cfg(tessera_libjpeg)]
#[test]
fn a_truncated_jpeg_is_an_error_naming_it() {
    let bytes = jpeg(64, 64, false);
    assert_refused_naming(&bytes[..bytes.len() / 2], "cats/2.jpg");
}
