//! # Writing a Tessera plugin
//!
//! A Tessera plugin is a speed-up method (label smoothing, CutOut, BlurPool, ...) compiled as a
//! `cdylib` that the unmodified `tessera` binary loads at run time. You write it against this
//! crate alone:
//!
//! 1. implement [`Method`] (what happens at each event) and [`Plugin`] (name, hooks, settings);
//! 2. call [`export_plugin!`] once;
//! 3. `cargo build --release`, copy `target/release/lib<name>.so` into a plugins folder;
//! 4. list it in `trainer.toml`:
//!
//! ```toml
//! [plugins]
//! dirs = ["plugins"]
//!
//! [[algorithms]]
//! plugin = "scale_input"
//! factor = 0.5
//! ```
//!
//! ## A complete plugin
//!
//! ```no_run
//! use tessera_plugin_api::{export_plugin, keys, Context, Error, Event, Hook, Method, Plugin};
//!
//! /// Multiplies every training input by a constant.
//! pub struct ScaleInput {
//!     factor: f64,
//! }
//!
//! impl Method for ScaleInput {
//!     fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
//!         let input = ctx.tensor(keys::INPUT).ok_or("the batch has no `input`")?;
//!         ctx.set_tensor(keys::INPUT, input.f_mul_scalar(self.factor)?)
//!     }
//! }
//!
//! impl Plugin for ScaleInput {
//!     const NAME: &'static str = "scale_input";
//!     const VERSION: &'static str = env!("CARGO_PKG_VERSION");
//!     const DESCRIPTION: &'static str = "multiplies training inputs by a constant";
//!     const DEFAULT_SETTINGS: &'static str = "factor = 1.0";
//!
//!     fn hooks() -> Vec<Hook> {
//!         vec![Hook::at(Event::AFTER_DATALOADER)]
//!     }
//!
//!     fn create(settings: &Settings) -> Result<Self, Error> {
//!         Ok(ScaleInput { factor: settings.f64("factor")? })
//!     }
//! }
//! # use tessera_plugin_api::Settings;
//!
//! export_plugin!(ScaleInput);
//! ```
//!
//! with this `Cargo.toml`:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib", "rlib"]
//!
//! [dependencies]
//! tessera-plugin-api = "1.11"
//! tch = "=0.26.0"
//! ```
//!
//! ## Rules
//! - **Tensors** come to you as owned `tch::Tensor`s that share storage with the host's
//!   ([`Context::tensor`], named by the constants in [`keys`]); give a new one back with
//!   [`Context::set_tensor`]. Autograd works across the boundary: host and plugin share one
//!   libtorch. Across the ABI a tensor travels as an owned [`abi::TensorHandle`]; whoever holds
//!   one frees its tensor by dropping it, so the safe layer needs no `unsafe` to receive one.
//! - **libtorch**: a plugin must be built against exactly the host's libtorch version (the host
//!   checks and refuses a mismatch). Use the same `LIBTORCH` you built `tessera` with.
//! - **Errors, not panics**: return [`Error`]; prefer tch's `f_` methods, which return errors.
//!   A panic is caught at the boundary and stops the run with a message naming the plugin and the
//!   event, but a panicking method is not called again.
//! - **Randomness** comes from the host ([`Context::rng_u64`]) so a seed fixes the whole run.
//! - **Ordering**: at each event methods run by descending [`Hook::priority`], then in
//!   `trainer.toml` order, reversed at `after_*` events.
//! - **Times** in settings (`"100ba"`, `"2ep"`, `"0.5dur"`) are read with [`Time::parse`], the
//!   host's own grammar, and compared with the clock by [`Time::reached`].
//!
//! ## Versions
//! - **1.0**: events, batch tensors, random numbers, metrics, logging.
//! - **1.1** (appended to the host's function table): batch keys and whole-batch replacement,
//!   the model's forward and loss, module tree and surgery, parameters, the learning rate, extra
//!   passes, method state in checkpoints.
//! - **1.2** (no change to the ABI's layout): the batch key constants ([`keys`]), time strings
//!   ([`time`]), and [`abi::TensorHandle`] freeing its tensor when dropped; the golden-file
//!   helpers of the `testing` feature (`testing::golden`).
//! - **1.3** (appended): evaluation results and stopping the run ([`Context::eval_results`],
//!   [`Context::request_stop`]); per-sample transforms run on the host's loader threads
//!   ([`Method::sample_transform`], [`SampleTransform`]); Beta draws and permutations from the
//!   host's stream ([`random`], [`Context::rng_beta`], [`Context::rng_permutation`]) and
//!   Composer's one-hot targets ([`targets`]).
//! - **1.4** (appended to the module and wrapper objects): what `tessera export` writes for a
//!   plugin's module ([`Module::export`]) or wrapper ([`Wrapper::export`]): kept as it is, or
//!   folded back into the plain module (weight standardization, Ghost BatchNorm, stochastic
//!   depth's evaluation scaling); [`ModuleInfo::attr`] and [`ModuleInfo::int_attr`] read a
//!   module's attributes (no ABI change); the run's precision ([`Context::precision`],
//!   appended to the host's function table).
//! - **1.5** (appended to the host's function table): the process's place in a data-parallel
//!   run ([`Context::ranks`], [`RankInfo`]); rank 0 of 1 in an older host.
//! - **1.6** (appended to the host's function table and the sample transform object):
//!   optimizer methods ([`Context::claim_parameters`], the `optimizer_step` event, step
//!   information, [`keys::FOUND_INF`]), parameter groups, training samples at `init`, the
//!   evaluation forward, and where a per-sample transform's sample is.
//! - **1.7** (appended to the module object): [`Module::forward_masked`], the forward of a
//!   batch with an attention mask ([`keys::ATTENTION_MASK`]); a module of an older plugin gets
//!   [`Module::forward`].
//! - **1.8** (no change to the ABI's layout): [`device::upload`], a host-made tensor (a
//!   permutation, a mask) to the device without a blocking copy; [`targets::ensure_one_hot`]
//!   no longer reads the targets on the host.
//! - **1.9** (appended to the host's function table): [`Context::all_gather`], a collective
//!   over the ranks, for a method that shares its work between them (Muon's orthogonalisation
//!   by matrix).
//! - **1.10** (appended to the host's function table): this rank's slices of the model's
//!   tensors under `[distributed] sharding` ([`Context::parameter_slice`],
//!   [`Context::gather_slices`], [`ParameterSlice`], [`SliceLayout`]), for a method that keeps a copy of the
//!   weights (EMA, SWA, Lookahead) to keep only its slice; whole tensors in an older host.
//! - **1.11** (no change to the ABI): the plugin [`kit`] — one surgery trait for the host's
//!   context and a test stand-in ([`kit::SurgeryModel`], [`kit::StandIn`]), module-tree walks,
//!   [`kit::ConvSpec`], [`kit::default_init`], and checkpoint state helpers
//!   ([`kit::StateReader`], [`kit::json_state`]); [`random::splitmix64`] outside `testing`.
#![warn(missing_docs)]

