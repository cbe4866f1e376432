//! LayerFreezing against Composer's golden case (`tests/golden/layer_freezing.*`): Composer's
//! test model (`conv` Conv2d, `bn` BatchNorm2d, `relu`, `block` = two Linear, `fc1`, `head`) as a
//! stand-in module tree with the host's conventions (depth first, BatchNorm's running statistics
//! as buffers), on which the crate's `freeze_layers` runs for every (start, level, duration) of
//! `results.runs`. The layers in order, the depth, the percentage, the frozen layers and the
//! parameters left in the optimizer must be Composer's, in the JSON and, bit for bit, in the
//! `table` tensor.

use serde_json::Value;
use tessera_plugin_api::abi::{ModuleInfo, ParamInfo};
use tessera_plugin_api::testing::golden::Golden;
use tessera_plugin_api::Error;

use layer_freezing::{freeze_layers, layers, Model};

const CASE: &str = "layer_freezing";

/// The module tree and tensors of the golden model, all parameters trainable.
struct FakeModel {
    modules: Vec<ModuleInfo>,
    params: Vec<ParamInfo>,
}

fn module(path: &str, kind: &str, tensors: &[&str]) -> ModuleInfo {
    ModuleInfo {
        path: path.into(),
        kind: kind.into(),
        attrs: Default::default(),
        params: tensors
            .iter()
            .map(|t| format!("{path}.{t}").into())
            .collect(),
    }
}

fn golden_model() -> FakeModel {
    let wb: &[&str] = &["weight", "bias"];
    let modules = vec![
        module("", "sequential", &[]),
        module("conv", "conv2d", wb),
        module(
            "bn",
            "batch_norm2d",
            &[
                "weight",
                "bias",
                "running_mean",
                "running_var",
                "num_batches_tracked",
            ],
        ),
        module("relu", "relu", &[]),
        module("block", "sequential", &[]),
        module("block.0", "linear", wb),
        module("block.1", "linear", wb),
        module("fc1", "linear", wb),
        module("head", "linear", wb),
    ];
    let params = modules
        .iter()
        .flat_map(|m| m.params.iter())
        .map(|name| {
            let buffer = name.contains("running_") || name.contains("num_batches");
            ParamInfo {
                name: name.clone(),
                shape: Default::default(),
                buffer,
                trainable: !buffer,
            }
        })
        .collect();
    FakeModel { modules, params }
}

impl Model for FakeModel {
    fn modules(&self) -> Result<Vec<ModuleInfo>, Error> {
        Ok(self.modules.clone())
    }

    fn parameters(&self) -> Result<Vec<ParamInfo>, Error> {
        Ok(self.params.clone())
    }

    fn set_trainable(&mut self, name: &str, trainable: bool) -> Result<(), Error> {
        let p = self
            .params
            .iter_mut()
            .find(|p| p.name.as_str() == name && !p.buffer)
            .ok_or_else(|| Error::from(format!("no parameter `{name}`")))?;
        p.trainable = trainable;
        Ok(())
    }
}

impl FakeModel {
    fn trainable(&self) -> usize {
        self.params.iter().filter(|p| p.trainable).count()
    }

    /// The layers all of whose parameters are frozen, in order.
    fn frozen_layers(&self) -> Vec<String> {
        layers(&self.modules, &self.params)
            .into_iter()
            .filter(|l| {
                l.params.iter().all(|name| {
                    self.params
                        .iter()
                        .any(|p| p.name.as_str() == name && !p.trainable)
                })
            })
            .map(|l| l.path)
            .collect()
    }
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
    let got: Vec<String> = layers(&model.modules, &model.params)
        .into_iter()
        .map(|l| l.path)
        .collect();
    assert_eq!(got, strings(&g.json["results"]["leaves_in_order"]));
    assert_eq!(
        model.trainable() as u64,
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
            model.frozen_layers(),
            strings(&run["frozen_leaves"]),
            "{what}"
        );
        assert_eq!(
            model.trainable() as f64,
            number(run, "params_left_in_optimizer"),
            "{what}"
        );
        let got = [
            start,
            level,
            t,
            done.depth as f64,
            done.percentage,
            model.trainable() as f64,
        ];
        for (column, value) in got.iter().enumerate() {
            let want = table.double_value(&[row as i64, column as i64]);
            assert_eq!(*value, want, "table row {row} column {column} ({what})");
        }
        // Freezing again at the same time changes nothing; the buffers were never touched.
        let again = freeze_layers(&mut model, t, start, level).expect("again");
        assert!(again.newly_frozen.is_empty(), "{what}");
        assert!(model
            .params
            .iter()
            .filter(|p| p.buffer)
            .all(|p| !p.trainable));
    }
}
