//! Unit tests of `loader`.
use super::super::transforms::{HorizontalFlip, Normalize, RandomCrop};
use super::super::ImageDataset;
use super::*;
use crate::data::source::SampleData;
use std::collections::HashSet;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

fn dataset(n: usize) -> Arc<ImageDataset> {
    Arc::new(ImageDataset::synthetic(11, n, 1, 6, 6, 4).unwrap())
}

fn augment() -> Arc<Vec<Transform>> {
    Arc::new(vec![
        Transform::RandomCrop(RandomCrop {
            size: 6,
            padding: 2,
        }),
        Transform::HorizontalFlip(HorizontalFlip { p: 0.5 }),
        Transform::Normalize(Normalize {
            mean: vec![0.5],
            std: vec![0.25],
        }),
    ])
}

fn loader(n: usize, batch_size: usize, workers: usize, drop_last: bool) -> Loader {
    let options = LoaderOptions {
        batch_size,
        shuffle: true,
        drop_last,
        seed: 42,
        workers,
        prefetch: 2,
    };
    Loader::new(dataset(n), augment(), options).unwrap()
}

fn collect(loader: &Loader, epoch: u64, start: u64) -> Vec<HostBatch> {
    loader
        .epoch(epoch, start)
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

#[test]
fn identical_for_any_worker_count() {
    let reference = collect(&loader(53, 8, 0, false), 3, 0);
    assert_eq!(reference.len(), 7);
    for workers in [1, 3, 16] {
        assert_eq!(
            collect(&loader(53, 8, workers, false), 3, 0),
            reference,
            "{workers} workers"
        );
    }
}

#[test]
fn resume_yields_the_tail_of_a_full_pass() {
    for workers in [0, 2] {
        let l = loader(53, 8, workers, false);
        let full = collect(&l, 1, 0);
        for start in [0, 1, 4, 6] {
            assert_eq!(
                collect(&l, 1, start),
                full[start as usize..],
                "start {start}"
            );
        }
        assert!(collect(&l, 1, 7).is_empty());
        assert!(collect(&l, 1, 100).is_empty());
    }
}

#[test]
fn every_sample_once_per_epoch_with_indices_and_shapes() {
    // Without transforms each sample's pixels identify it.
    let ds = Arc::new(
        ImageDataset::new(
            1,
            1,
            2,
            (0..100u8).collect(),
            (0..50).map(|i| i % 3).collect(),
            3,
        )
        .unwrap(),
    );
    let options = LoaderOptions {
        workers: 2,
        ..LoaderOptions::new(7)
    };
    let l = Loader::new(ds, Arc::new(vec![]), options).unwrap();
    let batches = collect(&l, 0, 0);
    let mut seen = HashSet::new();
    for (i, b) in batches.iter().enumerate() {
        assert_eq!(b.index, i as u64);
        let size = if i < 7 { 7 } else { 1 };
        assert_eq!(b.input_shape(), vec![size, 1, 1, 2]);
        assert_eq!(b.pixels().unwrap().len(), size * 2);
        assert_eq!(b.target.len(), size);
        let Some(Pixels::Bytes(bytes)) = b.pixels() else {
            panic!("without transforms the pixels stay u8");
        };
        for (pixels, &label) in bytes.chunks(2).zip(&b.target) {
            let sample = i64::from(pixels[0]) / 2;
            assert_eq!(label, sample % 3);
            assert!(seen.insert(sample));
        }
    }
    assert_eq!(seen.len(), 50);
}

#[test]
fn drop_last_behaviour() {
    let keep = loader(53, 8, 0, false);
    let drop = loader(53, 8, 0, true);
    assert_eq!((keep.batches_per_epoch(), drop.batches_per_epoch()), (7, 6));
    let kept = collect(&keep, 0, 0);
    assert_eq!(kept.last().unwrap().len(), 5);
    let dropped = collect(&drop, 0, 0);
    assert_eq!(dropped.len(), 6);
    assert!(dropped.iter().all(|b| b.len() == 8));
    assert_eq!(dropped[..], kept[..6]);
    assert_eq!(loader(48, 8, 0, true).batches_per_epoch(), 6);
    assert_eq!(loader(48, 8, 0, false).batches_per_epoch(), 6);
    assert_eq!(loader(5, 8, 0, true).batches_per_epoch(), 0);
}

#[test]
fn epochs_differ_and_repeat() {
    let l = loader(40, 10, 1, false);
    let e0 = collect(&l, 0, 0);
    assert_eq!(collect(&l, 0, 0), e0);
    let e1 = collect(&l, 1, 0);
    assert_ne!(e0[0].target, e1[0].target);
    assert_ne!(e0[0].input, e1[0].input);
    let other_seed = Loader::new(
        dataset(40),
        augment(),
        LoaderOptions {
            seed: 43,
            ..l.options().clone()
        },
    )
    .unwrap();
    assert_ne!(collect(&other_seed, 0, 0)[0].input, e0[0].input);
}

#[test]
fn no_shuffle_keeps_order() {
    let options = LoaderOptions {
        shuffle: false,
        ..LoaderOptions::new(4)
    };
    let l = Loader::new(dataset(10), Arc::new(vec![]), options).unwrap();
    let targets: Vec<i64> = collect(&l, 5, 0)
        .into_iter()
        .flat_map(|b| b.target)
        .collect();
    assert_eq!(targets, (0..10).map(|i| i % 4).collect::<Vec<_>>());
}

#[test]
fn output_shape_follows_transforms() {
    let transforms = Arc::new(vec![Transform::RandomCrop(RandomCrop {
        size: 8,
        padding: 1,
    })]);
    let l = Loader::new(dataset(9), transforms, LoaderOptions::new(4)).unwrap();
    assert_eq!(l.sample_shape(), (1, 8, 8));
    let b = collect(&l, 0, 0);
    assert_eq!(b[0].input_shape(), vec![4, 1, 8, 8]);
    assert_eq!(b[2].input_shape(), vec![1, 1, 8, 8]);
}

#[test]
fn invalid_settings_rejected() {
    let msg = Loader::new(dataset(4), Arc::new(vec![]), LoaderOptions::new(0))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("batch_size"), "{msg}");
    let options = LoaderOptions {
        prefetch: 0,
        ..LoaderOptions::new(2)
    };
    assert!(Loader::new(dataset(4), Arc::new(vec![]), options).is_err());
    let too_big = Arc::new(vec![Transform::RandomCrop(RandomCrop {
        size: 99,
        padding: 0,
    })]);
    let msg = Loader::new(dataset(4), too_big, LoaderOptions::new(2))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("transform 0") && msg.contains("random_crop"),
        "{msg}"
    );
}

