//! ProgressiveResizing against Composer's golden outputs (`tests/golden/progressive_resizing.*`).
//!
//! Everything is read from the JSON and safetensors files: nearest resizes of the input and an
//! index target at several scales, crops with the corner torch drew (`results.crops`), and the
//! schedule (`schedule_table`, `results.settings`, `results.schedule`): unpinned scale and
//! output size at 11 elapsed fractions for three settings. All must match exactly.

use std::collections::VecDeque;

use progressive_resizing::{
    crop_batch, crop_size, resize_batch, resize_nearest, ProgressiveResizing, Schedule,
};
use serde_json::Value;
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::{parse_params, Golden};
use tessera_plugin_api::testing::{
    default_settings_json, settings, settings_for, RandomSource, TestHost,
};
use tessera_plugin_api::{boxed_method, keys, ErrorKind, Event, Hook, Plugin};

const CASE: &str = "progressive_resizing";

/// The image input and the index target.
fn inputs(g: &Golden) -> (&Tensor, &Tensor) {
    let names = g.names_with_role("input");
    assert_eq!(
        names.len(),
        2,
        "expected input and target_mask, got {names:?}"
    );
    (g.tensor("input"), g.tensor("target_mask"))
}

/// `(scale, name)` of every output named `<prefix>/scale=S/<what>`.
fn outputs(g: &Golden, prefix: &str, what: &str) -> Vec<(f64, String)> {
    let found: Vec<(f64, String)> = g
        .names_with_role("output")
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}/")) && n.ends_with(&format!("/{what}")))
        .map(|n| {
            let params = parse_params(n.split('/').nth(1).expect("scale=S"));
            (params["scale"].parse::<f64>().expect("scale"), n)
        })
        .collect();
    assert!(!found.is_empty(), "no {prefix}/.../{what} outputs");
    found
}

#[test]
fn resize_reproduces_composers_nearest_interpolation() {
    let g = Golden::load(CASE);
    let (x, y) = inputs(&g);
    for (scale, name) in outputs(&g, "resize", "input") {
        let (out, target) = resize_batch(x, y, scale, true).unwrap();
        assert!(out.equal(g.tensor(&name)), "{name}: input differs");
        let target_name = name.replace("/input", "/target");
        let want = g.tensor(&target_name);
        assert_eq!(target.kind(), want.kind(), "{target_name}: kind");
        assert!(target.equal(want), "{target_name}: target differs");
        // Without resize_targets the target is untouched.
        let (_, same) = resize_batch(x, y, scale, false).unwrap();
        assert!(
            same.equal(y),
            "{name}: target changed without resize_targets"
        );
    }
}

/// PyTorch's nearest rule written out: output `floor(size·scale)`, pixel `i` reads
/// `min(floor(i · (float)(1/scale)), size − 1)` (the kernel computes in the tensor's float type).
fn nearest_reference(images: &Tensor, scale: f64) -> Tensor {
    let index = |size: i64| -> Tensor {
        let out = (size as f64 * scale).floor() as i64;
        let step = (1.0 / scale) as f32;
        let v: Vec<i64> = (0..out)
            .map(|i| ((i as f32 * step).floor() as i64).min(size - 1))
            .collect();
        Tensor::from_slice(&v)
    };
    let s = images.size();
    images
        .index_select(2, &index(s[2]))
        .index_select(3, &index(s[3]))
}

#[test]
fn nearest_follows_pytorchs_rule_at_every_scale() {
    let mut checked = 0;
    for (h, w) in [(16, 16), (28, 28), (32, 24), (224, 224), (7, 30)] {
        let x = Tensor::arange(2 * h * w, (Kind::Float, Device::Cpu)).view([1, 2, h, w]);
        for scale in [0.25, 0.3, 0.45, 0.5, 0.6, 0.6875, 0.75, 0.8, 0.9375, 0.99] {
            let out = resize_nearest(&x, scale).unwrap();
            let want = nearest_reference(&x, scale);
            assert!(out.equal(&want), "{h}x{w} at {scale}\n{out}\n{want}");
            checked += 1;
        }
    }
    assert_eq!(checked, 50);
}

