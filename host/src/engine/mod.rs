//! The event engine: which methods run at each event, in which order, and what happens when one
//! fails. Methods are plugins loaded from `.so` files or built-in Rust objects; both implement
//! [`Algorithm`].
//!
//! Order at an event: descending [`Hook::priority`]; equal priorities keep the `trainer.toml`
//! order, reversed at `after_*` events (Composer's FILO rule, so that e.g. the method that
//! changed the target last before the loss restores it first after). Nothing else reorders.

mod state;

use std::sync::Arc;

pub use state::{Batch, CallError, Clock, RunState, Sampler, SetupState, Stage};
pub use tessera_plugin_api::{Event, Hook};

use crate::data::{MethodTransform, SampleFn};

/// What to do when a method fails during training (`on_error` of an `[[algorithms]]` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop training with the error (default).
    #[default]
    Stop,
    /// Disable the method and keep training.
    Disable,
}

impl OnError {
    /// Every policy with the name used in `trainer.toml`.
    pub const CHOICES: [(&'static str, OnError); 2] =
        [("stop", OnError::Stop), ("disable", OnError::Disable)];
}

/// A method the engine can run.
pub trait Algorithm: Send {
    /// Name used in messages and the run record.
    fn name(&self) -> &str;
    /// Events the method receives, with priorities.
    fn hooks(&self) -> Vec<Hook>;
    /// Runs the method at `event`. The error names what went wrong; the engine adds the
    /// method's name and the event.
    fn on_event(&mut self, event: Event, stage: &mut Stage<'_>) -> Result<(), MethodError>;
    /// The method's own state for checkpoints; `None` when it keeps none (default).
    fn state(&self) -> Result<Option<MethodSnapshot>, MethodError> {
        Ok(None)
    }
    /// Restores state returned by [`Algorithm::state`].
    fn load_state(&mut self, state: MethodSnapshot) -> Result<(), MethodError> {
        let _ = state;
        Ok(())
    }
    /// The method's version, recorded in checkpoints (empty for built-in methods).
    fn version(&self) -> &str {
        ""
    }
    /// The settings it runs with, recorded in checkpoints (`null` for built-in methods).
    fn settings(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// A per-sample transform of the training images, run on the loader's worker threads
    /// (RandAugment); asked once, before the loaders are built. None by default.
    fn sample_transform(&self) -> Option<Arc<dyn SampleFn>> {
        None
    }
}

/// One method as a checkpoint records it: who it is, how it was set, and its state.
#[derive(Debug)]
pub struct MethodRecord {
    /// The method's name.
    pub name: String,
    /// Its version (empty for built-in methods).
    pub version: String,
    /// The settings it ran with.
    pub settings: serde_json::Value,
    /// Its own state; `None` when it keeps none.
    pub snapshot: Option<MethodSnapshot>,
}

/// The methods' records do not fit this run's methods.
#[derive(Debug, thiserror::Error)]
pub enum MethodStatesError {
    /// The checkpoint holds the state of a method this run does not load.
    #[error("the checkpoint holds the state of method `{0}`, which this run does not load; add it to [[algorithms]] to continue this run")]
    MissingMethod(String),
    /// A method refused its saved state.
    #[error("method `{method}` cannot load its state: {message}")]
    Refused {
        /// The method.
        method: String,
        /// Why.
        message: String,
    },
    /// A state tensor cannot be moved to the training device.
    #[error("method `{method}`: moving its state to the device: {source}")]
    Device {
        /// The method.
        method: String,
        /// The libtorch error.
        source: tch::TchError,
    },
}

/// What a method reported when it failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct MethodError(pub String);

impl From<CallError> for MethodError {
    fn from(e: CallError) -> Self {
        MethodError(e.0)
    }
}

/// A method's state in a checkpoint: its layout version, bytes and named tensors.
pub use tessera_plugin_api::State as MethodSnapshot;

/// A method failed at an event and the run must stop.
#[derive(Debug, thiserror::Error)]
#[error("method `{method}` failed at event `{event}`: {message}")]
pub struct EngineError {
    /// The method's name.
    pub method: String,
    /// The event.
    pub event: Event,
    /// What the method reported.
    pub message: String,
}

struct Entry {
    algorithm: Box<dyn Algorithm>,
    on_error: OnError,
    disabled: bool,
    /// Host reads made in the method's hooks are charged to it (run.json's `host_reads`).
    source: crate::sync::observer::Source,
}

/// Dispatches events to methods and counts every event fired.
pub struct Engine {
    entries: Vec<Entry>,
    /// For each event id, the indices of the methods to run, in order.
    order: Vec<Vec<usize>>,
    counts: Vec<u64>,
}

impl Engine {
    /// An engine running `algorithms` (in `trainer.toml` order) with their error policies.
    pub fn new(algorithms: Vec<(Box<dyn Algorithm>, OnError)>) -> Engine {
        let entries: Vec<Entry> = algorithms
            .into_iter()
            .map(|(algorithm, on_error)| Entry {
                source: crate::sync::observer::Source::new(algorithm.name()),
                algorithm,
                on_error,
                disabled: false,
            })
            .collect();
        let hooks: Vec<Vec<Hook>> = entries.iter().map(|e| e.algorithm.hooks()).collect();
        let order = Event::ALL
            .iter()
            .map(|&event| {
                let mut hooked: Vec<(i32, usize)> = hooks
                    .iter()
                    .enumerate()
                    .filter_map(|(i, hs)| {
                        hs.iter()
                            .find(|h| h.event == event)
                            .map(|h| (h.priority, i))
                    })
                    .collect();
                if event.is_after() {
                    hooked.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
                } else {
                    hooked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                }
                hooked.into_iter().map(|(_, i)| i).collect()
            })
            .collect();
        Engine {
            entries,
            order,
            counts: vec![0; Event::ALL.len()],
        }
    }

    /// The names of the enabled methods hooked at `event`, in the order they run.
    pub fn methods_at(&self, event: Event) -> Vec<&str> {
        self.order
            .get(event.0 as usize)
            .map(|order| {
                order
                    .iter()
                    .filter(|&&i| !self.entries[i].disabled)
                    .map(|&i| self.entries[i].algorithm.name())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Fires `event`: runs every hooked, enabled method in order.
    pub fn fire(&mut self, event: Event, stage: &mut Stage<'_>) -> Result<(), EngineError> {
        let id = event.0 as usize;
        if let Some(count) = self.counts.get_mut(id) {
            *count += 1;
        }
        let Some(order) = self.order.get(id) else {
            return Ok(());
        };
        for &i in order {
            let entry = &mut self.entries[i];
            if entry.disabled {
                continue;
            }
            stage.set_current_method(i);
            let algorithm = &mut entry.algorithm;
            if let Err(e) = entry.source.charge(|| algorithm.on_event(event, stage)) {
                let error = EngineError {
                    method: entry.algorithm.name().to_owned(),
                    event,
                    message: e.0,
                };
                match entry.on_error {
                    OnError::Stop => return Err(error),
                    OnError::Disable => {
                        tracing::warn!("{error}; the method is disabled for the rest of the run (on_error = \"disable\")");
                        entry.disabled = true;
                    }
                }
            }
        }
        Ok(())
    }

    /// The methods' per-sample transforms, in method order.
    pub fn sample_transforms(&self) -> Vec<MethodTransform> {
        self.entries
            .iter()
            .filter_map(|e| {
                e.algorithm
                    .sample_transform()
                    .map(|transform| MethodTransform {
                        method: e.algorithm.name().to_owned(),
                        transform,
                    })
            })
            .collect()
    }

    /// The name of the method at `index` (configuration order).
    pub fn name_of(&self, index: usize) -> Option<&str> {
        self.entries.get(index).map(|e| e.algorithm.name())
    }

    /// How many times `event` has fired.
    pub fn count(&self, event: Event) -> u64 {
        self.counts.get(event.0 as usize).copied().unwrap_or(0)
    }

    /// The names of the methods that run at `event`, in order.
    pub fn order_at(&self, event: Event) -> Vec<&str> {
        self.order
            .get(event.0 as usize)
            .map(|o| {
                o.iter()
                    .map(|&i| self.entries[i].algorithm.name())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every method's record with its state, in configuration order.
    pub fn records(&self) -> Result<Vec<MethodRecord>, EngineError> {
        self.entries
            .iter()
            .map(|e| {
                let a = &e.algorithm;
                let name = a.name().to_owned();
                match a.state() {
                    Ok(snapshot) => Ok(MethodRecord {
                        version: a.version().to_owned(),
                        settings: a.settings(),
                        snapshot,
                        name,
                    }),
                    Err(e) => Err(EngineError {
                        method: name,
                        event: Event::BATCH_CHECKPOINT,
                        message: format!("saving its state: {e}"),
                    }),
                }
            })
            .collect()
    }

    /// Restores the methods' states from a checkpoint's `records` (tensors moved to `device`)
    /// and disables the methods that were disabled then. A method that kept state but is not
    /// in this run is an error; one that kept none is a warning, as is a method of this run
    /// missing from the checkpoint (it starts fresh) or settings that changed.
    pub fn restore(
        &mut self,
        records: Vec<MethodRecord>,
        disabled: &[String],
        device: tch::Device,
    ) -> Result<(), MethodStatesError> {
        for record in &records {
            if !self
                .entries
                .iter()
                .any(|e| e.algorithm.name() == record.name)
            {
                if record.snapshot.is_some() {
                    return Err(MethodStatesError::MissingMethod(record.name.clone()));
                }
                tracing::warn!(
                    "method `{}` ran before the checkpoint but is not in this run",
                    record.name
                );
            }
        }
        for entry in &self.entries {
            if !records.iter().any(|r| r.name == entry.algorithm.name()) {
                tracing::warn!(
                    "method `{}` is not in the checkpoint; it starts with fresh state",
                    entry.algorithm.name()
                );
            }
        }
        for record in records {
            let Some(entry) = self
                .entries
                .iter_mut()
                .find(|e| e.algorithm.name() == record.name)
            else {
                continue;
            };
            let now = entry.algorithm.settings();
            if now != record.settings {
                tracing::warn!(
                    "method `{}`: settings differ from the checkpoint's ({now} now, {} then)",
                    record.name,
                    record.settings
                );
            }
            let Some(mut snapshot) = record.snapshot else {
                continue;
            };
            for (_, t) in &mut snapshot.tensors {
                *t = t
                    .f_to_device(device)
                    .map_err(|source| MethodStatesError::Device {
                        method: record.name.clone(),
                        source,
                    })?;
            }
            entry
                .algorithm
                .load_state(snapshot)
                .map_err(|e| MethodStatesError::Refused {
                    method: record.name.clone(),
                    message: e.0,
                })?;
        }
        for entry in &mut self.entries {
            if disabled.iter().any(|d| d == entry.algorithm.name()) {
                entry.disabled = true;
            }
        }
        Ok(())
    }

    /// Names of the methods that were disabled after an error.
    pub fn disabled(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|e| e.disabled)
            .map(|e| e.algorithm.name())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    struct Recorder {
        name: String,
        hooks: Vec<Hook>,
        log: Arc<Mutex<Vec<String>>>,
        fail: bool,
    }

    impl Algorithm for Recorder {
        fn name(&self) -> &str {
            &self.name
        }
        fn hooks(&self) -> Vec<Hook> {
            self.hooks.clone()
        }
        fn on_event(&mut self, event: Event, _stage: &mut Stage<'_>) -> Result<(), MethodError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("{}@{event}", self.name));
            if self.fail {
                Err(MethodError("boom".into()))
            } else {
                Ok(())
            }
        }
    }

    fn rec(
        name: &str,
        hooks: Vec<Hook>,
        log: &Arc<Mutex<Vec<String>>>,
        fail: bool,
    ) -> Box<dyn Algorithm> {
        Box::new(Recorder {
            name: name.into(),
            hooks,
            log: log.clone(),
            fail,
        })
    }

    #[test]
    fn before_events_fifo_after_events_filo_priority_first() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let both = vec![Hook::at(Event::BEFORE_LOSS), Hook::at(Event::AFTER_LOSS)];
        let engine_algs = vec![
            (rec("a", both.clone(), &log, false), OnError::Stop),
            (rec("b", both.clone(), &log, false), OnError::Stop),
            (
                rec(
                    "first",
                    vec![
                        Hook {
                            event: Event::BEFORE_LOSS,
                            priority: 10,
                        },
                        Hook {
                            event: Event::AFTER_LOSS,
                            priority: 10,
                        },
                    ],
                    &log,
                    false,
                ),
                OnError::Stop,
            ),
        ];
        let mut engine = Engine::new(engine_algs);
        assert_eq!(engine.order_at(Event::BEFORE_LOSS), ["first", "a", "b"]);
        assert_eq!(engine.order_at(Event::AFTER_LOSS), ["first", "b", "a"]);
        let mut setup = SetupState::for_tests();
        let mut stage = Stage::Setup(&mut setup);
        engine.fire(Event::BEFORE_LOSS, &mut stage).unwrap();
        engine.fire(Event::AFTER_LOSS, &mut stage).unwrap();
        engine.fire(Event::BATCH_END, &mut stage).unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            [
                "first@before_loss",
                "a@before_loss",
                "b@before_loss",
                "first@after_loss",
                "b@after_loss",
                "a@after_loss"
            ]
        );
        assert_eq!(engine.count(Event::BATCH_END), 1);
    }

    #[test]
    fn errors_stop_or_disable() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let hooks = vec![Hook::at(Event::BATCH_START)];
        let mut stop = Engine::new(vec![(rec("bad", hooks.clone(), &log, true), OnError::Stop)]);
        let mut setup = SetupState::for_tests();
        let mut stage = Stage::Setup(&mut setup);
        let err = stop.fire(Event::BATCH_START, &mut stage).unwrap_err();
        assert_eq!(
            err.to_string(),
            "method `bad` failed at event `batch_start`: boom"
        );

        let mut disable = Engine::new(vec![
            (rec("bad", hooks.clone(), &log, true), OnError::Disable),
            (rec("good", hooks, &log, false), OnError::Stop),
        ]);
        disable.fire(Event::BATCH_START, &mut stage).unwrap();
        disable.fire(Event::BATCH_START, &mut stage).unwrap();
        assert_eq!(disable.disabled(), ["bad"]);
        let calls = log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("bad"))
            .count();
        assert_eq!(calls, 2, "one call from `stop`, one before being disabled");
    }
}
