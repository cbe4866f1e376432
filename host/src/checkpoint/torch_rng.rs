//! libtorch's default CPU generator, saved in checkpoints so that a resumed run draws the same
//! random numbers (dropout, `randn` in methods) as the uninterrupted one.

use tch::{Kind, Tensor};

use super::CheckpointError;

extern "C" {
    fn tessera_cpu_rng_state(out: *mut u8, capacity: i64) -> i64;
    fn tessera_set_cpu_rng_state(data: *const u8, len: i64) -> i32;
}

/// The generator's state as a `u8` tensor.
pub fn cpu_state() -> Result<Tensor, CheckpointError> {
    let failed = || CheckpointError::Part("libtorch could not read its CPU generator".into());
    // SAFETY: a null buffer only asks for the size.
    let len = unsafe { tessera_cpu_rng_state(std::ptr::null_mut(), 0) };
    let len = usize::try_from(len).map_err(|_| failed())?;
    let mut bytes = vec![0u8; len];
    // SAFETY: `bytes` holds `len` bytes, the size the generator reported.
    let written = unsafe { tessera_cpu_rng_state(bytes.as_mut_ptr(), len as i64) };
    if written != len as i64 {
        return Err(failed());
    }
    Ok(Tensor::from_slice(&bytes))
}

/// Sets the generator from a state written by [`cpu_state`].
pub fn set_cpu_state(state: &Tensor) -> Result<(), CheckpointError> {
    if state.kind() != Kind::Uint8 || state.dim() != 1 {
        return Err(CheckpointError::Part(format!(
            "the saved CPU generator state is a {:?} tensor of shape {:?}, not bytes",
            state.kind(),
            state.size()
        )));
    }
    let bytes = Vec::<u8>::try_from(state)
        .map_err(|e| CheckpointError::Part(format!("the saved CPU generator state: {e}")))?;
    // SAFETY: the pointer and length describe `bytes`; libtorch copies them.
    let status = unsafe { tessera_set_cpu_rng_state(bytes.as_ptr(), bytes.len() as i64) };
    if status != 0 {
        return Err(CheckpointError::Part(format!(
            "libtorch refused the saved CPU generator state ({} bytes; written by another libtorch?)",
            bytes.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_state_draws_the_same_numbers() {
        tch::manual_seed(5);
        let _ = Tensor::randn([10], (Kind::Float, tch::Device::Cpu));
        let state = cpu_state().unwrap();
        let first = Tensor::randn([100], (Kind::Float, tch::Device::Cpu)).bernoulli_p(0.5);
        let _ = Tensor::randn([1000], (Kind::Float, tch::Device::Cpu));
        set_cpu_state(&state).unwrap();
        let again = Tensor::randn([100], (Kind::Float, tch::Device::Cpu)).bernoulli_p(0.5);
        assert!(first.equal(&again));
        assert!(set_cpu_state(&Tensor::from_slice(&[1u8, 2, 3])).is_err());
        assert!(set_cpu_state(&Tensor::from_slice(&[1.0f32])).is_err());
    }
}
