//! Image-folder training and evaluation transforms against torchvision on the same draws:
//! Tessera decodes images with `RandomResizedCrop` + `ColorJitter` plans (and the centre-crop
//! evaluation plan), reporting what it drew; `tests/support/image_transforms_reference.py`
//! applies `torchvision.transforms.functional` to the PIL images with those draws and compares
//! pixels: the crop and resize at most 1/255 apart, the colour jitter (run by torchvision on
//! Tessera's resized pixels) at most 1/255 apart too; and it feeds the uniform numbers Tessera's `RandomResizedCrop`
//! consumed to torchvision's own `get_params`, which must give the same boxes.
//!
//! Needs `import torchvision` with the torch wheel's `PYTHONPATH` (see tests/export.rs):
//! skipped with a notice when it fails, failed under `TESSERA_REQUIRE_PYTORCH=1`.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use tessera::data::decode::{
    decode_image_drawn, random_resized_crop_params, ColorJitter, CropPlan, DecodePlan,
    RandomResizedCrop,
};
use tessera_tests::{python, python_can_import, TempDir};

/// A textured RGB image: gradients, stripes and deterministic noise, so that resampling and
/// colour errors show.
fn picture(width: u32, height: u32, seed: u64) -> image::RgbImage {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    image::RgbImage::from_fn(width, height, |x, y| {
        let noise: i32 = rng.gen_range(-40..40);
        let stripe = if (x / 7 + y / 5) % 2 == 0 { 60 } else { 0 };
        let c = |base: i32| (base + stripe + noise).clamp(0, 255) as u8;
        image::Rgb([
            c((x * 255 / width) as i32),
            c((y * 255 / height) as i32),
            c(128 + ((x as f32 / 9.0).sin() * 90.0) as i32),
        ])
    })
}

fn jitter() -> ColorJitter {
    ColorJitter {
        brightness: 0.4,
        contrast: 0.4,
        saturation: 0.4,
        hue: 0.1,
    }
}

fn plans() -> Vec<DecodePlan> {
    let rrc = |scale, ratio| CropPlan::RandomResized(RandomResizedCrop { scale, ratio });
    vec![
        DecodePlan {
            channels: 3,
            size: 64,
            crop: rrc([0.08, 1.0], [0.75, 4.0 / 3.0]),
            color_jitter: Some(jitter()),
        },
        DecodePlan {
            channels: 3,
            size: 96,
            crop: rrc([0.3, 0.9], [0.5, 2.0]),
            color_jitter: None,
        },
        DecodePlan {
            channels: 1,
            size: 48,
            crop: rrc([0.08, 1.0], [0.75, 4.0 / 3.0]),
            color_jitter: Some(jitter()),
        },
        DecodePlan {
            channels: 3,
            size: 56,
            crop: CropPlan::Centre { resize: 64 },
            color_jitter: None,
        },
        DecodePlan {
            channels: 3,
            size: 40,
            crop: CropPlan::Centre { resize: 40 },
            color_jitter: Some(jitter()),
        },
    ]
}

