//! The alternating flip through the ABI, as a 1.6 host's loader runs it
//! (`apply_sample_transform_at`): which images are mirrored in which epoch, and how that
//! depends on the run's seed.

use alternating_flip::{flipped, AlternatingFlip};
use tessera_plugin_api::abi::MethodBox;
use tessera_plugin_api::testing::{
    apply_sample_transform, apply_sample_transform_at, settings, RandomSource, TestHost,
};
use tessera_plugin_api::{boxed_method, Event, Sample, SamplePlace};

const IMAGES: u64 = 64;

/// A 2-channel 3x4 image whose values are all different, so a mirror is recognisable.
fn image(index: u64) -> Sample {
    let data = (0..24).map(|v| (v as f32 + index as f32) / 100.0).collect();
    Sample {
        channels: 2,
        height: 3,
        width: 4,
        data,
    }
}

/// `s` mirrored left–right, computed independently of the crate.
fn mirrored(s: &Sample) -> Sample {
    let mut data = Vec::new();
    for c in 0..s.channels {
        for y in 0..s.height {
            for x in (0..s.width).rev() {
                data.push(s.at(c, y, x));
            }
        }
    }
    Sample { data, ..s.clone() }
}

/// A method that received `init` from a host seeded with `seed`.
fn method(seed: u64) -> MethodBox {
    let mut m = boxed_method::<AlternatingFlip>(&settings("{}")).unwrap();
    TestHost::new(RandomSource::Seeded(seed))
        .fire(&mut m, Event::INIT)
        .unwrap();
    m
}

/// Whether the loader's transform mirrors image `index` in `epoch` (panics if it does anything
/// but keep or mirror it). Each call draws from another random stream, which must not matter.
fn is_flipped(m: &MethodBox, index: u64, epoch: u64) -> bool {
    let original = image(index);
    let mut rng = RandomSource::Seeded(epoch * 1000 + index);
    let at = SamplePlace { epoch, index };
    let out = apply_sample_transform_at(m, &original, &mut rng, at).unwrap();
    if out == original {
        false
    } else {
        assert_eq!(out, mirrored(&original), "image {index}, epoch {epoch}");
        true
    }
}

fn pattern(m: &MethodBox, epoch: u64) -> Vec<bool> {
    (0..IMAGES).map(|i| is_flipped(m, i, epoch)).collect()
}

fn key_of(m: &MethodBox) -> u64 {
    let state = m.state().into_result().unwrap();
    u64::from_le_bytes(state.blob.as_slice().try_into().unwrap())
}

#[test]
fn every_image_is_seen_once_each_way_in_any_two_consecutive_epochs() {
    let m = method(3);
    let epochs: Vec<Vec<bool>> = (0..6).map(|e| pattern(&m, e)).collect();
    for (e, pair) in epochs.windows(2).enumerate() {
        for (i, (now, next)) in pair[0].iter().zip(&pair[1]).enumerate() {
            assert_ne!(now, next, "image {i}, epochs {e}, {}", e + 1);
        }
    }
    // Even epochs repeat epoch 0's choice, odd ones its complement.
    assert_eq!(epochs[0], epochs[2]);
    assert_eq!(epochs[1], epochs[5]);
    // Epoch 0 mirrors a random part of the set (airbench's random pre-flip), neither none nor all.
    let count = epochs[0].iter().filter(|f| **f).count();
    assert!(0 < count && count < IMAGES as usize, "{count} of {IMAGES}");
}

#[test]
fn the_choice_is_a_pure_function_of_the_seed_the_index_and_the_epoch() {
    let (a, b, other) = (method(11), method(11), method(12));
    for e in 0..3 {
        assert_eq!(pattern(&a, e), pattern(&b, e), "epoch {e}");
    }
    assert_ne!(pattern(&a, 0), pattern(&other, 0), "seeds 11 and 12");
    // What the loader does is the crate's rule for the key the method drew.
    let key = key_of(&a);
    for e in 0..3 {
        for i in 0..IMAGES {
            assert_eq!(
                is_flipped(&a, i, e),
                flipped(key, i, e),
                "image {i}, epoch {e}"
            );
        }
    }
}

#[test]
fn a_restored_method_flips_as_the_saved_one() {
    let saved = method(5);
    let state = saved.state().into_result().unwrap();
    // A method restored from a checkpoint uses the checkpoint's key even before `init`.
    let mut restored = boxed_method::<AlternatingFlip>(&settings("{}")).unwrap();
    restored.load_state(state).into_result().unwrap();
    assert_eq!(pattern(&saved, 1), pattern(&restored, 1));
}

#[test]
fn a_host_that_cannot_say_which_sample_gets_a_clear_error() {
    let m = method(1);
    let err = apply_sample_transform(&m, &image(0), &mut RandomSource::Seeded(0)).unwrap_err();
    assert!(err.contains("plugin-api 1.6"), "{err}");
    // Before `init` there is no key.
    let fresh = boxed_method::<AlternatingFlip>(&settings("{}")).unwrap();
    let at = SamplePlace { epoch: 0, index: 0 };
    let err =
        apply_sample_transform_at(&fresh, &image(0), &mut RandomSource::Seeded(0), at).unwrap_err();
    assert!(err.contains("before the method's `init`"), "{err}");
}

#[test]
fn unknown_settings_are_refused() {
    match boxed_method::<AlternatingFlip>(&settings(r#"{"p": 0.5}"#)) {
        Ok(_) => panic!("`p` was accepted"),
        Err(e) => assert!(e.message().contains("`p`"), "{}", e.message()),
    }
}
