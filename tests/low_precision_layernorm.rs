//! The low_precision_layernorm plugin through the real binary: the mlp with `norm = "layer"` on
//! Fashion-MNIST. Under `amp_bf16` its two layer norms run in bf16 and training changes; under
//! fp32 the method warns and changes nothing; a killed and resumed run equals the straight
//! run. In-process: the bf16 branch under the host's own CPU autocast stays in bf16.

use low_precision_layernorm::{low_precision_layer_norm, METRIC_NUM_LAYERS};
use serde_json::Value;
use tch::{Device, Kind, Tensor};
use tessera::precision::{AutocastGuard, Precision};
use tessera_tests::resume::assert_killed_and_resumed_is_exact;
use tessera_tests::*;

fn mlp(label: &str, precision: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"mlp\"\nhidden = [64, 32]\nnorm = \"layer\"".to_owned();
    toml.precision = Some(precision.to_owned());
    toml
}

fn run(label: &str, precision: &str, with_method: bool) -> (Vec<Value>, Output) {
    let dir = TempDir::new(label);
    let mut toml = mlp(label, precision);
    if with_method {
        toml = toml.algorithm("low_precision_layernorm", "");
    }
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    (read_jsonl(&run_dir(&dir, label).join("metrics.jsonl")), out)
}

#[test]
fn under_amp_bf16_the_layer_norms_run_in_bf16() {
    let (plain, _) = run("lpln-plain", "amp_bf16", false);
    let (lp, out) = run("lpln-bf16", "amp_bf16", true);
    assert_eq!(
        method_metric(&lp, METRIC_NUM_LAYERS),
        [(0, 2.0)],
        "{}",
        out.dump()
    );
    let (p, l) = (train_losses(&plain), train_losses(&lp));
    assert_eq!(p.len(), 3);
    assert!(l.iter().all(|v| v.is_finite()), "{l:?}");
    assert_ne!(p, l, "bf16 layer norms changed nothing");
}

#[test]
fn under_fp32_it_warns_and_changes_nothing() {
    let (plain, _) = run("lpln-fp32-plain", "fp32", false);
    let (lp, out) = run("lpln-fp32", "fp32", true);
    assert!(
        out.stderr
            .contains("low_precision_layernorm only applies with a mixed precision"),
        "{}",
        out.dump()
    );
    assert_eq!(method_metric(&lp, METRIC_NUM_LAYERS), [(0, 0.0)]);
    assert_eq!(train_losses(&plain), train_losses(&lp));
}

#[test]
fn the_bf16_branch_stays_bf16_under_the_hosts_cpu_autocast() {
    let x = Tensor::randn([4, 16], (Kind::Float, Device::Cpu));
    let w = Tensor::rand([16], (Kind::Float, Device::Cpu));
    let b = Tensor::rand([16], (Kind::Float, Device::Cpu));
    let outside =
        low_precision_layer_norm(&x, &[16], Some(&w), Some(&b), 1e-5, Some(Kind::BFloat16))
            .expect("outside autocast");
    let _autocast = AutocastGuard::new(Precision::AmpBf16, Device::Cpu);
    let inside =
        low_precision_layer_norm(&x, &[16], Some(&w), Some(&b), 1e-5, Some(Kind::BFloat16))
            .expect("under autocast");
    assert_eq!(inside.kind(), Kind::BFloat16);
    assert!(inside.equal(&outside));
}

#[test]
fn killed_and_resumed_run_equals_the_straight_run_bit_for_bit() {
    assert_killed_and_resumed_is_exact("lpln-resume", |run| {
        let mut toml = mlp(run, "amp_bf16").algorithm("low_precision_layernorm", "");
        toml.max_duration = "8ba".to_owned();
        toml
    });
}

#[test]
fn the_wrapper_follows_autocast_as_composers_gate_does() {
    use low_precision_layernorm::active_autocast_dtype;
    assert_eq!(active_autocast_dtype(Device::Cpu).expect("probe"), None);
    let _autocast = AutocastGuard::new(Precision::AmpBf16, Device::Cpu);
    assert_eq!(
        active_autocast_dtype(Device::Cpu).expect("probe"),
        Some(Kind::BFloat16)
    );
}
