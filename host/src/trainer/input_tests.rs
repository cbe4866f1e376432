//! Unit tests of `input` (CPU).
use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::*;
use crate::data::{HorizontalFlip, ImageDataset, Loader, LoaderOptions, RandomCrop, Transforms};

fn image_loader(normalize: Option<Normalize>) -> Loader {
    let transforms = Transforms {
        normalize,
        random_crop: Some(RandomCrop {
            size: 8,
            padding: 2,
        }),
        horizontal_flip: Some(HorizontalFlip::default()),
    };
    let dataset = Arc::new(ImageDataset::synthetic(5, 37, 3, 8, 8, 10).unwrap());
    let options = LoaderOptions {
        seed: 9,
        ..LoaderOptions::new(16)
    };
    Loader::new(dataset, Arc::new(transforms.pipeline(true)), options).unwrap()
}

fn cifar_normalize() -> Normalize {
    Normalize {
        mean: vec![0.4914, 0.4822, 0.4465],
        std: vec![0.2470, 0.2435, 0.2616],
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()
}

#[test]
fn pixels_normalized_on_the_device_equal_the_host_formula_bit_for_bit_on_the_cpu() {
    for normalize in [Some(cifar_normalize()), None] {
        let loader = image_loader(normalize.clone());
        assert!(loader.serves_bytes());
        for host in loader.epoch(0, 0) {
            let host = host.unwrap();
            let batch = to_device(&host, Device::Cpu).unwrap();
            let input = batch.input().unwrap();
            assert_eq!(input.kind(), Kind::Float);
            assert_eq!(input.size(), [host.len() as i64, 3, 8, 8]);
            // `input_f32` is the loader's former host path (see the loader's tests): the
            // device's `to(float) / 255`, `- mean`, `* (1 / std)` give the same bits.
            let expected = host.input_f32().unwrap();
            let got = values(input);
            let differ = got
                .iter()
                .zip(&expected)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{normalize:?}: values differ from the host's");
            let target = Vec::<i64>::try_from(batch.target().unwrap()).unwrap();
            assert_eq!(target, host.target);
        }
    }
}

#[test]
fn floats_from_a_method_are_normalized_on_the_device_too() {
    let host = HostBatch {
        input: HostInput::Pixels {
            data: Pixels::Floats(vec![0.0, 0.5, 1.0, 0.25, 0.75, 0.125]),
            shape: [1, 2, 1, 3],
            normalize: Some(Arc::new(Normalize {
                mean: vec![0.5, 0.25],
                std: vec![0.5, 0.125],
            })),
        },
        target: vec![3],
        index: 0,
    };
    let batch = to_device(&host, Device::Cpu).unwrap();
    assert_eq!(
        values(batch.input().unwrap()),
        [-1.0, 0.0, 1.0, 0.0, 4.0, -1.0]
    );
    assert_eq!(host.input_f32().unwrap(), values(batch.input().unwrap()));
}

#[test]
fn token_batches_cross_as_int64() {
    let host = HostBatch {
        input: HostInput::Tokens {
            ids: vec![1, 2, 3, 4, 5, 6],
            shape: [2, 3],
            targets: TokenTargets::PerToken,
            attention_mask: None,
            token_type_ids: None,
        },
        target: vec![2, 3, 4, 5, 6, 7],
        index: 4,
    };
    let batch = to_device(&host, Device::Cpu).unwrap();
    let (input, target) = (batch.input().unwrap(), batch.target().unwrap());
    assert_eq!((input.kind(), input.size()), (Kind::Int64, vec![2, 3]));
    assert_eq!(target.size(), [2, 3]);
    assert_eq!(
        Vec::<i64>::try_from(target.flatten(0, -1)).unwrap(),
        host.target
    );
    assert_eq!(host.input_size_in_bytes(), 6 * 8);
    assert!(batch.get(keys::ATTENTION_MASK).is_none());
    assert!(batch.get(keys::TOKEN_TYPE_IDS).is_none());
}

#[test]
fn labelled_token_batches_carry_class_targets_and_the_attention_mask() {
    let host = HostBatch {
        input: HostInput::Tokens {
            ids: vec![9, 5, 10, 0, 9, 10, 0, 0],
            shape: [2, 4],
            targets: TokenTargets::PerSequence,
            attention_mask: Some(vec![1, 1, 1, 0, 1, 1, 0, 0]),
            token_type_ids: Some(vec![0, 0, 1, 0, 0, 0, 0, 0]),
        },
        target: vec![1, 0],
        index: 0,
    };
    let batch = to_device(&host, Device::Cpu).unwrap();
    assert_eq!(batch.input().unwrap().size(), [2, 4]);
    let target = batch.target().unwrap();
    assert_eq!((target.kind(), target.size()), (Kind::Int64, vec![2]));
    assert_eq!(Vec::<i64>::try_from(target).unwrap(), [1, 0]);
    let mask = batch.get(keys::ATTENTION_MASK).unwrap();
    assert_eq!((mask.kind(), mask.size()), (Kind::Int64, vec![2, 4]));
    assert_eq!(
        Vec::<i64>::try_from(mask.flatten(0, -1)).unwrap(),
        [1, 1, 1, 0, 1, 1, 0, 0]
    );
    let types = batch.get(keys::TOKEN_TYPE_IDS).unwrap();
    assert_eq!((types.kind(), types.size()), (Kind::Int64, vec![2, 4]));
    assert_eq!(
        Vec::<i64>::try_from(types.flatten(0, -1)).unwrap(),
        [0, 0, 1, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        batch.keys(),
        [
            keys::INPUT,
            keys::TARGET,
            keys::ATTENTION_MASK,
            keys::TOKEN_TYPE_IDS
        ]
    );
}

/// The loader's batches, with the positions of those the iterator has given out so far.
struct Counted<I> {
    inner: I,
    taken: Arc<std::sync::atomic::AtomicUsize>,
}

impl<I: Iterator> Iterator for Counted<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        let item = self.inner.next()?;
        self.taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Some(item)
    }
}

