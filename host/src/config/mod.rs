//! `trainer.toml`: the trainer's configuration file.
//!
//! [`load`] reads the file, applies `--set key=value` overrides, checks it
//! against the schema (every table rejects unknown keys), resolves relative
//! paths against the file's folder, fills defaults and validates ranges.
//! Every [`ConfigError`] names the file, the dotted key and the line and
//! column (or the `--set` argument) of the offending text, and says what is
//! allowed:
//!
//! ```text
//! trainer.toml:12:6: optimizer.lr: must be > 0, got -0.1
//! trainer.toml: --set train.max_duration=3dur: train.max_duration: unit "dur" is not allowed here; use "ep", "ba", "sp", "tok" or "iter"
//! ```
//!
//! Config sits on top of the domain modules: each table is read into the type of the module
//! that uses it (`optim::Rule`, `data::Transforms`, `model::ModelConfig`, ...), which
//! holds the defaults. One file per table; `section!` names each key once.
//! `docs/trainer-reference.toml` documents every key.

mod algorithms;
mod checkpoint;
mod data;
mod de;
mod distributed;
mod error;
mod logging;
mod model;
mod optimizer;
mod reader;
mod recipe;
mod recorded;
mod scheduler;
mod section;
mod sweep;
mod syntax;
mod train;
mod tree;

#[cfg(test)]
mod data_tests;
#[cfg(test)]
mod file_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod syntax_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_cuda;
#[cfg(test)]
mod tests_optim;
#[cfg(test)]
mod text_tests;
#[cfg(test)]
mod train_tests;
#[cfg(test)]
mod values_tests;

pub use crate::plugin::PluginsConfig;
pub use algorithms::AlgorithmConfig;
pub use checkpoint::{CheckpointConfig, KeepBest};
pub use data::DataConfig;
pub use distributed::DistributedConfig;
pub use error::{ConfigError, ErrorKind, Location};
pub use logging::LoggingConfig;
pub use recipe::{load_recipe, load_with_recipe, recipe_from_str, Recipe};
pub use recorded::{from_recorded, recorded_toml};
pub use sweep::{load_sweep, Axis, AxisValue, SweepSpec};
pub use train::{MicrobatchSize, TrainConfig};

use crate::model::ModelConfig;
use crate::optim::{schedule::Schedule, OptimizerConfig};
use crate::report::Metric;
use reader::{Bounds, Tbl};
use section::{section, Section};
use serde::Serialize;
use std::path::{Path, PathBuf};
use tree::{Node, SourceMap};

/// The resolved configuration of one training run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    /// Name of the run; the run folder is `output_dir/run_name`. Defaults to the file stem.
    pub run_name: String,
    /// Global random seed (default 42).
    pub seed: u64,
    /// Folder holding run folders, resolved against the file's folder (default `runs`).
    pub output_dir: PathBuf,
    /// The recipe's name: a label for the set of methods, which `tessera explore` and sweeps
    /// group and label runs by. Default: the methods' names joined by `+`, or `baseline`
    /// without methods (see [`Config::recipe_label`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipe: Option<String>,
    /// Price of the machine in USD per hour, for the cost estimate: `usd_per_hour`, or the
    /// price of `instance`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usd_per_hour: Option<f64>,
    /// The instance preset (`aws/p4d.24xlarge`, see [`crate::cost::Instances`]) that set
    /// `usd_per_hour`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// `[data]`
    pub data: DataConfig,
    /// `[model]`
    pub model: ModelConfig,
    /// `[optimizer]` (default SGD, no groups, fused).
    pub optimizer: OptimizerConfig,
    /// `[scheduler]` (default `{ name = "constant" }`).
    pub scheduler: Schedule,
    /// `[train]`
    pub train: TrainConfig,
    /// `[plugins]`
    pub plugins: PluginsConfig,
    /// `[[algorithms]]`, in file order.
    pub algorithms: Vec<AlgorithmConfig>,
    /// `[checkpoint]`
    pub checkpoint: CheckpointConfig,
    /// `[distributed]`: data-parallel settings, used when the run has several ranks.
    pub distributed: DistributedConfig,
    /// `[logging]`: experiment tracking (an MLflow server).
    pub logging: LoggingConfig,
}

section!(Config {
    run_name,
    seed: u64(),
    recipe: string(),
    output_dir,
    usd_per_hour: float(Bounds::NON_NEGATIVE),
    instance,
    data,
    model,
    optimizer,
    scheduler,
    train,
    plugins,
    algorithms,
    checkpoint,
    distributed,
    logging,
});

impl Config {
    /// The run folder: `output_dir/run_name`.
    pub fn run_dir(&self) -> PathBuf {
        self.output_dir.join(&self.run_name)
    }

    /// `recipe` when given, else the methods' names joined by `+` in file order, else
    /// `baseline`.
    pub fn recipe_label(&self) -> String {
        if let Some(name) = &self.recipe {
            return name.clone();
        }
        if self.algorithms.is_empty() {
            return "baseline".to_owned();
        }
        self.algorithms
            .iter()
            .map(|a| a.plugin.as_str())
            .collect::<Vec<_>>()
            .join("+")
    }

