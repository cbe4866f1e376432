//! The run's data from its config: the datasets, the training and evaluation loaders (a text
//! dataset's token loaders), the evaluation subset and each rank's share.

use std::sync::Arc;

use crate::config::Config;
use crate::data::{
    self, ImageDataset, ImageFolder, Loader, LoaderOptions, MethodTransform, SampleSource,
};
use crate::engine::Engine;
use crate::model::InputShape;

use super::dist::DataParallel;
use super::error::{fail, Context as _, Result};
use super::token_sets::{load_token_sets, TokenSets};
use crate::checkpoint::TokenizerFile;
use crate::data::SubsetChoice;
use crate::data::TextFacts;

/// The data a run reads: its loaders, and what its text told.
pub(super) struct RunData {
    pub(super) train_loader: Loader,
    /// The whole evaluation set (`tessera predict`).
    pub(super) eval_loader: Loader,
    /// What evaluations score: the fixed subset of `train.eval_subset_batches` (and the choice,
    /// for the run record), or `None` for the whole set.
    pub(super) eval_subset: Option<(Loader, SubsetChoice)>,
    /// A text dataset's vocabulary, classes and special tokens (for the run record).
    pub(super) text_facts: Option<TextFacts>,
    /// The tokenizer file of a text run and its sha256 (`None` for `synthetic-text` and
    /// images).
    pub(super) tokenizer: Option<TokenizerFile>,
}

/// The training and evaluation loaders of the configured data; the methods' per-sample
/// transforms (`methods`) run in the training loader, on at least one worker thread.
fn build_loaders(config: &Config, methods: &[MethodTransform]) -> Result<(Loader, Loader)> {
    let (train_set, test_set) = load_datasets(config)?;
    let d = &config.data;
    let mut workers = d.workers;
    if workers == 0 && !methods.is_empty() {
        let names: Vec<&str> = methods.iter().map(|m| m.method.as_str()).collect();
        tracing::info!(
            "data.workers = 0, but {} transform(s) every training sample: making batches on 1 loader thread instead of the training thread (the batches are the same)",
            names.join(", ")
        );
        workers = 1;
    }
    let train_loader = Loader::new(
        train_set,
        Arc::new(d.transforms.train_pipeline_with(methods)),
        LoaderOptions {
            batch_size: d.batch_size,
            shuffle: d.shuffle,
            drop_last: d.drop_last,
            seed: config.seed,
            workers,
            prefetch: d.prefetch,
        },
    )?;
    let eval_loader = Loader::new(
        test_set,
        Arc::new(d.transforms.pipeline(false)),
        LoaderOptions {
            batch_size: d.eval_batch_size,
            shuffle: false,
            drop_last: false,
            seed: config.seed,
            workers: d.workers.min(1),
            prefetch: d.prefetch,
        },
    )?;
    Ok((train_loader, eval_loader))
}

/// The training and evaluation loaders of a text dataset (token sequences of
/// `data.text.seq_len`), its facts and its tokenizer file. Per-sample transforms do not apply
/// to text: a method that asks for one is an error.
fn build_token_loaders(
    config: &Config,
    methods: &[MethodTransform],
) -> Result<(
    Loader,
    Loader,
    Option<data::TextFacts>,
    Option<crate::checkpoint::TokenizerFile>,
)> {
    if let Some(m) = methods.first() {
        fail!(
            "method `{}` transforms every training sample (an image transform), but dataset \
             `{}` is text",
            m.method,
            config.data.dataset
        );
    }
    let TokenSets {
        train,
        eval,
        facts,
        tokenizer,
    } = load_token_sets(config)?;
    let d = &config.data;
    let train_loader = Loader::tokens(
        train,
        LoaderOptions {
            batch_size: d.batch_size,
            shuffle: d.shuffle,
            drop_last: d.drop_last,
            seed: config.seed,
            workers: d.workers.min(1),
            prefetch: d.prefetch,
        },
    )?;
    let eval_loader = Loader::tokens(
        eval,
        LoaderOptions {
            batch_size: d.eval_batch_size,
            shuffle: false,
            drop_last: false,
            seed: config.seed,
            workers: d.workers.min(1),
            prefetch: d.prefetch,
        },
    )?;
    if train_loader.batches_per_epoch() == 0 {
        fail!(
            "dataset `{}` has {} training sequences of {} tokens, fewer than one batch of {} \
             (data.drop_last is on); lower data.batch_size or data.text.seq_len",
            d.dataset,
            train_loader.len(),
            train_loader.sample_shape().2,
            d.batch_size
        );
    }
    Ok((train_loader, eval_loader, Some(facts), tokenizer))
}

