//! A speed-up method ([`Method`]) and its checkpoint state ([`State`]).

use abi_stable::std_types::RVec;

use crate::abi::{Event, MethodState};
use crate::{named_tensors, Context, Error, SampleTransform};

/// A speed-up method: reacts to the events it hooks.
pub trait Method: Send + 'static {
    /// Called at each hooked event, in the order described in the crate docs.
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error>;

    /// The method's own state for checkpoints (counters, shadow weights...). Default: none.
    fn state(&self) -> Result<State, Error> {
        Ok(State::default())
    }

    /// Restores state returned by [`Method::state`].
    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let _ = state;
        Ok(())
    }

    /// A transform of single training images for the host to run on its loader's worker
    /// threads (plugin-api 1.3; see [`SampleTransform`]). Asked once, right after the method is
    /// created. Default: none.
    fn sample_transform(&self) -> Option<Box<dyn SampleTransform>> {
        None
    }
}

/// A method's own state in a checkpoint.
#[derive(Debug, Default)]
pub struct State {
    /// The method's own version of this layout, to migrate old checkpoints.
    pub format_version: u32,
    /// Serialized counters or settings, in a format the method chooses.
    pub bytes: Vec<u8>,
    /// Named tensors.
    pub tensors: Vec<(String, tch::Tensor)>,
}

impl From<State> for MethodState {
    fn from(s: State) -> MethodState {
        MethodState {
            format_version: s.format_version,
            blob: RVec::from(s.bytes),
            tensors: named_tensors(s.tensors),
        }
    }
}

impl From<MethodState> for State {
    fn from(s: MethodState) -> State {
        State {
            format_version: s.format_version,
            bytes: s.blob.into_vec(),
            tensors: s
                .tensors
                .into_iter()
                .map(|n| (n.name.into_string(), n.tensor.into_tensor()))
                .collect(),
        }
    }
}
