#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod attention;
mod compat;
pub mod kinds;
mod model;
mod positions;
mod standin;

pub use attention::{
    apply_rotary, conv1d, dropout, qk_rms_norm, AttentionSpec, AttentionWeights, ExtAttention,
    Rotary,
};
pub use compat::{module_at, paths_of_kind, tensor, Model, StandIn};
pub use model::rebuild_attention;
pub use positions::ZeroPositions;
pub use standin::{gpt2, Normal, Sizes};