/// The train and test sets named in the config: a registry dataset loaded (fetched when
/// allowed), a synthetic one generated, or an image folder listed (its images are decoded by
/// the loader).
pub fn load_datasets(cfg: &Config) -> Result<(Arc<dyn SampleSource>, Arc<dyn SampleSource>)> {
    let d = &cfg.data;
    if let (Some(f), Some(root)) = (&d.folder, &d.data_dir) {
        let (train, val) = ImageFolder::open_split(root, f)
            .with_context(|| format!("reading the image folder {}", root.display()))?;
        tracing::info!(
            "image folder {}: {} training and {} validation images of {} classes",
            root.display(),
            train.len(),
            val.len(),
            train.classes().len()
        );
        return Ok((Arc::new(train), Arc::new(val)));
    }
    if let (Some(s), Some(root), Some(format)) = (&d.shards, &d.data_dir, d.dataset.shard_format())
    {
        let (train, val) = data::Sharded::open_split(root, format, s)
            .with_context(|| format!("reading the {} shards of {}", d.dataset, root.display()))?;
        tracing::info!(
            "{} shards {}: {} training samples in {} shards, {} validation samples in {} shards",
            d.dataset,
            root.display(),
            train.len(),
            train.shard_sizes().len(),
            val.len(),
            val.shard_sizes().len()
        );
        return Ok((Arc::new(train), Arc::new(val)));
    }
    if let Some(s) = &d.synthetic {
        let train = ImageDataset::synthetic(
            cfg.seed, s.samples, s.channels, s.height, s.width, s.classes,
        )?;
        let test = ImageDataset::synthetic(
            cfg.seed.wrapping_add(1),
            s.eval_samples,
            s.channels,
            s.height,
            s.width,
            s.classes,
        )?;
        return Ok((Arc::new(train), Arc::new(test)));
    }
    let name = d.dataset.as_str();
    let root = d.data_dir.clone().unwrap_or_else(data::default_cache_root);
    if d.fetch {
        data::fetch(name, &root).with_context(|| format!("fetching dataset `{name}`"))?;
    }
    let split = data::load(name, &root).with_context(|| {
        format!(
            "loading dataset `{name}` from {} (run `tessera data fetch {name}` first, or set data.fetch = true)",
            root.display()
        )
    })?;
    Ok((Arc::new(split.train), Arc::new(split.test)))
}

impl RunData {
    /// The run's loaders, the methods' per-sample transforms (of `engine`) in the training
    /// loader. In a data-parallel run, rank 0 fetches and prepares the data (caches) while the
    /// others wait, then they read it, and each rank gets its share.
    pub(super) fn load(
        config: &Config,
        engine: &Engine,
        dp: Option<&DataParallel>,
    ) -> Result<RunData> {
        if let Some(dp) = dp.filter(|d| d.rank() != 0) {
            dp.group
                .barrier()
                .context("waiting for rank 0 to prepare the data")?;
        }
        let (train_loader, eval_loader, text_facts, tokenizer) = if config.data.is_text() {
            build_token_loaders(config, &engine.sample_transforms())?
        } else {
            let (train, eval) = build_loaders(config, &engine.sample_transforms())?;
            (train, eval, None, None)
        };
        if let Some(dp) = dp.filter(|d| d.rank() == 0) {
            dp.group
                .barrier()
                .context("waiting for the other ranks to join")?;
        }
        // The evaluation subset is chosen from the whole set, the same on any number of ranks.
        let eval_subset = match config.train.eval_subset_batches {
            0 => None,
            n => {
                let count = n.saturating_mul(config.data.eval_batch_size);
                let (loader, choice) = eval_loader
                    .subset(count, config.train.eval_subset_seed)
                    .context("choosing the evaluation subset (train.eval_subset_batches)")?;
                Some((loader, choice))
            }
        };
        // Each rank trains on its share of every epoch and evaluates its share of the test set;
        // over several nodes, a sharded dataset gives each node shards of its own to train on.
        let (train_loader, eval_loader, eval_subset) = match dp {
            Some(dp) => (
                train_loader
                    .shard(dp.rank(), dp.world(), true)
                    .across_nodes(dp.local_world),
                eval_loader.shard(dp.rank(), dp.world(), false),
                eval_subset
                    .map(|(loader, choice)| (loader.shard(dp.rank(), dp.world(), false), choice)),
            ),
            None => (train_loader, eval_loader, eval_subset),
        };
        Ok(RunData {
            train_loader,
            eval_loader,
            eval_subset,
            text_facts,
            tokenizer,
        })
    }

    /// The input shape the model is built for: the training loader's samples, after the
    /// methods' per-sample transforms.
    pub(super) fn input_shape(&self) -> InputShape {
        let (c, h, w) = self.train_loader.sample_shape();
        InputShape {
            channels: c as i64,
            height: h as i64,
            width: w as i64,
        }
    }
}
