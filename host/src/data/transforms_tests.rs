use super::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn ramp(channels: usize, height: usize, width: usize) -> Sample {
    let pixels: Vec<u8> = (0..channels * height * width).map(|i| i as u8).collect();
    Sample::from_u8(&pixels, channels, height, width)
}

fn crop(size: usize, padding: usize) -> Transform {
    Transform::RandomCrop(RandomCrop { size, padding })
}

#[test]
fn from_u8_scales_to_unit_range() {
    let s = Sample::from_u8(&[0, 255, 51], 1, 1, 3);
    assert_eq!(s.data, vec![0.0, 1.0, 0.2]);
}

#[test]
fn flip_twice_is_identity_and_flip_mirrors_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let flip = Transform::HorizontalFlip(HorizontalFlip { p: 1.0 });
    let original = ramp(2, 3, 4);
    let mut s = original.clone();
    flip.apply(&mut s, &mut rng).unwrap();
    assert_ne!(s, original);
    assert_eq!(&s.data[..4], &[3.0 / 255.0, 2.0 / 255.0, 1.0 / 255.0, 0.0]);
    flip.apply(&mut s, &mut rng).unwrap();
    assert_eq!(s, original);
    let never = Transform::HorizontalFlip(HorizontalFlip { p: 0.0 });
    never.apply(&mut s, &mut rng).unwrap();
    assert_eq!(s, original);
}

#[test]
fn crops_and_flips_on_bytes_equal_them_on_floats() {
    let pixels: Vec<u8> = (0..3 * 5 * 7).map(|i| (i * 37 % 256) as u8).collect();
    let transforms = [
        crop(6, 2),
        Transform::HorizontalFlip(HorizontalFlip { p: 0.5 }),
        crop(4, 0),
    ];
    for seed in 0..50 {
        let (mut rng_bytes, mut rng_floats) = (
            ChaCha8Rng::seed_from_u64(seed),
            ChaCha8Rng::seed_from_u64(seed),
        );
        let mut bytes = Sample {
            data: pixels.clone(),
            channels: 3,
            height: 5,
            width: 7,
        };
        let mut floats = Sample::from_u8(&pixels, 3, 5, 7);
        for t in &transforms {
            assert!(t.works_on_bytes());
            t.apply_to_bytes(&mut bytes, &mut rng_bytes).unwrap();
            t.apply(&mut floats, &mut rng_floats).unwrap();
        }
        assert_eq!(Sample::from_u8(&bytes.data, 3, 4, 4), floats, "seed {seed}");
    }
}

#[test]
fn transforms_that_compute_values_refuse_bytes() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let normalize = Transform::Normalize(Normalize {
        mean: vec![0.5],
        std: vec![0.5],
    });
    assert!(!normalize.works_on_bytes());
    let mut s = Sample {
        data: vec![1u8, 2],
        channels: 1,
        height: 1,
        width: 2,
    };
    let msg = normalize.apply_to_bytes(&mut s, &mut rng).unwrap_err();
    assert!(
        msg.0.starts_with("normalize:") && msg.0.contains("f32"),
        "{msg}"
    );
    assert_eq!(s.data, vec![1, 2], "the sample is left alone");
}

#[test]
fn normalize_planes_normalizes_a_batch_as_each_sample() {
    let n = Normalize {
        mean: vec![0.1, 0.2, 0.3],
        std: vec![0.5, 0.25, 2.0],
    };
    let pixels: Vec<u8> = (0..2 * 3 * 4).map(|i| (i * 11) as u8).collect();
    let mut batch: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    n.normalize_planes(&mut batch, 3, 4);
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let mut expected = Vec::new();
    for image in pixels.chunks(12) {
        let mut s = Sample::from_u8(image, 3, 2, 2);
        Transform::Normalize(n.clone())
            .apply(&mut s, &mut rng)
            .unwrap();
        expected.extend(s.data);
    }
    assert_eq!(batch, expected);
    let (mean, inv_std) = n.per_channel(3);
    assert_eq!((mean, inv_std), (vec![0.1, 0.2, 0.3], vec![2.0, 4.0, 0.5]));
}

#[test]
fn crop_same_size_without_padding_is_identity() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let original = ramp(3, 5, 5);
    let mut s = original.clone();
    crop(5, 0).apply(&mut s, &mut rng).unwrap();
    assert_eq!(s, original);
}

