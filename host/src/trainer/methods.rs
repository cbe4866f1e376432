//! The run's methods: the plugins its config names loaded (then the built-in ones), the
//! engine that runs them, and the parameters they claim checked.

use crate::config::Config;
use crate::engine::{Algorithm, Engine, Event, OnError, SetupState};
use crate::plugin::LoadedPlugin;
use crate::report::PluginRecord;

use super::error::{fail, Context as _, Result};

/// Loads the plugins listed under `[[algorithms]]` and makes their methods, followed by the
/// `extra` built-in ones; returns the engine and what the run record says of each plugin.
pub(super) fn load_methods(
    config: &Config,
    extra: Vec<Box<dyn Algorithm>>,
) -> Result<(Engine, Vec<PluginRecord>)> {
    let dirs = crate::plugin::search_dirs(crate::plugin::configured_dirs(&config.plugins));
    let mut algorithms: Vec<(Box<dyn Algorithm>, OnError)> = Vec::new();
    let mut plugins = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for a in &config.algorithms {
        if !seen.insert(a.plugin.clone()) {
            fail!(
                "trainer.toml line {}: plugin `{}` is listed twice",
                a.line,
                a.plugin
            );
        }
        let plugin = LoadedPlugin::load_named(&a.plugin, &dirs, a.sha256.as_deref())
            .with_context(|| format!("[[algorithms]] at line {}", a.line))?;
        let method = plugin
            .create(&a.settings_json())
            .with_context(|| format!("[[algorithms]] at line {}", a.line))?;
        tracing::info!(
            "loaded plugin {} {} ({})",
            plugin.name,
            plugin.version,
            plugin.path.display()
        );
        plugins.push(PluginRecord {
            name: plugin.name.clone(),
            version: plugin.version.clone(),
            path: plugin.path.clone(),
            sha256: plugin.sha256.clone(),
            settings: serde_json::Value::Object(a.settings.clone()),
        });
        algorithms.push((Box::new(method), a.on_error));
    }
    algorithms.extend(extra.into_iter().map(|a| (a, OnError::Stop)));
    Ok((Engine::new(algorithms), plugins))
}

/// The parameters methods claimed at `init` (plugin-api 1.6), after checking that each method
/// that claimed some receives `optimizer_step`, where it must update them.
pub(super) fn check_claims(
    engine: &crate::engine::Engine,
    setup: &SetupState,
) -> Result<Vec<String>> {
    let updating = engine.order_at(Event::OPTIMIZER_STEP);
    for (index, name) in &setup.claims {
        let method = engine.name_of(*index).unwrap_or("?");
        if !updating.contains(&method) {
            fail!("method `{method}` claimed parameter `{name}` but does not hook `optimizer_step`, where it would update it: the parameter would never train");
        }
    }
    if !setup.claims.is_empty() {
        tracing::info!(
            "{} parameters are updated by methods: {}",
            setup.claims.len(),
            engine_summary(engine, &setup.claims)
        );
    }
    Ok(setup.claims.iter().map(|(_, n)| n.clone()).collect())
}

/// `method (n parameters)` for every method that claimed parameters.
fn engine_summary(engine: &crate::engine::Engine, claims: &[(usize, String)]) -> String {
    let mut counts: Vec<(usize, usize)> = Vec::new();
    for (i, _) in claims {
        match counts.iter_mut().find(|(m, _)| m == i) {
            Some((_, c)) => *c += 1,
            None => counts.push((*i, 1)),
        }
    }
    counts
        .iter()
        .map(|(i, c)| format!("{} ({c})", engine.name_of(*i).unwrap_or("?")))
        .collect::<Vec<_>>()
        .join(", ")
}