fn write_cases(dir: &Path) -> Value {
    let sizes = [(500, 375), (375, 500), (97, 61), (640, 120), (50, 400)];
    let mut decodes = Vec::new();
    for (i, &(w, h)) in sizes.iter().enumerate() {
        let path = dir.join(format!("{i}.png"));
        picture(w, h, i as u64).save(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        for (p, plan) in plans().iter().enumerate() {
            for seed in 0..4u64 {
                let mut rng = ChaCha8Rng::seed_from_u64(seed * 31 + p as u64);
                let (pixels, drawn) =
                    decode_image_drawn(&bytes, &path.display().to_string(), plan, &mut rng)
                        .unwrap();
                let output = dir.join(format!("{i}-{p}-{seed}.u8"));
                std::fs::write(&output, &pixels).unwrap();
                // The same crop without the jitter (the crop is drawn first): the jitter is
                // checked on Tessera's own resized pixels, the resize on its own, since the HSV
                // round trip can turn a 1/255 resampling difference into a few.
                let before_jitter = plan.color_jitter.as_ref().map(|_| {
                    let plain = DecodePlan {
                        color_jitter: None,
                        ..plan.clone()
                    };
                    let mut rng = ChaCha8Rng::seed_from_u64(seed * 31 + p as u64);
                    let (pixels, _) = decode_image_drawn(&bytes, "", &plain, &mut rng).unwrap();
                    let file = dir.join(format!("{i}-{p}-{seed}-before-jitter.u8"));
                    std::fs::write(&file, &pixels).unwrap();
                    file
                });
                let resize = match plan.crop {
                    CropPlan::Centre { resize } => Some(resize),
                    CropPlan::RandomResized(_) => None,
                };
                decodes.push(json!({
                    "path": path,
                    "output": output,
                    "channels": plan.channels,
                    "size": plan.size,
                    "resize": resize,
                    "crop": drawn.crop,
                    "jitter": drawn.jitter,
                    "before_jitter": before_jitter,
                }));
            }
        }
    }
    // RandomResizedCrop draws with the uniform numbers they consumed.
    let mut draws = Vec::new();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let settings = [
        RandomResizedCrop::default(),
        RandomResizedCrop {
            scale: [0.5, 1.0],
            ratio: [0.2, 5.0],
        },
        RandomResizedCrop {
            scale: [0.9, 1.0],
            ratio: [1.0, 1.0],
        },
    ];
    for &(w, h) in sizes.iter().chain(&[(3, 2), (1000, 10)]) {
        for crop in &settings {
            for _ in 0..150 {
                let mut uniforms = Vec::new();
                let b = random_resized_crop_params(w as usize, h as usize, crop, &mut || {
                    let u: f64 = rng.gen();
                    uniforms.push(u);
                    u
                });
                draws.push(json!({
                    "width": w, "height": h, "scale": crop.scale, "ratio": crop.ratio,
                    "uniforms": uniforms, "crop": b,
                }));
            }
        }
    }
    json!({ "decodes": decodes, "draws": draws })
}

#[test]
fn training_and_evaluation_transforms_match_torchvision_on_the_same_draws() {
    let dir = TempDir::new("image-transforms");
    let cases = write_cases(dir.path());
    let n_decodes = cases["decodes"].as_array().unwrap().len();
    let n_draws = cases["draws"].as_array().unwrap().len();
    if !python_can_import("torchvision", "image-folder transforms") {
        return;
    }
    let file = dir.path().join("cases.json");
    std::fs::write(&file, cases.to_string()).unwrap();
    let out = python(&[
        "tests/support/image_transforms_reference.py",
        file.to_str().unwrap(),
    ])
    .unwrap();
    assert!(
        out.status.success(),
        "reference failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let diffs = report["diffs"].as_array().unwrap();
    assert_eq!(diffs.len(), n_decodes);
    let worst = diffs
        .iter()
        .map(|d| d["max"].as_i64().unwrap_or(i64::MAX))
        .max()
        .unwrap();
    let over: Vec<_> = diffs
        .iter()
        .filter(|d| d["max"].as_i64().is_none_or(|m| m > 1))
        .collect();
    assert!(
        over.is_empty(),
        "pixels more than 1/255 from torchvision: {over:?}"
    );
    eprintln!(
        "{n_decodes} decodes, largest difference {worst}/255 (crop + resize, and jitter on the \
         same input); end to end with jitter {}/255",
        report["end_to_end_jitter_max"]
    );
    assert_eq!(report["draws"].as_u64(), Some(n_draws as u64));
    let mismatches = report["draw_mismatches"].as_array().unwrap();
    assert!(
        mismatches.is_empty(),
        "{} of {n_draws} RandomResizedCrop draws differ from torchvision's get_params: {:?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(5)]
    );
    // The centre-crop fallback after ten failed tries was exercised too.
    assert!(report["fallbacks"].as_u64().unwrap() > 0, "{report}");
}