#[test]
fn worker_panic_is_an_error_not_a_hang() {
    let producer: Producer = Arc::new(|batch| {
        if batch == 5 {
            panic!("boom at five");
        }
        Ok(HostBatch {
            input: HostInput::Pixels {
                data: Pixels::Bytes(vec![]),
                shape: [0, 1, 1, 1],
                normalize: None,
            },
            target: vec![],
            index: batch,
        })
    });
    for workers in [0, 1, 3] {
        let results: Vec<_> = EpochIter::new(Arc::clone(&producer), 2, 10, workers, 1).collect();
        assert_eq!(
            results.len(),
            4,
            "{workers} workers: 2, 3, 4, then the error"
        );
        assert!(results[..3].iter().all(Result::is_ok));
        let msg = results[3].as_ref().unwrap_err().to_string();
        assert!(
            msg.contains("batch 5") && msg.contains("boom at five"),
            "{msg}"
        );
    }
}

#[test]
fn dropping_the_iterator_stops_workers_promptly() {
    let made = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&made);
    let producer: Producer = Arc::new(move |batch| {
        counter.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        Ok(HostBatch {
            input: HostInput::Pixels {
                data: Pixels::Bytes(vec![0; 16]),
                shape: [1, 1, 4, 4],
                normalize: None,
            },
            target: vec![0],
            index: batch,
        })
    });
    let mut iter = EpochIter::new(producer, 0, 1_000_000, 3, 1);
    assert_eq!(iter.next().unwrap().unwrap().index, 0);
    let started = Instant::now();
    drop(iter);
    assert!(started.elapsed() < Duration::from_secs(2));
    // Each worker holds at most one queued batch, one blocked in send and one in progress.
    assert!(made.load(Ordering::SeqCst) <= 1 + 3 * 3, "{made:?}");
}

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

