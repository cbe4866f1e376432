//! Which parameters Muon trains: by default every trainable parameter with at least two
//! dimensions except the embeddings and the output head; `include` / `exclude` globs change it.

use tessera_plugin_api::{Error, ModuleInfo, ParamInfo};

use crate::config::MuonConfig;

/// Module kinds whose weights are never hidden matrices: embeddings (GPT's `wte`, `wpe`).
const EMBEDDING_KINDS: [&str; 1] = ["embedding"];
/// Module kinds that can be the output head (the last such module of the tree).
const HEAD_KINDS: [&str; 2] = ["linear", "tied_lm_head"];

/// The names of the parameters Muon trains, in the model's order.
///
/// Candidates are trainable parameters with ≥ 2 dimensions. Without `include`, the parameters
/// of `embedding` modules and of the output head (the last `linear` or `tied_lm_head` module
/// of the depth-first tree) are left to the host's optimizer; with `include`, exactly the
/// candidates matching one of its patterns are taken. `exclude` then removes matches. An
/// `include` pattern that matches no candidate, or an empty selection, is an error.
pub fn select_parameters(
    params: &[ParamInfo],
    modules: &[ModuleInfo],
    config: &MuonConfig,
) -> Result<Vec<String>, Error> {
    let patterns = |key: &str, texts: &[String]| -> Result<Vec<glob::Pattern>, Error> {
        texts
            .iter()
            .map(|t| {
                glob::Pattern::new(t)
                    .map_err(|e| Error::config(format!("setting `{key}`: pattern {t:?}: {e}")))
            })
            .collect()
    };
    let include = patterns("include", &config.include)?;
    let exclude = patterns("exclude", &config.exclude)?;
    let candidates: Vec<&str> = params
        .iter()
        .filter(|p| !p.buffer && p.trainable && p.shape.len() >= 2)
        .map(|p| p.name.as_str())
        .collect();

    let mut left_out: Vec<&str> = Vec::new();
    for m in modules {
        if EMBEDDING_KINDS.contains(&m.kind.as_str()) {
            left_out.extend(m.params.iter().map(|p| p.as_str()));
        }
    }
    if let Some(head) = modules
        .iter()
        .rev()
        .find(|m| HEAD_KINDS.contains(&m.kind.as_str()))
    {
        left_out.extend(head.params.iter().map(|p| p.as_str()));
    }

    let mut selected: Vec<&str> = if include.is_empty() {
        candidates
            .iter()
            .copied()
            .filter(|n| !left_out.contains(n))
            .collect()
    } else {
        for (text, pattern) in config.include.iter().zip(&include) {
            if !candidates.iter().any(|n| pattern.matches(n)) {
                return Err(Error::config(format!(
                    "setting `include`: pattern {text:?} matches no trainable parameter with ≥ 2 dimensions (candidates: {candidates:?})"
                )));
            }
        }
        candidates
            .iter()
            .copied()
            .filter(|n| include.iter().any(|p| p.matches(n)))
            .collect()
    };
    selected.retain(|n| !exclude.iter().any(|p| p.matches(n)));
    if selected.is_empty() {
        return Err(Error::config(format!(
            "no parameter selected: Muon trains trainable parameters with ≥ 2 dimensions other than embeddings and the output head{}{} (candidates: {candidates:?})",
            if config.include.is_empty() { String::new() } else { format!(", matching `include` {:?}", config.include) },
            if config.exclude.is_empty() { String::new() } else { format!(", not matching `exclude` {:?}", config.exclude) },
        )));
    }
    Ok(selected.into_iter().map(str::to_owned).collect())
}
