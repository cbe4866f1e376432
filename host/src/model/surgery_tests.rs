use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;

/// A layer from outside the zoo, as a plugin's would be: multiplies by a held tensor and
/// counts its forwards.
#[derive(Debug)]
struct Scale {
    factor: Tensor,
    forwards: Arc<AtomicUsize>,
}

impl Layer for Scale {
    fn kind(&self) -> &str {
        "scale"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![("factor", Attr::Float(2.0))]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![("factor", &self.factor)]
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        self.forwards.fetch_add(1, Ordering::SeqCst);
        xs.f_mul(&self.factor)
    }
}

fn resnet20() -> Model {
    let config = ModelConfig {
        name: ModelName::Resnet20,
        torchscript: None,
        hidden: Vec::new(),
        widths: Vec::new(),
        width: None,
        num_classes: 10,
        dropout: 0.0,
        norm: None,
        gpt2: None,
        bert: None,
        llama: None,
        vit: None,
        init: None,
    };
    let input = InputShape {
        channels: 3,
        height: 8,
        width: 8,
    };
    Model::build(&config, input, 10, Device::Cpu).unwrap()
}

fn scale(forwards: &Arc<AtomicUsize>) -> Box<dyn Layer> {
    Box::new(Scale {
        factor: Tensor::from(2.0f32),
        forwards: Arc::clone(forwards),
    })
}

#[test]
fn a_layer_from_outside_replaces_a_block_child_in_the_tree_store_and_forward() {
    let mut m = resnet20();
    let forwards = Arc::new(AtomicUsize::new(0));
    m.replace_module("layer1.0.conv1", scale(&forwards))
        .unwrap();
    let node = m
        .root
        .walk()
        .into_iter()
        .find(|i| i.path == "layer1.0.conv1")
        .unwrap();
    assert_eq!(node.kind, "scale");
    assert_eq!(node.attrs.get("factor"), Some(&Attr::Float(2.0)));
    assert_eq!(node.tensors, ["layer1.0.conv1.factor"]);
    assert!(m.params.get("layer1.0.conv1.weight").is_none());
    let factor = m.params.get("layer1.0.conv1.factor").unwrap();
    assert_eq!(factor.role, Role::Buffer);
    let x = Tensor::randn([2, 3, 8, 8], (tch::Kind::Float, Device::Cpu));
    assert_eq!(m.forward(&x, true).unwrap().size(), [2, 10]);
    assert_eq!(m.forward(&x, false).unwrap().size(), [2, 10]);
    assert_eq!(forwards.load(Ordering::SeqCst), 2);
}

#[test]
fn replacing_a_subtree_removes_all_its_tensors() {
    let mut m = resnet20();
    let before = m.params.entries().len();
    let forwards = Arc::new(AtomicUsize::new(0));
    m.replace_module("layer2.0", scale(&forwards)).unwrap();
    // conv1, bn1, conv2, bn2 and the projection shortcut (conv + bn): 3 convs, 3 BNs of 5.
    assert_eq!(m.params.entries().len(), before - 18 + 1);
    assert!(m
        .params
        .entries()
        .iter()
        .all(|e| !e.name.starts_with("layer2.0.") || e.name == "layer2.0.factor"));
    let paths: Vec<String> = m.root.walk().into_iter().map(|i| i.path).collect();
    assert!(paths.contains(&"layer2.0".to_owned()));
    assert!(!paths.iter().any(|p| p.starts_with("layer2.0.")));
}

#[test]
fn surgery_refuses_the_root_and_unknown_paths_without_changing_the_model() {
    let mut m = resnet20();
    let forwards = Arc::new(AtomicUsize::new(0));
    let before = m.root.walk();
    for (path, message) in [
        ("", "the root module cannot be replaced"),
        ("layer9.0", "no module at `layer9`"),
        ("layer1.7", "no module at `layer1.7`"),
        ("layer1.0.shortcut", "no module at `layer1.0.shortcut`"),
    ] {
        assert_eq!(
            m.replace_module(path, scale(&forwards)).unwrap_err().0,
            message
        );
    }
    assert_eq!(m.root.walk(), before);
    assert!(m.params.get("layer1.0.conv1.weight").is_some());
}

#[test]
fn a_hugging_face_gpt2_config_reads_or_names_what_is_not_computed() {
    let json = serde_json::json!({
        "model_type": "gpt2", "n_layer": 3, "n_head": 2, "n_embd": 16, "n_positions": 40,
        "vocab_size": 99, "n_inner": null, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-6, "tie_word_embeddings": false
    });
    let c = Gpt2Config::from_hf_config(&json).unwrap();
    assert_eq!(
        (c.n_layer, c.n_head, c.n_embd, c.n_positions, c.vocab_size),
        (3, 2, 16, 40, Some(99))
    );
    assert!(!c.tie_embeddings && c.layer_norm_epsilon == 1e-6);
    for (key, value, says) in [
        (
            "activation_function",
            serde_json::json!("relu"),
            "activation_function",
        ),
        ("n_inner", serde_json::json!(20), "n_inner"),
        (
            "add_cross_attention",
            serde_json::json!(true),
            "add_cross_attention",
        ),
        ("n_layer", serde_json::json!("two"), "whole number"),
        ("model_type", serde_json::json!("bert"), "model_type"),
    ] {
        let mut bad = json.clone();
        bad[key] = value;
        let e = Gpt2Config::from_hf_config(&bad).unwrap_err();
        assert!(e.contains(says), "{key}: {e}");
    }
}
