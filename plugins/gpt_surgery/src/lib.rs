#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod attention;
pub mod kinds;
mod model;
mod positions;
mod standin;

pub use attention::{
    apply_rotary, conv1d, dropout, qk_rms_norm, AttentionSpec, AttentionWeights, ExtAttention,
    Rotary,
};
pub use model::{module_at, paths_of_kind, rebuild_attention, tensor, Model};
pub use positions::ZeroPositions;
pub use standin::{Normal, Sizes, StandIn};
