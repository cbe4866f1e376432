//! LayerFreezing against Composer's golden case (`tests/golden/layer_freezing.*`): Composer's
//! test model (`conv` Conv2d, `bn` BatchNorm2d, `relu`, `block` = two Linear, `fc1`, `head`) as a
//! stand-in module tree with the host's conventions (depth first, BatchNorm's running statistics
//! as buffers), on which the crate's `freeze_layers` runs for every (start, level, duration) of
//! `results.runs`. The layers in order, the depth, the percentage, the frozen layers and the
//! parameters left in the optimizer must be Composer's, in the JSON and, bit for bit, in the
//! `table` tensor.

use serde_json::Value;
use tessera_plugin_api::kit::{StandIn, SurgeryModel};
use tessera_plugin_api::tch::{kind::FLOAT_CPU, Tensor};
use tessera_plugin_api::testing::golden::Golden;

use layer_freezing::{freeze_layers, layers};

const CASE: &str = "layer_freezing";

/// The module tree and tensors of the golden model, all parameters trainable (BatchNorm's
/// running statistics are buffers).
fn golden_model() -> StandIn {
    let param = || Tensor::zeros([1], FLOAT_CPU).set_requires_grad(true);
    let buffer = || Tensor::zeros([1], FLOAT_CPU);
    let wb = || vec![("weight", param()), ("bias", param())];
    StandIn::new(0)
        .module("", "sequential", &[], vec![])
        .module("conv", "conv2d", &[], wb())
        .module(
            "bn",
            "batch_norm2d",
            &[],
            vec![
                ("weight", param()),
                ("bias", param()),
                ("running_mean", buffer()),
                ("running_var", buffer()),
                ("num_batches_tracked", buffer()),
            ],
        )
        .module("relu", "relu", &[], vec![])
        .module("block", "sequential", &[], vec![])
        .module("block.0", "linear", &[], wb())
        .module("block.1", "linear", &[], wb())
        .module("fc1", "linear", &[], wb())
        .module("head", "linear", &[], wb())
}

fn trainable(model: &StandIn) -> usize {
    model
        .parameters()
        .unwrap()
        .iter()
        .filter(|p| p.trainable)
        .count()
}

/// The layers all of whose parameters are frozen, in order.
fn frozen_layers(model: &StandIn) -> Vec<String> {
    layers(&model.modules().unwrap(), &model.parameters().unwrap())
        .into_iter()
        .filter(|l| l.params.iter().all(|name| !model.trainable(name)))
        .map(|l| l.path)
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect()
}

fn number(run: &Value, key: &str) -> f64 {
    run[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} in {run}"))
}

#[test]
fn the_layers_are_composers_leaves_in_order() {
    let g = Golden::load(CASE);
    let model = golden_model();
    let got: Vec<String> = layers(&model.modules().unwrap(), &model.parameters().unwrap())
        .into_iter()
        .map(|l| l.path)
        .collect();
    assert_eq!(got, strings(&g.json["results"]["leaves_in_order"]));
    assert_eq!(
        trainable(&model) as u64,
        g.json["results"]["total_params"].as_u64().expect("total")
    );
}

#[test]
fn every_run_freezes_what_composer_froze() {
    let g = Golden::load(CASE);
    let runs = g.json["results"]["runs"].as_array().expect("runs");
    let table = g.tensor("table");
    assert_eq!(table.size(), [runs.len() as i64, 6]);
    for (row, run) in runs.iter().enumerate() {
        let (start, level, t) = (
            number(run, "freeze_start"),
            number(run, "freeze_level"),
            number(run, "current_duration"),
        );
        let mut model = golden_model();
        let done = freeze_layers(&mut model, t, start, level).expect("freezing");
        let what = format!("start {start}, level {level}, t {t}");
        assert_eq!(done.depth as f64, number(run, "freeze_depth"), "{what}");
        // serde_json (without `float_roundtrip`) may read a decimal an ulp off: the JSON to
        // within 1e-15, the `table` tensor below bit for bit.
        let json_percentage = number(run, "freeze_percentage");
        assert!(
            (done.percentage - json_percentage).abs() <= 1e-15,
            "{what}: {} vs {json_percentage}",
            done.percentage
        );
        assert_eq!(
            frozen_layers(&model),
            strings(&run["frozen_leaves"]),
            "{what}"
        );
        assert_eq!(
            trainable(&model) as f64,
            number(run, "params_left_in_optimizer"),
            "{what}"
        );
        let got = [
            start,
            level,
            t,
            done.depth as f64,
            done.percentage,
            trainable(&model) as f64,
        ];
        for (column, value) in got.iter().enumerate() {
            let want = table.double_value(&[row as i64, column as i64]);
            assert_eq!(*value, want, "table row {row} column {column} ({what})");
        }
        // Freezing again at the same time changes nothing; the buffers were never touched.
        let again = freeze_layers(&mut model, t, start, level).expect("again");
        assert!(again.newly_frozen.is_empty(), "{what}");
        assert!(model
            .parameters()
            .unwrap()
            .iter()
            .filter(|p| p.buffer)
            .all(|p| !p.trainable));
    }
}
