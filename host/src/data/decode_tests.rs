use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::*;

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
    };
    let pixels = decode_image(&bytes, "a.png", &plan, &mut ChaCha8Rng::seed_from_u64(0)).unwrap();
    // Planar: the red plane is x * 7.
    assert_eq!(&pixels[..8], &[0, 7, 14, 21, 28, 35, 42, 49]);
}

#[test]
fn an_undecodable_image_is_named() {
    let plan = DecodePlan {
        channels: 3,
        size: 8,
        crop: CropPlan::Centre { resize: 8 },
        color_jitter: None,
    };
    let err = decode_image(
        b"not an image",
        "cats/1.jpg",
        &plan,
        &mut ChaCha8Rng::seed_from_u64(0),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("cats/1.jpg") && err.contains("on_bad_file"),
        "{err}"
    );
}

#[test]
fn hsv_round_trips_like_pillow_for_greys_and_primaries() {
    assert_eq!(rgb_to_hsv(255, 0, 0), [0, 255, 255]);
    assert_eq!(hsv_to_rgb(0, 255, 255), [255, 0, 0]);
    assert_eq!(rgb_to_hsv(9, 9, 9), [0, 0, 9]);
    assert_eq!(hsv_to_rgb(85, 255, 200), [0, 200, 0]);
}
