//! Ghost batch norm against Composer's own outputs (`tests/golden/ghost_batchnorm.*`), read
//! generically: every case `<name>` with `<name>/input` and `<name>/init/*` tensors, its ghost
//! batch size in the name (`..._ghost=4`), its chunk sizes in `results`.

use ghost_batchnorm::{
    apply_ghost_batchnorm, chunk_sizes, ghost_batch_norm, targets, BatchNormTensors,
    GhostBatchNorm, KIND,
};
use tessera_plugin_api::kit::{StandIn, SurgeryModel};
use tessera_plugin_api::tch::kind::{FLOAT_CPU, INT64_CPU};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::settings;
use tessera_plugin_api::{boxed_method, Attribute, ErrorKind, ModuleInfo, Plugin};

const CASE: &str = "ghost_batchnorm";

/// `(name, ghost batch size)` of every case with an input.
fn cases(g: &Golden) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = g
        .entries()
        .keys()
        .filter_map(|k| k.strip_suffix("/input"))
        .map(|name| {
            let ghost = name
                .split('_')
                .find_map(|part| part.strip_prefix("ghost="))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("case `{name}` names no ghost=N"));
            (name.to_owned(), ghost)
        })
        .collect();
    out.sort();
    assert!(out.len() >= 2, "too few cases: {out:?}");
    out
}

fn bn_from(g: &Golden, name: &str) -> BatchNormTensors {
    let t = |field: &str| g.tensor(&format!("{name}/init/{field}")).copy();
    BatchNormTensors {
        weight: t("weight"),
        bias: t("bias"),
        running_mean: t("running_mean"),
        running_var: t("running_var"),
        num_batches_tracked: t("num_batches_tracked"),
        // Composer's BatchNorm defaults, as the host's batch norm reports them.
        momentum: 0.1,
        eps: 1e-5,
    }
}

