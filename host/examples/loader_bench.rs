//! Runs an image folder's training loader alone for one epoch (no model) and prints images/s as
//! JSON: what `scripts/bench-jpeg-loader.sh` compares with torchvision's `DataLoader`.
//!
//! `loader_bench ROOT SIZE WORKERS BATCH [rrc|rrc-dct|centre]` iterates `ROOT/train` with
//! `RandomResizedCrop(SIZE)` + horizontal flip (`rrc-dct`: with `jpeg_dct_scale = true`; or
//! `Resize(SIZE)` + `CenterCrop(SIZE)` + flip), batches of BATCH u8 samples, WORKERS loader
//! threads. `loader_bench ROOT SIZE profile N` times the stages of the first N images on this
//! thread instead: reading the file, decoding the whole image with the `image` crate (the
//! decoder before libjpeg-turbo region decoding), and the whole `decode_image` (decode of the
//! crop's region + resize + layout) without and with `jpeg_dct_scale`.

use std::sync::Arc;
use std::time::Instant;

use rand::SeedableRng;
use tessera::data::decode::{decode_image, DecodePlan, RandomResizedCrop};
use tessera::data::{
    FolderConfig, HorizontalFlip, ImageFolder, Loader, LoaderOptions, SampleSource, Transform,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: loader_bench ROOT SIZE WORKERS BATCH [rrc|rrc-dct|centre] | ROOT SIZE profile N";
    let (root, size) = match &args[..] {
        [root, size, ..] => (std::path::PathBuf::from(root), size.parse::<usize>()?),
        _ => return Err(usage.into()),
    };
    let centre = args.get(4).is_some_and(|m| m == "centre");
    let mut config = FolderConfig::new(size);
    if !centre {
        config.random_resized_crop = Some(RandomResizedCrop::default());
    }
    config.jpeg_dct_scale = args.get(4).is_some_and(|m| m == "rrc-dct");
    let (train, _) = ImageFolder::open_split(&root, &config)?;
    if args.get(2).is_some_and(|a| a == "profile") {
        let n: usize = args.get(3).ok_or(usage)?.parse()?;
        let n = n.min(train.len());
        let (mut read, mut decode, mut whole, mut dct) = (0.0, 0.0, 0.0, 0.0);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let dct_plan = DecodePlan {
            jpeg_dct_scale: true,
            ..train.plan().clone()
        };
        for path in &train.files()[..n] {
            let t = Instant::now();
            let bytes = std::fs::read(path)?;
            read += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let image = image::load_from_memory(&bytes)?.into_rgb8();
            decode += t.elapsed().as_secs_f64();
            drop(image);
            let t = Instant::now();
            decode_image(&bytes, "", train.plan(), &mut rng)?;
            whole += t.elapsed().as_secs_f64();
            let t = Instant::now();
            decode_image(&bytes, "", &dct_plan, &mut rng)?;
            dct += t.elapsed().as_secs_f64();
        }
        let ms = |s: f64| 1000.0 * s / n as f64;
        println!(
            "{{\"images\": {n}, \"read_ms\": {:.3}, \"image_crate_whole_decode_ms\": {:.3}, \"decode_image_ms\": {:.3}, \"decode_image_dct_scale_ms\": {:.3}}}",
            ms(read),
            ms(decode),
            ms(whole),
            ms(dct)
        );
        return Ok(());
    }
    let workers: usize = args.get(2).ok_or(usage)?.parse()?;
    let batch: usize = args.get(3).ok_or(usage)?.parse()?;
    let source: Arc<dyn SampleSource> = Arc::new(train);
    let transforms = vec![Transform::HorizontalFlip(HorizontalFlip { p: 0.5 })];
    let options = LoaderOptions {
        workers,
        prefetch: 2,
        ..LoaderOptions::new(batch)
    };
    let loader = Loader::new(source, Arc::new(transforms), options)?;
    let start = Instant::now();
    let mut images = 0usize;
    for batch in loader.epoch(0, 0) {
        images += batch?.len();
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{{\"images\": {images}, \"seconds\": {seconds:.3}, \"images_per_s\": {:.1}}}",
        images as f64 / seconds
    );
    Ok(())
}
