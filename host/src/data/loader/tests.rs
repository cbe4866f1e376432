//! Unit tests of `loader`.
use super::super::transforms::{HorizontalFlip, Normalize, RandomCrop};
use super::super::ImageDataset;
use super::*;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub(super) fn dataset(n: usize) -> Arc<ImageDataset> {
    Arc::new(ImageDataset::synthetic(11, n, 1, 6, 6, 4).unwrap())
}

pub(super) fn augment() -> Arc<Vec<Transform>> {
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

pub(super) fn loader(n: usize, batch_size: usize, workers: usize, drop_last: bool) -> Loader {
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

pub(super) fn collect(loader: &Loader, epoch: u64, start: u64) -> Vec<HostBatch> {
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
