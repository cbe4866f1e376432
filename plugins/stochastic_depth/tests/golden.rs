//! Stochastic depth against Composer's outputs (`tests/golden/stochastic_depth.*`): the drop
//! rate schedules of torchvision's ResNet-50, and a net of two bottleneck blocks in evaluation
//! (block and sample), in training with every block kept or dropped, and in sample mode with
//! the recorded masks. The blocks are computed here from the recorded weights with the same
//! libtorch ops the host's layers use; `stochastic_bottleneck` composes them.

use std::collections::HashMap;

use stochastic_depth::{
    drop_rates, sample_mask, stochastic_bottleneck, targets, Decision, Distribution, Part,
    StochasticDepth,
};
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::settings;
use tessera_plugin_api::{boxed_method, Attribute, Error, ErrorKind, ModuleInfo};

const CASE: &str = "stochastic_depth";

#[test]
fn resnet50_schedules_match() {
    let g = Golden::load(CASE);
    for (name, dist) in [
        ("linear", Distribution::Linear),
        ("uniform", Distribution::Uniform),
    ] {
        let want: Vec<f32> =
            Vec::try_from(g.tensor(&format!("resnet50_drop_rates/{name}"))).unwrap();
        let got = drop_rates(want.len(), 0.2, dist);
        assert_eq!(got, want, "{name}");
    }
    let small: Vec<f64> =
        serde_json::from_value(g.json["results"]["small_block_drop_rates"].clone()).unwrap();
    let got: Vec<f64> = drop_rates(small.len(), 0.5, Distribution::Linear)
        .into_iter()
        .map(f64::from)
        .collect();
    assert_eq!(got, small);
}

/// The small net's recorded tensors of block `b`, fresh copies.
fn params(g: &Golden, b: usize) -> HashMap<String, Tensor> {
    let prefix = format!("small/param/{b}.");
    g.entries()
        .keys()
        .filter_map(|k| {
            k.strip_prefix(&prefix)
                .map(|rest| (k.clone(), rest.to_owned()))
        })
        .map(|(k, rest)| (rest, g.tensor(&k).copy()))
        .collect()
}

fn conv(p: &HashMap<String, Tensor>, name: &str, x: &Tensor, stride: i64) -> Tensor {
    let w = &p[&format!("{name}.weight")];
    let pad = w.size()[2] / 2;
    x.conv2d(w, None::<&Tensor>, [stride, stride], [pad, pad], [1, 1], 1)
}

fn bn(p: &HashMap<String, Tensor>, name: &str, x: &Tensor, train: bool) -> Tensor {
    let t = |f: &str| &p[&format!("{name}.{f}")];
    Tensor::batch_norm(
        x,
        Some(t("weight")),
        Some(t("bias")),
        Some(t("running_mean")),
        Some(t("running_var")),
        train,
        0.1,
        1e-5,
        true,
    )
}

/// The net (two blocks; the first has stride 2 and a projection) under `decisions`.
fn net(g: &Golden, train: bool, rates: &[f32], decisions: &[Option<Decision>]) -> Tensor {
    let mut x = g.tensor("small/input").copy();
    for (b, decision) in decisions.iter().enumerate() {
        let p = params(g, b);
        let stride = if b == 0 { 2 } else { 1 };
        let mut branch = |x: &Tensor| -> Result<Tensor, Error> {
            let y = bn(&p, "bn1", &conv(&p, "conv1", x, 1), train).relu();
            let y = bn(&p, "bn2", &conv(&p, "conv2", &y, stride), train).relu();
            Ok(bn(&p, "bn3", &conv(&p, "conv3", &y, 1), train))
        };
        let mut down = |x: &Tensor| -> Result<Tensor, Error> {
            Ok(bn(
                &p,
                "downsample.1",
                &conv(&p, "downsample.0", x, stride),
                train,
            ))
        };
        let downsample: Option<Part<'_>> = if p.contains_key("downsample.0.weight") {
            Some(&mut down)
        } else {
            None
        };
        x = stochastic_bottleneck(
            &x,
            train,
            rates[b],
            decision.as_ref(),
            &mut branch,
            downsample,
        )
        .unwrap();
    }
    x
}

