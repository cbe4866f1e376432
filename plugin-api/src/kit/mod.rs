//! The plugin kit (plugin-api 1.11): what many methods need, written once, so that a method's
//! crate holds only its method. Nothing here crosses the ABI: it is ordinary Rust compiled into
//! the plugin, so a plugin built with the kit loads in any host of this major version.
//!
//! - [`SurgeryModel`]: a model as a surgery sees it — the module tree, its tensors, replacing
//!   and wrapping modules, freezing parameters, the seeded random stream. [`Context`] is one at
//!   `init`; [`StandIn`] is one in a unit test, so the surgery's pure function runs on both.
//! - [`walk`]: finding modules in the tree (by path, by kind, inside another).
//! - [`ConvSpec`]: a 2-d convolution's hyperparameters, read from its module and run.
//! - [`default_init`]: PyTorch's default initialisation, drawn from the host's stream.
//! - [`StateReader`] and [`json_state`]: a method's checkpoint state written and read back
//!   with errors that name the method; [`detached_copy`] and [`copy_into`] for the weights a
//!   method keeps (EMA, SWA, Lookahead).
//!
//! # A complete surgery plugin
//!
//! Scales the output of every `linear` layer by a trainable scalar (a wrapper, so the layer's
//! own weights keep their names), with a pure function tests call on a [`StandIn`]:
//!
//! ```no_run
//! use tessera_plugin_api::kit::{walk, SurgeryModel};
//! use tessera_plugin_api::tch::Tensor;
//! use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Inner, Method, Plugin, Settings, Wrapper};
//!
//! struct Scaled(Tensor);
//!
//! impl Wrapper for Scaled {
//!     fn kind(&self) -> &str {
//!         "scaled_linear"
//!     }
//!     fn forward(&self, x: &Tensor, train: bool, inner: &mut Inner<'_>) -> Result<Tensor, Error> {
//!         Ok(inner.forward(x, train)?.f_mul(&self.0)?)
//!     }
//! }
//!
//! /// Wraps every plain `linear` of `model`; returns how many.
//! pub fn apply(model: &mut impl SurgeryModel, init: f64) -> Result<usize, Error> {
//!     let modules = model.modules()?;
//!     let targets: Vec<String> = walk::of_kind(&modules, "linear")
//!         .filter(|m| !walk::inside_kind(&modules, m.path.as_str(), "scaled_linear"))
//!         .map(|m| m.path.to_string())
//!         .collect();
//!     for path in &targets {
//!         let scale = Tensor::f_from_slice(&[init as f32])?.set_requires_grad(true);
//!         let own = vec![("scale", scale.shallow_clone())];
//!         model.wrap_module(path, Scaled(scale), None, own)?;
//!     }
//!     Ok(targets.len())
//! }
//!
//! pub struct ScaleLinear(f64);
//!
//! impl Method for ScaleLinear {
//!     fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
//!         let n = apply(ctx, self.0)?;
//!         ctx.log_metric("scale_linear/wrapped", n as f64);
//!         Ok(())
//!     }
//! }
//!
//! impl Plugin for ScaleLinear {
//!     const NAME: &'static str = "scale_linear";
//!     const VERSION: &'static str = env!("CARGO_PKG_VERSION");
//!     const DESCRIPTION: &'static str = "a trainable scale after every linear layer";
//!     const DEFAULT_SETTINGS: &'static str = "init = 1.0";
//!     fn hooks() -> Vec<Hook> {
//!         vec![Hook::at(Event::INIT)]
//!     }
//!     fn create(settings: &Settings) -> Result<Self, Error> {
//!         Ok(ScaleLinear(settings.f64("init")?))
//!     }
//! }
//!
//! export_plugin!(ScaleLinear);
//! ```
//!
//! [`Context`]: crate::Context

mod conv;
mod init;
mod standin;
mod state;
mod surgery;
pub mod walk;
mod weights;

pub use conv::ConvSpec;
pub use init::default_init;
pub use standin::StandIn;
pub use state::{json_state, StateReader};
pub use surgery::{OwnTensors, SurgeryModel};
pub use weights::{copy_into, detached_copy};