/// The rows of `b` (pixels and target) as (target, pixel bytes) pairs, order-free.
fn rows(b: &HostBatch) -> Vec<(i64, Vec<u32>)> {
    let pixels = b.input_f32().unwrap();
    let per = pixels.len() / b.len().max(1);
    (0..b.len())
        .map(|i| {
            let row = pixels[i * per..(i + 1) * per].iter().map(|v| v.to_bits());
            (b.target[i], row.collect())
        })
        .collect()
}

#[test]
fn ranks_together_serve_the_global_batches() {
    // 64 samples, 2 ranks of batch 8 = one loader of batch 16: same samples in every batch,
    // same augmentation draws (keyed by the global position), same number of batches.
    let global = collect(&loader(64, 16, 0, false), 2, 0);
    let shards: Vec<Vec<HostBatch>> = (0..2)
        .map(|r| collect(&loader(64, 8, 1, false).shard(r, 2, true), 2, 0))
        .collect();
    assert_eq!(shards[0].len(), global.len());
    assert_eq!(shards[1].len(), global.len());
    for (b, whole) in global.iter().enumerate() {
        let mut expected = rows(whole);
        let mut got: Vec<_> = shards.iter().flat_map(|s| rows(&s[b])).collect();
        expected.sort();
        got.sort();
        assert_eq!(got, expected, "batch {b}");
    }
    // Resuming a shard at batch 3 yields the tail of its full pass.
    let tail = collect(&loader(64, 8, 0, false).shard(1, 2, true), 2, 3);
    assert_eq!(tail, shards[1][3..]);
}

#[test]
fn training_shards_are_padded_evaluation_shards_are_not() {
    // 53 samples on 4 ranks: padded, every rank gets 14 (3 samples served twice); unpadded,
    // 14, 13, 13, 13 and each sample exactly once.
    let padded: Vec<Loader> = (0..4)
        .map(|r| loader(53, 5, 0, false).shard(r, 4, true))
        .collect();
    assert!(padded
        .iter()
        .all(|l| l.len() == 14 && l.batches_per_epoch() == 3));
    let exact: Vec<Loader> = (0..4)
        .map(|r| loader(53, 5, 0, false).shard(r, 4, false))
        .collect();
    let lens: Vec<usize> = exact.iter().map(Loader::len).collect();
    assert_eq!(lens, [14, 13, 13, 13]);
    let orders: Vec<u32> = exact.iter().flat_map(|l| l.order(0)).collect();
    let distinct: HashSet<u32> = orders.iter().copied().collect();
    assert_eq!((orders.len(), distinct.len()), (53, 53));
    let padded_orders: Vec<u32> = padded.iter().flat_map(|l| l.order(0)).collect();
    let distinct: HashSet<u32> = padded_orders.iter().copied().collect();
    assert_eq!((padded_orders.len(), distinct.len()), (56, 53));
}

/// A method's transform in tests: `1 - x` (computes new values, so it needs floats).
struct Invert;

impl crate::data::SampleFn for Invert {
    fn output_shape(&self, shape: (usize, usize, usize)) -> Result<(usize, usize, usize), String> {
        Ok(shape)
    }

    fn apply(
        &self,
        sample: &mut Sample,
        _rng: &mut dyn rand::RngCore,
        _at: tessera_plugin_api::SamplePlace,
    ) -> Result<(), String> {
        sample.data.iter_mut().for_each(|v| *v = 1.0 - *v);
        Ok(())
    }
}