#[test]
fn train_input_serves_the_loaders_batches_in_order_fetching_one_ahead() {
    use std::sync::atomic::Ordering::SeqCst;
    let loader = image_loader(Some(cifar_normalize()));
    let expected: Vec<HostBatch> = loader.epoch(1, 1).map(Result::unwrap).collect();
    assert_eq!(expected.len(), 2);
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let batches = Counted {
        inner: loader.epoch(1, 1),
        taken: Arc::clone(&taken),
    };
    let mut input = TrainInput::new(batches, Device::Cpu, None).unwrap();
    assert_eq!(
        taken.load(SeqCst),
        0,
        "nothing is fetched before it is asked for"
    );
    for (i, host) in expected.iter().enumerate() {
        let batch = input.next_batch().unwrap().unwrap();
        // The batch handed out and the one after it have been taken from the loader.
        assert_eq!(taken.load(SeqCst), (i + 2).min(expected.len()));
        let reference = to_device(host, Device::Cpu).unwrap();
        assert!(batch.input().unwrap().equal(reference.input().unwrap()));
        assert!(batch.target().unwrap().equal(reference.target().unwrap()));
    }
    assert!(input.next_batch().is_none());
    assert!(input.next_batch().is_none());
}

#[test]
fn a_loader_error_comes_when_its_batch_is_due() {
    let loader = image_loader(None);
    let mut hosts: Vec<std::result::Result<HostBatch, DataError>> =
        loader.epoch(0, 0).take(2).collect();
    hosts.push(Err(DataError::Invalid("batch 2 is broken".into())));
    let mut input = TrainInput::new(hosts.into_iter(), Device::Cpu, None).unwrap();
    // Batch 1 is handed out while batch 2 (the error) is already fetched; the error waits.
    assert!(input.next_batch().unwrap().is_ok());
    assert!(input.next_batch().unwrap().is_ok());
    let err = input.next_batch().unwrap().unwrap_err().to_string();
    assert!(err.contains("batch 2 is broken"), "{err}");
    assert!(input.next_batch().is_none());
}

#[test]
fn token_ids_outside_the_models_vocabulary_are_refused_on_the_host() {
    let host = |ids: Vec<i64>| HostBatch {
        input: HostInput::Tokens {
            ids,
            shape: [2, 2],
            targets: TokenTargets::PerToken,
            attention_mask: None,
            token_type_ids: None,
        },
        target: vec![0, 1, 2, 3],
        index: 0,
    };
    let uploader = Uploader::new(Device::Cpu, Some(10));
    assert!(uploader.batch(&host(vec![0, 9, 3, 4])).is_ok());
    for (ids, bad, at) in [(vec![0, 10, 3, 4], 10, 1), (vec![0, 1, 2, -1], -1, 3)] {
        let err = uploader.batch(&host(ids)).unwrap_err().to_string();
        assert!(
            err.contains(&format!("token id {bad} (at position {at} of the batch)"))
                && err.contains("[0, 10)"),
            "{err}"
        );
    }
    // Without a token embedding (a vision model, TorchScript) nothing is checked here.
    assert!(Uploader::new(Device::Cpu, None)
        .batch(&host(vec![0, 10, 3, 4]))
        .is_ok());
}

#[test]
fn the_normalization_is_uploaded_once_per_uploader() {
    let loader = image_loader(Some(cifar_normalize()));
    let uploader = Uploader::new(Device::Cpu, None);
    for host in loader.epoch(0, 0) {
        let host = host.unwrap();
        let batch = uploader.batch(&host).unwrap();
        let got = values(batch.input().unwrap());
        assert_eq!(got, host.input_f32().unwrap());
    }
    assert_eq!(uploader.per_channel.borrow().len(), 1);
}
