//! The host's ResNet-20 with one method, in process and through the binary: the set-up that
//! tests/methods/channels_last.rs and tests/methods/weight_standardization.rs share (`#[path]`
//! module).

use tessera::config;
use tessera::model::Model;
use tessera::trainer::Trainer;
use tessera_plugin_api::tch::Device;
use tessera_tests::*;

/// A 2-batch run `run_name` of ResNet-20 (width 8) on 16 synthetic 3x16x16 images, SGD with
/// momentum, a checkpoint at the end; `algorithms` is appended (its `[[algorithms]]` lines).
pub fn synthetic_toml(run_name: &str, algorithms: &str) -> String {
    format!(
        r#"run_name = "{run_name}"
seed = 5
output_dir = "runs"
[data]
dataset = "synthetic"
batch_size = 8
eval_batch_size = 8
workers = 0
[data.synthetic]
samples = 16
eval_samples = 8
channels = 3
height = 16
width = 16
classes = 10
[model]
name = "resnet20"
width = 8
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
[train]
max_duration = "2ba"
progress = false
[checkpoint]
interval = "2ba"
[plugins]
dirs = [{dirs}]
{algorithms}"#,
        dirs = toml_string(&target_dir().display().to_string()),
    )
}

/// An in-process trainer for `text` in `dir` (`init` ran: the methods' surgery is in its model).
pub fn trainer(dir: &TempDir, text: &str) -> Trainer {
    let cfg = config::from_str(text, dir.path(), "trainer.toml").expect("the test's trainer.toml");
    Trainer::new(cfg, Vec::new()).expect("the trainer")
}

/// `batches` batches of ResNet-20 (width 4) on Fashion-MNIST on the CPU, with `plugin` and
/// its settings when given.
pub fn fashion(label: &str, batches: u32, plugin: Option<(&str, &str)>) -> TrainerToml {
    let mut toml = TrainerToml::new(label);
    toml.model = "name = \"resnet20\"\nwidth = 4".to_owned();
    toml.device = Some("cpu".to_owned());
    toml.max_duration = format!("{batches}ba");
    if let Some((plugin, settings)) = plugin {
        toml = toml.algorithm(plugin, settings);
    }
    toml
}

/// Trains `toml` through the binary; returns its training losses, its method metric
/// `metric`, and its model as built (before any method) in process from the same
/// configuration.
pub fn run_and_build(toml: &TrainerToml, metric: &str) -> (Vec<f64>, Vec<(u64, f64)>, Model) {
    let dir = TempDir::new(&toml.run_name);
    let path = toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let lines = read_jsonl(&run_dir(&dir, &toml.run_name).join("metrics.jsonl"));
    let cfg = config::from_str(&toml.render(), dir.path(), &path.display().to_string())
        .expect("the test's trainer.toml");
    let model = Model::build(
        &cfg.model,
        cfg.data.input_shape(),
        cfg.model.num_classes as i64,
        Device::Cpu,
    )
    .expect("the model");
    (train_losses(&lines), method_metric(&lines, metric), model)
}
