//! Host→device batch preparation, before and after batches stayed `u8` to the device: per
//! batch, the loader's work (read, crop, flip; before: also ÷255 and normalize, per sample, in
//! `f32`), the work of moving it to the device (before: an `f32` tensor; after: a `u8` tensor
//! scaled and normalized there) and the bytes that cross. On the CPU "the device" is the CPU,
//! so the crossing is a copy into a tensor; on CUDA it is the PCIe/NVLink transfer these bytes
//! measure. Both paths run side by side in one process on the same samples, interleaved round by
//! round, the loader in the calling thread (`workers = 0`), libtorch on `THREADS` threads.
//!
//! Run with `cargo bench -p tessera --bench input` (`ROUNDS=n BATCHES=k THREADS=t` change the
//! sample sizes and libtorch's threads).

use std::sync::Arc;
use std::time::Instant;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::{Device, Tensor};
use tessera::data::{
    HorizontalFlip, HostBatch, ImageDataset, Loader, LoaderOptions, Normalize, RandomCrop, Sample,
    SampleSource, Transform, Transforms,
};
use tessera::trainer::input::to_device;

mod common;
use common::{env_usize, median};

/// One image shape and its augmentation.
struct Case {
    name: &'static str,
    batch: usize,
    side: usize,
    crop: RandomCrop,
}

/// The loader's former path: every transform on `f32` values in [0, 1], normalize included,
/// sample by sample (what `make_batch` did before); then an `f32` tensor on the device.
fn before(
    dataset: &ImageDataset,
    transforms: &[Transform],
    shape: [i64; 4],
    first: usize,
) -> (Vec<f32>, f64, Tensor, f64) {
    let batch = shape[0] as usize;
    let started = Instant::now();
    let mut values = Vec::new();
    for index in first..first + batch {
        let (data, _) = dataset
            .read(index % dataset.len())
            .expect("read")
            .expect("sample");
        let tessera::data::SampleData::Pixels(pixels) = data else {
            panic!("an in-memory dataset serves pixels");
        };
        let (c, h, w) = SampleSource::shape(dataset);
        let mut sample = Sample::from_u8(&pixels, c, h, w);
        let mut rng = ChaCha8Rng::seed_from_u64(index as u64);
        for t in transforms {
            t.apply(&mut sample, &mut rng).expect("transform");
        }
        values.extend_from_slice(&sample.data);
    }
    let host = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let tensor = Tensor::from_slice(&values)
        .view(shape)
        .to_device(Device::Cpu);
    (values, host, tensor, started.elapsed().as_secs_f64())
}

fn main() {
    let rounds = env_usize("ROUNDS", 5);
    let batches = env_usize("BATCHES", 8);
    tch::set_num_threads(env_usize("THREADS", 1) as i32);
    let normalize = Normalize {
        mean: vec![0.485, 0.456, 0.406],
        std: vec![0.229, 0.224, 0.225],
    };
    let cases = [
        Case {
            name: "CIFAR-like 3x32x32, pad 4, batch 128",
            batch: 128,
            side: 32,
            crop: RandomCrop {
                size: 32,
                padding: 4,
            },
        },
        Case {
            name: "ImageNet-like 3x256x256 -> crop 224, batch 64",
            batch: 64,
            side: 256,
            crop: RandomCrop::new(224),
        },
    ];
    println!("libtorch threads: {}", tch::get_num_threads());
    for case in cases {
        let samples = case.batch * 2;
        let dataset = Arc::new(
            ImageDataset::synthetic(1, samples, 3, case.side, case.side, 10).expect("dataset"),
        );
        let transforms = Transforms {
            normalize: Some(normalize.clone()),
            random_crop: Some(case.crop.clone()),
            horizontal_flip: Some(HorizontalFlip::default()),
        }
        .pipeline(true);
        let loader = Loader::new(
            dataset.clone(),
            Arc::new(transforms.clone()),
            LoaderOptions {
                shuffle: false,
                drop_last: true,
                ..LoaderOptions::new(case.batch)
            },
        )
        .expect("loader");
        let (mut host_before, mut device_before) = (Vec::new(), Vec::new());
        let (mut host_after, mut device_after) = (Vec::new(), Vec::new());
        let (mut bytes_before, mut bytes_after) = (0, 0);
        for round in 0..=rounds {
            for b in 0..batches {
                let first = (b % 2) * case.batch;
                let side = case.crop.size as i64;
                let shape = [case.batch as i64, 3, side, side];
                let (values, host, tensor, device) = before(&dataset, &transforms, shape, first);
                let started = Instant::now();
                let host_batch: HostBatch = loader
                    .epoch(round as u64, (b % 2) as u64)
                    .next()
                    .expect("a batch")
                    .expect("batch");
                let host_new = started.elapsed().as_secs_f64();
                let started = Instant::now();
                let batch = to_device(&host_batch, Device::Cpu).expect("to device");
                let device_new = started.elapsed().as_secs_f64();
                assert_eq!(tensor.size(), batch.input().expect("input").size());
                // Round 0 warms up.
                if round > 0 {
                    host_before.push(host);
                    device_before.push(device);
                    host_after.push(host_new);
                    device_after.push(device_new);
                }
                bytes_before = std::mem::size_of_val(values.as_slice());
                bytes_after = host_batch.input_size_in_bytes();
            }
        }
        let ms = |v: &mut Vec<f64>| median(v) * 1e3;
        let (hb, db) = (ms(&mut host_before), ms(&mut device_before));
        let (ha, da) = (ms(&mut host_after), ms(&mut device_after));
        println!(
            "{} ({} batches each, medians):",
            case.name,
            host_before.len()
        );
        println!(
            "  before (f32 from the loader): loader {hb:7.2} ms + to device {db:6.2} ms = {:7.2} ms, {:>9} bytes cross",
            hb + db,
            bytes_before
        );
        println!(
            "  after  (u8, normalized there): loader {ha:7.2} ms + to device {da:6.2} ms = {:7.2} ms, {:>9} bytes cross",
            ha + da,
            bytes_after
        );
    }
}
