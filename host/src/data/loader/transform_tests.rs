//! Where the loader runs image transforms: crops and flips on `u8` pixels, the normalization left
//! to the device, a transform that computes values making floats from there on.

use super::assemble::TransformKey;
use super::order::key;
use super::tests::{augment, collect, dataset, loader};
use super::*;
use crate::data::transforms::Normalize;
use crate::data::Sample;
use crate::data::SampleData;
use std::sync::Arc;

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
