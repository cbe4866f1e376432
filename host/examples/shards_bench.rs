//! Tessera's loader over an MDS dataset alone (no model), printing JSON: what
//! `scripts/bench-streaming.sh` compares with `streaming`'s `StreamingDataset` + `DataLoader`.
//!
//! `shards_bench ROOT SIZE CLASSES WORKERS BATCH epoch` reads one training epoch of the MDS
//! split `ROOT/train` (images decoded at SIZE, horizontal flip, u8 batches of BATCH, WORKERS
//! loader threads) and prints images/s. `shards_bench ROOT SIZE CLASSES WORKERS BATCH resume F`
//! opens the dataset and takes the first batch of epoch 0 at fraction F of the epoch (as a run
//! resumed from a checkpoint there does), printing the seconds from opening to that batch, and
//! the same from the epoch's start for comparison.

use std::sync::Arc;
use std::time::Instant;

use tessera::data::{
    HorizontalFlip, Loader, LoaderOptions, SampleSource, ShardFormat, Sharded, ShardsConfig,
    Transform,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: shards_bench ROOT SIZE CLASSES WORKERS BATCH epoch | ... resume FRACTION";
    let [root, size, classes, workers, batch, mode, rest @ ..] = &args[..] else {
        return Err(usage.into());
    };
    let root = std::path::PathBuf::from(root);
    let config = ShardsConfig::new(ShardFormat::Mds, size.parse()?, classes.parse()?);
    let workers: usize = workers.parse()?;
    let batch: usize = batch.parse()?;
    // Opening the dataset (index.json, shard sizes) is part of what a resume pays.
    let open = || -> Result<Loader, Box<dyn std::error::Error>> {
        let (train, _) = Sharded::open_split(&root, ShardFormat::Mds, &config)?;
        let source: Arc<dyn SampleSource> = Arc::new(train);
        let transforms = vec![Transform::HorizontalFlip(HorizontalFlip { p: 0.5 })];
        let options = LoaderOptions {
            workers,
            prefetch: 2,
            ..LoaderOptions::new(batch)
        };
        Ok(Loader::new(source, Arc::new(transforms), options)?)
    };
    match (mode.as_str(), rest) {
        ("epoch", []) => {
            let start = Instant::now();
            let loader = open()?;
            let mut images = 0usize;
            for batch in loader.epoch(0, 0) {
                images += batch?.len();
            }
            let seconds = start.elapsed().as_secs_f64();
            println!(
                "{{\"images\": {images}, \"seconds\": {seconds:.3}, \"images_per_s\": {:.1}}}",
                images as f64 / seconds
            );
        }
        ("resume", [fraction]) => {
            let fraction: f64 = fraction.parse()?;
            let first_batch = |start_batch: u64| -> Result<f64, Box<dyn std::error::Error>> {
                let start = Instant::now();
                let loader = open()?;
                let mut epoch = loader.epoch(0, start_batch);
                epoch.next().ok_or("the epoch is empty")??;
                Ok(start.elapsed().as_secs_f64())
            };
            let batches = open()?.batches_per_epoch();
            let at = (fraction * batches as f64).floor() as u64;
            let from_start = first_batch(0)?;
            let resumed = first_batch(at)?;
            println!(
                "{{\"batches\": {batches}, \"resume_batch\": {at}, \"first_batch_s\": {from_start:.4}, \"resume_first_batch_s\": {resumed:.4}}}"
            );
        }
        _ => return Err(usage.into()),
    }
    Ok(())
}
