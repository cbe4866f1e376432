//! `tessera generate`: text from a trained causal language model (docs/generate.md).
//!
//! The model comes from a run's checkpoint, rebuilt with its methods, or from a Hugging Face
//! folder ([`source`]); prompts are encoded with its tokenizer ([`text`]); each next token is
//! chosen greedily or drawn ([`sample`]); the decoding loop ([`decode`]) runs the prompts in
//! batches, left-padded, feeding each step's new tokens only through the layers'
//! [`forward_cached`](crate::model::Layer::forward_cached) with a
//! [`KvCache`](crate::model::layers::KvCache), or recomputing whole sequences when a module on
//! the way cannot decode incrementally.

mod decode;
pub mod sample;
pub mod source;
pub mod text;

pub use decode::{generate, Completion, Event, Finish, Report};
pub use sample::Sampling;
pub use source::LanguageModel;
pub use text::{parse_ids, read_prompts, Prompt};

/// Why generation could not run. The message names the option, file or prompt involved.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// A setting, a prompt or a source that cannot be used; the message says which and why.
    #[error("{0}")]
    Invalid(String),
    /// The run cannot be rebuilt from its checkpoint.
    #[error(transparent)]
    Run(#[from] crate::trainer::TrainError),
    /// The run's tokenizer cannot be read.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// The device is not usable.
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    /// A folder's weights cannot be read or do not fit its config.
    #[error(transparent)]
    Weights(#[from] crate::model::InitWeightsError),
    /// libtorch refused an operation (a prompt longer than the context, ...).
    #[error(transparent)]
    Tensor(#[from] tch::TchError),
}

/// How to generate.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tokens to generate per prompt at most.
    pub max_new_tokens: usize,
    /// How each next token is chosen.
    pub sampling: Sampling,
    /// The seed of the draws (each prompt has its own stream of it).
    pub seed: u64,
    /// Strings that end a sequence when its generated text contains one (cut off there).
    pub stop: Vec<String>,
    /// Prompts decoded together at most.
    pub batch_size: usize,
    /// Whether to decode incrementally with a kv cache (else every step recomputes whole
    /// sequences; for comparisons).
    pub kv_cache: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_new_tokens: 64,
            sampling: Sampling::default(),
            seed: 0,
            stop: Vec::new(),
            batch_size: 8,
            kv_cache: true,
        }
    }
}

impl Settings {
    /// Checks the settings; errors name the option.
    pub fn validate(&self) -> Result<(), GenerateError> {
        self.sampling.validate()?;
        if self.max_new_tokens == 0 {
            return Err(GenerateError::Invalid(
                "--max-new-tokens must be at least 1".to_owned(),
            ));
        }
        if self.batch_size == 0 {
            return Err(GenerateError::Invalid(
                "--batch-size must be at least 1".to_owned(),
            ));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(GenerateError::Invalid(
                "--stop takes a non-empty string".to_owned(),
            ));
        }
        Ok(())
    }
}
