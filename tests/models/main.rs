//! The model zoo and language-model work: GPT-2, Llama, BERT, ViT, TorchScript models, generation,
//! LoRA, chat data, fine-tuning, export to and import from PyTorch, timm and Hugging Face, mixed
//! precision.
//!
//! One of the few test binaries (tests/Cargo.toml): cargo links it once, and its tests share one
//! pool of test threads. Each file below is one feature or method; docs/testing.md lists them.

mod activation_checkpointing;
mod amp_fp16;
mod bert;
mod chat;
mod export;
mod finetune;
mod generate;
mod gpt2;
mod language_model;
mod llama;
mod lora;
mod masked_lm;
mod torchscript;
mod vit;
