//! A plugin's method as the engine runs it (`PluginMethod`): events, state and its sample transform
//! across the ABI.

use super::host_api;
use super::sample;
use std::sync::Arc;

use tessera_plugin_api::abi::MethodBox;
use tessera_plugin_api::{Event, Hook};

use crate::data::SampleFn;
use crate::engine::{Algorithm, MethodError, MethodSnapshot, Stage};

/// A method instance living in a plugin.
pub struct PluginMethod {
    pub(super) name: String,
    pub(super) version: String,
    pub(super) settings: serde_json::Value,
    pub(super) hooks: Vec<Hook>,
    pub(super) object: MethodBox,
}

impl Algorithm for PluginMethod {
    fn name(&self) -> &str {
        &self.name
    }

    fn hooks(&self) -> Vec<Hook> {
        self.hooks.clone()
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn settings(&self) -> serde_json::Value {
        self.settings.clone()
    }

    fn on_event(&mut self, event: Event, stage: &mut Stage<'_>) -> Result<(), MethodError> {
        let handle = host_api::handle(stage);
        self.object
            .on_event(event, handle)
            .into_result()
            .map_err(reported)
    }

    fn state(&self) -> Result<Option<MethodSnapshot>, MethodError> {
        let s = MethodSnapshot::from(self.object.state().into_result().map_err(reported)?);
        let empty = s.format_version == 0 && s.bytes.is_empty() && s.tensors.is_empty();
        Ok((!empty).then_some(s))
    }

    fn load_state(&mut self, state: MethodSnapshot) -> Result<(), MethodError> {
        self.object
            .load_state(state.into())
            .into_result()
            .map_err(reported)
    }

    fn sample_transform(&self) -> Option<Arc<dyn SampleFn>> {
        let object = self.object.sample_transform().into_option()?;
        Some(Arc::new(sample::PluginSampleTransform { object }))
    }
}

/// A plugin's error value as the engine reports it: its kind and message.
fn reported(e: tessera_plugin_api::abi::PluginError) -> MethodError {
    MethodError(format!("{}: {}", e.kind.name(), e.message))
}
