#![doc = include_str!("../README.md")]

use augmentation_primitives::pillow::Image;
use augmentation_primitives::{
    apply_op, augmentation_set, draw_op, to_image, to_sample, Draws, Primitive,
};
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Method, Plugin, Sample, SampleRandom,
    SampleTransform, Settings,
};

/// `randaugment_image`: `depth` times, a primitive drawn uniformly (with replacement) from
/// `set` is drawn and applied at `severity`.
pub fn randaugment_image(
    img: &mut Image,
    severity: f64,
    depth: u64,
    set: &[Primitive],
    draws: &mut dyn Draws,
) -> Result<(), Error> {
    for _ in 0..depth {
        let primitive = set[draws.choice(set.len())];
        let op = draw_op(primitive, severity, img.width, img.height, draws);
        apply_op(img, &op)?;
    }
    Ok(())
}

/// The per-sample transform (Composer's `RandAugmentTransform`).
pub struct RandAugmentTransform {
    /// Severity of every op, in `[0, 10]`.
    pub severity: f64,
    /// Ops per image.
    pub depth: u64,
    /// The primitives drawn from.
    pub set: Vec<Primitive>,
}

impl SampleTransform for RandAugmentTransform {
    fn output_shape(&self, shape: (usize, usize, usize)) -> Result<(usize, usize, usize), Error> {
        match shape.0 {
            1 | 3 => Ok(shape),
            c => Err(Error::config(format!(
                "randaugment works on RGB (3-channel) or greyscale (1-channel) images, as \
                 Pillow's modes \"RGB\" and \"L\"; the dataset has {c} channels"
            ))),
        }
    }

    fn apply(&self, sample: &mut Sample, rng: &mut SampleRandom<'_>) -> Result<(), Error> {
        let mut img = to_image(sample);
        randaugment_image(&mut img, self.severity, self.depth, &self.set, rng)?;
        *sample = to_sample(&img);
        Ok(())
    }
}

/// The RandAugment method: a per-sample transform only.
pub struct RandAugment {
    severity: f64,
    depth: u64,
    set: Vec<Primitive>,
}

impl Method for RandAugment {
    fn sample_transform(&self) -> Option<Box<dyn SampleTransform>> {
        Some(Box::new(RandAugmentTransform {
            severity: self.severity,
            depth: self.depth,
            set: self.set.clone(),
        }))
    }

    fn on_event(&mut self, _event: Event, _ctx: &mut Context<'_>) -> Result<(), Error> {
        Ok(())
    }
}

impl Plugin for RandAugment {
    const NAME: &'static str = "randaugment";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "applies `depth` random Pillow-exact image operations to every training image";
    const DEFAULT_SETTINGS: &'static str = "severity = 9\ndepth = 2\naugmentation_set = \"all\"";

    fn hooks() -> Vec<Hook> {
        Vec::new()
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let severity = settings.f64("severity")?;
        if !(0.0..=10.0).contains(&severity) {
            return Err(Error::config(format!(
                "`severity` must be in [0, 10] (Composer's RandAugment range), got {severity}"
            )));
        }
        let depth = settings.u64("depth")?;
        let name = settings.str("augmentation_set")?;
        let set = augmentation_set(&name).ok_or_else(|| {
            Error::config(format!(
                "`augmentation_set` must be \"all\", \"safe\" or \"original\", got \"{name}\""
            ))
        })?;
        Ok(RandAugment {
            severity,
            depth,
            set,
        })
    }
}

export_plugin!(RandAugment);
