//! Building a run from its config: device, data, model, methods, optimizer, schedule.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::checkpoint;
use crate::config::{self, Config};
use crate::data::{
    self, ImageDataset, ImageFolder, Loader, LoaderOptions, MethodTransform, SampleSource,
};
use crate::dist::shard::Sharding;
use crate::engine::{Algorithm, Engine, Event, OnError, RunState, SetupState, Stage};
use crate::model::{unit_paths, InputShape, Model};
use crate::optim::Optimizer;
use crate::plugin::LoadedPlugin;
use crate::report::{PluginRecord, Reporter};
use crate::time::RunLength;

use super::error::{fail, Context as _, Result};
use super::resume::{find_resume_checkpoint, same_folder, weights_checkpoint};
use super::{Purpose, Trainer};

impl Trainer {
    /// Builds a run from `config`: data, model, methods (plugins named in the config, then
    /// `extra` built-in methods), then — after `init`, where surgery may change the model — the
    /// optimizer with its schedule; resumes from a checkpoint when asked. Fires `init`,
    /// `before_load`, `after_load`.
    pub fn new(config: Config, extra: Vec<Box<dyn Algorithm>>) -> Result<Trainer> {
        Trainer::build(config, extra, Purpose::Fit)
    }

    /// [`Trainer::new`] for `purpose`: a standalone trainer starts from the checkpoint the
    /// config names (`checkpoint.load`, autoresume) but neither prepares the checkpoint folder
    /// nor opens the run's metrics file.
    pub(super) fn build(
        mut config: Config,
        extra: Vec<Box<dyn Algorithm>>,
        purpose: Purpose,
    ) -> Result<Trainer> {
        let started = Instant::now();
        // A data-parallel rank joins its group first: a rank that never comes is reported
        // before any work.
        let rank_env = match purpose {
            Purpose::Fit => crate::dist::RankEnv::from_env()?,
            Purpose::Standalone => None,
        };
        // One GPU per rank (cuda:LOCAL_RANK) unless the config names one; then libtorch's
        // process-wide settings, before any CUDA work (cuBLAS reads CUBLAS_WORKSPACE_CONFIG
        // at its first handle).
        let device = config
            .train
            .device
            .resolve_for(rank_env.as_ref().map(crate::dist::RankEnv::local))?;
        crate::device::apply_settings(
            config.train.deterministic,
            config.train.matmul_precision,
            device,
        )
        .map_err(crate::device::DeviceError::from)?;
        let dp = match rank_env {
            Some(env) => Some(super::dist::join(&config, &env, device)?),
            None => None,
        };
        if config.train.microbatch_size == crate::config::MicrobatchSize::Auto {
            if dp.is_some() {
                fail!("train.microbatch_size = \"auto\" is not supported in data-parallel runs yet (a rank that runs out of memory mid-backward would leave the others waiting in the gradient all-reduce); give a number");
            }
            if purpose == Purpose::Fit && !super::microbatch::watch_oom() {
                tracing::warn!("train.microbatch_size = \"auto\": another memory reporter (a profiler) is installed, so out-of-memory errors cannot be recognised and will stop the run");
            }
        }
        // TESSERA_MEMORY_PEAK=1: count the CPU allocations from before the model exists.
        if std::env::var(crate::memory::peak::CPU_VARIABLE).is_ok_and(|v| v == "1")
            && !crate::memory::peak::watch_cpu()
        {
            tracing::warn!("TESSERA_MEMORY_PEAK=1: a profiler holds libtorch's memory reporter, so the CPU peak is not counted");
        }
        // Every rank builds the same model from the run's seed; each gets its own streams
        // after set-up (`seed_rank`).
        tch::manual_seed(config.seed as i64);
        if config.train.threads > 0 {
            tch::set_num_threads(config.train.threads as i32);
        } else if let Some(dp) = &dp {
            // The ranks on one machine share its cores, as torchrun's OMP_NUM_THREADS does.
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            tch::set_num_threads((cores / dp.local_world).max(1) as i32);
        }
        // Methods first: their per-sample transforms join the training loader.
        let (mut engine, plugins) = load_methods(&config, extra)?;
        // Rank 0 fetches and prepares the data (caches) while the others wait, then they read it.
        if let Some(dp) = dp.as_ref().filter(|d| d.rank() != 0) {
            dp.group
                .barrier()
                .context("waiting for rank 0 to prepare the data")?;
        }
        let (train_loader, eval_loader, text_facts, tokenizer) = if config.data.is_text() {
            build_token_loaders(&config, &engine.sample_transforms())?
        } else {
            let (train, eval) = build_loaders(&config, &engine.sample_transforms())?;
            (train, eval, None, None)
        };
        if let Some(dp) = dp.as_ref().filter(|d| d.rank() == 0) {
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
        let (train_loader, eval_loader, eval_subset) = match &dp {
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
        let (c, h, w) = train_loader.sample_shape();
        let input = InputShape {
            channels: c as i64,
            height: h as i64,
            width: w as i64,
        };
        // A language model predicts one of the vocabulary's tokens, a text classifier one of
        // the classes its labels name.
        if let Some(classes) = text_facts.as_ref().and_then(|f| f.classes.as_ref()) {
            if config.model.torchscript.is_none()
                && matches!(
                    config.model.name,
                    crate::model::ModelName::Gpt2 | crate::model::ModelName::Llama
                )
            {
                fail!(
                    "model {:?} is a language model (next-token logits over the vocabulary), \
                     but dataset {:?} is labelled text of {} classes: use a text classifier",
                    config.model.name.as_str(),
                    config.data.dataset.as_str(),
                    classes.count
                );
            }
        }
        let classes = match &text_facts {
            Some(facts) => facts.classes.as_ref().map_or(facts.vocab_size, |c| c.count),
            None => config.model.num_classes,
        };
        // What only the loaded text knows goes into the run's config, so that what is built
        // again from the recorded config (`tessera export`, `eval`) has the same shapes: the
        // outputs (the vocabulary with the reserved special tokens, or the classes), and a BERT
        // classifier's vocabulary.
        if let Some(facts) = &text_facts {
            config.model.num_classes = classes;
            if let Some(bert) = config.model.bert.as_mut() {
                if bert.head == crate::model::BertHead::Classification && bert.vocab_size.is_none()
                {
                    bert.vocab_size = Some(facts.vocab_size);
                }
            }
        }
        let model = Model::build(&config.model, input, classes as i64, device)
            .context("building the model")?;
        // Units are found by their kinds before a method's surgery wraps them in its own.
        let checkpointed_units = checkpointed_units(&config, &model, dp.is_some())?;
        let (sharded_units, blocks) = match &dp {
            Some(_) if config.distributed.sharding == Sharding::Full => (
                unit_paths(&model, config.distributed.shard_unit),
                unit_paths(&model, crate::model::Unit::Block),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        // Which checkpoint the run continues (or, weights only, starts) from: read before the
        // pretrained weights, which a resumed run does not need.
        let read_started = Instant::now();
        let resume = find_resume_checkpoint(&config.checkpoint)?;
        let read_ms = read_started.elapsed().as_secs_f64() * 1e3;
        let weights_from = weights_checkpoint(&config.checkpoint, resume.is_some())?;
        // Pretrained weights go in before the methods' surgery, as a model built with its
        // pretrained weights (torchvision's `weights=`, `from_pretrained`) in Composer.
        let init_report = match &config.model.init {
            Some(_) if weights_from.is_some() => fail!(
                "give either `[model] init_weights` (a PyTorch state_dict) or `checkpoint.load` with `weights_only` (a Tessera checkpoint), not both"
            ),
            Some(init) if resume.is_none() => Some(load_init_weights(&config, &model, init)?),
            Some(init) => {
                tracing::info!(
                    "resuming: the weights come from the checkpoint, not from init_weights {}",
                    init.path.display()
                );
                None
            }
            None => None,
        };
        let run = RunLength::new(
            config.train.max_duration,
            train_loader.batches_per_epoch(),
            config.data.batch_size as u64,
        )?
        .scaled(config.train.scale_schedule_ratio)?;
        config
            .scheduler
            .check(&run, config.train.scale_schedule_ratio)
            .context("[scheduler]")?;

        // Set-up: surgery at `init` happens before the optimizer exists, so the optimizer
        // simply sees the parameters as surgery left them.
        let mut setup = SetupState::new(
            model,
            config.train.precision,
            run,
            config.optimizer.lr(),
            config.seed,
        );
        setup.sampler = Some(training_sampler(train_loader.clone(), device));
        engine.fire(Event::INIT, &mut Stage::Setup(&mut setup))?;
        setup.sampler = None;
        check_context_length(&config, &setup.model)?;
        let claimed = check_claims(&engine, &setup)?;
        if let Some(file) = &config.model.torchscript {
            announce_torchscript(file, &setup);
        }
        let optimizer = Optimizer::new(
            config.optimizer.clone(),
            config.scheduler.clone(),
            config.train.scale_schedule_ratio,
            &setup.model.params,
            &setup.model.root.walk(),
        )
        .map_err(crate::optim::OptimizerStateError::from)
        .context("[optimizer.groups]")?;
        let mut optimizer = optimizer;
        optimizer.hand_over(&claimed);
        // After the surgery and the optimizer's groups (which read the units' own kinds).
        if let Err(e) = setup.model.checkpoint_activations(&checkpointed_units) {
            fail!("train.activation_checkpointing: {e}");
        }
        // train.cuda_graphs: refused at start, naming what cannot be captured.
        let graphs = if config.train.cuda_graphs {
            let world = dp.as_ref().map_or(1, |d| d.world());
            let capturable =
                super::graph::check(&config, &engine, &setup.model, &optimizer, world, device);
            if let Err(e) = capturable {
                fail!("train.cuda_graphs = true: {e}");
            }
            let index = match device {
                tch::Device::Cuda(i) => i,
                _ => 0,
            };
            optimizer.keep_lr_on_device(device)?;
            Some(super::graph::StepGraphs::new(index))
        } else {
            None
        };
        // Token ids are checked on the host against the token embedding as surgery left it.
        let uploader = super::input::Uploader::new(device, setup.model.token_rows());
        let mut state = RunState::new(setup, optimizer);
        state.loss_fn = config.train.loss_fn();

        if let Some(dp) = &dp {
            super::dist::agree_on_resume(dp, resume.as_ref())?;
        }
        let rank0 = dp.as_ref().is_none_or(|d| d.rank() == 0);
        let reporter = match purpose {
            Purpose::Fit if !rank0 => Reporter::discard(),
            Purpose::Fit => {
                prepare_checkpoint_folder(&config.checkpoint, resume.is_some())?;
                // Metrics continue where the checkpoint left them when it belongs to this run.
                let metrics_at = resume
                    .as_ref()
                    .filter(|(path, _)| same_folder(path, &config.checkpoint.folder))
                    .map(|(_, c)| c.meta.trainer.metrics_bytes);
                let mut reporter =
                    Reporter::resume(&config.run_dir(), config.train.progress, metrics_at)
                        .with_context(|| {
                            format!("creating the run folder {}", config.run_dir().display())
                        })?;
                super::tracking::start(&config, &plugins, metrics_at.is_some(), &mut reporter);
                reporter
            }
            Purpose::Standalone => Reporter::discard(),
        };
        let mut trainer = Trainer {
            engine,
            state,
            train_loader,
            eval_loader,
            eval_subset,
            text_facts,
            tokenizer,
            reporter,
            plugins,
            evals: Vec::new(),
            eval_times: Vec::new(),
            last_eval_batch: None,
            running_loss: 0.0,
            running_batches: 0,
            pending: Default::default(),
            scale_logged: false,
            host_reads: Default::default(),
            uploader,
            graphs,
            reads_at_start: (0, 0),
            microbatch: config.train.microbatch_size.initial(config.data.batch_size),
            train_seconds: 0.0,
            started,
            wall_before: 0.0,
            config,
            stop: None,
            last_checkpoint_batch: None,
            last_checkpoint: None,
            resumed_from: None,
            skipped_steps: 0,
            trained_samples: 0,
            quiet_metrics: resume.is_some(),
            purpose,
            dp,
            agreed_stop: None,
            step_samples: 0,
            target_reached: None,
            init_weights: init_report,
            weights_from: None,
            memory_after_step: None,
        };
        if trainer.dp.is_some() {
            // Every rank starts from rank 0's model (surgery drew the same weights, but a
            // method's own draws need not), then draws its own random numbers.
            trainer.broadcast_model(true, true)?;
            trainer.seed_rank();
            trainer.announce_data_parallel();
        }
        // Before a checkpoint is restored: its optimizer state is cut into this rank's pieces.
        trainer.start_sharding(&sharded_units, &blocks)?;
        if trainer.quiet_metrics {
            trainer.state.metrics.clear();
        }
        trainer.fire(Event::BEFORE_LOAD)?;
        if let Some((path, c)) = resume {
            let applied = Instant::now();
            trainer
                .apply_checkpoint(&path, c)
                .with_context(|| format!("resuming from {}", path.display()))?;
            let t = trainer.timestamp();
            tracing::info!(
                "{} {} at epoch {}, batch {} (read and verified in {read_ms:.0} ms, restored in {:.0} ms)",
                match purpose {
                    Purpose::Fit => "resumed from",
                    Purpose::Standalone => "loaded",
                },
                path.display(),
                t.epoch,
                t.batch,
                applied.elapsed().as_secs_f64() * 1e3
            );
        }
        if let Some((path, c)) = weights_from {
            trainer
                .apply_weights_only(&path, c)
                .with_context(|| format!("checkpoint.load {} (weights_only)", path.display()))?;
        }
        trainer.fire(Event::AFTER_LOAD)?;
        trainer.quiet_metrics = false;
        trainer.start_reducer()?;
        // The peak counts the training from here: the set-up's passing tensors are left out.
        crate::memory::peak::reset(device);
        Ok(trainer)
    }
}

/// Loads `[model] init_weights` into the freshly built `model`, logging what it loaded.
fn load_init_weights(
    config: &Config,
    model: &Model,
    init: &crate::model::InitWeights,
) -> Result<crate::model::InitReport> {
    let started = Instant::now();
    let report = crate::model::load_init_weights(
        model,
        config.model.name,
        &init.path,
        &init.ignore,
        init.strict,
    )
    .context("[model] init_weights")?;
    tracing::info!(
        "init_weights: loaded {} tensors from {} in {:.0} ms{}",
        report.loaded,
        init.path.display(),
        started.elapsed().as_secs_f64() * 1e3,
        [
            ("ignored", report.ignored.len()),
            ("new head", report.new_head.len()),
            ("converted", report.converted.len())
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!(", {n} {what}"))
        .collect::<String>()
    );
    for (what, names) in [
        ("the file lacks (left as drawn)", &report.missing),
        ("the model lacks (skipped)", &report.unexpected),
        ("differ (left as drawn)", &report.mismatched),
    ] {
        if !names.is_empty() {
            tracing::warn!(
                "init_weights: {} tensor(s) {what}: {}",
                names.len(),
                crate::model::listed(names, false)
            );
        }
    }
    Ok(report)
}

/// Reads training samples for methods at `init` (plugin-api 1.6 `training_sample`): the first
/// batches of epoch 0 of a copy of the training loader (so the run's loader does not move), as
/// the training step puts them on the device.
fn training_sampler(loader: crate::data::Loader, device: tch::Device) -> crate::engine::Sampler {
    Box::new(move |n: usize| {
        let fail = |e: String| crate::engine::CallError(format!("reading training samples: {e}"));
        let mut parts: Vec<crate::engine::Batch> = Vec::new();
        let mut have = 0usize;
        for batch in loader.epoch(0, 0) {
            if have >= n {
                break;
            }
            let batch = batch.map_err(|e| fail(e.to_string()))?;
            let batch = super::input::to_device(&batch, device).map_err(|e| fail(e.to_string()))?;
            have += batch.len() as usize;
            parts.push(batch);
        }
        let Some(first) = parts.first() else {
            return Err(fail("the training set is empty".into()));
        };
        let mut out = Vec::new();
        for key in first.keys() {
            let tensors: Vec<&tch::Tensor> = parts.iter().filter_map(|b| b.get(&key)).collect();
            let all = tch::Tensor::f_cat(&tensors, 0).map_err(|e| fail(e.to_string()))?;
            let keep = (n as i64).min(all.size().first().copied().unwrap_or(0));
            out.push((
                key,
                all.f_narrow(0, 0, keep).map_err(|e| fail(e.to_string()))?,
            ));
        }
        Ok(out)
    })
}

/// The parameters methods claimed at `init` (plugin-api 1.6), after checking that each method
/// that claimed some receives `optimizer_step`, where it must update them.
fn check_claims(engine: &crate::engine::Engine, setup: &SetupState) -> Result<Vec<String>> {
    let updating = engine.order_at(Event::OPTIMIZER_STEP);
    for (index, name) in &setup.claims {
        let method = engine.name_of(*index).unwrap_or("?");
        if !updating.contains(&method) {
            fail!("method `{method}` claimed parameter `{name}` but does not hook `optimizer_step`, where it would update it: the parameter would never train");
        }
    }
    if !setup.claims.is_empty() {
        tracing::info!(
            "{} parameters are updated by methods: {}",
            setup.claims.len(),
            engine_summary(engine, &setup.claims)
        );
    }
    Ok(setup.claims.iter().map(|(_, n)| n.clone()).collect())
}

/// `method (n parameters)` for every method that claimed parameters.
fn engine_summary(engine: &crate::engine::Engine, claims: &[(usize, String)]) -> String {
    let mut counts: Vec<(usize, usize)> = Vec::new();
    for (i, _) in claims {
        match counts.iter_mut().find(|(m, _)| m == i) {
            Some((_, c)) => *c += 1,
            None => counts.push((*i, 1)),
        }
    }
    counts
        .iter()
        .map(|(i, c)| format!("{} ({c})", engine.name_of(*i).unwrap_or("?")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The paths of the units `train.activation_checkpointing` recomputes (none when it is off);
/// a model without such units is refused, naming it.
fn checkpointed_units(config: &Config, model: &Model, data_parallel: bool) -> Result<Vec<String>> {
    let Some(checkpointing) = &config.train.activation_checkpointing else {
        return Ok(Vec::new());
    };
    let unit = checkpointing.unit.as_str();
    let model_name = match &config.model.torchscript {
        Some(file) => format!("the TorchScript model {}", file.path.display()),
        None => format!("model {:?}", config.model.name.as_str()),
    };
    let paths = checkpointing.select(model);
    if paths.is_empty() {
        fail!(
            "train.activation_checkpointing: {model_name} has no {unit} to recompute (blocks are \
             transformer, ResNet and airbench blocks; stages are containers of blocks); remove \
             the key"
        );
    }
    if data_parallel && config.distributed.find_unused_parameters {
        fail!(
            "train.activation_checkpointing needs `[distributed] find_unused_parameters = \
             false` in a data-parallel run: the reducer's search for unused parameters does \
             not see the parameters of the recomputed units and would then count them twice"
        );
    }
    tracing::info!(
        "activation checkpointing: {} of the model's {unit}s recomputed in backward",
        paths.len()
    );
    Ok(paths)
}

/// A language model whose learned position embeddings (`transformer.wpe`, still there after
/// `init`: no method such as ALiBi replaced them) are shorter than the training or evaluation
/// sequences is refused now, naming the setting, rather than at its first batch or evaluation.
fn check_context_length(config: &Config, model: &Model) -> Result<()> {
    let Some(text) = &config.data.text else {
        return Ok(());
    };
    let positions = model.root.walk().into_iter().find_map(|l| {
        (l.path == "transformer.wpe" && l.kind == "embedding")
            .then(|| match l.attrs.get("num_embeddings") {
                Some(crate::model::Attr::Int(n)) => Some(*n as usize),
                _ => None,
            })
            .flatten()
    });
    let Some(positions) = positions else {
        return Ok(());
    };
    for (key, len) in [
        ("data.text.seq_len", text.seq_len),
        ("data.text.eval_seq_len", text.eval_seq_len()),
    ] {
        if len > positions {
            fail!(
                "{key} = {len} is longer than the model's context of {positions} tokens \
                 (`[model] n_positions`, its learned position embeddings): raise n_positions, \
                 shorten the sequences, or use a method without position embeddings (alibi)"
            );
        }
    }
    Ok(())
}

/// Says which TorchScript model the run trains and, when a method looked for layers to change at
/// `init` (surgery), that it cannot see inside that model.
fn announce_torchscript(file: &crate::model::TorchscriptFile, setup: &SetupState) {
    let params = &setup.model.params;
    tracing::info!(
        "model: TorchScript {} (sha256 {}): {} tensors, {} trainable parameters",
        file.path.display(),
        file.sha256,
        params.entries().len(),
        params.num_trainable_scalars()
    );
    if setup.modules_listed {
        tracing::warn!(
            "the TorchScript model {} is opaque to surgery: methods that change layers \
             (blurpool, squeeze_excite, weight_standardization, ...) see it as one `torchscript` \
             module and leave it unchanged; methods that act on the batch, the loss or the \
             optimizer work as usual",
            file.path.display()
        );
    }
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

/// A text dataset's training and evaluation sequences and what the model needs to know of it.
pub struct TokenSets {
    /// The training sequences.
    pub train: Arc<dyn data::TokenSource>,
    /// The evaluation sequences.
    pub eval: Arc<dyn data::TokenSource>,
    /// The vocabulary, the classes of labelled text, the special tokens.
    pub facts: data::TextFacts,
    /// The tokenizer file the text was encoded with and its sha256, as the loader read them
    /// (`None` for `synthetic-text`); checkpoints record it for `tessera export --format hf`.
    pub tokenizer: Option<crate::checkpoint::TokenizerFile>,
}

/// The training and evaluation token sequences of a text dataset and its facts:
/// `synthetic-text` generated from the run's seed, a corpus loaded (fetched when allowed) and
/// tokenized, the user's own text read, split and tokenized (cached by its content hash), or
/// the user's labelled text read, split and encoded as `[CLS] tokens [SEP] [PAD]...` samples.
/// With `[data.mlm]`, a language model's sequences are served masked.
pub fn load_token_sets(cfg: &Config) -> Result<TokenSets> {
    let d = &cfg.data;
    let Some(text) = &d.text else {
        fail!("dataset `{}` is not text", d.dataset);
    };
    let own_text = |path: PathBuf| data::OwnTextConfig {
        path,
        eval_path: text.eval_path.clone(),
        eval_fraction: text.eval_fraction(),
        text_field: text.text_field().to_owned(),
        vocab_size: text.vocab_size,
        tokenizer: text.tokenizer.clone(),
        cache_dir: text
            .cache_dir
            .clone()
            .unwrap_or_else(|| data::default_cache_root().join("text")),
    };
    let announce = |path: PathBuf, sha256: String| {
        tracing::info!("tokenizer {} (sha256 {sha256})", path.display());
        Some(crate::checkpoint::TokenizerFile { path, sha256 })
    };
    if d.dataset == data::Dataset::Chat {
        let Some(path) = d.data_dir.clone() else {
            fail!("dataset = \"chat\" needs data.data_dir: the conversations");
        };
        let ccfg = data::ChatConfig {
            text: own_text(path),
            template: text.chat_template.clone(),
            loss_on: text.loss_on.unwrap_or(data::LossOn::Assistant),
            layout: if text.packing.unwrap_or(false) {
                data::ChatLayout::Packed
            } else {
                data::ChatLayout::Padded
            },
            seq_len: text.seq_len,
            eval_seq_len: text.eval_seq_len(),
            ignore: data::IGNORE_TARGET,
        };
        let loaded = data::load_chat(&ccfg).with_context(|| {
            format!("loading the conversations at {}", ccfg.text.path.display())
        })?;
        let tokenizer = announce(loaded.tokenizer_path, loaded.tokenizer_sha256);
        let truncated = loaded.train.truncated();
        if truncated > 0 {
            tracing::warn!(
                "{truncated} of {} training conversations are longer than {} tokens and are cut \
                 (raise data.text.seq_len, or set data.text.packing = true)",
                loaded.conversations.0,
                text.seq_len + 1
            );
        }
        for (split, seqs) in [("training", &loaded.train), ("evaluation", &loaded.eval)] {
            if seqs.dropped() > 0 {
                tracing::warn!(
                    "{} {split} sequences have no assistant token within {} tokens and are left \
                     out (their loss would be a mean over nothing; raise data.text.seq_len)",
                    seqs.dropped(),
                    seqs.seq_len() + 1
                );
            }
        }
        tracing::info!(
            "chat: {} training and {} evaluation conversations, template {}, {} sequences of {} ({}), {} scored targets ({}), vocabulary {}",
            loaded.conversations.0,
            loaded.conversations.1,
            loaded.template,
            loaded.train.len(),
            text.seq_len,
            if ccfg.layout == data::ChatLayout::Packed { "packed" } else { "one conversation each, padded" },
            loaded.train.scored_targets(),
            if ccfg.loss_on == data::LossOn::Assistant { "the assistant's tokens" } else { "every token" },
            loaded.vocab_size
        );
        return Ok(TokenSets {
            facts: data::TextFacts {
                vocab_size: loaded.vocab_size,
                classes: None,
                special_tokens: None,
            },
            train: Arc::new(loaded.train),
            eval: Arc::new(loaded.eval),
            tokenizer,
        });
    }
    if d.dataset == data::Dataset::LabelledText {
        let Some(path) = d.data_dir.clone() else {
            fail!("dataset = \"labelled-text\" needs data.data_dir: the labelled text");
        };
        let lcfg = data::LabelledTextConfig {
            text: own_text(path),
            label_field: text.label_field().to_owned(),
            pair_field: text.pair_field.clone(),
            seq_len: text.seq_len,
            eval_seq_len: text.eval_seq_len(),
        };
        let loaded = data::load_labelled_text(&lcfg).with_context(|| {
            format!("loading the labelled text at {}", lcfg.text.path.display())
        })?;
        let tokenizer = announce(loaded.tokenizer_path, loaded.tokenizer_sha256);
        tracing::info!(
            "{}: {} training and {} evaluation texts, {} classes{}, vocabulary {}, sequences of {}",
            d.dataset,
            loaded.train.len(),
            loaded.eval.len(),
            loaded.classes.count,
            loaded
                .classes
                .names
                .as_ref()
                .map(|n| format!(" ({})", n.join(", ")))
                .unwrap_or_default(),
            loaded.specials.vocab_size,
            text.seq_len
        );
        return Ok(TokenSets {
            facts: data::TextFacts {
                vocab_size: loaded.specials.vocab_size,
                classes: Some(loaded.classes),
                special_tokens: Some(loaded.specials),
            },
            tokenizer,
            train: Arc::new(loaded.train),
            eval: Arc::new(loaded.eval),
        });
    }
    // The token streams, their vocabulary and the special tokens' ids (tokenizer, if any).
    let (train, eval, vocab, specials, tokenizer) = match d.dataset {
        data::Dataset::SyntheticText => (
            data::synthetic_tokens(cfg.seed, text.tokens(), text.vocab_size)?,
            data::synthetic_tokens(
                cfg.seed.wrapping_add(1),
                text.eval_tokens(),
                text.vocab_size,
            )?,
            text.vocab_size,
            data::SpecialTokens::new(text.vocab_size, None, |_| None),
            None,
        ),
        data::Dataset::Text => {
            let Some(path) = d.data_dir.clone() else {
                fail!("dataset = \"text\" needs data.data_dir: the text to train on");
            };
            let cfg = own_text(path);
            let loaded = data::load_own_text(&cfg)
                .with_context(|| format!("loading the text at {}", cfg.path.display()))?;
            let specials = data::SpecialTokens::of(&loaded.tokenizer()?);
            let tokenizer = announce(loaded.tokenizer_path, loaded.tokenizer_sha256);
            (
                loaded.train,
                loaded.val,
                loaded.vocab_size,
                specials,
                tokenizer,
            )
        }
        corpus => {
            let root = d.data_dir.clone().unwrap_or_else(data::default_cache_root);
            let loaded = data::load_text(
                &data::CorpusConfig {
                    corpus: corpus.as_str().to_owned(),
                    vocab_size: text.vocab_size,
                    tokenizer: text.tokenizer.clone(),
                },
                &root,
                d.fetch,
            )
            .with_context(|| format!("loading the text corpus `{corpus}`"))?;
            let specials = data::SpecialTokens::of(&loaded.tokenizer()?);
            let tokenizer = announce(loaded.tokenizer_path, loaded.tokenizer_sha256);
            (
                loaded.train,
                loaded.val,
                loaded.vocab_size,
                specials,
                tokenizer,
            )
        }
    };
    let (n_train, n_eval) = (train.len(), eval.len());
    let train =
        data::PackedSequences::new(Arc::new(train), text.seq_len).context("the training split")?;
    let eval = data::PackedSequences::new(Arc::new(eval), text.eval_seq_len())
        .context("the evaluation split")?;
    let Some(mlm) = d.mlm else {
        tracing::info!(
            "{}: {n_train} training and {n_eval} evaluation tokens, vocabulary {vocab}, sequences of {} ({} in evaluation)",
            d.dataset,
            text.seq_len,
            text.eval_seq_len()
        );
        return Ok(TokenSets {
            train: Arc::new(train),
            eval: Arc::new(eval),
            facts: data::TextFacts {
                vocab_size: vocab,
                classes: None,
                special_tokens: None,
            },
            tokenizer,
        });
    };
    tracing::info!(
        "{}: {n_train} training and {n_eval} evaluation tokens, masked-LM (probability {}, [MASK] {}, random {}), vocabulary {} with [MASK] = {}, sequences of {} ({} in evaluation)",
        d.dataset,
        mlm.probability,
        mlm.mask_fraction,
        mlm.random_fraction,
        specials.vocab_size,
        specials.mask,
        text.seq_len,
        text.eval_seq_len()
    );
    let masked =
        |sequences, split| data::MaskedSequences::new(sequences, mlm, specials, cfg.seed, split);
    Ok(TokenSets {
        train: Arc::new(masked(train, data::MlmSplit::Train)),
        eval: Arc::new(masked(eval, data::MlmSplit::Eval)),
        facts: data::TextFacts {
            vocab_size: specials.vocab_size,
            classes: None,
            special_tokens: Some(specials),
        },
        tokenizer,
    })
}

/// Loads the plugins listed under `[[algorithms]]` and makes their methods, followed by the
/// `extra` built-in ones; returns the engine and what the run record says of each plugin.
fn load_methods(
    config: &Config,
    extra: Vec<Box<dyn Algorithm>>,
) -> Result<(Engine, Vec<PluginRecord>)> {
    let dirs = crate::plugin::search_dirs(crate::plugin::configured_dirs(&config.plugins));
    let mut algorithms: Vec<(Box<dyn Algorithm>, OnError)> = Vec::new();
    let mut plugins = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for a in &config.algorithms {
        if !seen.insert(a.plugin.clone()) {
            fail!(
                "trainer.toml line {}: plugin `{}` is listed twice",
                a.line,
                a.plugin
            );
        }
        let plugin = LoadedPlugin::load_named(&a.plugin, &dirs, a.sha256.as_deref())
            .with_context(|| format!("[[algorithms]] at line {}", a.line))?;
        let method = plugin
            .create(&a.settings_json())
            .with_context(|| format!("[[algorithms]] at line {}", a.line))?;
        tracing::info!(
            "loaded plugin {} {} ({})",
            plugin.name,
            plugin.version,
            plugin.path.display()
        );
        plugins.push(PluginRecord {
            name: plugin.name.clone(),
            version: plugin.version.clone(),
            path: plugin.path.clone(),
            sha256: plugin.sha256.clone(),
            settings: serde_json::Value::Object(a.settings.clone()),
        });
        algorithms.push((Box::new(method), a.on_error));
    }
    algorithms.extend(extra.into_iter().map(|a| (a, OnError::Stop)));
    Ok((Engine::new(algorithms), plugins))
}

/// Clears temporaries of interrupted writes and makes sure a fresh run (`resuming` false,
/// no autoresume) never silently replaces an earlier run's checkpoints: that is an error,
/// unless `checkpoint.overwrite` says to delete them.
fn prepare_checkpoint_folder(ck: &config::CheckpointConfig, resuming: bool) -> Result<()> {
    if ck.save {
        checkpoint::remove_stale_temporaries(&ck.folder);
    }
    let earlier = checkpoint::list(&ck.folder);
    if !ck.save || resuming || ck.autoresume || earlier.is_empty() {
        return Ok(());
    }
    if !ck.overwrite {
        fail!(
            "{} already holds {} checkpoint(s) of an earlier run (newest: {}); set checkpoint.autoresume = true to continue it, checkpoint.overwrite = true to start over (deleting them), or choose another run_name",
            ck.folder.display(),
            earlier.len(),
            earlier[0].display()
        );
    }
    let mut stale = earlier.clone();
    stale.push(ck.folder.join(checkpoint::LATEST));
    for old in stale.iter().filter(|p| p.symlink_metadata().is_ok()) {
        // A sharded checkpoint is a folder (`latest` a link to one).
        let is_folder = old.symlink_metadata().is_ok_and(|m| m.is_dir());
        let deleted = if is_folder {
            std::fs::remove_dir_all(old)
        } else {
            std::fs::remove_file(old)
        };
        deleted.with_context(|| format!("checkpoint.overwrite: deleting {}", old.display()))?;
    }
    tracing::info!(
        "checkpoint.overwrite: deleted {} checkpoint(s) of an earlier run in {}",
        earlier.len(),
        ck.folder.display()
    );
    Ok(())
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
