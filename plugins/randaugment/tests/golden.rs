//! RandAugment against Composer's golden outputs (`tests/golden/randaugment.*`).
//!
//! Everything is read from the JSON and safetensors files: the input images, the magnitude
//! table, every primitive at every recorded severity with the numpy draws Composer was forced
//! to make and the Pillow calls it made, and three seeded `RandAugmentTransform` runs with their
//! full draw trace. The recorded draws are replayed through the crate's `Draws` (each call's kind
//! and arguments checked), the Pillow parameters compared, and the output bytes must be equal.

use augmentation_primitives::pillow::{rotate_matrix, Image};
use augmentation_primitives::replay::{differences, image, Replay};
use augmentation_primitives::{
    apply_op, augmentation_set, draw_op, float_parameter, int_parameter, to_image, to_sample,
    Draws, Op, Primitive,
};
use randaugment::{randaugment_image, RandAugment};
use serde_json::Value;
use tessera_plugin_api::abi::SampleShape;
use tessera_plugin_api::testing::golden::Golden;
use tessera_plugin_api::testing::{apply_sample_transform, settings, RandomSource};
use tessera_plugin_api::{boxed_method, ErrorKind, Sample};

const CASE: &str = "randaugment";

/// The Pillow calls an op makes, as the golden JSON records them.
fn pil_calls(op: &Op, width: usize, height: usize) -> Vec<(String, Vec<f64>)> {
    let one = |name: &str, v: f64| vec![(name.to_owned(), vec![v])];
    match *op {
        Op::AutoContrast => one("autocontrast", 0.0),
        Op::Equalize => vec![("equalize".to_owned(), vec![])],
        Op::Posterize { bits } => one("posterize", bits as f64),
        Op::Solarize { threshold } => one("solarize", threshold as f64),
        Op::Rotate { degrees } => {
            let mut calls = one("rotate", degrees as f64);
            if degrees != 0 {
                let m = rotate_matrix(degrees as f64, width, height);
                calls.push(("transform".to_owned(), m.to_vec()));
            }
            calls
        }
        Op::Affine(m) => vec![("transform".to_owned(), m.to_vec())],
        Op::Color(f) => one("ImageEnhance.Color.enhance", f),
        Op::Contrast(f) => one("ImageEnhance.Contrast.enhance", f),
        Op::Brightness(f) => one("ImageEnhance.Brightness.enhance", f),
        Op::Sharpness(f) => one("ImageEnhance.Sharpness.enhance", f),
    }
}

/// The recorded Pillow calls in the same form.
fn recorded_pil_calls(calls: &Value) -> Vec<(String, Vec<f64>)> {
    calls
        .as_array()
        .expect("pil_calls")
        .iter()
        .map(|c| {
            let name = c[0].as_str().expect("call name").to_owned();
            let args = &c[1];
            let values = match name.as_str() {
                "autocontrast" => vec![args["cutoff"].as_f64().expect("cutoff")],
                "equalize" => vec![],
                "posterize" => vec![args["bits"].as_f64().expect("bits")],
                "solarize" => vec![args["threshold"].as_f64().expect("threshold")],
                "rotate" => {
                    assert_eq!(args["resample"], "BILINEAR");
                    vec![args["angle"].as_f64().expect("angle")]
                }
                "transform" => {
                    assert_eq!(args["method"], "AFFINE");
                    assert_eq!(args["resample"], "BILINEAR");
                    serde_json::from_value(args["data"].clone()).expect("affine data")
                }
                _ => vec![args["factor"].as_f64().expect("factor")],
            };
            (name, values)
        })
        .collect()
}

