//! The low_precision_layernorm and low_precision_groupnorm plugins through the real binary, on
//! Fashion-MNIST: the mlp with `norm = "layer"` and the cnn with `norm = "group"`. Under
//! `amp_bf16` their two norms run in bf16 and training changes; under fp32 the method warns and
//! changes nothing; a killed and resumed run equals the straight run. In-process: the bf16
//! branch under the host's own CPU autocast stays in bf16, and the wrapper's autocast probe
//! follows the host's autocast.
//!
//! Its kill -9 resume is a row of the method table (tests/methods/table.rs).

use low_precision_norms::{
    active_autocast_dtype, low_precision_group_norm, low_precision_layer_norm,
};
use serde_json::Value;
use tch::{Device, Kind, Tensor};
use tessera::precision::{AutocastGuard, Precision};
use tessera_tests::*;

/// (plugin, `[model]` with two norms of its kind).
const CASES: [(&str, &str); 2] = [
    (
        "low_precision_layernorm",
        "name = \"mlp\"\nhidden = [64, 32]\nnorm = \"layer\"",
    ),
    (
        "low_precision_groupnorm",
        "name = \"cnn\"\nwidth = 8\nnorm = \"group\"",
    ),
];

fn toml(label: &str, model: &str, precision: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = model.to_owned();
    toml.precision = Some(precision.to_owned());
    toml
}

fn run(label: &str, model: &str, precision: &str, plugin: Option<&str>) -> (Vec<Value>, Output) {
    let dir = TempDir::new(label);
    let mut toml = toml(label, model, precision);
    if let Some(p) = plugin {
        toml = toml.algorithm(p, "");
    }
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    (read_jsonl(&run_dir(&dir, label).join("metrics.jsonl")), out)
}

#[test]
fn under_amp_bf16_the_norms_run_in_bf16() {
    for (plugin, model) in CASES {
        let (plain, _) = run(&format!("{plugin}-plain"), model, "amp_bf16", None);
        let (lp, out) = run(&format!("{plugin}-bf16"), model, "amp_bf16", Some(plugin));
        let metric = format!("{plugin}/num_layers");
        assert_eq!(method_metric(&lp, &metric), [(0, 2.0)], "{}", out.dump());
        let (p, l) = (train_losses(&plain), train_losses(&lp));
        assert_eq!(p.len(), 3);
        assert!(l.iter().all(|v| v.is_finite()), "{plugin}: {l:?}");
        assert_ne!(p, l, "{plugin}: bf16 norms changed nothing");
    }
}

#[test]
fn under_fp32_they_warn_and_change_nothing() {
    for (plugin, model) in CASES {
        let (plain, _) = run(&format!("{plugin}-fp32-plain"), model, "fp32", None);
        let (lp, out) = run(&format!("{plugin}-fp32"), model, "fp32", Some(plugin));
        assert!(
            out.stderr
                .contains(&format!("{plugin} only applies with a mixed precision")),
            "{}",
            out.dump()
        );
        assert_eq!(
            method_metric(&lp, &format!("{plugin}/num_layers")),
            [(0, 0.0)]
        );
        assert_eq!(train_losses(&plain), train_losses(&lp), "{plugin}");
    }
}

#[test]
fn the_bf16_branch_stays_bf16_under_the_hosts_cpu_autocast() {
    let x = Tensor::randn([2, 8, 4, 4], (Kind::Float, Device::Cpu));
    let w = Tensor::rand([8], (Kind::Float, Device::Cpu));
    let b = Tensor::rand([8], (Kind::Float, Device::Cpu));
    let bf16 = Some(Kind::BFloat16);
    let norms = |x: &Tensor| {
        let flat = x.view([2, -1]).narrow(1, 0, 8);
        (
            low_precision_layer_norm(&flat, &[8], Some(&w), Some(&b), 1e-5, bf16).expect("ln"),
            low_precision_group_norm(x, 4, Some(&w), Some(&b), 1e-5, bf16).expect("gn"),
        )
    };
    let outside = norms(&x);
    assert_eq!(active_autocast_dtype(Device::Cpu).expect("probe"), None);
    let _autocast = AutocastGuard::new(Precision::AmpBf16, Device::Cpu);
    assert_eq!(active_autocast_dtype(Device::Cpu).expect("probe"), bf16);
    let inside = norms(&x);
    for (a, b) in [(&inside.0, &outside.0), (&inside.1, &outside.1)] {
        assert_eq!(a.kind(), Kind::BFloat16);
        assert!(a.equal(b));
    }
}
