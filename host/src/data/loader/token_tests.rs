//! The loader's batches of token sequences: packed, masked-LM and labelled text.

use super::tests::collect;
use super::*;
use std::collections::HashSet;
use std::sync::Arc;

#[test]
fn token_batches_are_shuffled_sequences_with_shifted_targets() {
    use super::super::PackedSequences;
    let stream: Vec<u32> = (0..101).collect();
    let seqs = Arc::new(PackedSequences::new(Arc::new(stream), 10).unwrap());
    let options = |workers| LoaderOptions {
        batch_size: 4,
        shuffle: true,
        drop_last: true,
        seed: 7,
        workers,
        prefetch: 2,
    };
    let loader = Loader::tokens(seqs.clone(), options(0)).unwrap();
    assert!(loader.is_tokens());
    assert_eq!(loader.sample_shape(), (1, 1, 10));
    assert_eq!(loader.batches_per_epoch(), 2); // 10 sequences, batches of 4, last dropped
    let batches = collect(&loader, 0, 0);
    let mut starts = HashSet::new();
    for b in &batches {
        assert_eq!(b.input_shape(), vec![4, 10]);
        assert_eq!(b.tokens(), 40);
        assert!(b.pixels().is_none());
        let HostInput::Tokens { ids, .. } = &b.input else {
            panic!("not tokens")
        };
        for (seq, tgt) in ids.chunks(10).zip(b.target.chunks(10)) {
            assert_eq!(seq[0] % 10, 0, "{seq:?}");
            for (x, y) in seq.iter().zip(tgt) {
                assert_eq!(x + 1, *y);
            }
            starts.insert(seq[0]);
        }
    }
    assert_eq!(starts.len(), 8);
    // The same for any worker count, another order in another epoch, resumable mid-epoch.
    assert_eq!(
        collect(&Loader::tokens(seqs.clone(), options(3)).unwrap(), 0, 0),
        batches
    );
    assert_ne!(collect(&loader, 1, 0), batches);
    assert_eq!(collect(&loader, 0, 1), batches[1..]);
}

/// Masked-LM sequences of 0..N (every id ordinary), with [MASK] etc. reserved after 5000.
fn masked_source() -> Arc<crate::data::MaskedSequences> {
    use crate::data::{MaskedSequences, MlmConfig, MlmSplit, PackedSequences, SpecialTokens};
    let stream: Vec<u32> = (1..=2001).collect();
    let packed = PackedSequences::new(Arc::new(stream), 20).unwrap();
    let specials = SpecialTokens::new(5000, None, |_| None);
    Arc::new(MaskedSequences::new(
        packed,
        MlmConfig::default(),
        specials,
        11,
        MlmSplit::Train,
    ))
}

fn token_options(batch_size: usize, workers: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size,
        shuffle: true,
        drop_last: true,
        seed: 3,
        workers,
        prefetch: 2,
    }
}

/// (input row, target row) pairs of a token batch, sorted: order-free.
fn token_rows(batches: &[HostBatch]) -> Vec<(Vec<i64>, Vec<i64>)> {
    let mut rows = Vec::new();
    for b in batches {
        let HostInput::Tokens { ids, shape, .. } = &b.input else {
            panic!("not tokens")
        };
        let per_target = b.target.len() / shape[0];
        for (x, y) in ids.chunks(shape[1]).zip(b.target.chunks(per_target)) {
            rows.push((x.to_vec(), y.to_vec()));
        }
    }
    rows.sort();
    rows
}

