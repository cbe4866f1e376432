//! A plugin's per-sample transform as the loader runs it: the sample crosses as an ABI buffer,
//! the random stream as a function pointer over the loader's generator for that sample.

use abi_stable::std_types::RVec;
use rand::RngCore;
use tessera_plugin_api::abi::{
    SampleBuf, SampleRng, SampleRngState, SampleShape, SampleTransformBox,
};

use crate::data::{Sample, SampleFn};

/// A plugin's `SampleTransformObject`, shared by the loader's worker threads.
pub(super) struct PluginSampleTransform {
    pub(super) object: SampleTransformBox,
}

fn message(e: tessera_plugin_api::abi::PluginError) -> String {
    format!("{}: {}", e.kind.name(), e.message)
}

/// The generator behind a [`SampleRngState`]: a `&mut dyn RngCore` for one `apply` call.
extern "C" fn next_u64(state: SampleRngState) -> u64 {
    // SAFETY: `state` was made by `apply` below from a `&mut &mut dyn RngCore` that outlives the
    // plugin call, on this thread.
    let rng = unsafe { &mut *(state.0 as *mut &mut dyn RngCore) };
    rng.next_u64()
}

impl SampleFn for PluginSampleTransform {
    fn output_shape(&self, shape: (usize, usize, usize)) -> Result<(usize, usize, usize), String> {
        let out = self
            .object
            .output_shape(SampleShape::new(shape)?)
            .into_result()
            .map_err(message)?;
        Ok(out.dims())
    }

    fn apply(
        &self,
        sample: &mut Sample,
        mut rng: &mut dyn RngCore,
        at: tessera_plugin_api::SamplePlace,
    ) -> Result<(), String> {
        let shape = SampleShape::new(sample.shape())?;
        let buf = SampleBuf {
            channels: shape.channels,
            height: shape.height,
            width: shape.width,
            data: RVec::from(std::mem::take(&mut sample.data)),
        };
        let state = SampleRngState(&mut rng as *mut &mut dyn RngCore as *mut std::ffi::c_void);
        let out = self
            .object
            .apply_at(buf, SampleRng { next_u64, state }, at)
            .into_result()
            .map_err(message)?;
        let (c, h, w) = (
            out.channels as usize,
            out.height as usize,
            out.width as usize,
        );
        if out.data.len() != c * h * w {
            return Err(format!(
                "returned {} values for a {c}x{h}x{w} sample",
                out.data.len()
            ));
        }
        *sample = Sample {
            data: out.data.into_vec(),
            channels: c,
            height: h,
            width: w,
        };
        Ok(())
    }
}
