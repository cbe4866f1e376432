#![doc = include_str!("../README.md")]

use augmentation_primitives::pillow::Image;
use augmentation_primitives::{
    apply_op, augmentation_set, draw_op, to_image, to_sample, Draws, Primitive,
};
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Method, Plugin, Sample, SampleRandom,
    SampleTransform, Settings,
};

/// AugMix's settings (Composer's `AugmentAndMixTransform`).
#[derive(Clone, Debug, PartialEq)]
pub struct AugMixSettings {
    /// Severity of every op, in `[0, 10]`.
    pub severity: f64,
    /// Ops per chain; `≤ 0`: a uniform draw in 1..=3 per chain.
    pub depth: i64,
    /// Chains per image, `≥ 1`.
    pub width: usize,
    /// Dirichlet and Beta parameter, `> 0`.
    pub alpha: f64,
    /// The primitives drawn from.
    pub set: Vec<Primitive>,
}

/// One image's draws and chains: what [`augmix_image`] mixes.
#[derive(Clone, Debug, PartialEq)]
pub struct Chains {
    /// The Dirichlet draw as `float32`.
    pub weights: Vec<f32>,
    /// The Beta draw as `float32`.
    pub mixing: f32,
    /// Each chain's augmented image.
    pub images: Vec<Image>,
}

/// Draws the chain weights, the mixing weight and the chains in Composer's order: Dirichlet,
/// Beta, then per chain its depth (a `randint(1, 4)` when `depth ≤ 0`) and per op its choice
/// and the primitive's own draws.
pub fn augmix_chains(
    img: &Image,
    settings: &AugMixSettings,
    draws: &mut dyn Draws,
) -> Result<Chains, Error> {
    let alpha = vec![settings.alpha; settings.width];
    let weights = draws.dirichlet(&alpha).iter().map(|&w| w as f32).collect();
    let mixing = draws.beta(settings.alpha, settings.alpha) as f32;
    let mut images = Vec::with_capacity(settings.width);
    for _ in 0..settings.width {
        let mut chain = img.clone();
        let depth = if settings.depth > 0 {
            settings.depth
        } else {
            draws.randint(1, 4)
        };
        for _ in 0..depth {
            let p = settings.set[draws.choice(settings.set.len())];
            let op = draw_op(p, settings.severity, chain.width, chain.height, draws);
            apply_op(&mut chain, &op)?;
        }
        images.push(chain);
    }
    Ok(Chains {
        weights,
        mixing,
        images,
    })
}

/// The mix, as numpy computes it in `float32`: `acc = Σ_i w_i·chain_i` (accumulated in chain
/// order), `mixed = (1 − m)·img + m·acc`, truncated to a byte (`np.uint8`).
pub fn augmix_mix(img: &Image, chains: &Chains) -> Image {
    let mut acc = vec![0f32; img.data.len()];
    for (w, chain) in chains.weights.iter().zip(&chains.images) {
        for (a, &v) in acc.iter_mut().zip(&chain.data) {
            *a += w * v as f32;
        }
    }
    let m = chains.mixing;
    let data = img
        .data
        .iter()
        .zip(&acc)
        .map(|(&v, &a)| ((1.0 - m) * v as f32 + m * a) as u8)
        .collect();
    Image {
        data,
        ..img.clone()
    }
}

/// `augmix_image`: the chains drawn by [`augmix_chains`], mixed by [`augmix_mix`].
pub fn augmix_image(
    img: &Image,
    settings: &AugMixSettings,
    draws: &mut dyn Draws,
) -> Result<Image, Error> {
    let chains = augmix_chains(img, settings, draws)?;
    Ok(augmix_mix(img, &chains))
}

/// The per-sample transform.
pub struct AugMixTransform(pub AugMixSettings);

impl SampleTransform for AugMixTransform {
    fn output_shape(&self, shape: (usize, usize, usize)) -> Result<(usize, usize, usize), Error> {
        match shape.0 {
            1 | 3 => Ok(shape),
            c => Err(Error::config(format!(
                "augmix works on RGB (3-channel) or greyscale (1-channel) images, as Pillow's \
                 modes \"RGB\" and \"L\"; the dataset has {c} channels"
            ))),
        }
    }

    fn apply(&self, sample: &mut Sample, rng: &mut SampleRandom<'_>) -> Result<(), Error> {
        let img = to_image(sample);
        *sample = to_sample(&augmix_image(&img, &self.0, rng)?);
        Ok(())
    }
}

/// The AugMix method: a per-sample transform only.
pub struct AugMix(AugMixSettings);

impl Method for AugMix {
    fn sample_transform(&self) -> Option<Box<dyn SampleTransform>> {
        Some(Box::new(AugMixTransform(self.0.clone())))
    }

    fn on_event(&mut self, _event: Event, _ctx: &mut Context<'_>) -> Result<(), Error> {
        Ok(())
    }
}

impl Plugin for AugMix {
    const NAME: &'static str = "augmix";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "mixes every training image with random chains of Pillow-exact image operations";
    const DEFAULT_SETTINGS: &'static str =
        "severity = 3\ndepth = -1\nwidth = 3\nalpha = 1.0\naugmentation_set = \"all\"";

    fn hooks() -> Vec<Hook> {
        Vec::new()
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let severity = settings.f64("severity")?;
        if !(0.0..=10.0).contains(&severity) {
            return Err(Error::config(format!(
                "`severity` must be in [0, 10] (Composer's AugMix range), got {severity}"
            )));
        }
        let depth: i64 = settings.get_or("depth", -1)?;
        let width = settings.u64("width")?;
        if width < 1 {
            return Err(Error::config(
                "`width` must be at least 1 (the number of augmentation chains)",
            ));
        }
        let alpha = settings.f64("alpha")?;
        if !(alpha > 0.0 && alpha.is_finite()) {
            return Err(Error::config(format!(
                "`alpha` must be a positive number (the Dirichlet and Beta parameter), got {alpha}"
            )));
        }
        let name = settings.str("augmentation_set")?;
        let set = augmentation_set(&name).ok_or_else(|| {
            Error::config(format!(
                "`augmentation_set` must be \"all\", \"safe\" or \"original\", got \"{name}\""
            ))
        })?;
        Ok(AugMix(AugMixSettings {
            severity,
            depth,
            width: width as usize,
            alpha,
            set,
        }))
    }
}

export_plugin!(AugMix);