#[test]
fn crop_reproduces_composers_recorded_corners() {
    let g = Golden::load(CASE);
    let (x, y) = inputs(&g);
    let (h, w) = (x.size()[2], x.size()[3]);
    let crops = g.json["results"]["crops"]
        .as_array()
        .expect("results.crops");
    let names = outputs(&g, "crop", "input");
    assert_eq!(
        crops.len(),
        names.len(),
        "one recorded corner per crop output"
    );
    for c in crops {
        let scale = c["scale"].as_f64().expect("scale");
        let (top, left) = (
            c["top"].as_i64().expect("top"),
            c["left"].as_i64().expect("left"),
        );
        let size: Vec<i64> = serde_json::from_value(c["size"].clone()).expect("size");
        assert_eq!(size, [crop_size(h, scale), crop_size(w, scale)], "{c}");
        // torch.randint(H − Hc) draws from [0, H − Hc).
        assert!(
            (0..h - size[0]).contains(&top) && (0..w - size[1]).contains(&left),
            "{c}"
        );
        let name = &names
            .iter()
            .find(|(s, _)| *s == scale)
            .unwrap_or_else(|| panic!("no crop output for {c}"))
            .1;
        let (out, target) = crop_batch(x, y, scale, (top, left), false).unwrap();
        assert!(out.equal(g.tensor(name)), "{name}: crop differs");
        assert!(target.equal(y), "{name}: target changed");
        // The invariant: input[:, :, top:top+Hc, left:left+Wc].
        let slice = x.narrow(2, top, size[0]).narrow(3, left, size[1]);
        assert!(out.equal(&slice), "{name}: not the slice");
        // With resize_targets, the same-sized target gets the same crop.
        let (_, t) = crop_batch(x, y, scale, (top, left), true).unwrap();
        assert!(
            t.equal(&y.narrow(1, top, size[0]).narrow(2, left, size[1])),
            "{name}: target"
        );
    }
}

/// One setting of `results.settings`.
fn schedule_of(s: &Value) -> (Schedule, i64) {
    let f = |k: &str| {
        s[k].as_f64()
            .unwrap_or_else(|| panic!("setting `{k}`: {s}"))
    };
    (
        Schedule {
            initial_scale: f("initial_scale"),
            finetune_fraction: f("finetune_fraction"),
            delay_fraction: f("delay_fraction"),
            size_increment: s["size_increment"].as_i64().expect("size_increment"),
        },
        s["W"].as_i64().expect("W"),
    )
}

#[test]
fn schedule_table_matches_exactly() {
    let g = Golden::load(CASE);
    let settings_list = g.json["results"]["settings"].as_array().expect("settings");
    let listed = g.json["results"]["schedule"].as_array().expect("schedule");
    let table: Vec<Vec<f64>> = Vec::try_from(g.tensor("schedule_table")).expect("f64 table");
    assert_eq!(
        table.len(),
        listed.len(),
        "table and results.schedule differ in length"
    );
    for (row, entry) in table.iter().zip(listed) {
        // Columns: setting, elapsed, unpinned scale, output H, output W.
        let (si, elapsed, scale, out_h, out_w) = (row[0], row[1], row[2], row[3], row[4]);
        assert_eq!(entry["setting"].as_f64(), Some(si), "{entry}");
        assert_eq!(entry["elapsed"].as_f64(), Some(elapsed), "{entry}");
        assert_eq!(entry["scale_factor"].as_f64(), Some(scale), "{entry}");
        assert_eq!(
            entry["out_hw"],
            serde_json::json!([out_h as i64, out_w as i64]),
            "{entry}"
        );
        let (schedule, width) = schedule_of(&settings_list[si as usize]);
        let what = format!("setting {si} ({schedule:?}, W = {width}) at {elapsed}");
        assert_eq!(schedule.scale(elapsed), scale, "{what}: scale");
        // Composer resized a (1, 1, W, W) batch; so do we.
        let pinned = schedule.pinned_scale(width, elapsed);
        let x = Tensor::zeros([1, 1, width, width], (Kind::Float, Device::Cpu));
        let (out, _) = resize_batch(
            &x,
            &Tensor::zeros([1], (Kind::Int64, Device::Cpu)),
            pinned,
            false,
        )
        .unwrap();
        assert_eq!(
            out.size(),
            [1, 1, out_h as i64, out_w as i64],
            "{what}: size"
        );
    }
}

#[test]
fn pinned_width_rounds_half_to_even() {
    // Python's round: 6.5 -> 6, 4.5 -> 4, 5.5 -> 6.
    let s = Schedule {
        initial_scale: 0.5,
        finetune_fraction: 0.2,
        delay_fraction: 0.0,
        size_increment: 4,
    };
    assert_eq!(s.pinned_width(32, 0.8125), 24);
    assert_eq!(s.pinned_width(32, 0.5625), 16);
    assert_eq!(s.pinned_width(44, 0.5), 24);
}

