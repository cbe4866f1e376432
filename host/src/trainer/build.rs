//! Building a run from its config: device, data, model, methods, optimizer, schedule.

use std::time::Instant;

use crate::checkpoint;
use crate::config::{self, Config};
use crate::data::TextFacts;
use crate::dist::shard::Sharding;
use crate::engine::{Algorithm, Engine, Event, RunState, SetupState, Stage};
use crate::model::{unit_paths, Model};
use crate::optim::Optimizer;
use crate::report::{PluginRecord, Reporter};
use crate::time::RunLength;

use super::data::RunData;
use super::dist::DataParallel;
use super::error::{fail, Context as _, Result};
use super::methods::{check_claims, load_methods};
use super::parts::{History, Saved, Tally, WallTime};
use super::resume::same_folder;
use super::start::Start;
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
        let process = Process::start(&config, purpose)?;
        // Methods first: their per-sample transforms join the training loader.
        let (mut engine, plugins) = load_methods(&config, extra)?;
        let data = RunData::load(&config, &engine, process.dp.as_ref())?;
        let classes = output_classes(&mut config, data.text_facts.as_ref())?;
        let model = Model::build(
            &config.model,
            data.input_shape(),
            classes as i64,
            process.device,
        )
        .context("building the model")?;
        let units = Units::of(&config, &model, process.dp.as_ref())?;
        let mut start = Start::find(&config, &model)?;
        let run = RunLength::new(
            config.train.max_duration,
            data.train_loader.batches_per_epoch(),
            config.data.batch_size as u64,
        )?
        .scaled(config.train.scale_schedule_ratio)?;
        config
            .scheduler
            .check(&run, config.train.scale_schedule_ratio)
            .context("[scheduler]")?;
        let (setup, optimizer, graphs) =
            set_up(&config, &mut engine, model, run, &data, &process, &units)?;
        // Token ids are checked on the host against the token embedding as surgery left it.
        let uploader = super::input::Uploader::new(process.device, setup.model.token_rows());
        let mut state = RunState::new(setup, optimizer);
        state.loss_fn = config.train.loss_fn();
        if let Some(dp) = &process.dp {
            super::dist::agree_on_resume(dp, start.resume.as_ref())?;
        }
        let reporter = open_reporter(&config, purpose, &process, &start, &plugins)?;
        let trainer = Trainer {
            engine,
            state,
            data,
            reporter,
            history: History::new(plugins, start.init_report.take()),
            tally: Tally::default(),
            wall: WallTime::new(started),
            saved: Saved::default(),
            uploader,
            graphs,
            microbatch: config.train.microbatch_size.initial(config.data.batch_size),
            config,
            stop: None,
            quiet_metrics: start.resume.is_some(),
            purpose,
            dp: process.dp,
            agreed_stop: None,
        };
        trainer.start(start, &units)
    }

    /// The last steps of [`Trainer::build`]: the ranks agree on the model, sharding starts, and
    /// the run continues from its checkpoint (`before_load`, `after_load` around it).
    fn start(mut self, start: Start, units: &Units) -> Result<Trainer> {
        if self.dp.is_some() {
            // Every rank starts from rank 0's model (surgery drew the same weights, but a
            // method's own draws need not), then draws its own random numbers.
            self.broadcast_model(true, true)?;
            self.seed_rank();
            self.announce_data_parallel();
        }
        // Before a checkpoint is restored: its optimizer state is cut into this rank's pieces.
        self.start_sharding(&units.sharded, &units.blocks)?;
        if self.quiet_metrics {
            self.state.metrics.clear();
        }
        self.fire(Event::BEFORE_LOAD)?;
        if let Some((path, c)) = start.resume {
            let applied = Instant::now();
            self.apply_checkpoint(&path, c)
                .with_context(|| format!("resuming from {}", path.display()))?;
            let t = self.timestamp();
            tracing::info!(
                "{} {} at epoch {}, batch {} (read and verified in {:.0} ms, restored in {:.0} ms)",
                match self.purpose {
                    Purpose::Fit => "resumed from",
                    Purpose::Standalone => "loaded",
                },
                path.display(),
                t.epoch,
                t.batch,
                start.read_ms,
                applied.elapsed().as_secs_f64() * 1e3
            );
        }
        if let Some((path, c)) = start.weights_from {
            self.apply_weights_only(&path, c)
                .with_context(|| format!("checkpoint.load {} (weights_only)", path.display()))?;
        }
        self.fire(Event::AFTER_LOAD)?;
        self.quiet_metrics = false;
        self.start_reducer()?;
        // The peak counts the training from here: the set-up's passing tensors are left out.
        crate::memory::peak::reset(self.state.device());
        Ok(self)
    }
}

/// The process a run trains in: its device (with libtorch's settings made) and, in a
/// data-parallel run, its membership of the group.
struct Process {
    device: tch::Device,
    dp: Option<DataParallel>,
}

