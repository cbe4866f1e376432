#![doc = include_str!("../README.md")]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tessera_plugin_api::kit::StateReader;
use tessera_plugin_api::{
    export_plugin, Context, Error, ErrorKind, Event, Hook, Method, Plugin, Sample, SamplePlace,
    SampleRandom, SampleTransform, Settings, State,
};

/// The layout version of [`AlternatingFlip`]'s checkpoint state (the key, 8 bytes LE).
const STATE_FORMAT: u32 = 1;

/// SplitMix64's output function: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The image's fixed random bit `b_i` (airbench's one random pre-flip, `batch_flip_lr` at
/// epoch 0): a pure function of the run's `key` and the sample's index.
pub fn pre_flipped(key: u64, index: u64) -> bool {
    mix(key ^ mix(index.wrapping_add(0x9E37_79B9_7F4A_7C15))) & 1 == 1
}

/// Whether sample `index` is mirrored in `epoch`: `(epoch + b_i) mod 2 = 1`, airbench's
/// pre-flip followed by flipping the whole set on odd epochs. Over any two consecutive epochs
/// every image is seen once each way.
pub fn flipped(key: u64, index: u64, epoch: u64) -> bool {
    (epoch % 2 == 1) != pre_flipped(key, index)
}

/// Mirrors a channel-major image left–right in place.
pub fn mirror(sample: &mut Sample) {
    let width = sample.width.max(1);
    for row in sample.data.chunks_mut(width) {
        row.reverse();
    }
}

/// The run's key, drawn at `init` and shared with the loader's transform.
#[derive(Default)]
struct Key {
    value: AtomicU64,
    set: AtomicBool,
}

impl Key {
    fn store(&self, value: u64) {
        self.value.store(value, Ordering::SeqCst);
        self.set.store(true, Ordering::SeqCst);
    }

    fn load(&self) -> Option<u64> {
        self.set
            .load(Ordering::SeqCst)
            .then(|| self.value.load(Ordering::SeqCst))
    }
}

/// The per-sample transform the host runs on its loader's workers.
struct AlternatingFlipTransform {
    key: Arc<Key>,
}

impl SampleTransform for AlternatingFlipTransform {
    fn apply(&self, _sample: &mut Sample, _rng: &mut SampleRandom<'_>) -> Result<(), Error> {
        Err(Error::new(
            ErrorKind::OTHER,
            "alternating_flip needs a host with plugin-api 1.6 or newer, which tells a \
             transform which sample of which epoch it works on (`apply_at`); this host does \
             not, so the flip cannot alternate per image: upgrade tessera or use the host's \
             `[data.transforms] horizontal_flip` instead",
        ))
    }

    fn apply_at(
        &self,
        sample: &mut Sample,
        _rng: &mut SampleRandom<'_>,
        at: SamplePlace,
    ) -> Result<(), Error> {
        let key = self.key.load().ok_or(
            "alternating_flip: the transform ran before the method's `init`, where its key is \
             drawn from the run's seed",
        )?;
        if flipped(key, at.index, at.epoch) {
            mirror(sample);
        }
        Ok(())
    }
}

/// The alternating-flip method: a per-sample transform keyed by the run's seed.
pub struct AlternatingFlip {
    key: Arc<Key>,
}

impl Method for AlternatingFlip {
    fn sample_transform(&self) -> Option<Box<dyn SampleTransform>> {
        Some(Box::new(AlternatingFlipTransform {
            key: Arc::clone(&self.key),
        }))
    }

    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        if event == Event::INIT {
            // The host's stream at `init` is a function of the run's seed only (the same on
            // every rank and when a run resumes); the checkpoint also carries the key.
            self.key.store(ctx.rng_u64());
        }
        Ok(())
    }

    fn state(&self) -> Result<State, Error> {
        let key = self
            .key
            .load()
            .ok_or("alternating_flip: no key before `init`")?;
        Ok(State {
            format_version: STATE_FORMAT,
            bytes: key.to_le_bytes().to_vec(),
            tensors: Vec::new(),
        })
    }

    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let reader = StateReader::open("alternating_flip", state, STATE_FORMAT)?;
        self.key.store(reader.u64()?);
        reader.finish()?;
        Ok(())
    }
}

impl Plugin for AlternatingFlip {
    const NAME: &'static str = "alternating_flip";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "mirrors each training image on every other epoch (a \
         random half in even epochs, the other half in odd ones), airbench's derandomised flip";
    const DEFAULT_SETTINGS: &'static str = "";

    fn hooks() -> Vec<Hook> {
        // First at `init`: another method's `training_sample` there runs this transform.
        vec![Hook {
            event: Event::INIT,
            priority: i32::MAX,
        }]
    }

    fn create(_settings: &Settings) -> Result<Self, Error> {
        Ok(AlternatingFlip {
            key: Arc::new(Key::default()),
        })
    }
}

export_plugin!(AlternatingFlip);