#[test]
fn masked_lm_batches_are_the_same_resumed_on_any_workers_and_ranks() {
    let source = masked_source();
    let loader = Loader::tokens(source.clone(), token_options(8, 0)).unwrap();
    assert!(loader.is_language());
    let batches = collect(&loader, 2, 0);
    assert_eq!(batches.len(), 12); // 100 sequences, batches of 8
    for b in &batches {
        let HostInput::Tokens {
            targets,
            attention_mask,
            ..
        } = &b.input
        else {
            panic!("not tokens")
        };
        assert_eq!((*targets, attention_mask), (TokenTargets::PerToken, &None));
        assert_eq!(b.target.len(), 8 * 20);
        assert!(b.target.contains(&-100) && b.target.iter().any(|&t| t > 0));
    }
    // Resumed at batch 5: the same batches, masks included.
    assert_eq!(collect(&loader, 2, 5), batches[5..]);
    assert_eq!(
        collect(
            &Loader::tokens(source.clone(), token_options(8, 3)).unwrap(),
            2,
            0
        ),
        batches
    );
    // Two ranks of batch 4 together serve what one process of batch 8 does, with the same
    // masks: they are drawn per sample, not per batch or rank.
    let ranks: Vec<HostBatch> = (0..2)
        .flat_map(|rank| {
            let l = Loader::tokens(source.clone(), token_options(4, 0))
                .unwrap()
                .shard(rank, 2, true);
            collect(&l, 2, 0)
        })
        .collect();
    assert_eq!(token_rows(&ranks), token_rows(&batches));
    // Another epoch draws other masks of the same sequences.
    assert_ne!(token_rows(&collect(&loader, 3, 0)), token_rows(&batches));
}

#[test]
fn labelled_batches_carry_class_targets_and_attention_masks() {
    use crate::data::{LabelledSequences, SpecialTokens};
    let specials = SpecialTokens::new(100, None, |_| None); // pad 100, cls 101, sep 102
    let texts: Vec<Vec<u32>> = (0..10).map(|i| (0..i as u32).collect()).collect();
    let labels: Vec<i64> = (0..10).map(|i| i % 3).collect();
    let source = Arc::new(LabelledSequences::new(texts, labels, 6, specials).unwrap());
    let loader = Loader::tokens(source.clone(), token_options(4, 0)).unwrap();
    assert!(loader.is_tokens() && !loader.is_language());
    let batches = collect(&loader, 0, 0);
    assert_eq!(batches.len(), 2);
    for b in &batches {
        let HostInput::Tokens {
            ids,
            shape,
            targets,
            attention_mask,
            token_type_ids,
        } = &b.input
        else {
            panic!("not tokens")
        };
        assert_eq!(token_type_ids, &None, "single texts have no token types");
        assert_eq!((*shape, *targets), ([4, 6], TokenTargets::PerSequence));
        let mask = attention_mask.as_ref().unwrap();
        assert_eq!(b.target.len(), 4);
        for ((row, m), &class) in ids.chunks(6).zip(mask.chunks(6)).zip(&b.target) {
            // The text of length n holds 0..n, so its length (truncated at 4) tells the
            // sample, and the class is its index mod 3 — unless truncation hid the index.
            let real = m.iter().filter(|&&v| v == 1).count();
            assert_eq!(row[0], 101);
            assert_eq!(row[real - 1], 102);
            assert!(row[real..].iter().all(|&t| t == 100));
            assert!(m[..real].iter().all(|&v| v == 1));
            if real < 6 {
                assert_eq!(class, (real as i64 - 2) % 3);
            }
        }
    }
    assert_eq!(collect(&loader, 0, 1), batches[1..]);
}

#[test]
fn an_evaluation_subset_of_labelled_text_is_stratified_by_class() {
    use crate::data::{LabelledSequences, SpecialTokens};
    let specials = SpecialTokens::new(100, None, |_| None);
    // 90 texts of class 0, then 30 of class 1: a first-N subset would hold class 0 only.
    let labels: Vec<i64> = (0..120).map(|i| i64::from(i >= 90)).collect();
    let texts = vec![vec![1, 2]; 120];
    let source = Arc::new(LabelledSequences::new(texts, labels, 4, specials).unwrap());
    let loader = Loader::tokens(source, token_options(8, 0)).unwrap();
    let (subset, choice) = loader.subset(40, 5).unwrap();
    assert!(choice.stratified);
    assert_eq!(subset.len(), 40);
    let classes: Vec<i64> = collect(&subset, 0, 0)
        .iter()
        .flat_map(|b| b.target.clone())
        .collect();
    assert_eq!(
        classes.iter().filter(|&&c| c == 1).count(),
        10,
        "{classes:?}"
    );
}