#[test]
fn method_reproduces_resize_and_crop_at_the_initial_scale() {
    // The test host's clock is at the start of training, so the method applies initial_scale
    // (pinned to size_increment = 4 on 16-pixel images).
    let g = Golden::load(CASE);
    let (x, y) = inputs(&g);
    let w = x.size()[3];
    let defaults: Value = serde_json::from_str(&default_settings_json(
        ProgressiveResizing::DEFAULT_SETTINGS,
    ))
    .unwrap();
    let mut checked = 0;
    for (scale, name) in outputs(&g, "resize", "input") {
        let schedule = Schedule {
            initial_scale: scale,
            finetune_fraction: 0.2,
            delay_fraction: 0.5,
            size_increment: 4,
        };
        if schedule.pinned_scale(w, 0.0) != scale {
            eprintln!(
                "{name}: scale {scale} is not a multiple of 4 pixels; checked functionally only"
            );
            continue;
        }
        let mut configs = vec![format!(
            r#"{{"initial_scale": {scale}, "resize_targets": true}}"#
        )];
        if defaults["initial_scale"] == serde_json::json!(scale) {
            configs.push(r#"{"resize_targets": true}"#.to_owned());
        }
        for config in configs {
            let mut method = boxed_method::<ProgressiveResizing>(&settings(&config)).unwrap();
            let mut host = TestHost::new(RandomSource::Scripted(VecDeque::new()))
                .with(keys::INPUT, x)
                .with(keys::TARGET, y);
            host.fire(&mut method, Event::AFTER_DATALOADER).unwrap();
            assert_eq!(
                host.draws + host.overdrawn,
                0,
                "{config}: resize draws nothing"
            );
            assert!(
                host.get(keys::INPUT).equal(g.tensor(&name)),
                "{config}: input"
            );
            assert!(
                host.get(keys::TARGET)
                    .equal(g.tensor(&name.replace("/input", "/target"))),
                "{config}: target"
            );
            let size = g.tensor(&name).size();
            assert_eq!(
                host.metrics,
                [
                    ("progressive_resizing/height".to_owned(), size[2] as f64),
                    ("progressive_resizing/width".to_owned(), size[3] as f64),
                    ("progressive_resizing/scale_factor".to_owned(), scale),
                ],
                "{config}"
            );
            checked += 1;
        }
    }
    for c in g.json["results"]["crops"].as_array().expect("crops") {
        let scale = c["scale"].as_f64().unwrap();
        let (top, left) = (c["top"].as_u64().unwrap(), c["left"].as_u64().unwrap());
        let config = format!(r#"{{"initial_scale": {scale}, "mode": "crop"}}"#);
        let mut method = boxed_method::<ProgressiveResizing>(&settings(&config)).unwrap();
        // Top before left, as Composer draws them.
        let mut host = TestHost::new(RandomSource::Scripted(VecDeque::from([top, left])))
            .with(keys::INPUT, x)
            .with(keys::TARGET, y);
        host.fire(&mut method, Event::AFTER_DATALOADER).unwrap();
        assert_eq!((host.draws, host.overdrawn), (2, 0), "{config}");
        let want = g.tensor(&format!("crop/scale={scale}/input"));
        assert!(host.get(keys::INPUT).equal(want), "{config}: crop");
        assert!(host.get(keys::TARGET).equal(y), "{config}: target changed");
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} method checks");
}

#[test]
fn crop_corners_are_uniform_and_seeded() {
    let g = Golden::load(CASE);
    let (x, y) = inputs(&g);
    let (h, w) = (x.size()[2], x.size()[3]);
    let run = |seed: u64| -> Vec<Tensor> {
        let mut method =
            boxed_method::<ProgressiveResizing>(&settings(r#"{"mode": "crop"}"#)).unwrap();
        let mut host = TestHost::new(RandomSource::Seeded(seed));
        (0..400)
            .map(|_| {
                host.tensors.insert(keys::INPUT.to_owned(), x.copy());
                host.tensors.insert(keys::TARGET.to_owned(), y.copy());
                host.fire(&mut method, Event::AFTER_DATALOADER).unwrap();
                host.get(keys::INPUT).copy()
            })
            .collect()
    };
    let outs = run(4);
    let (ch, cw) = (crop_size(h, 0.5), crop_size(w, 0.5));
    let mut corners = std::collections::BTreeMap::new();
    for out in &outs {
        assert_eq!(out.size(), [x.size()[0], x.size()[1], ch, cw]);
        // Find the corner: the crop equals exactly one slice of the input.
        let matches: Vec<(i64, i64)> = (0..h - ch)
            .flat_map(|t| (0..w - cw).map(move |l| (t, l)))
            .filter(|&(t, l)| x.narrow(2, t, ch).narrow(3, l, cw).equal(out))
            .collect();
        assert_eq!(
            matches.len(),
            1,
            "crop is not one slice of [0, H − Hc): {matches:?}"
        );
        *corners.entry(matches[0]).or_insert(0) += 1;
    }
    // 8 × 8 possible corners, 400 draws: every one appears (missing one has odds ~ 64·e^-6.25).
    assert_eq!(corners.len() as i64, (h - ch) * (w - cw), "{corners:?}");
    for (a, b) in outs.iter().zip(run(4)) {
        assert!(a.equal(&b), "seed 4 not reproducible");
    }
}

#[test]
fn hooks_and_name() {
    assert_eq!(
        ProgressiveResizing::hooks(),
        vec![Hook::at(Event::AFTER_DATALOADER)]
    );
    assert_eq!(ProgressiveResizing::NAME, "progressive_resizing");
}

#[test]
fn settings_are_validated() {
    for ok in [
        "{}",
        r#"{"mode": "crop", "initial_scale": 1, "delay_fraction": 0, "finetune_fraction": 0}"#,
        r#"{"size_increment": 1, "resize_targets": true}"#,
        r#"{"delay_fraction": 0.5, "finetune_fraction": 0.49}"#,
    ] {
        boxed_method::<ProgressiveResizing>(&settings(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for (bad, needle) in [
        (
            r#"{"mode": "bilinear"}"#,
            "`mode` must be \"resize\" or \"crop\"",
        ),
        (r#"{"mode": "Resize"}"#, "`mode` must be"),
        (
            r#"{"initial_scale": 0}"#,
            "`initial_scale` must be in (0, 1]",
        ),
        (
            r#"{"initial_scale": 1.5}"#,
            "`initial_scale` must be in (0, 1]",
        ),
        (
            r#"{"finetune_fraction": -0.1}"#,
            "`finetune_fraction` must be in [0, 1]",
        ),
        (
            r#"{"delay_fraction": 1.2}"#,
            "`delay_fraction` must be in [0, 1]",
        ),
        (
            r#"{"delay_fraction": 0.8, "finetune_fraction": 0.2}"#,
            "must be below 1",
        ),
        (
            r#"{"size_increment": 0}"#,
            "`size_increment` must be a positive",
        ),
        (
            r#"{"size_increment": 2.5}"#,
            "`size_increment` must be a non-negative integer",
        ),
        (
            r#"{"resize_targets": "no"}"#,
            "`resize_targets` must be true or false",
        ),
    ] {
        let err = ProgressiveResizing::create(&settings_for::<ProgressiveResizing>(bad))
            .err()
            .unwrap_or_else(|| panic!("{bad} was accepted"));
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{bad}: {err}");
        assert!(err.message().contains(needle), "{bad}: {err}");
    }
    let err = boxed_method::<ProgressiveResizing>(&settings(r#"{"initial_scal": 0.3}"#))
        .err()
        .expect("unknown key accepted");
    assert!(err.message().contains("`initial_scal`"), "{err}");
}

#[test]
fn method_rejects_batches_it_cannot_resize() {
    let mut method = boxed_method::<ProgressiveResizing>(&settings("{}")).unwrap();
    let labels = Tensor::from_slice(&[1i64, 2]);
    let mut host = TestHost::new(RandomSource::Seeded(1)).with(keys::TARGET, &labels);
    let err = host.fire(&mut method, Event::AFTER_DATALOADER).unwrap_err();
    assert!(err.contains("`input`"), "{err}");
    let flat = Tensor::zeros([2, 8], (Kind::Float, Device::Cpu));
    let mut host = TestHost::new(RandomSource::Seeded(1))
        .with(keys::INPUT, &flat)
        .with(keys::TARGET, &labels);
    let err = host.fire(&mut method, Event::AFTER_DATALOADER).unwrap_err();
    assert!(err.contains("(N, C, H, W)"), "{err}");
    // 4-pixel-wide images at scale 0.25 round to width 0.
    let mut small =
        boxed_method::<ProgressiveResizing>(&settings(r#"{"initial_scale": 0.25}"#)).unwrap();
    let tiny = Tensor::zeros([2, 1, 4, 4], (Kind::Float, Device::Cpu));
    let mut host = TestHost::new(RandomSource::Seeded(1))
        .with(keys::INPUT, &tiny)
        .with(keys::TARGET, &labels);
    let err = host.fire(&mut small, Event::AFTER_DATALOADER).unwrap_err();
    assert!(err.contains("width 0"), "{err}");
    // resize_targets with class-index targets: nothing to resize.
    let mut targets =
        boxed_method::<ProgressiveResizing>(&settings(r#"{"resize_targets": true}"#)).unwrap();
    let images = Tensor::zeros([2, 1, 16, 16], (Kind::Float, Device::Cpu));
    let mut host = TestHost::new(RandomSource::Seeded(1))
        .with(keys::INPUT, &images)
        .with(keys::TARGET, &labels);
    let err = host
        .fire(&mut targets, Event::AFTER_DATALOADER)
        .unwrap_err();
    assert!(err.contains("at least 3 dimensions"), "{err}");
}
