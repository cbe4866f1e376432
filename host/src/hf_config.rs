//! `tessera export --format hf`: the `config.json` Hugging Face's `from_pretrained` reads beside
//! the exported `model.safetensors`, written from the run's `[model]` section, so that
//! `AutoModelForCausalLM.from_pretrained(DIR)` builds the same network (gpt2, llama, Qwen2-style
//! llama) and loads every tensor; a bert loads with `AutoModelForMaskedLM` or
//! `AutoModelForSequenceClassification`, after its head.

use serde_json::{json, Value};

/// The Hugging Face config of the model `model_json` describes (the run's `[model]` section as
/// recorded in a checkpoint), or why there is none.
pub fn hf_config(model_json: &Value) -> Result<Value, String> {
    let name = model_json.get("name").and_then(Value::as_str).unwrap_or("");
    let k = Keys(model_json);
    let vocab = k
        .int("vocab_size")
        .or(k.int("num_classes"))
        .ok_or("the model's config has neither `vocab_size` nor `num_classes`")?;
    match name {
        "gpt2" => Ok(gpt2_config(&k, vocab)),
        "llama" => llama_config(&k, vocab),
        "bert" => bert_config(&k, vocab),
        other => Err(format!(
            "`--format hf` writes gpt2, llama and bert models; model {other:?} is exported as a plain \
             safetensors file (without --format)"
        )),
    }
}

/// The recorded `[model]` section's keys, read as numbers, counts and flags.
struct Keys<'a>(&'a Value);

impl Keys<'_> {
    fn num(&self, key: &str) -> Option<f64> {
        self.0.get(key).and_then(Value::as_f64)
    }

    fn int(&self, key: &str) -> Option<u64> {
        self.0.get(key).and_then(Value::as_u64)
    }

    fn flag(&self, key: &str) -> Option<bool> {
        self.0.get(key).and_then(Value::as_bool)
    }
}

/// GPT-2's `GPT2LMHeadModel` config.
fn gpt2_config(k: &Keys<'_>, vocab: u64) -> Value {
    let dropout = k.num("dropout").unwrap_or(0.0);
    json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab,
        "n_layer": k.int("n_layer"),
        "n_head": k.int("n_head"),
        "n_embd": k.int("n_embd"),
        "n_positions": k.int("n_positions"),
        "layer_norm_epsilon": k.num("layer_norm_epsilon"),
        "activation_function": "gelu_new",
        "embd_pdrop": dropout,
        "attn_pdrop": dropout,
        "resid_pdrop": dropout,
        "tie_word_embeddings": k.flag("tie_embeddings").unwrap_or(true),
        // GPT-2's end-of-text token where the vocabulary has it, else none.
        "bos_token_id": (vocab > 50256).then_some(50256),
        "eos_token_id": (vocab > 50256).then_some(50256),
        "torch_dtype": "float32",
    })
}

/// A Llama's `LlamaForCausalLM` config, or Qwen2's `Qwen2ForCausalLM` (biases on q, k and v only).
fn llama_config(k: &Keys<'_>, vocab: u64) -> Result<Value, String> {
    let bias = k.flag("attention_bias").unwrap_or(false);
    let o_bias = k.flag("o_bias").unwrap_or(bias);
    // Biases on q, k and v but not o: Qwen2's layout (Llama's `attention_bias` puts one
    // on all four).
    let qwen2 = bias && !o_bias;
    if !bias && o_bias {
        return Err(
            "a bias on the output projection only (`o_bias` without `attention_bias`) \
             has no Hugging Face model"
                .into(),
        );
    }
    let heads = k
        .int("num_attention_heads")
        .ok_or("`num_attention_heads` is missing")?;
    let mut rope = json!({
        "rope_type": "default",
        "rope_theta": k.num("rope_theta").unwrap_or(10000.0),
    });
    if let Some(s) = k.0.get("rope_scaling").filter(|s| s.is_object()) {
        rope = json!({
            "rope_type": "llama3",
            "rope_theta": k.num("rope_theta").unwrap_or(10000.0),
            "factor": s.get("factor"),
            "low_freq_factor": s.get("low_freq_factor"),
            "high_freq_factor": s.get("high_freq_factor"),
            // transformers wants a whole number here.
            "original_max_position_embeddings": s
                .get("original_max_position_embeddings")
                .and_then(Value::as_f64)
                .map(|v| if v.fract() == 0.0 && v >= 0.0 { json!(v as u64) } else { json!(v) }),
        });
    }
    let mut config = json!({
        "architectures": [if qwen2 { "Qwen2ForCausalLM" } else { "LlamaForCausalLM" }],
        "model_type": if qwen2 { "qwen2" } else { "llama" },
        "vocab_size": vocab,
        "hidden_size": k.int("hidden_size"),
        "intermediate_size": k.int("intermediate_size"),
        "num_hidden_layers": k.int("num_hidden_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": k.int("num_key_value_heads").unwrap_or(heads),
        "max_position_embeddings": k.int("max_position_embeddings"),
        "rms_norm_eps": k.num("rms_norm_eps"),
        "initializer_range": k.num("initializer_range"),
        "hidden_act": "silu",
        "tie_word_embeddings": k.flag("tie_embeddings").unwrap_or(true),
        // transformers 5 reads `rope_parameters`, 4 `rope_theta` and `rope_scaling`.
        "rope_parameters": rope.clone(),
        "rope_theta": rope["rope_theta"],
        "torch_dtype": "float32",
    });
    if rope["rope_type"] == "llama3" {
        config["rope_scaling"] = rope;
    }
    if let Some(d) = k.int("head_dim") {
        config["head_dim"] = json!(d);
    }
    if !qwen2 {
        config["attention_bias"] = json!(bias);
        config["mlp_bias"] = json!(false);
    }
    Ok(config)
}

/// BERT's `BertForMaskedLM` or `BertForSequenceClassification` config, after its head.
fn bert_config(k: &Keys<'_>, vocab: u64) -> Result<Value, String> {
    let dropout = k.num("dropout").unwrap_or(0.0);
    let classifier = k.0.get("head").and_then(Value::as_str) == Some("classification");
    let mut config = json!({
        "architectures": [if classifier { "BertForSequenceClassification" } else { "BertForMaskedLM" }],
        "model_type": "bert",
        "vocab_size": if classifier { k.int("vocab_size").ok_or("a bert classifier's config has no `vocab_size`")? } else { vocab },
        "hidden_size": k.int("n_embd"),
        "num_hidden_layers": k.int("n_layer"),
        "num_attention_heads": k.int("n_head"),
        "intermediate_size": k.int("n_inner"),
        "hidden_act": "gelu",
        "hidden_dropout_prob": dropout,
        "attention_probs_dropout_prob": dropout,
        "max_position_embeddings": k.int("n_positions"),
        "type_vocab_size": k.int("type_vocab_size"),
        "layer_norm_eps": k.num("layer_norm_epsilon"),
        "initializer_range": 0.02,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": true,
        "torch_dtype": "float32",
    });
    if classifier {
        let classes = k
            .int("num_classes")
            .ok_or("a bert classifier's config has no `num_classes`")?;
        config["num_labels"] = json!(classes);
        config["problem_type"] = json!("single_label_classification");
        let labels: serde_json::Map<String, Value> = (0..classes)
            .map(|i| (i.to_string(), json!(format!("LABEL_{i}"))))
            .collect();
        config["id2label"] = Value::Object(labels);
        config["label2id"] = (0..classes)
            .map(|i| (format!("LABEL_{i}"), json!(i)))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    Ok(config)
}
