//! The plugin crates of this repository, found by reading `plugins/`, and the settings that
//! make each act within a few batches (shared by `tests/methods/all_plugins.rs` and
//! `tests/distributed/distributed.rs`).

use crate::repo_root;

/// Methods for language models (GPT-2 attention and MLP surgery, token-sequence batches): they
/// have nothing to act on in a ResNet and are trained on the GPT instead.
pub const LANGUAGE_PLUGINS: [&str; 9] = [
    "lora",
    "alibi",
    "gated_linear_units",
    "seq_length_warmup",
    "rotary",
    "qk_norm",
    "relu_squared",
    "logit_softcap",
    "zero_init_projections",
];

/// The Composer methods for language models, which train together.
pub const COMPOSER_LANGUAGE_PLUGINS: [&str; 3] =
    ["alibi", "gated_linear_units", "seq_length_warmup"];

/// modded-nanogpt's architecture changes, which train together (rotary and alibi both replace
/// the positions, relu_squared and gated_linear_units both the MLP: they refuse each other).
pub const MODDED_NANOGPT_PLUGINS: [&str; 5] = [
    "rotary",
    "qk_norm",
    "relu_squared",
    "logit_softcap",
    "zero_init_projections",
];

/// Every plugin crate of the repository: every folder of `plugins/` whose Cargo.toml builds a
/// `cdylib`, sorted.
pub fn cdylib_plugins() -> Vec<String> {
    let dir = repo_root().join("plugins");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let manifest = std::fs::read_to_string(path.join("Cargo.toml")).ok()?;
            manifest
                .contains("cdylib")
                .then(|| path.file_name()?.to_str().map(str::to_owned))?
        })
        .collect();
    names.sort_unstable();
    names
}

/// The plugin crates of the repository for vision models: [`cdylib_plugins`] less
/// [`LANGUAGE_PLUGINS`].
pub fn repository_plugins() -> Vec<String> {
    cdylib_plugins()
        .into_iter()
        .filter(|name| !LANGUAGE_PLUGINS.contains(&name.as_str()))
        .collect()
}

/// Settings that make each plugin act on a 3-batch ResNet-50 run (defaults otherwise).
pub fn plugin_settings(plugin: &str) -> &'static str {
    match plugin {
        "selective_backprop" => "start = 0.0\nend = 1.0\ninterrupt = 0",
        "ema" => "half_life = \"2ba\"",
        "ghost_batchnorm" => "ghost_batch_size = 16",
        // 12 of the 22 convs left after Factorize and BlurPool: the stem, layer1's (inside
        // stochastic depth's blocks) and the first of layer2 (inside SqueezeExcite). Standardizing
        // them all makes this 3-batch ResNet-50's activations explode (batch-norm running
        // statistics are still near their initial values), and its float32 output is then
        // rounding noise that no export comparison can check (scripts/check_export.py says so).
        "weight_standardization" => "n_last_layers_ignore = 10",
        // Updates at batches 1, 2 and 3; the average replaces the model at batch 3.
        "swa" => "swa_start = \"0.3dur\"\nswa_end = \"0.9dur\"\nupdate_interval = \"1ba\"",
        "gradient_clipping" => "clipping_type = \"norm\"\nclipping_threshold = 1.0",
        // Syncs at batch 2; the slow weights go into the model at batch 3 (the end).
        "lookahead" => "k = 2",
        _ => "",
    }
}