#[test]
fn crop_with_padding_shifts_content_and_zero_fills() {
    let original = ramp(1, 4, 4);
    let mut seen_shifts = std::collections::HashSet::new();
    for seed in 0..200 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut s = original.clone();
        crop(4, 1).apply(&mut s, &mut rng).unwrap();
        assert_eq!(s.shape(), (1, 4, 4));
        // Find the shift (dy, dx) that explains the output: out[y][x] = in[y+dy][x+dx] or 0.
        let shift = (-1i64..=1)
            .flat_map(|dy| (-1i64..=1).map(move |dx| (dy, dx)))
            .find(|&(dy, dx)| {
                (0..4i64).all(|y| {
                    (0..4i64).all(|x| {
                        let (sy, sx) = (y + dy, x + dx);
                        let expected = if (0..4).contains(&sy) && (0..4).contains(&sx) {
                            original.data[(sy * 4 + sx) as usize]
                        } else {
                            0.0
                        };
                        s.data[(y * 4 + x) as usize] == expected
                    })
                })
            });
        seen_shifts.insert(shift.expect("output is a shifted, zero-filled window"));
    }
    assert_eq!(seen_shifts.len(), 9, "all 9 offsets occur");
}

#[test]
fn crop_output_shape_and_errors() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut s = ramp(3, 28, 28);
    crop(32, 2).apply(&mut s, &mut rng).unwrap();
    assert_eq!((s.shape(), s.data.len()), ((3, 32, 32), 3 * 32 * 32));
    let mut s = ramp(1, 28, 28);
    crop(20, 0).apply(&mut s, &mut rng).unwrap();
    assert_eq!(s.shape(), (1, 20, 20));
    let msg = crop(40, 4).apply(&mut s, &mut rng).unwrap_err();
    assert!(
        msg.0.contains("random_crop") && msg.0.contains("`size` 40"),
        "{msg}"
    );
    assert_eq!(
        s.shape(),
        (1, 20, 20),
        "a failed apply leaves the sample alone"
    );
    assert!(crop(0, 0).validate().unwrap_err().0.contains("`size`"));
}

#[test]
fn normalize_math_and_broadcast() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut s = Sample {
        data: vec![0.5, 1.0, 0.0, 0.25],
        channels: 2,
        height: 1,
        width: 2,
    };
    let n = Transform::Normalize(Normalize {
        mean: vec![0.5, 0.25],
        std: vec![0.5],
    });
    n.apply(&mut s, &mut rng).unwrap();
    assert_eq!(s.data, vec![0.0, 1.0, -0.5, 0.0]);
    assert_eq!(s.shape(), (2, 1, 2));
}

#[test]
fn normalize_validation_names_the_setting() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let bad_std = Transform::Normalize(Normalize {
        mean: vec![0.0],
        std: vec![0.0],
    });
    assert!(bad_std.validate().unwrap_err().0.contains("`std`"));
    let wrong_channels = Transform::Normalize(Normalize {
        mean: vec![0.1, 0.2],
        std: vec![1.0],
    });
    let msg = wrong_channels
        .apply(&mut ramp(3, 2, 2), &mut rng)
        .unwrap_err();
    assert!(
        msg.0.contains("`mean` has 2 values") && msg.0.contains("3 channel"),
        "{msg}"
    );
    let empty = Transform::Normalize(Normalize {
        mean: vec![],
        std: vec![1.0],
    });
    assert!(empty.validate().is_err());
}

#[test]
fn flip_probability_validated() {
    let msg = Transform::HorizontalFlip(HorizontalFlip { p: 1.5 })
        .validate()
        .unwrap_err();
    assert!(msg.0.contains("`p`"), "{msg}");
    assert!(Transform::HorizontalFlip(HorizontalFlip { p: f64::NAN })
        .validate()
        .is_err());
}

#[test]
fn mismatched_buffer_is_an_error() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut s = Sample {
        data: vec![0.0; 5],
        channels: 1,
        height: 2,
        width: 2,
    };
    let flip = Transform::HorizontalFlip(HorizontalFlip { p: 1.0 });
    assert!(flip
        .apply(&mut s, &mut rng)
        .unwrap_err()
        .0
        .contains("holds 5"));
}

#[test]
fn pipeline_orders_crop_flip_normalize_and_eval_only_normalizes() {
    let normalize = Normalize {
        mean: vec![0.5],
        std: vec![0.25],
    };
    let t = Transforms {
        normalize: Some(normalize.clone()),
        random_crop: Some(RandomCrop {
            size: 28,
            padding: 2,
        }),
        horizontal_flip: Some(HorizontalFlip::default()),
    };
    assert_eq!(
        t.pipeline(true),
        vec![
            crop(28, 2),
            Transform::HorizontalFlip(HorizontalFlip { p: 0.5 }),
            Transform::Normalize(normalize.clone()),
        ]
    );
    assert_eq!(t.pipeline(false), vec![Transform::Normalize(normalize)]);
    assert_eq!(Transforms::default().pipeline(true), vec![]);
}