#[test]
fn chunk_sizes_follow_torch_chunk() {
    let g = Golden::load(CASE);
    let results = g.json["results"].as_object().expect("results");
    let mut checked = 0;
    for (key, value) in results {
        let Some(case) = key.strip_suffix("_chunk_sizes") else {
            continue;
        };
        let n: i64 = case
            .split('_')
            .find_map(|p| p.strip_prefix("N="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key}: no N="));
        let ghost: i64 = case
            .split('_')
            .find_map(|p| p.strip_prefix("ghost="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key}: no ghost="));
        let want: Vec<i64> = serde_json::from_value(value.clone()).expect("sizes");
        assert_eq!(chunk_sizes(n, ghost).unwrap(), want, "{key}");
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} chunk-size results");
    // Composer's error for a batch smaller than a ghost batch.
    let message = results["batch_smaller_than_ghost"]
        .as_str()
        .expect("message");
    let err = chunk_sizes(8, 16).unwrap_err();
    assert!(message.ends_with(&err), "{message} vs {err}");
}

#[test]
fn training_and_evaluation_match_composer() {
    let g = Golden::load(CASE);
    for (name, ghost) in cases(&g) {
        let input = g.tensor(&format!("{name}/input"));
        let bn = bn_from(&g, &name);
        let out = ghost_batch_norm(input, &bn, ghost).unwrap();
        assert_close(
            &format!("{name}/train_out"),
            &out,
            g.tensor(&format!("{name}/train_out")),
            1e-5,
            1e-6,
        );
        for field in ["weight", "bias", "running_mean", "running_var"] {
            let key = format!("{name}/after_train/{field}");
            let got = match field {
                "weight" => &bn.weight,
                "bias" => &bn.bias,
                "running_mean" => &bn.running_mean,
                _ => &bn.running_var,
            };
            assert_close(&key, got, g.tensor(&key), 1e-5, 1e-7);
        }
        let key = format!("{name}/after_train/num_batches_tracked");
        assert_eq!(
            bn.num_batches_tracked.int64_value(&[]),
            g.tensor(&key).int64_value(&[]),
            "{key}"
        );
        // Evaluation is the plain batch norm with the updated running statistics.
        let eval = Tensor::batch_norm(
            input,
            Some(&bn.weight),
            Some(&bn.bias),
            Some(&bn.running_mean),
            Some(&bn.running_var),
            false,
            0.1,
            1e-5,
            true,
        );
        let key = format!("{name}/eval_out");
        assert_close(&key, &eval, g.tensor(&key), 1e-5, 1e-6);
        // And differs from plain batch norm over the whole batch when there are chunks.
        let plain = g.tensor(&format!("{name}/plain_bn_train_out"));
        let chunked = chunk_sizes(input.size()[0], ghost).unwrap().len() > 1;
        let same = (&out - plain).abs().max().double_value(&[]) < 1e-6;
        assert_eq!(same, !chunked, "{name}: chunked {chunked}");
        assert_eq!(out.kind(), Kind::Float);
    }
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
fn surgery_targets_every_batch_norm_once() {
    let before = vec![
        module("", "sequential"),
        module("conv1", "conv2d"),
        module("bn1", "batch_norm2d"),
        module("layer1.0.bn2", "batch_norm2d"),
    ];
    assert_eq!(targets(&before), ["bn1", "layer1.0.bn2"]);
    // After the surgery the wrapped batch norms sit under their wrappers: none is targeted.
    let after = vec![
        module("", "sequential"),
        module("bn1", "ghost_batch_norm2d"),
        module("bn1.batchnorm", "batch_norm2d"),
        module("layer1.0.bn2", "ghost_batch_norm2d"),
        module("layer1.0.bn2.batchnorm", "batch_norm2d"),
    ];
    assert!(targets(&after).is_empty(), "{:?}", targets(&after));
}

#[test]
fn the_surgery_wraps_each_batch_norm_once_over_its_own_tensors() {
    let bn = || {
        let p = || Tensor::ones([4], FLOAT_CPU).set_requires_grad(true);
        let b = || Tensor::zeros([4], FLOAT_CPU);
        vec![
            ("weight", p()),
            ("bias", p()),
            ("running_mean", b()),
            ("running_var", b()),
            ("num_batches_tracked", Tensor::zeros([], INT64_CPU)),
        ]
    };
    let mut model = StandIn::new(1)
        .module("", "sequential", &[], vec![])
        .module("conv1", "conv2d", &[], vec![])
        .module("bn1", "batch_norm2d", &[], bn())
        .module("layer1", "sequential", &[], vec![])
        .module("layer1.bn2", "batch_norm2d", &[], bn());
    let mean = model.tensor("bn1.running_mean").unwrap().shallow_clone();
    let wrapped = apply_ghost_batchnorm(&mut model, 8).unwrap();
    assert_eq!(wrapped, ["bn1", "layer1.bn2"]);
    for path in ["bn1", "layer1.bn2"] {
        assert_eq!(model.kind(path), Some(KIND));
        assert_eq!(
            model.info(path).unwrap().attr("ghost_batch_size"),
            Some(8.0)
        );
        let inner = format!("{path}.batchnorm");
        assert_eq!(model.kind(&inner), Some("batch_norm2d"));
        assert!(model.wrapper(path).is_some());
    }
    assert_eq!(model.kind("conv1"), Some("conv2d"));
    // The batch norms' tensors moved below their wrappers, buffers still buffers, the same
    // storage.
    let names: Vec<String> = model.tensors().keys().cloned().collect();
    let leaves = [
        "bias",
        "num_batches_tracked",
        "running_mean",
        "running_var",
        "weight",
    ];
    let want: Vec<String> = ["bn1", "layer1.bn2"]
        .iter()
        .flat_map(|p| leaves.iter().map(move |l| format!("{p}.batchnorm.{l}")))
        .collect();
    assert_eq!(names, want);
    let buffers: Vec<String> = model
        .parameters()
        .unwrap()
        .into_iter()
        .filter(|p| p.buffer)
        .map(|p| p.name.to_string())
        .collect();
    assert_eq!(buffers.len(), 6, "{buffers:?}");
    assert!(model.trainable("bn1.batchnorm.weight"));
    let moved = model.tensor("bn1.batchnorm.running_mean").unwrap();
    assert_eq!(moved.data_ptr(), mean.data_ptr());
    // A second application changes nothing.
    let before = model.modules().unwrap();
    assert!(apply_ghost_batchnorm(&mut model, 8).unwrap().is_empty());
    assert_eq!(model.modules().unwrap(), before);
    let after: Vec<String> = model.tensors().keys().cloned().collect();
    assert_eq!(after, names);
}

#[test]
fn settings_are_checked() {
    assert!(boxed_method::<GhostBatchNorm>(&settings("{}")).is_ok());
    for (bad, needle) in [
        (r#"{"ghost_batch_size": 0}"#, "`ghost_batch_size`"),
        (r#"{"ghost_batch_size": 1.5}"#, "ghost_batch_size"),
        (r#"{"ghost_size": 8}"#, "ghost_size"),
    ] {
        let err = match boxed_method::<GhostBatchNorm>(&settings(bad)) {
            Ok(_) => panic!("{bad} accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{bad}: {err}");
        assert!(err.to_string().contains(needle), "{bad}: {err}");
    }
    assert_eq!(GhostBatchNorm::NAME, "ghost_batchnorm");
}