    /// The evaluation metrics the run acts on besides those it reports: the target's, the
    /// `reduce_on_plateau` schedule's and `checkpoint.keep_best`'s (each is computed at every
    /// evaluation).
    pub fn watched_metrics(&self) -> Vec<Metric> {
        let monitor = self.scheduler.monitor().and_then(Metric::from_name);
        let best = self.checkpoint.keep_best.map(|b| b.metric);
        let target = self.train.target.map(|t| t.metric);
        target.into_iter().chain(monitor).chain(best).collect()
    }
}

/// Reads `path`, applies `--set key=value` overrides in order and returns the
/// validated configuration. Relative paths resolve against the file's folder;
/// `run_name` defaults to the file stem.
pub fn load(path: &Path, overrides: &[String]) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let text = read_text(path, &file)?;
    let base = path.parent().unwrap_or_else(|| Path::new(""));
    from_str_with_overrides(&text, base, &file, overrides)
}

/// The text of a configuration file (`file` names it in the error).
fn read_text(path: &Path, file: &str) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            file,
            Location::Unknown,
            "",
            ErrorKind::Io,
            format!("cannot read the configuration file: {e}"),
        )
    })
}

/// Parses configuration text as if read from `source_name` in `base_dir`.
pub fn from_str(text: &str, base_dir: &Path, source_name: &str) -> Result<Config, ConfigError> {
    from_str_with_overrides(text, base_dir, source_name, &[])
}

/// [`from_str`] with `--set key=value` overrides applied in order.
pub fn from_str_with_overrides(
    text: &str,
    base_dir: &Path,
    source_name: &str,
    overrides: &[String],
) -> Result<Config, ConfigError> {
    let map = SourceMap::new(text);
    let doc = toml_edit::ImDocument::parse(text)
        .map_err(|e| syntax::syntax_error(&e, &map, source_name))?;
    let mut root = tree::from_document(&doc, &map);
    for arg in overrides {
        tree::apply_override(&mut root, arg, source_name)?;
    }
    let stem = Path::new(source_name)
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("run");
    build(&root, base_dir, source_name, stem)
}

fn build(root: &Node, base: &Path, file: &str, stem: &str) -> Result<Config, ConfigError> {
    let top = Tbl::open(file, base, "", root, Some(Config::KEYS))?;

    let run_name = match top.string("run_name")? {
        Some(name) => {
            if name.is_empty()
                || name == "."
                || name == ".."
                || name.contains(['/', '\\'])
                || name.chars().any(char::is_control)
            {
                return Err(top.err(
                    "run_name",
                    ErrorKind::InvalidValue,
                    format!("{name:?} is not a folder name; use a non-empty name without / or \\"),
                ));
            }
            name
        }
        None => stem.to_string(),
    };
    let output_dir = top.path("output_dir")?.unwrap_or_else(|| base.join("runs"));

    let data = data::read(&top)?;
    let model = model::read(&top, &data)?;
    let optimizer = optimizer::read(&top)?;
    let scheduler = scheduler::read(&top, &data)?;
    let train = train::read(&top, &data)?;
    let mut plugins = top
        .section("plugins", PluginsConfig::default)?
        .unwrap_or_default();
    plugins.beside = Some(base.join("plugins")).filter(|p| p.is_dir());
    let algorithms = algorithms::read(&top)?;
    let checkpoint = checkpoint::read(&top, &output_dir.join(&run_name), &data)?;
    let distributed = distributed::read(&top)?;
    let logging = logging::read(&top)?;

    Config {
        run_name,
        seed: 42,
        output_dir,
        recipe: None,
        usd_per_hour: None,
        instance: None,
        data,
        model,
        optimizer,
        scheduler,
        train,
        plugins,
        algorithms,
        checkpoint,
        distributed,
        logging,
    }
    .read_keys(&top)?
    .with_instance_price(&top)
}

impl Config {
    /// Reads `instance` and, when given, sets `usd_per_hour` to its price (giving both is
    /// refused: which one is meant?).
    fn with_instance_price(mut self, top: &Tbl<'_>) -> Result<Config, ConfigError> {
        let Some(id) = top.string("instance")? else {
            return Ok(self);
        };
        if self.usd_per_hour.is_some() {
            return Err(top.err(
                "instance",
                ErrorKind::InvalidValue,
                "give either `instance` or `usd_per_hour`, not both (the instance sets the price)",
            ));
        }
        let presets = crate::cost::Instances::load()
            .map_err(|e| top.err("instance", ErrorKind::InvalidValue, e.to_string()))?;
        let preset = presets
            .find(&id)
            .map_err(|message| top.err("instance", ErrorKind::InvalidValue, message))?;
        self.usd_per_hour = Some(preset.usd_per_hour);
        self.instance = Some(id);
        Ok(self)
    }
}

/// A required sub-table of the top level.
fn required_table<'a>(
    top: &Tbl<'a>,
    key: &str,
    allowed: &[&str],
    what: &str,
) -> Result<Tbl<'a>, ConfigError> {
    top.sub(key, Some(allowed))?.ok_or_else(|| {
        ConfigError::new(
            top.file,
            Location::Unknown,
            key,
            ErrorKind::MissingKey,
            format!("missing required table [{key}]; it needs at least {what}"),
        )
    })
}