/// Asserts that two call lists are equal: names and integer or factor arguments exactly, the
/// affine data within 1e-14 (Pillow's rotation offset `c` for -7° is one ulp away from the
/// value its own formula gives in Python, -1.8306479207435056 vs ...054; no pixel moves).
fn assert_same_calls(got: &[(String, Vec<f64>)], want: &[(String, Vec<f64>)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for ((gn, gv), (wn, wv)) in got.iter().zip(want) {
        assert_eq!(gn, wn, "{what}");
        assert_eq!(gv.len(), wv.len(), "{what}: {gn}");
        for (g, w) in gv.iter().zip(wv) {
            let ok = if gn == "transform" {
                (g - w).abs() <= 1e-14
            } else {
                g == w
            };
            assert!(ok, "{what}: {gn} {gv:?} vs {wv:?}");
        }
    }
}

#[test]
fn every_primitive_at_every_severity_matches_pillow_bytes() {
    let g = Golden::load(CASE);
    let input = image(g.tensor("image/0"));
    let records = g.json["results"]["primitives"]
        .as_array()
        .expect("primitives");
    assert_eq!(
        records.len(),
        Primitive::ALL.len() * 3,
        "17 primitives × 3 severities"
    );
    let mut failures = Vec::new();
    for r in records {
        let name = r["primitive"].as_str().expect("primitive");
        let severity = r["severity"].as_f64().expect("severity");
        let what = format!("{name} at severity {severity}");
        let primitive = Primitive::from_name(name).unwrap_or_else(|| panic!("unknown {name}"));
        let mut replay = Replay::new(&r["numpy_calls"], &[], what.clone());
        let op = draw_op(primitive, severity, input.width, input.height, &mut replay);
        replay.finish();
        assert_same_calls(
            &pil_calls(&op, input.width, input.height),
            &recorded_pil_calls(&r["pil_calls"]),
            &what,
        );
        let mut got = input.clone();
        apply_op(&mut got, &op).unwrap();
        let want = image(g.tensor(&format!("primitive/{name}/severity={severity}")));
        let (count, max) = differences(&got, &want);
        if count > 0 {
            failures.push(format!("{what}: {count} bytes differ, by up to {max}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_magnitude_table_is_composers() {
    let g = Golden::load(CASE);
    let t = g.tensor("magnitude_table");
    let rows = t.size()[0];
    for i in 0..rows {
        let row = Vec::<f64>::try_from(&t.get(i)).expect("float64 row");
        let level = row[0];
        let want = [
            level,
            (4 - int_parameter(level, 4.0)) as f64,
            int_parameter(level, 30.0) as f64,
            (256 - int_parameter(level, 256.0)) as f64,
            float_parameter(level, 0.3),
            int_parameter(level, 32.0 / 3.0) as f64,
            float_parameter(level, 1.8) + 0.1,
        ];
        assert_eq!(row, want, "magnitude table row {i} (level {level})");
    }
}

#[test]
fn the_seeded_transform_runs_replay_exactly() {
    let g = Golden::load(CASE);
    let runs = g.json["results"]["transforms"]
        .as_array()
        .expect("transforms");
    assert!(!runs.is_empty());
    for run in runs {
        let severity = run["severity"].as_f64().expect("severity");
        let depth = run["depth"].as_u64().expect("depth");
        let set_name = run["augmentation_set"].as_str().expect("set");
        let set = augmentation_set(set_name).expect("a known set");
        let listed: Vec<String> = serde_json::from_value(
            g.json["hyperparameters"]["augmentation_sets"][set_name].clone(),
        )
        .expect("the set's names");
        assert_eq!(set.iter().map(|p| p.name()).collect::<Vec<_>>(), listed);
        for trace in run["trace"].as_array().expect("trace") {
            let index = trace["image"].as_u64().expect("image index");
            let what = format!("severity={severity},depth={depth},set={set_name}/image={index}");
            let mut img = image(g.tensor(&format!("image/{index}")));
            // The draws and the Pillow calls, op by op.
            let mut replay = Replay::new(&trace["numpy_calls"], &set, what.clone());
            let mut calls = Vec::new();
            let mut ops = Vec::new();
            for _ in 0..depth {
                let p = set[replay.choice(set.len())];
                let op = draw_op(p, severity, img.width, img.height, &mut replay);
                calls.extend(pil_calls(&op, img.width, img.height));
                ops.push(p.name().to_owned());
            }
            replay.finish();
            let recorded_ops: Vec<String> =
                serde_json::from_value(trace["ops"].clone()).expect("ops");
            assert_eq!(ops, recorded_ops, "{what}");
            assert_same_calls(&calls, &recorded_pil_calls(&trace["pil_calls"]), &what);
            // The whole transform fed the same draws.
            let mut replay = Replay::new(&trace["numpy_calls"], &set, what.clone());
            randaugment_image(&mut img, severity, depth, &set, &mut replay).unwrap();
            replay.finish();
            let want = image(g.tensor(&format!("transform/{what}")));
            assert_eq!(differences(&img, &want), (0, 0), "{what}");
        }
    }
}

fn method(json: &str) -> tessera_plugin_api::abi::MethodBox {
    boxed_method::<RandAugment>(&settings(json)).unwrap()
}

#[test]
fn tesseras_draws_are_reproducible_and_stay_on_the_byte_grid() {
    let g = Golden::load(CASE);
    let sample = to_sample(&image(g.tensor("image/0")));
    let run = |json: &str, seed: u64| {
        apply_sample_transform(&method(json), &sample, &mut RandomSource::Seeded(seed)).unwrap()
    };
    let a = run("{}", 3);
    assert_eq!(a, run("{}", 3), "the same seed gives the same image");
    let outputs: Vec<Sample> = (0..8).map(|s| run("{}", s)).collect();
    assert!(
        outputs.iter().any(|o| *o != a),
        "eight seeds all gave one image"
    );
    for o in outputs.iter().chain([&a]) {
        assert_eq!(o.shape(), sample.shape());
        // Every value is k/255 exactly: the image went through the 8-bit grid.
        assert_eq!(to_sample(&to_image(o)), *o);
    }
    assert_eq!(run(r#"{"depth": 0}"#, 3), sample, "depth 0 keeps the image");
}

/// A 1-channel image is Pillow's mode "L": every primitive acts on it as on an RGB image whose
/// three channels are that image (the luma of a grey pixel is the pixel), and colour is a no-op.
#[test]
fn grey_images_behave_as_pillow_mode_l() {
    let g = Golden::load(CASE);
    let rgb = image(g.tensor("image/1"));
    let n = rgb.height * rgb.width;
    let grey = Image {
        channels: 1,
        data: rgb.data[n..2 * n].to_vec(),
        ..rgb.clone()
    };
    let grey_rgb = Image {
        channels: 3,
        data: grey.data.repeat(3),
        ..rgb
    };
    let mut seed = 11u64;
    for p in Primitive::ALL {
        for severity in [3.0, 7.0, 10.0] {
            let mut draws = RandomSource::Seeded(seed);
            seed += 1;
            let mut unit = || {
                let RandomSource::Seeded(s) = &mut draws else {
                    unreachable!()
                };
                (tessera_plugin_api::testing::splitmix64(s) >> 11) as f64 / (1u64 << 53) as f64
            };
            let mut script = Unit(&mut unit);
            let op = draw_op(p, severity, grey.width, grey.height, &mut script);
            let (mut l, mut rgb) = (grey.clone(), grey_rgb.clone());
            apply_op(&mut l, &op).unwrap();
            apply_op(&mut rgb, &op).unwrap();
            assert_eq!(
                rgb.data,
                l.data.repeat(3),
                "{} at {severity}: {op:?}",
                p.name()
            );
            if let Op::Color(_) = op {
                assert_eq!(l, grey, "color changes no grey image");
            }
        }
    }
}

/// Draws from a unit-uniform closure.
struct Unit<'a>(&'a mut dyn FnMut() -> f64);

impl Draws for Unit<'_> {
    fn choice(&mut self, n: usize) -> usize {
        ((self.0)() * n as f64) as usize
    }
    fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * (self.0)()
    }
    fn uniform_unit(&mut self) -> f64 {
        (self.0)()
    }
    fn random(&mut self) -> f64 {
        (self.0)()
    }
    fn dirichlet(&mut self, _alpha: &[f64]) -> Vec<f64> {
        unreachable!("no primitive draws a Dirichlet")
    }
    fn beta(&mut self, _a: f64, _b: f64) -> f64 {
        unreachable!("no primitive draws a Beta")
    }
    fn randint(&mut self, _low: i64, _high: i64) -> i64 {
        unreachable!("no primitive draws a randint")
    }
}

#[test]
fn only_one_or_three_channels_are_accepted() {
    let m = method("{}");
    let transform = m
        .sample_transform()
        .into_option()
        .expect("a sample transform");
    let shape = |channels| SampleShape {
        channels,
        height: 4,
        width: 4,
    };
    for c in [1, 3] {
        assert_eq!(transform.output_shape(shape(c)).unwrap(), shape(c));
    }
    let err = transform.output_shape(shape(2)).into_result().unwrap_err();
    assert!(err.message.contains("2 channels"), "{}", err.message);
}

#[test]
fn bad_settings_are_refused_naming_the_key() {
    for (json, key) in [
        (r#"{"severity": 11}"#, "severity"),
        (r#"{"severity": -1}"#, "severity"),
        (r#"{"depth": -1}"#, "depth"),
        (r#"{"depth": 1.5}"#, "depth"),
        (r#"{"augmentation_set": "some"}"#, "augmentation_set"),
        (r#"{"augmentation_set": 3}"#, "augmentation_set"),
        (r#"{"sevrity": 3}"#, "sevrity"),
    ] {
        let err = match boxed_method::<RandAugment>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{json}");
        assert!(err.message().contains(key), "{json}: {}", err.message());
    }
}