impl Process {
    /// Joins the data-parallel group (a rank that never comes is reported before any work),
    /// picks the device and makes libtorch's process-wide settings, seeds, and sets the threads.
    fn start(config: &Config, purpose: Purpose) -> Result<Process> {
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
            Some(env) => Some(super::dist::join(config, &env, device)?),
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
        Ok(Process { device, dp })
    }
}

/// The number of outputs: a language model predicts one of the vocabulary's tokens, a text
/// classifier one of the classes its labels name. What only the loaded text knows goes into
/// the run's config, so that what is built again from the recorded config (`tessera export`,
/// `eval`) has the same shapes: the outputs (the vocabulary with the reserved special tokens,
/// or the classes), and a BERT classifier's vocabulary.
fn output_classes(config: &mut Config, text_facts: Option<&TextFacts>) -> Result<usize> {
    if let Some(classes) = text_facts.and_then(|f| f.classes.as_ref()) {
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
    let classes = match text_facts {
        Some(facts) => facts.classes.as_ref().map_or(facts.vocab_size, |c| c.count),
        None => config.model.num_classes,
    };
    if let Some(facts) = text_facts {
        config.model.num_classes = classes;
        if let Some(bert) = config.model.bert.as_mut() {
            if bert.head == crate::model::BertHead::Classification && bert.vocab_size.is_none() {
                bert.vocab_size = Some(facts.vocab_size);
            }
        }
    }
    Ok(classes)
}

/// The model's units that set-up treats apart, found by their kinds before a method's surgery
/// wraps them in its own.
struct Units {
    /// `train.activation_checkpointing`'s.
    checkpointed: Vec<String>,
    /// `[distributed] sharding = "full"`'s units, and the model's blocks.
    sharded: Vec<String>,
    blocks: Vec<String>,
}

impl Units {
    fn of(config: &Config, model: &Model, dp: Option<&DataParallel>) -> Result<Units> {
        let checkpointed = checkpointed_units(config, model, dp.is_some())?;
        let (sharded, blocks) = match dp {
            Some(_) if config.distributed.sharding == Sharding::Full => (
                unit_paths(model, config.distributed.shard_unit),
                unit_paths(model, crate::model::Unit::Block),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        Ok(Units {
            checkpointed,
            sharded,
            blocks,
        })
    }
}

/// Set-up: `init` fires (surgery happens before the optimizer exists, so the optimizer simply
/// sees the parameters as surgery left them), then the optimizer, activation checkpointing and
/// `train.cuda_graphs`' captured steps are made.
fn set_up(
    config: &Config,
    engine: &mut Engine,
    model: Model,
    run: RunLength,
    data: &RunData,
    process: &Process,
    units: &Units,
) -> Result<(SetupState, Optimizer, Option<super::graph::StepGraphs>)> {
    let device = process.device;
    let mut setup = SetupState::new(
        model,
        config.train.precision,
        run,
        config.optimizer.lr(),
        config.seed,
    );
    setup.sampler = Some(training_sampler(data.train_loader.clone(), device));
    engine.fire(Event::INIT, &mut Stage::Setup(&mut setup))?;
    setup.sampler = None;
    check_context_length(config, &setup.model)?;
    let claimed = check_claims(engine, &setup)?;
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
    if let Err(e) = setup.model.checkpoint_activations(&units.checkpointed) {
        fail!("train.activation_checkpointing: {e}");
    }
    // train.cuda_graphs: refused at start, naming what cannot be captured.
    let graphs = if config.train.cuda_graphs {
        let world = process.dp.as_ref().map_or(1, |d| d.world());
        let capturable =
            super::graph::check(config, engine, &setup.model, &optimizer, world, device);
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
    Ok((setup, optimizer, graphs))
}

/// The run's reporter: rank 0 of a training run prepares the checkpoint folder and opens the
/// run's metrics (continuing where the checkpoint left them when it belongs to this run) and
/// its tracking; other ranks and standalone runs report nothing.
fn open_reporter(
    config: &Config,
    purpose: Purpose,
    process: &Process,
    start: &Start,
    plugins: &[PluginRecord],
) -> Result<Reporter> {
    let rank0 = process.dp.as_ref().is_none_or(|d| d.rank() == 0);
    Ok(match purpose {
        Purpose::Fit if !rank0 => Reporter::discard(),
        Purpose::Fit => {
            prepare_checkpoint_folder(&config.checkpoint, start.resume.is_some())?;
            let metrics_at = start
                .resume
                .as_ref()
                .filter(|(path, _)| same_folder(path, &config.checkpoint.folder))
                .map(|(_, c)| c.meta.trainer.metrics_bytes);
            let mut reporter =
                Reporter::resume(&config.run_dir(), config.train.progress, metrics_at)
                    .with_context(|| {
                        format!("creating the run folder {}", config.run_dir().display())
                    })?;
            super::tracking::start(config, plugins, metrics_at.is_some(), &mut reporter);
            reporter
        }
        Purpose::Standalone => Reporter::discard(),
    })
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
    stale.push(ck.folder.join(checkpoint::BEST));
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
