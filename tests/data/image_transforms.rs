//! Image-folder training and evaluation transforms against torchvision on the same draws:
//! Tessera decodes images with `RandomResizedCrop` + `ColorJitter` plans (and the centre-crop
//! evaluation plan), reporting what it drew; `tests/support/image_transforms_reference.py`
//! applies `torchvision.transforms.functional` to the PIL images with those draws and compares
//! pixels: the crop and resize at most 1/255 apart, the colour jitter (run by torchvision on
//! Tessera's resized pixels) at most 1/255 apart too; and it feeds the uniform numbers Tessera's `RandomResizedCrop`
//! consumed to torchvision's own `get_params`, which must give the same boxes.
//!
//! Needs `import torchvision` with the torch wheel's `PYTHONPATH` (see tests/models/export.rs):
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
            jpeg_dct_scale: false,
        },
        DecodePlan {
            channels: 3,
            size: 96,
            crop: rrc([0.3, 0.9], [0.5, 2.0]),
            color_jitter: None,
            jpeg_dct_scale: false,
        },
        DecodePlan {
            channels: 1,
            size: 48,
            crop: rrc([0.08, 1.0], [0.75, 4.0 / 3.0]),
            color_jitter: Some(jitter()),
            jpeg_dct_scale: false,
        },
        DecodePlan {
            channels: 3,
            size: 56,
            crop: CropPlan::Centre { resize: 64 },
            color_jitter: None,
            jpeg_dct_scale: false,
        },
        DecodePlan {
            channels: 3,
            size: 40,
            crop: CropPlan::Centre { resize: 40 },
            color_jitter: Some(jitter()),
            jpeg_dct_scale: false,
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
    let report = reference(&file);
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

/// Writes `picture` as JPEGs of the kinds Pillow writes (baseline 4:2:0, 4:2:2 and 4:4:4,
/// progressive, grey, CMYK) and a larger one, with Pillow itself.
const PILLOW_JPEGS: &str = r#"
import sys
from PIL import Image
src, out = sys.argv[1], sys.argv[2]
img = Image.open(src).convert("RGB")
img.save(f"{out}/s420.jpg", quality=90, subsampling=2)
img.save(f"{out}/s422.jpg", quality=90, subsampling=1)
img.save(f"{out}/s444.jpg", quality=95, subsampling=0)
img.save(f"{out}/progressive.jpg", quality=90, progressive=True)
img.convert("L").save(f"{out}/grey.jpg", quality=90)
img.convert("CMYK").save(f"{out}/cmyk.jpg", quality=90)
img.resize((img.width * 2, img.height * 2), Image.BICUBIC).save(f"{out}/large.jpg", quality=90)
"#;

#[test]
fn jpegs_decode_like_pillow_and_dct_scaling_stays_near_torchvision() {
    if !python_can_import("torchvision", "JPEG decoding against Pillow") {
        return;
    }
    let dir = TempDir::new("jpeg-kinds");
    let png = dir.path().join("picture.png");
    picture(500, 375, 9).save(&png).unwrap();
    let out = python(&[
        "-c",
        PILLOW_JPEGS,
        png.to_str().unwrap(),
        dir.path().to_str().unwrap(),
    ])
    .unwrap();
    assert!(
        out.status.success(),
        "Pillow failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rrc = |channels, size, jpeg_dct_scale| DecodePlan {
        channels,
        size,
        crop: CropPlan::RandomResized(RandomResizedCrop::default()),
        color_jitter: None,
        jpeg_dct_scale,
    };
    let centre = |channels| DecodePlan {
        channels,
        size: 224,
        crop: CropPlan::Centre { resize: 256 },
        color_jitter: None,
        jpeg_dct_scale: false,
    };
    // (kind, plan, whether it is DCT-scaled).
    let mut runs = Vec::new();
    for kind in [
        "s420",
        "s422",
        "s444",
        "progressive",
        "grey",
        "cmyk",
        "large",
    ] {
        for channels in [3, 1] {
            runs.push((kind, rrc(channels, 224, false), false));
            runs.push((kind, rrc(channels, 64, false), false));
            runs.push((kind, centre(channels), false));
        }
        runs.push((kind, rrc(3, 224, true), true));
        runs.push((kind, rrc(3, 64, true), true));
    }
    let mut decodes = Vec::new();
    let mut scaled_cases = Vec::new();
    for (r, (kind, plan, dct)) in runs.iter().enumerate() {
        let path = dir.path().join(format!("{kind}.jpg"));
        let bytes = std::fs::read(&path).unwrap();
        for seed in 0..6u64 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let (pixels, drawn) = decode_image_drawn(&bytes, kind, plan, &mut rng).unwrap();
            let output = dir.path().join(format!("{r}-{seed}.u8"));
            std::fs::write(&output, &pixels).unwrap();
            let resize = match plan.crop {
                CropPlan::Centre { resize } => Some(resize),
                CropPlan::RandomResized(_) => None,
            };
            if *dct {
                scaled_cases.push((decodes.len(), drawn.dct_scale));
            }
            decodes.push(json!({
                "path": path, "output": output, "channels": plan.channels, "size": plan.size,
                "resize": resize, "crop": drawn.crop, "jitter": null, "before_jitter": null,
                "kind": kind, "dct_scale": drawn.dct_scale,
            }));
        }
    }
    let file = dir.path().join("cases.json");
    std::fs::write(
        &file,
        json!({ "decodes": decodes, "draws": [] }).to_string(),
    )
    .unwrap();
    let report = reference(&file);
    let diffs = report["diffs"].as_array().unwrap();
    assert_eq!(diffs.len(), decodes.len());
    let scaled: std::collections::HashMap<usize, usize> = scaled_cases.iter().copied().collect();
    // Full-size decodes of the 500x375 JPEGs libjpeg-turbo decodes (every DCT-scaled plan whose
    // crop was under twice the sample too): the crop and resize within 1/255 of torchvision on
    // Pillow's decode. CMYK goes through zune-jpeg and the 1000x750 one is shrunk more than the
    // PNG check covers: their distances are printed, not bounded.
    for kind in ["cmyk", "large"] {
        let worst = diffs
            .iter()
            .enumerate()
            .filter(|(i, _)| decodes[*i]["kind"] == kind && scaled.get(i).is_none_or(|&s| s == 1))
            .filter_map(|(_, d)| d["max"].as_i64())
            .max();
        eprintln!("{kind}: full-size decodes at most {worst:?}/255 from Pillow + torchvision");
    }
    let over: Vec<_> = diffs
        .iter()
        .enumerate()
        .filter(|(i, d)| {
            !["cmyk", "large"].contains(&decodes[*i]["kind"].as_str().unwrap_or(""))
                && scaled.get(i).is_none_or(|&s| s == 1)
                && d["max"].as_i64().is_none_or(|m| m > 1)
        })
        .map(|(i, d)| (&decodes[i]["kind"], d))
        .collect();
    assert!(
        over.is_empty(),
        "full-size JPEG decodes more than 1/255 from Pillow + torchvision: {over:?}"
    );
    // DCT-scaled ones: the same as Pillow's decode at that scale (`draft`, libjpeg's scaled
    // IDCT) resized from the crop's box, within 1/255 as the full-size path is; and how far from
    // torchvision's full-size path they are, printed (the scaled IDCT averages each block, a box
    // filter, where torchvision's resize weighs a triangle over the full-size pixels).
    let mut by_scale: std::collections::BTreeMap<usize, (i64, f64, i64, usize)> =
        Default::default();
    for (&i, &s) in scaled.iter().filter(|(_, &s)| s > 1) {
        let d = &diffs[i];
        if ["cmyk"].contains(&decodes[i]["kind"].as_str().unwrap_or("")) {
            continue; // zune-jpeg decodes CMYK whole, at full size
        }
        assert!(d["draft_error"].is_null(), "{d}");
        let e = by_scale.entry(s).or_default();
        e.0 = e.0.max(d["max"].as_i64().unwrap());
        e.1 += d["mean"].as_f64().unwrap();
        e.2 = e.2.max(d["draft_max"].as_i64().expect("draft_max"));
        e.3 += 1;
    }
    for (s, (max, sum, draft_max, n)) in &by_scale {
        eprintln!(
            "DCT scale 1/{s}: {n} decodes; from Pillow's scaled decode at most {draft_max}/255; \
             from torchvision's full-size path at most {max}/255, mean {:.3}/255",
            sum / *n as f64
        );
        assert!(
            *draft_max <= 1,
            "DCT scale 1/{s}: {draft_max}/255 from Pillow's decode at that scale"
        );
    }
    assert!(!by_scale.is_empty(), "no decode was DCT-scaled");
}

/// The report of tests/support/image_transforms_reference.py on the cases in `file`.
fn reference(file: &std::path::Path) -> Value {
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
    serde_json::from_slice(&out.stdout).unwrap()
}
