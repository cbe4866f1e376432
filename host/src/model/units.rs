//! The repeated units of a model, read from its module tree: what activation checkpointing
//! recomputes (`train.activation_checkpointing`) and what sharding gathers one at a time.

use serde::Serialize;

use super::tree::LayerInfo;
use super::Model;

/// A kind of repeated unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// A block: a transformer block (GPT-2's `transformer.h.N`, BERT's
    /// `bert.encoder.layer.N`, a ViT's `blocks.N`), a ResNet residual or bottleneck block
    /// (`layer1.0`), an airbench conv group (`layers.2`). Kinds: [`Unit::BLOCK_KINDS`].
    Block,
    /// A stage: a `sequential` container whose children are all blocks (a ResNet's `layer1`,
    /// GPT-2's whole `transformer.h`).
    Stage,
}

impl Unit {
    /// The names `trainer.toml` uses.
    pub const CHOICES: [(&'static str, Unit); 2] = [("block", Unit::Block), ("stage", Unit::Stage)];

    /// The layer kinds that are blocks.
    pub const BLOCK_KINDS: [&'static str; 7] = [
        "gpt2_block",
        "llama_block",
        "bert_layer",
        "vit_block",
        "residual_block",
        "bottleneck_block",
        "conv_group",
    ];

    /// The name `trainer.toml` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Block => "block",
            Unit::Stage => "stage",
        }
    }
}

/// The module-tree paths of `model`'s units of kind `unit`, in forward order; empty when it has
/// none (an MLP, a TorchScript model). A unit inside another is not listed.
///
/// Units are recognised by their layers' kinds, so read the tree before a method's surgery
/// wraps a block in a plugin's layer (which shows the plugin's kind): the paths stay valid.
pub fn unit_paths(model: &Model, unit: Unit) -> Vec<String> {
    let layers = model.root.walk();
    let is_block = |l: &LayerInfo| Unit::BLOCK_KINDS.contains(&l.kind.as_str());
    let found = layers.iter().filter(|l| match unit {
        Unit::Block => is_block(l),
        Unit::Stage => {
            let mut children = layers.iter().filter(|c| is_child(&l.path, &c.path));
            l.kind == "sequential" && children.clone().next().is_some() && children.all(is_block)
        }
    });
    let mut paths: Vec<String> = Vec::new();
    for l in found {
        let nested = paths.iter().any(|p| {
            l.path
                .strip_prefix(p.as_str())
                .is_some_and(|r| r.starts_with('.'))
        });
        if !nested && !l.path.is_empty() {
            paths.push(l.path.clone());
        }
    }
    paths
}

/// Whether `path` is a direct child of `parent`.
fn is_child(parent: &str, path: &str) -> bool {
    let rest = if parent.is_empty() {
        Some(path)
    } else {
        path.strip_prefix(parent).and_then(|r| r.strip_prefix('.'))
    };
    rest.is_some_and(|r| !r.is_empty() && !r.contains('.'))
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;
    use crate::model::{BertConfig, Gpt2Config, InputShape, ModelConfig, ModelName};

    fn build(name: ModelName, channels: i64, size: i64) -> Model {
        let mut config = ModelConfig::new(name, 10);
        config.gpt2 = Some(Gpt2Config {
            n_layer: 3,
            n_embd: 16,
            n_head: 2,
            n_positions: 8,
            ..Gpt2Config::default()
        });
        config.bert = Some(BertConfig {
            n_layer: 2,
            n_embd: 16,
            n_head: 2,
            n_inner: 32,
            n_positions: 8,
            ..BertConfig::default()
        });
        let input = InputShape {
            channels,
            height: size,
            width: size,
        };
        Model::build(&config, input, 10, Device::Cpu).unwrap()
    }

    #[test]
    fn blocks_and_stages_of_the_zoo() {
        let paths = |name, unit| unit_paths(&build(name, 3, 32), unit);
        assert_eq!(
            paths(ModelName::Gpt2, Unit::Block),
            ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
        );
        assert_eq!(paths(ModelName::Gpt2, Unit::Stage), ["transformer.h"]);
        assert_eq!(
            paths(ModelName::Bert, Unit::Block),
            ["bert.encoder.layer.0", "bert.encoder.layer.1"]
        );
        let resnet = paths(ModelName::Resnet20, Unit::Block);
        assert_eq!(resnet.len(), 9);
        assert_eq!(
            (resnet[0].as_str(), resnet[8].as_str()),
            ("layer1.0", "layer3.2")
        );
        assert_eq!(
            paths(ModelName::Resnet20, Unit::Stage),
            ["layer1", "layer2", "layer3"]
        );
        assert_eq!(paths(ModelName::Resnet50, Unit::Block).len(), 16);
        assert_eq!(paths(ModelName::VitTiny, Unit::Block).len(), 12);
        assert_eq!(
            paths(ModelName::Airbench, Unit::Block),
            ["layers.1", "layers.2", "layers.3"]
        );
        assert!(paths(ModelName::Airbench, Unit::Stage).is_empty());
        for name in [ModelName::Mlp, ModelName::Cnn] {
            assert!(paths(name, Unit::Block).is_empty(), "{name:?}");
            assert!(paths(name, Unit::Stage).is_empty(), "{name:?}");
        }
    }

    #[test]
    fn direct_children_only() {
        assert!(is_child("", "a"));
        assert!(is_child("a", "a.b"));
        assert!(!is_child("a", "a.b.c"));
        assert!(!is_child("a", "ab.c"));
        assert!(!is_child("a", "a"));
    }
}
