//! The kv cache's steps give the logits of whole-sequence forwards, for left-padded rows too.

use tch::{Device, Kind, Tensor};

use crate::model::layers::KvCache;
use crate::model::{Gpt2Config, InputShape, LlamaConfig, Model, ModelConfig, ModelName};

const VOCAB: i64 = 50;

fn models() -> Vec<(&'static str, Model)> {
    let input = InputShape {
        channels: 1,
        height: 1,
        width: 1,
    };
    tch::manual_seed(3);
    let llama = ModelConfig {
        llama: Some(LlamaConfig {
            num_hidden_layers: 2,
            hidden_size: 32,
            intermediate_size: 48,
            num_attention_heads: 4,
            num_key_value_heads: Some(2),
            max_position_embeddings: 64,
            initializer_range: 0.3,
            ..LlamaConfig::default()
        }),
        ..ModelConfig::new(ModelName::Llama, VOCAB as usize)
    };
    let gpt2 = ModelConfig {
        gpt2: Some(Gpt2Config {
            n_layer: 2,
            n_head: 2,
            n_embd: 32,
            n_positions: 64,
            ..Gpt2Config::default()
        }),
        ..ModelConfig::new(ModelName::Gpt2, VOCAB as usize)
    };
    [("llama", llama), ("gpt2", gpt2)]
        .into_iter()
        .map(|(name, c)| (name, Model::build(&c, input, VOCAB, Device::Cpu).unwrap()))
        .collect()
}

/// The last position's logits of `tokens` run whole.
fn whole(model: &Model, tokens: &[i64]) -> Tensor {
    let ids = Tensor::from_slice(tokens).view([1, -1]);
    model.forward(&ids, false).unwrap().select(1, -1).squeeze()
}

#[test]
fn cached_steps_give_whole_sequence_logits_for_padded_rows() {
    let _no_grad = tch::no_grad_guard();
    for (name, model) in models() {
        // Two rows: 7 prompt tokens and 3 (left-padded by 4), then 4 steps of one token each.
        let mut rows = vec![vec![5i64, 9, 2, 41, 7, 7, 30], vec![11i64, 3, 48]];
        let width = 7;
        let mut ids = Vec::new();
        let mut real = Vec::new();
        for r in &rows {
            let pad = width - r.len();
            ids.extend(std::iter::repeat_n(0, pad).chain(r.iter().copied()));
            real.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1, r.len())));
        }
        let mut input = Tensor::from_slice(&ids).view([2, width as i64]);
        let mut real = Tensor::from_slice(&real).view([2, width as i64]);
        let mut cache = KvCache::new();
        for step in 0..5 {
            let new = input.size()[1];
            cache.begin_step(&real, new).unwrap();
            let logits = model.root.forward_cached(&input, &mut cache).unwrap();
            cache.end_step(new);
            assert_eq!(logits.size(), [2, 1, VOCAB], "{name}");
            for (i, row) in rows.iter().enumerate() {
                let want = whole(&model, row);
                let got = logits.get(i as i64).squeeze();
                let diff = (&got - &want).abs().max().double_value(&[]);
                let scale = want.abs().max().double_value(&[]);
                assert!(
                    diff <= 1e-5 * scale.max(1.0),
                    "{name} step {step} row {i}: {diff:e}"
                );
            }
            let next = [
                (step * 7 + 1) as i64 % VOCAB,
                (step * 13 + 4) as i64 % VOCAB,
            ];
            for (row, token) in rows.iter_mut().zip(next) {
                row.push(token);
            }
            input = Tensor::from_slice(&next).view([2, 1]);
            real = Tensor::cat(
                &[&real, &Tensor::ones([2, 1], (Kind::Int64, Device::Cpu))],
                1,
            );
        }
        assert!(cache.unsupported_kind().is_none());
    }
}

#[test]
fn a_shrunk_batch_keeps_each_row_exact() {
    let _no_grad = tch::no_grad_guard();
    for (name, model) in models() {
        let mut rows = vec![vec![1i64, 2, 3, 4, 5, 6], vec![7i64, 8]];
        let ids = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6, 0, 0, 0, 0, 7, 8]).view([2, 6]);
        let mut real = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1]).view([2, 6]);
        let mut cache = KvCache::new();
        cache.begin_step(&real, 6).unwrap();
        let logits = model.root.forward_cached(&ids, &mut cache).unwrap();
        assert_eq!(logits.size(), [2, 1, VOCAB], "{name}");
        cache.end_step(6);
        // The first row ends: the second keeps its 2 tokens, its 4 padding columns dropped.
        let kept = Tensor::from_slice(&[1i64]);
        cache.keep(&kept, 4).unwrap();
        real = real.index_select(0, &kept).narrow(1, 4, 2);
        rows.remove(0);
        for token in [9i64, 10, 11] {
            rows[0].push(token);
            real = Tensor::cat(
                &[&real, &Tensor::ones([1, 1], (Kind::Int64, Device::Cpu))],
                1,
            );
            cache.begin_step(&real, 1).unwrap();
            let logits = model
                .root
                .forward_cached(&Tensor::from_slice(&[token]).view([1, 1]), &mut cache)
                .unwrap();
            cache.end_step(1);
            let want = whole(&model, &rows[0]);
            let diff = (logits.squeeze() - &want).abs().max().double_value(&[]);
            assert!(
                diff <= 1e-5 * want.abs().max().double_value(&[]).max(1.0),
                "{name}: {diff:e}"
            );
        }
        assert_eq!(cache.past(), 5, "{name}");
    }
}
