//! Fresh weights drawn from the host's stream.

use tch::{Device, Kind, Tensor};

use crate::Error;

/// A new tensor of `shape` with PyTorch's default initialisation (`reset_parameters`:
/// kaiming-uniform with `a = √5` for weights, the same bound for biases), `U(−1/√fan_in,
/// 1/√fan_in)`, drawn element by element from `uniform` (values in `[0, 1)`, e.g.
/// [`crate::kit::SurgeryModel::uniform`]), trainable.
pub fn default_init(
    shape: &[i64],
    fan_in: i64,
    uniform: &mut dyn FnMut() -> f64,
    options: (Kind, Device),
) -> Result<Tensor, Error> {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    let count: i64 = shape.iter().product();
    let values: Vec<f32> = (0..count)
        .map(|_| ((2.0 * uniform() - 1.0) * bound) as f32)
        .collect();
    Ok(Tensor::f_from_slice(&values)?
        .f_view(shape)?
        .f_to_kind(options.0)?
        .f_to_device(options.1)?
        .set_requires_grad(true))
}
