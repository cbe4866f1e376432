//! Why a run could not be built, trained, evaluated or saved: [`TrainError`], typed by the module
//! that failed, with the trainer's context (the file, the config entry, the step) on top.

use crate::checkpoint::CheckpointError;
use crate::config::ConfigError;
use crate::data::DataError;
use crate::device::DeviceError;
use crate::engine::EngineError;
use crate::plugin::LoadError;
use crate::time::TimeError;

/// A run that cannot go on. Printed with its causes (`{:#}` through anyhow, or walking
/// [`std::error::Error::source`]), it reads like `context: cause: cause`.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The run itself cannot go on: a non-finite loss, a batch a method emptied, a method
    /// asking for too many passes, a checkpoint that does not fit, ...; the message says what
    /// and what to do.
    #[error("{0}")]
    Run(String),
    /// Where it happened (a file, a config entry), then why.
    #[error("{context}")]
    Context {
        /// Where, or what the trainer was doing.
        context: String,
        /// Why.
        #[source]
        source: Box<TrainError>,
    },
    /// The device is not usable.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The data cannot be fetched, read or batched.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A duration cannot be resolved for this run.
    #[error(transparent)]
    Time(#[from] TimeError),
    /// The learning-rate schedule does not fit the run.
    #[error(transparent)]
    Schedule(#[from] crate::optim::schedule::ScheduleError),
    /// A plugin cannot be loaded or refused its settings.
    #[error(transparent)]
    Plugin(#[from] LoadError),
    /// The state refused a request (a batch without `input`, a tensor on the wrong device).
    #[error(transparent)]
    State(#[from] crate::engine::CallError),
    /// A method failed at an event.
    #[error(transparent)]
    Method(#[from] EngineError),
    /// The methods' saved states do not fit this run's methods.
    #[error(transparent)]
    MethodStates(#[from] crate::engine::MethodStatesError),
    /// The optimizer's saved state does not fit.
    #[error(transparent)]
    Optimizer(#[from] crate::optim::OptimizerStateError),
    /// A checkpoint cannot be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A model cannot be exported (`tessera export`).
    #[error(transparent)]
    Export(#[from] crate::export::ExportError),
    /// A configuration (a checkpoint's, for `tessera eval`) cannot be read.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// libtorch refused an operation.
    #[error(transparent)]
    Tensor(#[from] tch::TchError),
    /// A record cannot be serialized.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A file cannot be read or written (the context names it).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A configuration cannot be written back as TOML.
    #[error(transparent)]
    Toml(#[from] toml::ser::Error),
    /// The data-parallel group failed: joining it, or a collective (another rank failed).
    #[error(transparent)]
    Dist(#[from] crate::dist::DistError),
    /// Sharded training failed: laying out the parameters, or a collective.
    #[error(transparent)]
    Shard(#[from] crate::dist::shard::ShardError),
    /// Pretrained weights (`[model] init_weights`) cannot be read or do not fit.
    #[error(transparent)]
    InitWeights(#[from] crate::model::InitWeightsError),
}

/// The trainer's results.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// Adds where an error happened, as `anyhow::Context` does, keeping the error's type.
pub(crate) trait Context<T> {
    /// Wraps the error with `context`.
    fn context(self, context: &str) -> Result<T>;
    /// Wraps the error with the context `f` makes (only on error).
    fn with_context(self, f: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<TrainError>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: &str) -> Result<T> {
        self.with_context(|| context.to_owned())
    }
    fn with_context(self, f: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| TrainError::Context {
            context: f(),
            source: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, message: &str) -> Result<T> {
        self.ok_or_else(|| TrainError::Run(message.to_owned()))
    }
    fn with_context(self, f: impl FnOnce() -> String) -> Result<T> {
        self.ok_or_else(|| TrainError::Run(f()))
    }
}

/// Returns a [`TrainError::Run`] with a formatted message.
macro_rules! fail {
    ($($arg:tt)*) => {
        return Err($crate::trainer::TrainError::Run(format!($($arg)*)))
    };
}
pub(crate) use fail;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_reads_like_a_chain_without_repeating_the_cause() {
        let inner: std::result::Result<(), tch::TchError> =
            Err(tch::TchError::Torch("bad kind".into()));
        let e = inner.context("building the model").unwrap_err();
        assert_eq!(e.to_string(), "building the model");
        let cause = std::error::Error::source(&e).expect("a cause");
        assert!(cause.to_string().contains("bad kind"), "{cause}");
        let chained = crate::with_causes(&e);
        assert!(chained.starts_with("building the model: "), "{chained}");
        assert_eq!(chained.matches("bad kind").count(), 1, "{chained}");
        let none: Option<u8> = None;
        assert_eq!(
            none.context("no input").unwrap_err().to_string(),
            "no input"
        );
    }
}
