//! libtorch's default generators, saved in checkpoints so that a resumed run draws the same
//! random numbers (dropout, `randn` in methods) as the uninterrupted one: the CPU generator, and
//! the generator of every CUDA device this process sees (`torch.cuda.get_rng_state_all`).
//!
//! A checkpoint holds one CUDA state per device of the machine that wrote it (none on a machine
//! without CUDA). Resuming restores the states of the devices both machines have; a run on CUDA
//! that finds no state for its device (a checkpoint written on the CPU or by an older Tessera)
//! goes on from the device's seed, with a warning. A CUDA checkpoint resumed on the CPU only
//! needs the CPU generator.

use tch::{Kind, Tensor};

use super::CheckpointError;

extern "C" {
    fn tessera_cpu_rng_state(out: *mut u8, capacity: i64) -> i64;
    fn tessera_set_cpu_rng_state(data: *const u8, len: i64) -> i32;
    fn tessera_cuda_rng_state(device: i32, out: *mut u8, capacity: i64) -> i64;
    fn tessera_set_cuda_rng_state(device: i32, data: *const u8, len: i64) -> i32;
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
    let bytes = state_bytes(state, "CPU")?;
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

/// The state of each CUDA device's generator, in device order (empty without CUDA).
pub fn cuda_states() -> Result<Vec<Tensor>, CheckpointError> {
    (0..crate::device::cuda_device_count())
        .map(|i| {
            let failed =
                || CheckpointError::Part(format!("libtorch could not read cuda:{i}'s generator"));
            let device = i as i32;
            // SAFETY: a null buffer only asks for the size.
            let len = unsafe { tessera_cuda_rng_state(device, std::ptr::null_mut(), 0) };
            let len = usize::try_from(len).map_err(|_| failed())?;
            let mut bytes = vec![0u8; len];
            // SAFETY: `bytes` holds `len` bytes, the size the generator reported.
            let written = unsafe { tessera_cuda_rng_state(device, bytes.as_mut_ptr(), len as i64) };
            if written != len as i64 {
                return Err(failed());
            }
            Ok(Tensor::from_slice(&bytes))
        })
        .collect()
}

/// What restoring the CUDA generators left undone, for a warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaStatesMissing {
    /// CUDA states in the checkpoint.
    pub saved: usize,
    /// CUDA devices here.
    pub here: usize,
}

impl std::fmt::Display for CudaStatesMissing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.saved == 0 {
            write!(
                f,
                "the checkpoint holds no CUDA generator state (written on the CPU or by an \
                 older Tessera): CUDA random draws (dropout) after the resume differ from an \
                 uninterrupted run's"
            )
        } else {
            write!(
                f,
                "the checkpoint holds the CUDA generators of {} device(s) and this machine has \
                 {}: devices {}.. start from their seeds, so their random draws after the resume \
                 differ from an uninterrupted run's",
                self.saved, self.here, self.saved
            )
        }
    }
}

/// Sets the CUDA generators from states written by [`cuda_states`] (device `i` from state `i`),
/// for the devices this machine has. `Some` when `on_cuda` (the run trains on CUDA) and this
/// machine has devices the checkpoint holds no state for.
pub fn set_cuda_states(
    states: &[Tensor],
    on_cuda: bool,
) -> Result<Option<CudaStatesMissing>, CheckpointError> {
    set_cuda_states_on(states, on_cuda, crate::device::cuda_device_count())
}

fn set_cuda_states_on(
    states: &[Tensor],
    on_cuda: bool,
    here: usize,
) -> Result<Option<CudaStatesMissing>, CheckpointError> {
    for (i, state) in states.iter().enumerate() {
        let bytes = state_bytes(state, &format!("cuda:{i}"))?;
        if i >= here {
            continue;
        }
        // SAFETY: the pointer and length describe `bytes`; libtorch copies them.
        let status =
            unsafe { tessera_set_cuda_rng_state(i as i32, bytes.as_ptr(), bytes.len() as i64) };
        if status != 0 {
            return Err(CheckpointError::Part(format!(
                "libtorch refused the saved generator state of cuda:{i} ({} bytes; written by \
                 another libtorch?)",
                bytes.len()
            )));
        }
    }
    Ok(
        (on_cuda && states.len() < here).then_some(CudaStatesMissing {
            saved: states.len(),
            here,
        }),
    )
}

/// A saved generator state's bytes (a 1-D `u8` tensor).
fn state_bytes(state: &Tensor, which: &str) -> Result<Vec<u8>, CheckpointError> {
    if state.kind() != Kind::Uint8 || state.dim() != 1 {
        return Err(CheckpointError::Part(format!(
            "the saved {which} generator state is a {:?} tensor of shape {:?}, not bytes",
            state.kind(),
            state.size()
        )));
    }
    Vec::<u8>::try_from(state)
        .map_err(|e| CheckpointError::Part(format!("the saved {which} generator state: {e}")))
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

    #[test]
    fn without_cuda_no_state_is_saved_and_saved_ones_are_checked_then_left() {
        if crate::device::cuda_device_count() > 0 {
            // On a GPU machine, each device's state reads back as it was set.
            let states = cuda_states().unwrap();
            assert!(states
                .iter()
                .all(|s| s.kind() == Kind::Uint8 && s.numel() > 0));
            assert_eq!(set_cuda_states(&states, true).unwrap(), None);
            return;
        }
        assert!(cuda_states().unwrap().is_empty());
        // A CUDA checkpoint resumed here: the states are checked, nothing is restored and
        // nothing is missing (no device here).
        let saved = [
            Tensor::from_slice(&[7u8; 16]),
            Tensor::from_slice(&[9u8; 16]),
        ];
        assert_eq!(set_cuda_states(&saved, false).unwrap(), None);
        assert_eq!(set_cuda_states(&saved, true).unwrap(), None);
        let bad = [Tensor::from_slice(&[1.0f32, 2.0])];
        let e = set_cuda_states(&bad, false).unwrap_err().to_string();
        assert!(e.contains("cuda:0") && e.contains("not bytes"), "{e}");
    }

    #[test]
    fn a_cuda_run_is_told_which_devices_have_no_saved_state() {
        // Without states to restore no libtorch call is made, whatever the device count.
        let missing = set_cuda_states_on(&[], true, 2).unwrap().unwrap();
        assert_eq!(missing, CudaStatesMissing { saved: 0, here: 2 });
        assert!(missing.to_string().contains("no CUDA generator state"));
        assert_eq!(set_cuda_states_on(&[], false, 2).unwrap(), None);
        assert_eq!(set_cuda_states_on(&[], true, 0).unwrap(), None);
        let text = CudaStatesMissing { saved: 1, here: 4 }.to_string();
        assert!(
            text.contains("1 device(s)") && text.contains("has 4") && text.contains("devices 1..")
        );
    }
}
