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
pub use model::rebuild_attention;
pub use positions::ZeroPositions;
pub use standin::{gpt2, Normal, Sizes};
