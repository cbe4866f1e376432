//! AugMix against Composer's golden outputs (`tests/golden/augmix.*`).
//!
//! Everything is read from the JSON and safetensors files: the input images and, per seeded
//! `AugmentAndMixTransform` run and image, the full numpy trace (Dirichlet, Beta, chain depths,
//! ops and the primitives' draws), each chain's image, the weights as float32 and the output.
//! The recorded draws are replayed through the crate (each call's kind and arguments checked):
//! the weights, every chain and the output must be equal, byte for byte.

use augmentation_primitives::pillow::Image;
use augmentation_primitives::replay::{differences, image, Replay};
use augmentation_primitives::{augmentation_set, to_image, to_sample};
use augmix::{augmix_chains, augmix_image, augmix_mix, AugMix, AugMixSettings, Chains};
use serde_json::Value;
use tessera_plugin_api::abi::SampleShape;
use tessera_plugin_api::testing::golden::{parse_params, Golden};
use tessera_plugin_api::testing::{apply_sample_transform, settings, RandomSource};
use tessera_plugin_api::{boxed_method, ErrorKind, Sample};

const CASE: &str = "augmix";

/// A recorded run's settings and the prefix of its tensors' names.
fn runs(g: &Golden) -> Vec<(AugMixSettings, String, Value)> {
    let prefixes: Vec<String> = g
        .names_with_role("aux")
        .into_iter()
        .chain(g.names_with_role("output"))
        .filter_map(|n| n.split_once("/image=").map(|(p, _)| p.to_owned()))
        .collect();
    let runs = g.json["results"]["transforms"]
        .as_array()
        .expect("transforms");
    assert!(!runs.is_empty());
    runs.iter()
        .map(|r| {
            let set_name = r["augmentation_set"].as_str().expect("set");
            let s = AugMixSettings {
                severity: r["severity"].as_f64().expect("severity"),
                depth: r["depth"].as_i64().expect("depth"),
                width: r["width"].as_u64().expect("width") as usize,
                alpha: r["alpha"].as_f64().expect("alpha"),
                set: augmentation_set(set_name).expect("a known set"),
            };
            let prefix = prefixes
                .iter()
                .find(|p| {
                    let k = parse_params(p);
                    k["severity"].parse::<f64>().ok() == Some(s.severity)
                        && k["depth"].parse::<i64>().ok() == Some(s.depth)
                        && k["width"].parse::<usize>().ok() == Some(s.width)
                        && k["alpha"].parse::<f64>().ok() == Some(s.alpha)
                        && k["set"] == set_name
                })
                .unwrap_or_else(|| panic!("no tensors for run {r}"))
                .clone();
            (s, prefix, r["trace"].clone())
        })
        .collect()
}

/// The chain images of `name` (width, H, W, C) as [`Image`]s.
fn chain_images(g: &Golden, name: &str) -> Vec<Image> {
    let t = g.tensor(name);
    (0..t.size()[0]).map(|i| image(&t.get(i))).collect()
}

#[test]
fn the_seeded_runs_replay_exactly() {
    let g = Golden::load(CASE);
    for (s, prefix, trace) in runs(&g) {
        for t in trace.as_array().expect("trace") {
            let index = t["image"].as_u64().expect("image");
            let what = format!("{prefix}/image={index}");
            let img = image(g.tensor(&format!("image/{index}")));
            let mut replay = Replay::new(&t["numpy_calls"], &s.set, what.clone());
            let chains = augmix_chains(&img, &s, &mut replay).unwrap();
            replay.finish();
            let want_weights =
                Vec::<f32>::try_from(g.tensor(&format!("{what}/chain_weights"))).unwrap();
            assert_eq!(chains.weights, want_weights, "{what}: chain weights");
            let want_m = f32::try_from(g.tensor(&format!("{what}/mixing_weight"))).unwrap();
            assert_eq!(chains.mixing, want_m, "{what}: mixing weight");
            let want_chains = chain_images(&g, &format!("{what}/chains"));
            assert_eq!(chains.images.len(), s.width);
            for (i, (got, want)) in chains.images.iter().zip(&want_chains).enumerate() {
                assert_eq!(differences(got, want), (0, 0), "{what}: chain {i}");
            }
            let want = image(g.tensor(&format!("{what}/output")));
            let out = augmix_mix(&img, &chains);
            assert_eq!(differences(&out, &want), (0, 0), "{what}: output");
            // Composer's mix of its own chains, and the whole transform fed the same draws.
            let given = Chains {
                images: want_chains.clone(),
                ..chains
            };
            assert_eq!(
                augmix_mix(&img, &given),
                want,
                "{what}: mix of the golden chains"
            );
            let mut replay = Replay::new(&t["numpy_calls"], &s.set, what.clone());
            let whole = augmix_image(&img, &s, &mut replay).unwrap();
            assert_eq!(differences(&whole, &want), (0, 0), "{what}");
            replay.finish();
            // The invariant: each pixel between (min − 1) and max of the original and chains.
            for (k, &v) in want.data.iter().enumerate() {
                let values = want_chains.iter().map(|c| c.data[k]).chain([img.data[k]]);
                let (lo, hi) = values.fold((255u8, 0u8), |(l, h), x| (l.min(x), h.max(x)));
                assert!(
                    v + 1 >= lo && v <= hi,
                    "{what}: pixel {k} = {v} outside [{lo} − 1, {hi}]"
                );
            }
        }
    }
}

fn method(json: &str) -> tessera_plugin_api::abi::MethodBox {
    boxed_method::<AugMix>(&settings(json)).unwrap()
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
        assert_eq!(to_sample(&to_image(o)), *o);
    }
    // Small alpha: a near-one-hot Dirichlet and a Beta near 0 or 1, still finite weights.
    let grey = Sample {
        channels: 1,
        height: 8,
        width: 8,
        data: (0..64).map(|k| (k * 4) as f32 / 255.0).collect(),
    };
    let m = method(r#"{"alpha": 0.01, "width": 4, "depth": 2}"#);
    for seed in 0..20 {
        let o = apply_sample_transform(&m, &grey, &mut RandomSource::Seeded(seed)).unwrap();
        assert_eq!(o.shape(), grey.shape());
        assert_eq!(to_sample(&to_image(&o)), o);
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
    let err = transform.output_shape(shape(4)).into_result().unwrap_err();
    assert!(err.message.contains("4 channels"), "{}", err.message);
}

#[test]
fn bad_settings_are_refused_naming_the_key() {
    for (json, key) in [
        (r#"{"severity": 10.5}"#, "severity"),
        (r#"{"width": 0}"#, "width"),
        (r#"{"width": -2}"#, "width"),
        (r#"{"alpha": 0}"#, "alpha"),
        (r#"{"depth": 1.5}"#, "depth"),
        (r#"{"augmentation_set": "none"}"#, "augmentation_set"),
        (r#"{"mixing": 3}"#, "mixing"),
    ] {
        let err = match boxed_method::<AugMix>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{json}");
        assert!(err.message().contains(key), "{json}: {}", err.message());
    }
}