pub mod abi;
mod context;
pub mod device;
mod error;
pub mod kit;
mod method;
mod module;
mod plugin;
pub mod random;
mod sample;
mod settings;
mod slices;
pub mod targets;
#[cfg(feature = "testing")]
pub mod testing;
pub mod time;
mod wrap;

pub use abi_stable;
pub use context::Context;
pub use error::Error;
pub use method::{Method, State};
pub use module::Module;
pub use plugin::{boxed_method, Plugin};
#[doc(hidden)]
pub use plugin::{install_quiet_panic_hook, root_module};

pub(crate) use error::host_result;
pub(crate) use module::{export_answer, module_box, named_tensors};
pub(crate) use plugin::guard;
pub use sample::{Sample, SampleRandom, SampleTransform};
pub use settings::Settings;
pub use slices::{gather_for_save, ParameterSlice, SliceLayout, SlicedCopies};
pub use tch;
pub use wrap::{Inner, Wrapper};

pub use abi::{Attribute, EvalResults, Metric, ModuleInfo, ParamInfo};
pub use abi::{ErrorKind, Event, Hook, RankInfo, TimeInfo};
pub use abi::{ParamGroup, SamplePlace, StepInfo};
pub use time::{Time, TimeError, TimeUnit};

/// The version of this interface crate; plugins report it and the host checks it.
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The names of the tensors the host shares at events (plugin-api 1.2): use them with
/// [`Context::tensor`], [`Context::set_tensor`] and [`Context::set_batch`] instead of spelling
/// the strings.
pub mod keys {
    /// The batch's model input (images: `(N, C, H, W)`); a batch entry.
    pub const INPUT: &str = "input";
    /// The batch's labels (class indices `(N)` or probabilities `(N, C)`); a batch entry.
    pub const TARGET: &str = "target";
    /// The model's output for the current microbatch, set from `after_forward` on.
    pub const OUTPUT: &str = "output";
    /// The training loss of the current microbatch (a floating scalar), set from `after_loss`
    /// on.
    pub const LOSS: &str = "loss";
    /// At `optimizer_step` (plugin-api 1.6): a 0-dim float32 tensor on the training device
    /// holding 1 when the host skipped its own update of this step (a non-finite loss, or
    /// overflowed gradients under `amp_fp16`), else 0. A method updating claimed parameters
    /// skips its update too (read it on the device, e.g. as a mask, to keep the step free of
    /// host reads). Absent when the host never skips.
    pub const FOUND_INF: &str = "found_inf";
    /// The batch's attention mask of token inputs `(N, T)`, int64: 1 where a token is, 0 at
    /// padding; a batch entry of text datasets that pad (labelled text, BERT). Transformer
    /// attention ignores the padded keys. Absent: every position is a token.
    pub const ATTENTION_MASK: &str = "attention_mask";
    /// The batch's token type ids `(N, T)`, int64: 0 on a sentence pair's first text (with
    /// `[CLS]` and its `[SEP]`) and on padding, 1 on the second; a batch entry of labelled text
    /// read as sentence pairs (`data.text.pair_field`). BERT's embeddings add the token-type
    /// embedding of these ids. Absent: every token is of type 0.
    pub const TOKEN_TYPE_IDS: &str = "token_type_ids";
}

