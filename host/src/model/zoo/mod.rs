//! The model zoo: whole models, each built from the generic layers of [`super::layers`] and,
//! for the transformers, layers of its own (one folder a model, one concept a file), named as
//! their PyTorch counterparts so weights map 1:1 to a PyTorch `state_dict`.

pub mod bert;
pub mod gpt2;
pub mod llama;
mod transformer;
mod vision;
pub mod vit;

pub use bert::{Bert, BertConfig, BertHead, BertLayer, BertModel};
pub use gpt2::{Gpt2Attention, Gpt2Block, Gpt2LmHeadModel, Gpt2Mlp, Gpt2Model};
pub use llama::{
    LlamaAttention, LlamaBlock, LlamaConfig, LlamaForCausalLm, LlamaMlp, LlamaModel, RopeScaling,
};
pub use vision::{
    airbench, airbench_whiten_width, cnn, imagenet_resnet, mlp, resnet, ImagenetDepth,
};
pub use vit::{PatchEmbed, VisionTransformer, VitAttention, VitBlock, VitConfig, VitMlp};
