//! PyTorch's default initializations, so a fresh model starts where PyTorch's would.

use tch::nn::init::{FanInOut, NonLinearity, NormalOrUniform};
use tch::nn::Init;

/// PyTorch's default weight init for conv and linear layers: kaiming_uniform(a = sqrt(5)).
pub const TORCH_DEFAULT_WEIGHT: Init = Init::Kaiming {
    dist: NormalOrUniform::Uniform,
    fan: FanInOut::FanIn,
    non_linearity: NonLinearity::ExplicitGain(0.577_350_269_189_625_8), // gain sqrt(2/(1+5)) = 1/sqrt(3)
};

/// PyTorch's default bias init for conv and linear layers: uniform(±1/sqrt(fan_in)).
pub fn torch_default_bias(fan_in: i64) -> Init {
    let bound = 1.0 / (fan_in as f64).sqrt();
    Init::Uniform {
        lo: -bound,
        up: bound,
    }
}