/// The libtorch version this crate (and so the plugin or host using it) was compiled against.
pub const LIBTORCH_VERSION: &str = env!("TESSERA_LIBTORCH_VERSION");

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::std_types::RVec;

    #[test]
    fn module_attributes_are_read_by_key() {
        let info = ModuleInfo {
            path: "layer1.0.conv1".into(),
            kind: "conv2d".into(),
            attrs: vec![
                Attribute {
                    key: "stride".into(),
                    value: 2.0,
                },
                Attribute {
                    key: "eps".into(),
                    value: 1e-5,
                },
            ]
            .into(),
            params: RVec::new(),
        };
        assert_eq!(info.attr("eps"), Some(1e-5));
        assert_eq!(info.attr("groups"), None);
        assert_eq!(info.int_attr("stride", None).ok(), Some(2));
        assert_eq!(info.int_attr("groups", Some(1)).ok(), Some(1));
        let e = info.int_attr("groups", None).unwrap_err().to_string();
        assert!(e.contains("conv2d `layer1.0.conv1` has no `groups`"), "{e}");
        let e = info.int_attr("eps", None).unwrap_err().to_string();
        assert!(e.contains("`eps` = 0.00001 is not an integer"), "{e}");
    }

    #[test]
    fn export_symbol_matches_abi_stable() {
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }

    #[test]
    fn events_round_trip_by_name() {
        // Composer's 40 events and Tessera's `optimizer_step` (1.6).
        assert_eq!(Event::ALL.len(), 41);
        assert_eq!(Event::OPTIMIZER_STEP.name(), "optimizer_step");
        for (i, e) in Event::ALL.iter().enumerate() {
            assert_eq!(e.0 as usize, i);
            assert_eq!(Event::from_name(e.name()), Some(*e));
        }
        assert!(Event::AFTER_LOSS.is_after());
        assert!(!Event::EVAL_AFTER_ALL.is_after());
        assert!(!Event::BATCH_END.is_after());
    }

    #[test]
    fn panics_become_errors() {
        let err = guard::<()>(|| panic!("boom")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PANIC);
        assert_eq!(err.message(), "boom");
    }
}