fn invert() -> Transform {
    Transform::Method(crate::data::MethodTransform {
        method: "invert".into(),
        transform: Arc::new(Invert),
    })
}

/// The batches of `loader`'s epoch as the loader made them before it left the scaling and the
/// normalization to the device: every transform on the `f32` values, sample by sample.
fn all_on_host_f32(l: &Loader, transforms: &[Transform], epoch: u64) -> Vec<Vec<f32>> {
    let Source::Images { dataset, .. } = &l.source else {
        panic!("an image loader");
    };
    let order = l.order(epoch);
    let transform_key = TransformKey {
        key: key(l.options.seed, epoch, *b"transfrm"),
        rank: 0,
        world: 1,
        epoch,
    };
    let (c, h, w) = dataset.shape();
    order
        .chunks(l.options.batch_size)
        .enumerate()
        .map(|(b, indices)| {
            let mut values = Vec::new();
            for (i, &index) in indices.iter().enumerate() {
                let (data, _) = dataset.read(index as usize).unwrap().unwrap();
                let SampleData::Pixels(pixels) = data else {
                    panic!("an in-memory dataset serves pixels");
                };
                let mut sample = Sample::from_u8(&pixels, c, h, w);
                let mut rng = transform_key.rng(b * l.options.batch_size + i);
                for t in transforms {
                    t.apply(&mut sample, &mut rng).unwrap();
                }
                values.extend(sample.data);
            }
            values
        })
        .collect()
}

#[test]
fn crops_and_flips_keep_u8_and_the_normalization_is_left_to_the_device() {
    let l = loader(29, 8, 2, false);
    assert!(l.serves_bytes());
    let batches = collect(&l, 1, 0);
    let reference = all_on_host_f32(&l, &augment(), 1);
    assert_eq!(batches.len(), reference.len());
    for (b, expected) in batches.iter().zip(&reference) {
        let HostInput::Pixels {
            data: Pixels::Bytes(bytes),
            normalize,
            ..
        } = &b.input
        else {
            panic!("u8 pixels");
        };
        assert_eq!(bytes.len(), expected.len());
        assert_eq!(b.input_size_in_bytes(), expected.len());
        assert_eq!(
            normalize.as_deref(),
            Some(&Normalize {
                mean: vec![0.5],
                std: vec![0.25]
            })
        );
        // Moving u8 pixels then scaling them is exactly scaling then moving: same bits.
        assert_eq!(b.input_f32().as_ref(), Some(expected));
    }
}

#[test]
fn a_transform_that_computes_values_makes_floats_from_there_on() {
    // crop, flip (u8), invert (f32), normalize (device).
    let mut transforms = augment().to_vec();
    transforms.insert(2, invert());
    let l = Loader::new(
        dataset(21),
        Arc::new(transforms.clone()),
        LoaderOptions::new(8),
    )
    .unwrap();
    assert!(!l.serves_bytes());
    let batches = collect(&l, 0, 0);
    let reference = all_on_host_f32(&l, &transforms, 0);
    for (b, expected) in batches.iter().zip(&reference) {
        let HostInput::Pixels {
            data: Pixels::Floats(values),
            normalize,
            ..
        } = &b.input
        else {
            panic!("f32 values");
        };
        assert!(
            normalize.is_some(),
            "the final normalize still runs on the device"
        );
        assert_eq!(b.input_size_in_bytes(), 4 * values.len());
        assert_eq!(b.input_f32().as_ref(), Some(expected));
    }
    // A normalize that is not last runs on the host, with what follows it.
    let transforms = vec![augment()[2].clone(), augment()[1].clone()];
    let l = Loader::new(
        dataset(21),
        Arc::new(transforms.clone()),
        LoaderOptions::new(8),
    )
    .unwrap();
    let b = collect(&l, 0, 0);
    let HostInput::Pixels {
        data: Pixels::Floats(values),
        normalize: None,
        ..
    } = &b[0].input
    else {
        panic!("f32 values, normalized on the host");
    };
    assert_eq!(values, &all_on_host_f32(&l, &transforms, 0)[0]);
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
