//! The stochastic_depth plugin through the real binary (plugin-api 1.3's `wrap_module`, the
//! wrapper calling the block's own layers through the host): ResNet-50 (width 4) on
//! Fashion-MNIST, its 16 bottleneck blocks wrapped; block and sample modes change training;
//! the warmup ramps the logged drop rate; a killed and resumed run equals the straight run.
//!
//! Its kill -9 resume is a row of the method table (tests/methods/table.rs).

use serde_json::Value;
use tessera_tests::*;

fn resnet50(label: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"resnet50\"\nwidth = 4".to_owned();
    toml.device = Some("cpu".to_owned());
    toml
}

fn run(label: &str, settings: Option<&str>) -> (Vec<Value>, Output) {
    let dir = TempDir::new(label);
    let mut toml = resnet50(label);
    if let Some(s) = settings {
        toml = toml.algorithm("stochastic_depth", s);
    }
    toml.write_to(&dir);
    let out = train(&dir, &[], &[]);
    out.assert_success();
    (read_jsonl(&run_dir(&dir, label).join("metrics.jsonl")), out)
}

#[test]
fn both_modes_wrap_the_sixteen_bottlenecks_and_change_training() {
    let (plain, _) = run("sd-plain", None);
    let (block, _) = run("sd-block", Some("drop_rate = 0.9"));
    let (sample, _) = run(
        "sd-sample",
        Some("stochastic_method = \"sample\"\ndrop_rate = 0.9"),
    );
    for lines in [&block, &sample] {
        assert_eq!(
            method_metric(lines, "stochastic_depth/num_stochastic_layers"),
            [(0, 16.0)]
        );
    }
    let (p, b, s) = (
        train_losses(&plain),
        train_losses(&block),
        train_losses(&sample),
    );
    assert_eq!(p.len(), 3);
    assert_ne!(p, b, "block mode changed nothing");
    assert_ne!(p, s, "sample mode changed nothing");
    assert_ne!(b, s);
}

#[test]
fn the_warmup_ramps_the_drop_rate() {
    // 3 batches, warmup over the whole run: 0, 1/3 and 2/3 of the rate at batch starts.
    let (lines, _) = run("sd-warmup", Some("drop_rate = 0.6\ndrop_warmup = 1.0"));
    let rates: Vec<f64> = method_metric(&lines, "stochastic_depth/drop_rate")
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(rates.len(), 3, "{rates:?}");
    for (got, want) in rates.iter().zip([0.0, 0.2, 0.4]) {
        assert!((got - want).abs() < 1e-12, "{rates:?}");
    }
}
