//! `tessera export --format peft`: a run's low-rank adapters as the folder Hugging Face PEFT's
//! `PeftModel.from_pretrained(base_model, DIR)` loads: `adapter_model.safetensors` and
//! `adapter_config.json`.
//!
//! The adapters are the layers of kind `lora_linear` in the live model (the `lora` plugin's
//! wrappers, rebuilt as `tessera eval` rebuilds a run): each holds `<path>.lora_A.weight`
//! `(r, in)` and `<path>.lora_B.weight` `(out, r)` and the attributes `r`, `lora_alpha`,
//! `lora_dropout`, `use_rslora`. They are written under PEFT's names,
//! `base_model.model.<path>.lora_A.weight` (a model's paths are already Hugging Face's), and the
//! config names the adapted layers: by their last name (`["q_proj", "v_proj"]`) when those
//! names select exactly the adapted layers, else by their full paths. This module knows nothing
//! of the trainer or the plugin beyond that contract.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};
use tch::{Device, Tensor};

use crate::model::{Attr, LayerInfo, Model};

/// The kind of an adapted linear layer (the `lora` plugin's wrapper).
pub const LORA_KIND: &str = "lora_linear";

/// A run's adapters, ready to write.
#[derive(Debug)]
pub struct PeftAdapter {
    /// The adapter tensors under PEFT's names, on the CPU.
    pub tensors: Vec<(String, Tensor)>,
    /// `adapter_config.json`.
    pub config: Value,
    /// The adapted layers' paths.
    pub layers: Vec<String>,
}

fn number(layer: &LayerInfo, key: &str) -> Result<f64, String> {
    match layer.attrs.get(key) {
        Some(Attr::Int(v)) => Ok(*v as f64),
        Some(Attr::Float(v)) => Ok(*v),
        Some(Attr::Bool(v)) => Ok(f64::from(u8::from(*v))),
        None => Err(format!(
            "the adapted layer `{}` has no attribute `{key}` (a LoRA plugin of another interface)",
            layer.path
        )),
    }
}

/// The adapters of `model`. `model_json` is the run's `[model]` section: its `init_weights`
/// becomes the config's `base_model_name_or_path`. Fails naming the reason when the model has
/// no adapters or when they differ in rank, alpha, dropout or scaling (one PEFT config holds
/// one setting).
pub fn peft_adapter(model: &Model, model_json: &Value) -> Result<PeftAdapter, String> {
    let walk = model.root.walk();
    let adapted: Vec<&LayerInfo> = walk.iter().filter(|l| l.kind == LORA_KIND).collect();
    let Some(first) = adapted.first() else {
        return Err(
            "the run has no LoRA adapters (no `lora_linear` layer): `--format peft` exports the \
             adapters the `lora` plugin trains"
                .to_owned(),
        );
    };
    let keys = ["r", "lora_alpha", "lora_dropout", "use_rslora"];
    let setting: Vec<f64> = keys
        .iter()
        .map(|k| number(first, k))
        .collect::<Result<_, _>>()?;
    for layer in &adapted {
        for (k, want) in keys.iter().zip(&setting) {
            if number(layer, k)? != *want {
                return Err(format!(
                    "the adapters differ in `{k}` (`{}` and `{}`): one PEFT adapter has one setting",
                    first.path, layer.path
                ));
            }
        }
    }
    let mut tensors = Vec::with_capacity(2 * adapted.len());
    for layer in &adapted {
        for part in ["lora_A.weight", "lora_B.weight"] {
            let name = format!("{}.{part}", layer.path);
            let entry = model
                .params
                .get(&name)
                .ok_or_else(|| format!("the adapted layer `{}` has no `{name}`", layer.path))?;
            let t = entry
                .tensor
                .detach()
                .f_to_device(Device::Cpu)
                .and_then(|t| t.f_contiguous())
                .map_err(|e| format!("`{name}`: {e}"))?;
            tensors.push((format!("base_model.model.{name}"), t));
        }
    }
    let layers: Vec<String> = adapted.iter().map(|l| l.path.clone()).collect();
    let config = json!({
        "peft_type": "LORA",
        "task_type": task_type(&walk),
        "base_model_name_or_path": model_json.get("init_weights").and_then(Value::as_str),
        "r": setting[0] as i64,
        "lora_alpha": setting[1],
        "lora_dropout": setting[2],
        "use_rslora": setting[3] != 0.0,
        "target_modules": target_modules(&walk, &layers),
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "modules_to_save": Value::Null,
    });
    Ok(PeftAdapter {
        tensors,
        config,
        layers,
    })
}

/// PEFT's task of the model: a causal language model for the decoders.
fn task_type(walk: &[LayerInfo]) -> Value {
    match walk.first().map(|l| l.kind.as_str()) {
        Some("llama_for_causal_lm") | Some("gpt2_lm_head_model") => json!("CAUSAL_LM"),
        _ => Value::Null,
    }
}

/// The adapted layers as PEFT's `target_modules`: their last names when a layer of the model
/// (linear or adapted) has one of those names exactly when it is adapted, else the full paths
/// (PEFT matches a name against the path or its last components, so a full path selects only
/// itself).
fn target_modules(walk: &[LayerInfo], layers: &[String]) -> Vec<String> {
    let leaf = |p: &str| p.rsplit('.').next().unwrap_or(p).to_owned();
    let names: BTreeSet<String> = layers.iter().map(|p| leaf(p)).collect();
    let selected = walk
        .iter()
        .filter(|l| !l.path.is_empty() && names.contains(&leaf(&l.path)))
        .count();
    if selected == layers.len() {
        names.into_iter().collect()
    } else {
        layers.to_vec()
    }
}

/// Writes `adapter` into the folder `dir` (created when missing): `adapter_model.safetensors`,
/// then `adapter_config.json`, each atomically.
pub fn write_adapter(adapter: &PeftAdapter, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let file = dir.join("adapter_model.safetensors");
    let partial = dir.join(".adapter_model.safetensors.partial");
    let named: Vec<(&str, &Tensor)> = adapter
        .tensors
        .iter()
        .map(|(n, t)| (n.as_str(), t))
        .collect();
    Tensor::write_safetensors(&named, &partial)
        .map_err(|e| format!("writing {}: {e}", partial.display()))?;
    std::fs::rename(&partial, &file).map_err(|e| format!("writing {}: {e}", file.display()))?;
    let text = serde_json::to_string_pretty(&adapter.config).map_err(|e| e.to_string())? + "\n";
    let config = dir.join("adapter_config.json");
    crate::files::write_atomic(&config, text.as_bytes())
        .map_err(|e| format!("writing {}: {e}", config.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn layer(path: &str, kind: &str) -> LayerInfo {
        LayerInfo {
            path: path.to_owned(),
            kind: kind.to_owned(),
            attrs: BTreeMap::new(),
            tensors: Vec::new(),
        }
    }

    #[test]
    fn target_modules_are_names_when_names_select_exactly_the_adapted_layers() {
        let walk = vec![
            layer("", "llama_for_causal_lm"),
            layer("model.layers.0.self_attn.q_proj", LORA_KIND),
            layer("model.layers.0.self_attn.k_proj", "linear"),
            layer("model.layers.1.self_attn.q_proj", "linear"),
        ];
        let all = [
            "model.layers.0.self_attn.q_proj".to_owned(),
            "model.layers.1.self_attn.q_proj".to_owned(),
        ];
        assert_eq!(target_modules(&walk, &all), ["q_proj"]);
        // Only layer 0's q_proj: the name would select layer 1's too.
        assert_eq!(target_modules(&walk, &all[..1]), &all[..1]);
    }
}
