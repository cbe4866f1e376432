//! Unit tests of `mlm`: the masking's statistics against Hugging Face's rates, special tokens
//! left alone, and masks that depend on (seed, epoch, split, index) only.
use std::sync::Arc;

use super::*;

/// A vocabulary of 1000 ids with `[PAD]`..`[MASK]` reserved at 1000..1003 and eos 0.
fn specials() -> SpecialTokens {
    SpecialTokens::new(1000, Some(0), |_| None)
}

/// Counts of a masking of `n` ordinary tokens: (selected, became [MASK], became another id,
/// kept their id).
fn counts(cfg: &MlmConfig, n: usize, seed: u64) -> (usize, usize, usize, usize) {
    let s = specials();
    let ids: Vec<u32> = (0..n).map(|i| 1 + (i % 997) as u32).collect();
    let (mut input, mut target) = (Vec::new(), Vec::new());
    mask_tokens(
        &ids,
        cfg,
        &s,
        &mut sample_rng(seed, 0, MlmSplit::Train, 0),
        &mut input,
        &mut target,
    );
    assert_eq!((input.len(), target.len()), (n, n));
    let (mut selected, mut masked, mut random, mut kept) = (0, 0, 0, 0);
    for ((&id, &x), &y) in ids.iter().zip(&input).zip(&target) {
        if y == IGNORE_TARGET {
            assert_eq!(x, i64::from(id), "an unselected position keeps its token");
            continue;
        }
        assert_eq!(y, i64::from(id), "the target is the original id");
        selected += 1;
        if x == i64::from(s.mask) {
            masked += 1;
        } else if x == i64::from(id) {
            kept += 1;
        } else {
            assert!((0..s.vocab_size as i64).contains(&x), "{x}");
            random += 1;
        }
    }
    (selected, masked, random, kept)
}

/// The masking's rates on 200 000 tokens. Each count is binomial; the tolerance is 5 standard
/// deviations `sqrt(p (1 - p) / n)` of the observed fraction (a false failure has a chance below
/// 1e-6 per check). Selected: p = 0.15, n = 200 000, sd 0.0008, so ±0.004. Of the ~30 000
/// selected: [MASK] p = 0.8, sd 0.0023, ±0.012; random p = 0.1 (less the 1/1004 chance the
/// draw is the token itself or [MASK], counted as kept or masked: 1e-4, far inside), sd 0.0017,
/// ±0.009; kept likewise ±0.009.
#[test]
fn selection_and_replacement_rates_match_hugging_face() {
    let n = 200_000;
    let (selected, masked, random, kept) = counts(&MlmConfig::default(), n, 17);
    let within = |observed: usize, of: usize, p: f64| {
        let fraction = observed as f64 / of as f64;
        let tolerance = 5.0 * (p * (1.0 - p) / of as f64).sqrt();
        assert!(
            (fraction - p).abs() < tolerance,
            "{observed}/{of} = {fraction}, expected {p} ± {tolerance}"
        );
    };
    within(selected, n, 0.15);
    within(masked, selected, 0.8);
    within(random, selected, 0.1);
    within(kept, selected, 0.1);
    assert_eq!(masked + random + kept, selected);
    // Other settings move the rates with them.
    let cfg = MlmConfig {
        probability: 0.3,
        mask_fraction: 0.5,
        random_fraction: 0.5,
    };
    let (selected, masked, random, kept) = counts(&cfg, n, 18);
    within(selected, n, 0.3);
    within(masked, selected, 0.5);
    assert!(
        kept < selected / 500,
        "{kept}: only a random draw of the same id keeps it"
    );
    assert_eq!(masked + random + kept, selected);
    // probability 1, mask_fraction 1: every ordinary token becomes [MASK].
    let all = MlmConfig {
        probability: 1.0,
        mask_fraction: 1.0,
        random_fraction: 0.0,
    };
    assert_eq!(counts(&all, 1000, 1), (1000, 1000, 0, 0));
}

#[test]
fn special_tokens_are_never_selected() {
    let s = specials();
    let all = MlmConfig {
        probability: 1.0,
        mask_fraction: 1.0,
        random_fraction: 0.0,
    };
    let ids = [0, 5, s.pad, 6, s.cls, s.sep, s.mask, 7];
    let (mut input, mut target) = (Vec::new(), Vec::new());
    mask_tokens(
        &ids,
        &all,
        &s,
        &mut sample_rng(1, 0, MlmSplit::Train, 0),
        &mut input,
        &mut target,
    );
    let m = i64::from(s.mask);
    let keep = |id: u32| i64::from(id);
    assert_eq!(
        input,
        [
            keep(0),
            m,
            keep(s.pad),
            m,
            keep(s.cls),
            keep(s.sep),
            keep(s.mask),
            m
        ]
    );
    assert_eq!(target, [-100, 5, -100, 6, -100, -100, -100, 7]);
}

fn masked(split: MlmSplit, seed: u64) -> MaskedSequences {
    let stream: Vec<u32> = (0..4001).map(|i| 1 + (i % 900) as u32).collect();
    let packed = PackedSequences::new(Arc::new(stream), 100).unwrap();
    MaskedSequences::new(packed, MlmConfig::default(), specials(), seed, split)
}

fn sample(m: &MaskedSequences, index: usize, epoch: u64) -> (Vec<i64>, Vec<i64>) {
    let (mut input, mut target) = (Vec::new(), Vec::new());
    m.write(index, epoch, &mut input, &mut target);
    (input, target)
}

#[test]
fn masks_depend_on_seed_epoch_split_and_index_only() {
    let train = masked(MlmSplit::Train, 7);
    assert_eq!((train.len(), train.seq_len()), (40, 100));
    // The same sample, however often and in whatever order it is read.
    let first = sample(&train, 3, 2);
    let _ = sample(&train, 9, 2);
    assert_eq!(sample(&train, 3, 2), first);
    assert_eq!(sample(&masked(MlmSplit::Train, 7), 3, 2), first);
    // Another index, epoch, seed or split masks otherwise (the input ids at 3 and 4 differ too,
    // but the targets' positions alone show it: 100 positions at p = 0.15 agreeing by chance has
    // a probability far below 1e-9).
    let positions = |(_, t): &(Vec<i64>, Vec<i64>)| -> Vec<bool> {
        t.iter().map(|&y| y != IGNORE_TARGET).collect()
    };
    for other in [
        sample(&train, 4, 2),
        sample(&train, 3, 3),
        sample(&masked(MlmSplit::Train, 8), 3, 2),
        sample(&masked(MlmSplit::Eval, 7), 3, 2),
    ] {
        assert_ne!(positions(&other), positions(&first));
    }
    // The input is sequence 3's tokens where not selected.
    let (input, target) = &first;
    for (t, (&x, &y)) in input.iter().zip(target).enumerate() {
        if y == IGNORE_TARGET {
            assert_eq!(x, i64::from(1 + ((300 + t) % 900) as u32));
        }
    }
}