#[test]
fn the_small_net_matches_in_every_recorded_mode() {
    let g = Golden::load(CASE);
    let rates = drop_rates(2, 0.5, Distribution::Linear);
    let none = [None, None];
    for mode in ["block", "sample"] {
        let key = format!("small/{mode}/eval_out");
        assert_close(
            &key,
            &net(&g, false, &rates, &none),
            g.tensor(&key),
            1e-5,
            1e-5,
        );
    }
    let kept = [Some(Decision::Keep(true)), Some(Decision::Keep(true))];
    let key = "small/block/train_all_kept";
    assert_close(
        key,
        &net(&g, true, &rates, &kept),
        g.tensor(key),
        1e-5,
        1e-5,
    );
    let dropped = [Some(Decision::Keep(false)), Some(Decision::Keep(false))];
    let key = "small/block/train_all_dropped";
    assert_close(
        key,
        &net(&g, true, &rates, &dropped),
        g.tensor(key),
        1e-5,
        1e-5,
    );
    // Sample mode with the masks Composer drew (blocks x N).
    let masks = g.tensor("small/sample/train_masks_seed9");
    let decisions = [
        Some(Decision::Mask(masks.get(0))),
        Some(Decision::Mask(masks.get(1))),
    ];
    let key = "small/sample/train_out_seed9";
    assert_close(
        key,
        &net(&g, true, &rates, &decisions),
        g.tensor(key),
        1e-5,
        1e-5,
    );
    // The dropped and kept runs differ: the test can tell the decisions apart.
    assert!(!net(&g, true, &rates, &kept).allclose(
        &net(&g, true, &rates, &dropped),
        1e-3,
        1e-3,
        false
    ));
}

#[test]
fn sample_masks_are_floor_of_keep_plus_uniform() {
    let g = Golden::load(CASE);
    let mask: Vec<f32> = Vec::try_from(g.tensor("sample_drop/mask_p0.25_seed11")).unwrap();
    assert!(mask.iter().all(|&m| m == 0.0 || m == 1.0), "{mask:?}");
    // floor(0.75 + u): u below 0.25 drops, at or above keeps.
    assert_eq!(
        sample_mask(0.25, &[0.0, 0.2499, 0.25, 0.9]),
        [0.0, 0.0, 1.0, 1.0]
    );
    let input = g.tensor("sample_drop/input");
    let n = input.size()[0];
    let m = Tensor::from_slice(&mask).view([n, 1, 1, 1]);
    assert_close(
        "sample_drop/out",
        &(input * m),
        g.tensor("sample_drop/out_p0.25_seed11"),
        0.0,
        0.0,
    );
}

fn module(path: &str, kind: &str) -> ModuleInfo {
    ModuleInfo {
        path: path.into(),
        kind: kind.into(),
        attrs: Vec::<Attribute>::new().into(),
        params: Vec::new().into(),
    }
}

#[test]
fn surgery_finds_bottlenecks_and_their_projections() {
    let modules = vec![
        module("", "sequential"),
        module("layer1.0", "bottleneck_block"),
        module("layer1.0.downsample", "sequential"),
        module("layer1.1", "bottleneck_block"),
        module("layer2.0.conv1", "conv2d"),
    ];
    assert_eq!(
        targets(&modules),
        [
            ("layer1.0".to_owned(), true),
            ("layer1.1".to_owned(), false)
        ]
    );
}

#[test]
fn settings_are_checked() {
    assert!(boxed_method::<StochasticDepth>(&settings("{}")).is_ok());
    for (bad, needle) in [
        (
            r#"{"target_layer_name": "BasicBlock"}"#,
            "`target_layer_name`",
        ),
        (r#"{"stochastic_method": "row"}"#, "`stochastic_method`"),
        (r#"{"drop_rate": 1.5}"#, "`drop_rate`"),
        (r#"{"drop_distribution": "cubic"}"#, "`drop_distribution`"),
        (r#"{"drop_warmup": "3ep"}"#, "`drop_warmup`"),
        (
            r#"{"stochastic_method": "sample", "drop_warmup": 0.1}"#,
            "can not be used",
        ),
        (r#"{"droprate": 0.1}"#, "droprate"),
    ] {
        let err = match boxed_method::<StochasticDepth>(&settings(bad)) {
            Ok(_) => panic!("{bad} accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{bad}: {err}");
        assert!(err.to_string().contains(needle), "{bad}: {err}");
    }
    assert!(boxed_method::<StochasticDepth>(&settings(r#"{"drop_warmup": "0.1dur"}"#)).is_ok());
}
