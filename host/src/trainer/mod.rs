//! The training and evaluation loops, firing Composer's events in Composer's order
//! (`shared/reference/composer.md` §1.2).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _};
use serde_json::json;
use tch::{Device, Kind, Reduction, Tensor};
use tessera_plugin_api::{TimeInfo, LIBTORCH_VERSION};

use crate::checkpoint::{self, Checkpoint, Meta, MethodMeta, TrainerMeta};
use crate::config::{self, Config};
use crate::data::{self, ImageDataset, Loader, LoaderOptions};
use crate::engine::{Algorithm, Batch, Engine, Event, MethodSnapshot, OnError, State};
use crate::model::{cross_entropy, InputShape, Model, NonFiniteLoss};
use crate::optim::{schedule::Schedule, Optimizer};
use crate::plugin::Plugin;
use crate::precision::AutocastGuard;
use crate::report::{write_atomic, EvalRecord, PluginRecord, Reporter, RunRecord};
use crate::time::{RunLength, Time, TimeUnit, Timestamp};

/// Loads (fetching when allowed) the train and test sets named in the config.
pub fn load_datasets(cfg: &Config) -> anyhow::Result<(ImageDataset, ImageDataset)> {
    let d = &cfg.data;
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
        return Ok((train, test));
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
    Ok((split.train, split.test))
}

/// A summary of a finished `fit`.
#[derive(Debug, Clone)]
pub struct FitSummary {
    /// The run record also written to `run.json`.
    pub record: RunRecord,
    /// The signal that interrupted the run (a checkpoint was written), if any.
    pub interrupted_by: Option<i32>,
}

/// The name of a signal number, for messages.
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        2 => "SIGINT",
        15 => "SIGTERM",
        1 => "SIGHUP",
        _ => "a signal",
    }
}

/// Owns everything a run needs and runs it.
pub struct Trainer {
    config: Config,
    device: Device,
    schedule: Schedule,
    engine: Engine,
    state: State,
    train_loader: Loader,
    eval_loader: Loader,
    run: RunLength,
    timestamp: Timestamp,
    reporter: Reporter,
    plugins: Vec<PluginRecord>,
    evals: Vec<EvalRecord>,
    last_eval_batch: Option<u64>,
    running_loss: Option<Tensor>,
    running_batches: u64,
    train_seconds: f64,
    started: Instant,
    stop: Option<Arc<AtomicUsize>>,
    last_checkpoint_batch: Option<u64>,
    last_checkpoint: Option<PathBuf>,
    resumed_from: Option<PathBuf>,
    skipped_steps: u64,
    /// Drop method metrics (while a resumed run replays `init`..`after_load`, whose metrics
    /// the original run already wrote).
    quiet_metrics: bool,
}

impl Trainer {
    /// Builds a run from `config`: data, model, methods (plugins named in the config, then
    /// `extra` built-in methods), optimizer, schedule. Fires `init`, `before_load`,
    /// `after_load`.
    pub fn new(config: Config, extra: Vec<Box<dyn Algorithm>>) -> anyhow::Result<Trainer> {
        let started = Instant::now();
        let device = config.train.device.resolve()?;
        tch::manual_seed(config.seed as i64);
        if config.train.threads > 0 {
            tch::set_num_threads(config.train.threads as i32);
        }

        let (train_set, test_set) = load_datasets(&config)?;
        let d = &config.data;
        let train_loader = Loader::new(
            Arc::new(train_set),
            Arc::new(d.transforms.pipeline(true)),
            LoaderOptions {
                batch_size: d.batch_size,
                shuffle: d.shuffle,
                drop_last: d.drop_last,
                seed: config.seed,
                workers: d.workers,
                prefetch: d.prefetch,
            },
        )?;
        let eval_loader = Loader::new(
            Arc::new(test_set),
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
        let (c, h, w) = train_loader.sample_shape();
        let input = InputShape {
            channels: c as i64,
            height: h as i64,
            width: w as i64,
        };
        let model = Model::build(
            &config.model,
            input,
            config.model.num_classes as i64,
            device,
        )
        .context("building the model")?;

        let run = RunLength::new(
            config.train.max_duration,
            train_loader.batches_per_epoch(),
            d.batch_size as u64,
        )?
        .scaled(config.train.scale_schedule_ratio)?;
        let schedule = config.scheduler.clone();
        schedule
            .check(&run, config.train.scale_schedule_ratio)
            .map_err(|e| anyhow::anyhow!("[scheduler]: {e}"))?;

        let dirs = crate::plugin::search_dirs(&config.plugins.dirs);
        let mut algorithms: Vec<(Box<dyn Algorithm>, OnError)> = Vec::new();
        let mut plugins = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for a in &config.algorithms {
            if !seen.insert(a.plugin.clone()) {
                bail!(
                    "trainer.toml line {}: plugin `{}` is listed twice",
                    a.line,
                    a.plugin
                );
            }
            let plugin = Plugin::load_named(&a.plugin, &dirs, a.sha256.as_deref())
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
        let engine = Engine::new(algorithms);
        let state = State::new(model, config.train.precision, config.seed);

        let mut engine = engine;
        let mut state = state;
        state.time.batches_per_epoch = run.batches_per_epoch;
        state.time.max_batches = run.max_batches().unwrap_or(0);
        state.time.training = true;
        state.surgery_allowed = true;
        engine.fire(Event::INIT, &mut state)?;
        state.surgery_allowed = false;
        // The optimizer is built after INIT so that it sees any parameters surgery created.
        state.optimizer = Some(Optimizer::new(
            config.optimizer.clone(),
            &state.model.params,
        ));

        let read_started = Instant::now();
        let resume = find_resume_checkpoint(&config.checkpoint)?;
        let read_ms = read_started.elapsed().as_secs_f64() * 1e3;
        let ck = &config.checkpoint;
        if ck.save {
            checkpoint::remove_stale_temporaries(&ck.folder);
        }
        // A fresh run never silently replaces an earlier run's checkpoints.
        let earlier = checkpoint::list(&ck.folder);
        if ck.save && resume.is_none() && !ck.autoresume && !earlier.is_empty() {
            if !ck.overwrite {
                bail!(
                    "{} already holds {} checkpoint(s) of an earlier run (newest: {}); set checkpoint.autoresume = true to continue it, checkpoint.overwrite = true to start over (deleting them), or choose another run_name",
                    ck.folder.display(),
                    earlier.len(),
                    earlier[0].display()
                );
            }
            let mut stale = earlier.clone();
            stale.push(ck.folder.join(checkpoint::LATEST));
            for old in stale.iter().filter(|p| p.symlink_metadata().is_ok()) {
                std::fs::remove_file(old)
                    .with_context(|| format!("checkpoint.overwrite: deleting {}", old.display()))?;
            }
            tracing::info!(
                "checkpoint.overwrite: deleted {} checkpoint(s) of an earlier run in {}",
                earlier.len(),
                ck.folder.display()
            );
        }
        // Metrics continue where the checkpoint left them when it belongs to this run.
        let metrics_at = resume
            .as_ref()
            .filter(|(path, _)| same_folder(path, &config.checkpoint.folder))
            .map(|(_, c)| c.meta.trainer.metrics_bytes);
        let reporter = Reporter::resume(&config.run_dir(), config.train.progress, metrics_at)
            .with_context(|| format!("creating the run folder {}", config.run_dir().display()))?;
        let mut trainer = Trainer {
            device,
            schedule,
            engine,
            state,
            train_loader,
            eval_loader,
            run,
            timestamp: Timestamp::default(),
            reporter,
            plugins,
            evals: Vec::new(),
            last_eval_batch: None,
            running_loss: None,
            running_batches: 0,
            train_seconds: 0.0,
            started,
            config,
            stop: None,
            last_checkpoint_batch: None,
            last_checkpoint: None,
            resumed_from: None,
            skipped_steps: 0,
            quiet_metrics: resume.is_some(),
        };
        if trainer.quiet_metrics {
            trainer.state.metrics.clear();
        }
        trainer.fire(Event::BEFORE_LOAD)?;
        if let Some((path, c)) = resume {
            let applied = Instant::now();
            trainer
                .apply_checkpoint(&path, c)
                .with_context(|| format!("resuming from {}", path.display()))?;
            tracing::info!(
                "resumed from {} at epoch {}, batch {} (read and verified in {read_ms:.0} ms, restored in {:.0} ms)",
                path.display(),
                trainer.timestamp.epoch,
                trainer.timestamp.batch,
                applied.elapsed().as_secs_f64() * 1e3
            );
        }
        trainer.fire(Event::AFTER_LOAD)?;
        trainer.quiet_metrics = false;
        Ok(trainer)
    }

    /// Makes the run stop cleanly — finish the step, write a checkpoint, return — once `flag`
    /// holds a non-zero signal number (set by a signal handler).
    pub fn set_stop_flag(&mut self, flag: Arc<AtomicUsize>) {
        self.stop = Some(flag);
    }

    fn stop_requested(&self) -> Option<i32> {
        self.stop
            .as_ref()
            .map(|f| f.load(Ordering::SeqCst) as i32)
            .filter(|&s| s != 0)
    }

    /// The newest checkpoint this run wrote.
    pub fn last_checkpoint(&self) -> Option<&Path> {
        self.last_checkpoint.as_deref()
    }

    /// The checkpoint this run continued from.
    pub fn resumed_from(&self) -> Option<&Path> {
        self.resumed_from.as_deref()
    }

    /// Restores everything a checkpoint holds. Surgery already ran at `init`, so the model's
    /// tensors are the ones the checkpoint names; anything that does not fit is an error that
    /// says what differs.
    fn apply_checkpoint(&mut self, path: &Path, c: Checkpoint) -> anyhow::Result<()> {
        let meta = &c.meta;
        if meta.batches_per_epoch != self.run.batches_per_epoch {
            bail!(
                "the checkpoint was written with {} batches per epoch, this run has {} (data.batch_size, drop_last or the dataset changed); the data position would not carry over",
                meta.batches_per_epoch,
                self.run.batches_per_epoch
            );
        }
        // 1. The model.
        let saved: HashMap<&str, &Tensor> = c.with_prefix("model/").collect();
        let mut problems = Vec::new();
        for e in self.state.model.params.entries() {
            match saved.get(e.name.as_str()) {
                None => problems.push(format!("`{}` is missing", e.name)),
                Some(t) if t.size() != e.tensor.size() => problems.push(format!(
                    "`{}` has shape {:?} in the checkpoint but {:?} in this model",
                    e.name,
                    t.size(),
                    e.tensor.size()
                )),
                Some(t) if t.kind() != e.tensor.kind() => problems.push(format!(
                    "`{}` is {:?} in the checkpoint but {:?} in this model",
                    e.name,
                    t.kind(),
                    e.tensor.kind()
                )),
                Some(_) => {}
            }
        }
        for name in saved.keys() {
            if self.state.model.params.get(name).is_none() {
                problems.push(format!("`{name}` is not in this model"));
            }
        }
        if !problems.is_empty() {
            let n = problems.len();
            problems.truncate(4);
            let theirs = meta
                .config
                .get("model")
                .map(|m| m.to_string())
                .unwrap_or_default();
            let ours = serde_json::to_string(&self.config.model).unwrap_or_default();
            bail!(
                "the checkpoint does not fit this model ({n} difference(s): {}{}); it was written for model {theirs}, this run builds {ours}",
                problems.join("; "),
                if n > 4 { "; ..." } else { "" }
            );
        }
        tch::no_grad(|| -> Result<(), tch::TchError> {
            for e in self.state.model.params.entries() {
                if let Some(t) = saved.get(e.name.as_str()) {
                    e.tensor.shallow_clone().f_copy_(t)?;
                }
            }
            Ok(())
        })?;
        // 2. The optimizer.
        let optim_state: Vec<(String, Tensor)> = c
            .with_prefix("optim/")
            .map(|(n, t)| (n.to_owned(), t.shallow_clone()))
            .collect();
        let State {
            model, optimizer, ..
        } = &mut self.state;
        optimizer
            .as_mut()
            .context("internal error: the optimizer was not built")?
            .load_state(&meta.optimizer, &model.params, &optim_state)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        // 3. The methods.
        let names: Vec<String> = self.engine.names().iter().map(|n| n.to_string()).collect();
        for m in &meta.methods {
            if !names.contains(&m.name) && !m.has_state {
                tracing::warn!(
                    "method `{}` ran before the checkpoint but is not in this run",
                    m.name
                );
                continue;
            }
            if !names.contains(&m.name) {
                bail!(
                    "the checkpoint holds the state of method `{}`, which this run does not load; add it to [[algorithms]] to continue this run",
                    m.name
                );
            }
            if let Some(p) = self.plugins.iter().find(|p| p.name == m.name) {
                if p.settings != m.settings {
                    tracing::warn!(
                        "method `{}`: settings differ from the checkpoint's ({} now, {} then)",
                        m.name,
                        p.settings,
                        m.settings
                    );
                }
            }
            if !m.has_state {
                continue;
            }
            let prefix = format!("method/{}/", m.name);
            let mut snapshot = MethodSnapshot {
                format_version: m.format_version,
                ..Default::default()
            };
            if let Some(bytes) = c.tensor(&format!("{prefix}__bytes__")) {
                snapshot.bytes = Vec::<u8>::try_from(bytes)?;
            }
            for n in &m.tensors {
                let t = c.tensor(&format!("{prefix}{n}")).with_context(|| {
                    format!("method `{}`: state tensor `{n}` is missing", m.name)
                })?;
                snapshot
                    .tensors
                    .push((n.clone(), t.f_to_device(self.device)?));
            }
            self.engine
                .load_state(&m.name, snapshot)
                .map_err(|e| anyhow::anyhow!("method `{}` cannot load its state: {e}", m.name))?;
        }
        for name in &names {
            if !meta.methods.iter().any(|m| &m.name == name) {
                tracing::warn!(
                    "method `{name}` is not in the checkpoint; it starts with fresh state"
                );
            }
        }
        for name in &meta.trainer.disabled {
            self.engine.disable(name);
        }
        // 4. The clock, the random stream and the trainer's counters.
        self.state
            .set_rng(checkpoint::rng_from_meta(&meta.rng).map_err(anyhow::Error::msg)?);
        self.timestamp = meta.timestamp.clone();
        let t = &meta.trainer;
        self.train_seconds = t.train_seconds;
        self.evals = t.evals.clone();
        self.last_eval_batch = t.last_eval_batch;
        self.running_batches = t.running_batches;
        self.skipped_steps = t.skipped_steps;
        self.running_loss = match c.tensor("trainer/running_loss") {
            Some(l) => Some(l.f_to_device(self.device)?),
            None => None,
        };
        self.last_checkpoint_batch = Some(self.timestamp.batch);
        self.resumed_from = Some(path.to_owned());
        Ok(())
    }

    /// Writes a checkpoint of the current state to the checkpoint folder, points `latest` at it
    /// and deletes the oldest beyond `keep`.
    pub fn save_checkpoint(&mut self) -> anyhow::Result<PathBuf> {
        let started = Instant::now();
        let folder = self.config.checkpoint.folder.clone();
        let path = folder.join(checkpoint::file_name(&self.timestamp));
        let metrics_bytes = self
            .reporter
            .flush()
            .with_context(|| format!("writing {}", self.reporter.metrics_path().display()))?;
        let mut tensors: Vec<(String, Tensor)> = self
            .state
            .model
            .params
            .entries()
            .iter()
            .map(|e| (format!("model/{}", e.name), e.tensor.shallow_clone()))
            .collect();
        let optimizer = self
            .state
            .optimizer
            .as_ref()
            .context("internal error: the optimizer was not built")?;
        tensors.extend(
            optimizer
                .state_tensors()
                .into_iter()
                .map(|(n, t)| (format!("optim/{n}"), t)),
        );
        let optimizer_meta = optimizer.meta();
        let mut methods = Vec::new();
        for (name, snapshot) in self.engine.states()? {
            let (version, settings) = match self.plugins.iter().find(|p| p.name == name) {
                Some(p) => (p.version.clone(), p.settings.clone()),
                None => (String::new(), serde_json::Value::Null),
            };
            let has_state = snapshot.is_some();
            let mut format_version = 0;
            let mut tensor_names = Vec::new();
            if let Some(s) = snapshot {
                format_version = s.format_version;
                tensor_names = s.tensors.iter().map(|(n, _)| n.clone()).collect();
                tensors.push((
                    format!("method/{name}/__bytes__"),
                    Tensor::from_slice(&s.bytes),
                ));
                for (n, t) in s.tensors {
                    if n == "__bytes__" {
                        bail!("method `{name}` saved a tensor named `__bytes__`, a reserved name");
                    }
                    tensors.push((format!("method/{name}/{n}"), t));
                }
            }
            methods.push(MethodMeta {
                name,
                version,
                settings,
                format_version,
                has_state,
                tensors: tensor_names,
            });
        }
        if let Some(l) = &self.running_loss {
            tensors.push(("trainer/running_loss".to_owned(), l.shallow_clone()));
        }
        let meta = Meta {
            format: checkpoint::FORMAT_VERSION,
            tessera_version: env!("CARGO_PKG_VERSION").to_owned(),
            libtorch_version: LIBTORCH_VERSION.to_owned(),
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            run_name: self.config.run_name.clone(),
            timestamp: self.timestamp.clone(),
            batches_per_epoch: self.run.batches_per_epoch,
            optimizer: optimizer_meta,
            rng: checkpoint::rng_meta(self.state.rng()),
            trainer: TrainerMeta {
                train_seconds: self.train_seconds,
                evals: self.evals.clone(),
                last_eval_batch: self.last_eval_batch,
                running_batches: self.running_batches,
                metrics_bytes,
                disabled: self
                    .engine
                    .disabled()
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                skipped_steps: self.skipped_steps,
            },
            methods,
            config: serde_json::to_value(&self.config)?,
        };
        let bytes = Checkpoint { meta, tensors }
            .write(&path)
            .context("writing a checkpoint")?;
        checkpoint::update_latest(&folder, &path).with_context(|| {
            format!(
                "pointing {} at the new checkpoint",
                folder.join(checkpoint::LATEST).display()
            )
        })?;
        for old in checkpoint::prune(&folder, self.config.checkpoint.keep, &path) {
            tracing::debug!("deleted old checkpoint {}", old.display());
        }
        self.last_checkpoint_batch = Some(self.timestamp.batch);
        self.last_checkpoint = Some(path.clone());
        tracing::info!(
            "checkpoint {} ({:.2} MB in {:.0} ms)",
            path.display(),
            bytes as f64 / 1e6,
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(path)
    }

    /// Fires a `*_checkpoint` event, telling methods whether a checkpoint follows, and writes
    /// it when due: at `checkpoint.interval`, at the end of training and when a stop was
    /// requested.
    fn checkpoint_event(&mut self, event: Event, previous: &Timestamp) -> anyhow::Result<()> {
        let ck = &self.config.checkpoint;
        let interval_event = if event == Event::EPOCH_CHECKPOINT {
            Event::EPOCH_END
        } else {
            Event::BATCH_END
        };
        let end = self.run.reached(&self.timestamp, &self.run.max_duration);
        let stop = event == Event::BATCH_CHECKPOINT && self.stop_requested().is_some();
        let due = ck.save
            && (self.due(&ck.interval, previous, interval_event)
                || ((end || stop) && self.last_checkpoint_batch != Some(self.timestamp.batch)));
        self.state.checkpoint_pending = due;
        let fired = self.fire(event);
        self.state.checkpoint_pending = false;
        fired?;
        if due {
            self.save_checkpoint()?;
        }
        Ok(())
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.state.model
    }

    /// The optimizer (built right after `init`).
    pub fn optimizer(&self) -> Option<&Optimizer> {
        self.state.optimizer.as_ref()
    }

    fn optimizer_mut(&mut self) -> anyhow::Result<&mut Optimizer> {
        self.state
            .optimizer
            .as_mut()
            .context("internal error: the optimizer was not built")
    }

    /// The event engine (for per-event counts).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The training clock.
    pub fn timestamp(&self) -> &Timestamp {
        &self.timestamp
    }

    /// The training device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Evaluations so far.
    pub fn evals(&self) -> &[EvalRecord] {
        &self.evals
    }

    fn time_info(&self, training: bool) -> TimeInfo {
        let t = &self.timestamp;
        TimeInfo {
            epoch: t.epoch,
            batch: t.batch,
            sample: t.sample,
            token: t.token,
            batch_in_epoch: t.batch_in_epoch,
            sample_in_epoch: t.sample_in_epoch,
            token_in_epoch: t.token_in_epoch,
            batches_per_epoch: self.run.batches_per_epoch,
            max_batches: self.run.max_batches().unwrap_or(0),
            elapsed_fraction: self.run.elapsed_fraction(t),
            training,
        }
    }

    fn fire_as(&mut self, event: Event, training: bool) -> anyhow::Result<()> {
        self.state.time = self.time_info(training);
        self.engine.fire(event, &mut self.state)?;
        if !self.state.metrics.is_empty() {
            let metrics = std::mem::take(&mut self.state.metrics);
            if !self.quiet_metrics {
                self.reporter.method_metrics(self.timestamp.batch, &metrics);
            }
        }
        Ok(())
    }

    fn fire(&mut self, event: Event) -> anyhow::Result<()> {
        self.fire_as(event, true)
    }

    fn set_scheduled_lr(&mut self) -> anyhow::Result<()> {
        let multiplier = self.schedule.multiplier(
            &self.timestamp,
            &self.run,
            self.config.train.scale_schedule_ratio,
        );
        let optimizer = self.optimizer_mut()?;
        let lr = optimizer.initial_lr() * multiplier;
        optimizer.set_lr(lr);
        Ok(())
    }

    /// Moves a loader batch to the device as the state's batch.
    fn device_batch(&self, b: data::HostBatch) -> anyhow::Result<Batch> {
        let [n, c, h, w] = b.input_shape.map(|v| v as i64);
        let input = Tensor::f_from_slice(&b.input)?
            .f_view([n, c, h, w])?
            .f_to_device(self.device)?;
        let target = Tensor::f_from_slice(&b.target)?.f_to_device(self.device)?;
        Ok(Batch::new(input, target))
    }

    /// Trains one batch already in `state.batch`: `before_train_batch`, the microbatch loop
    /// with its forward/loss/backward events, `after_train_batch` — repeated when a method asks
    /// for an extra pass (SAM) — then the optimizer step.
    pub fn train_batch(&mut self) -> anyhow::Result<()> {
        const MAX_PASSES: u32 = 8;
        self.state.pass_index = 0;
        let mut first_pass_loss = None;
        loop {
            let loss = self.forward_backward()?;
            if first_pass_loss.is_none() {
                first_pass_loss = loss;
            }
            if !std::mem::take(&mut self.state.extra_pass_requested) {
                break;
            }
            self.state.pass_index += 1;
            if self.state.pass_index >= MAX_PASSES {
                bail!(
                    "methods asked for more than {MAX_PASSES} forward/backward passes in one step"
                );
            }
        }
        if let Some(loss) = &first_pass_loss {
            let value = loss.f_double_value(&[])?;
            if !value.is_finite() {
                let t = &self.timestamp;
                match self.config.train.nonfinite_loss {
                    NonFiniteLoss::Stop => {
                        let kept = match &self.last_checkpoint {
                            Some(p) => format!("; the last checkpoint, {}, is intact", p.display()),
                            None => String::new(),
                        };
                        bail!(
                            "the training loss is {value} at batch {} (epoch {}); stopped before the update{kept}. Lower the learning rate, check the data, or set train.nonfinite_loss = \"skip\" to skip such steps",
                            t.batch + 1,
                            t.epoch
                        );
                    }
                    NonFiniteLoss::Skip => {
                        self.skipped_steps += 1;
                        tracing::warn!(
                            "the training loss is {value} at batch {} (epoch {}); skipping the update ({} skipped so far)",
                            t.batch + 1,
                            t.epoch,
                            self.skipped_steps
                        );
                        self.optimizer_mut()?.zero_grad();
                        self.state
                            .metrics
                            .push(("train/skipped_steps".to_owned(), self.skipped_steps as f64));
                        return Ok(());
                    }
                }
            }
        }
        self.optimizer_mut()?.step()?;
        if let Some(loss) = first_pass_loss {
            self.running_loss = Some(match self.running_loss.take() {
                None => loss,
                Some(sum) => sum.f_add(&loss)?,
            });
            self.running_batches += 1;
        }
        Ok(())
    }

    /// One forward/backward pass over the batch, from `before_train_batch` to
    /// `after_train_batch`; returns the batch loss (detached, on the device).
    fn forward_backward(&mut self) -> anyhow::Result<Option<Tensor>> {
        self.state.in_train_batch = true;
        self.fire(Event::BEFORE_TRAIN_BATCH)?;
        self.optimizer_mut()?.zero_grad();
        let full = self.state.batch.shallow_clone();
        let total = full.len();
        if total == 0 {
            bail!(
                "a method emptied the batch at batch {}",
                self.timestamp.batch
            );
        }
        let microbatch = (self.config.train.microbatch_size as i64).clamp(1, total);
        let parts = full.split(microbatch)?;
        let mut batch_loss: Option<Tensor> = None;
        for part in parts {
            let size = part.len();
            self.state.batch = part;
            self.fire(Event::BEFORE_FORWARD)?;
            let input = self
                .state
                .batch
                .input()
                .map(Tensor::shallow_clone)
                .context("the batch has no `input`")?;
            let output = {
                let _autocast = AutocastGuard::new(self.config.train.precision, self.device);
                self.state.model.forward(&input, true)?
            };
            self.state.output = Some(output);
            self.fire(Event::AFTER_FORWARD)?;
            self.fire(Event::BEFORE_LOSS)?;
            let (output, target) = match (&self.state.output, self.state.batch.target()) {
                (Some(o), Some(t)) => (o.shallow_clone(), t.shallow_clone()),
                _ => bail!("the batch has no `target` or the model no output"),
            };
            let loss = {
                let _autocast = AutocastGuard::new(self.config.train.precision, self.device);
                cross_entropy(&output, &target)?
            };
            self.state.loss = Some(loss);
            self.fire(Event::AFTER_LOSS)?;
            self.fire(Event::BEFORE_BACKWARD)?;
            let loss = self.state.loss.as_ref().context("the loss was removed")?;
            let weight = size as f64 / total as f64;
            let scaled = loss.f_mul_scalar(weight)?;
            scaled.f_backward()?;
            let detached = scaled.f_detach()?;
            batch_loss = Some(match batch_loss {
                None => detached,
                Some(sum) => sum.f_add(&detached)?,
            });
            self.fire(Event::AFTER_BACKWARD)?;
        }
        self.state.batch = full;
        self.fire(Event::AFTER_TRAIN_BATCH)?;
        self.state.in_train_batch = false;
        Ok(batch_loss)
    }

    /// One training step on a batch already on the device, from `after_dataloader` to
    /// `batch_end`: the batch's events, forward/backward over its microbatches, the optimizer
    /// step, the schedule and the clock. `started` is when the step began (for wall-clock time
    /// and throughput). Returns the timestamp before the step.
    pub fn step(&mut self, batch: Batch, started: Instant) -> anyhow::Result<Timestamp> {
        self.state.batch = batch;
        self.fire(Event::AFTER_DATALOADER)?;
        let samples = self.state.batch.len() as u64;
        self.fire(Event::BATCH_START)?;
        self.train_batch()?;
        // As in Composer: the schedule is stepped before the clock advances.
        self.set_scheduled_lr()?;
        let previous = self.timestamp.clone();
        let seconds = started.elapsed().as_secs_f64();
        self.train_seconds += seconds;
        self.timestamp = self.timestamp.to_next_batch(samples, 0, seconds);
        self.reporter
            .batch_done(self.timestamp.sample as f64 / self.train_seconds.max(1e-9));
        self.fire(Event::BATCH_END)?;
        Ok(previous)
    }

    fn due(&self, interval: &Time, previous: &Timestamp, event: Event) -> bool {
        let unit = interval.unit();
        let at_epoch = unit == TimeUnit::Epoch;
        if at_epoch != (event == Event::EPOCH_END) {
            return false;
        }
        let (step_unit, every) = if interval.is_dur() {
            match self.run.resolve(interval, 1.0) {
                Ok(t) => (t.unit(), t.count().unwrap_or(0)),
                Err(_) => return false,
            }
        } else {
            (unit, interval.count().unwrap_or(0))
        };
        if every == 0 {
            return false;
        }
        match (previous.get(step_unit), self.timestamp.get(step_unit)) {
            (Some(before), Some(now)) => before / every != now / every,
            _ => false,
        }
    }

    /// Runs evaluation over the test set, with its events.
    pub fn evaluate(&mut self) -> anyhow::Result<EvalRecord> {
        let started = Instant::now();
        self.fire_as(Event::EVAL_BEFORE_ALL, false)?;
        self.fire_as(Event::EVAL_START, false)?;
        let _no_grad = tch::no_grad_guard();
        let saved_batch = std::mem::take(&mut self.state.batch);
        let mut correct = Tensor::f_zeros([], (Kind::Int64, self.device))?;
        let mut loss_sum = Tensor::f_zeros([], (Kind::Double, self.device))?;
        let mut samples = 0u64;
        let limit = match self.config.train.eval_subset_batches {
            0 => u64::MAX,
            n => n as u64,
        };
        for (i, batch) in self.eval_loader.epoch(0, 0).enumerate() {
            if i as u64 >= limit {
                break;
            }
            let batch = batch?;
            self.state.batch = self.device_batch(batch)?;
            self.fire_as(Event::EVAL_BATCH_START, false)?;
            self.fire_as(Event::EVAL_BEFORE_FORWARD, false)?;
            let input = self
                .state
                .batch
                .input()
                .map(Tensor::shallow_clone)
                .context("no input")?;
            let output = {
                let _autocast = AutocastGuard::new(self.config.train.precision, self.device);
                self.state.model.forward(&input, false)?
            };
            self.state.output = Some(output.shallow_clone());
            self.fire_as(Event::EVAL_AFTER_FORWARD, false)?;
            let target = self
                .state
                .batch
                .target()
                .map(Tensor::shallow_clone)
                .context("no target")?;
            let n = target.size().first().copied().unwrap_or(0);
            let output = output.f_to_kind(Kind::Float)?;
            let ce =
                output.f_cross_entropy_loss::<Tensor>(&target, None, Reduction::Sum, -100, 0.0)?;
            loss_sum = loss_sum.f_add(&ce.f_to_kind(Kind::Double)?)?;
            let hits = output
                .f_argmax(1, false)?
                .f_eq_tensor(&target)?
                .f_sum(Kind::Int64)?;
            correct = correct.f_add(&hits)?;
            samples += n as u64;
            self.fire_as(Event::EVAL_BATCH_END, false)?;
        }
        let denom = samples.max(1) as f64;
        let record = EvalRecord {
            epoch: self.timestamp.epoch,
            batch: self.timestamp.batch,
            accuracy: correct.f_double_value(&[])? / denom,
            cross_entropy: loss_sum.f_double_value(&[])? / denom,
            samples,
        };
        self.state.batch = saved_batch;
        self.state.output = None;
        self.fire_as(Event::EVAL_END, false)?;
        self.fire_as(Event::EVAL_AFTER_ALL, false)?;
        self.reporter.eval(&record);
        self.evals.push(record.clone());
        self.last_eval_batch = Some(self.timestamp.batch);
        tracing::debug!("evaluation took {:.2}s", started.elapsed().as_secs_f64());
        Ok(record)
    }

    fn log_train_line(&mut self) -> anyhow::Result<()> {
        let loss = match self.running_loss.take() {
            Some(sum) => sum.f_double_value(&[])? / self.running_batches.max(1) as f64,
            None => return Ok(()),
        };
        self.running_batches = 0;
        let t = &self.timestamp;
        let line = json!({
            "epoch": t.epoch,
            "batch": t.batch,
            "sample": t.sample,
            "loss": loss,
            "lr": self.state.optimizer.as_ref().map(Optimizer::lr),
            "samples_per_second": if self.train_seconds > 0.0 { t.sample as f64 / self.train_seconds } else { 0.0 },
        });
        if !loss.is_finite() {
            bail!(
                "the training loss is {loss} at batch {} (epoch {}); stopping (lower the learning rate or check the data)",
                t.batch,
                t.epoch
            );
        }
        self.reporter.train_line(line);
        Ok(())
    }

    /// Runs the training loop to `max_duration`, evaluating at `eval_interval` and at the end,
    /// and writes the run record.
    pub fn fit(&mut self) -> anyhow::Result<FitSummary> {
        self.fire(Event::FIT_START)?;
        // A resumed run keeps the learning rate the checkpoint holds: the schedule is stepped
        // before the clock advances, so the next step's rate is a function of the previous
        // batch, not of the restored clock.
        if self.resumed_from.is_none() {
            self.set_scheduled_lr()?;
        }
        let log_every = self.config.train.log_interval;
        let eval_every = self.config.train.eval_interval;
        let max_epochs = match self.run.max_duration.unit() {
            TimeUnit::Epoch => self.run.max_duration.count(),
            _ => None,
        };
        let mut interrupted_by = None;
        'fit: while !self.run.reached(&self.timestamp, &self.run.max_duration) {
            if self.timestamp.epoch_in_iteration == 0 && self.timestamp.batch_in_epoch == 0 {
                self.fire(Event::ITERATION_START)?;
            }
            if self.timestamp.batch_in_epoch == 0 {
                self.fire(Event::EPOCH_START)?;
            }
            let epoch = self.timestamp.epoch;
            let start = self.timestamp.batch_in_epoch;
            self.reporter
                .start_epoch(epoch, max_epochs, self.run.batches_per_epoch, start);
            let mut batches = self.train_loader.epoch(epoch, start);
            let mut finished_early = false;
            loop {
                // Training time counts from the request for data to the end of the step.
                let step_started = Instant::now();
                self.fire(Event::BEFORE_DATALOADER)?;
                let Some(host_batch) = batches.next() else {
                    break;
                };
                let batch = self.device_batch(host_batch?)?;
                let previous = self.step(batch, step_started)?;
                if self.due(&log_every, &previous, Event::BATCH_END) {
                    self.log_train_line()?;
                }
                if self.due(&eval_every, &previous, Event::BATCH_END) {
                    self.evaluate()?;
                }
                self.checkpoint_event(Event::BATCH_CHECKPOINT, &previous)?;
                if let Some(signal) = self.stop_requested() {
                    interrupted_by = Some(signal);
                    break 'fit;
                }
                if self.run.reached(&self.timestamp, &self.run.max_duration) {
                    finished_early = true;
                    break;
                }
            }
            drop(batches);
            if !finished_early || self.timestamp.batch_in_epoch == self.run.batches_per_epoch {
                let previous = self.timestamp.clone();
                self.timestamp = self.timestamp.to_next_epoch();
                self.fire(Event::EPOCH_END)?;
                self.log_train_line()?;
                if self.due(&eval_every, &previous, Event::EPOCH_END) {
                    self.evaluate()?;
                }
                self.checkpoint_event(Event::EPOCH_CHECKPOINT, &previous)?;
            }
            if self.run.batches_per_epoch == 0 {
                bail!("the training set gives no batch (batch_size larger than the set with drop_last = true?)");
            }
        }
        if let Some(signal) = interrupted_by {
            let name = signal_name(signal);
            match &self.last_checkpoint {
                Some(p) if self.last_checkpoint_batch == Some(self.timestamp.batch) => {
                    tracing::warn!(
                        "{name}: stopped after batch {} with a checkpoint at {}; continue with checkpoint.autoresume = true",
                        self.timestamp.batch,
                        p.display()
                    )
                }
                _ => tracing::warn!(
                    "{name}: stopped after batch {}; checkpoints are off (checkpoint.save = false), so this progress is not saved",
                    self.timestamp.batch
                ),
            }
        } else {
            self.fire(Event::FIT_END)?;
            if self.last_eval_batch != Some(self.timestamp.batch) {
                self.evaluate()?;
            }
            self.log_train_line()?;
        }
        self.reporter.finish();
        let mut record = self.run_record();
        if let Some(signal) = interrupted_by {
            record.status = format!("interrupted by {}", signal_name(signal));
        }
        let path = self.config.run_dir().join("run.json");
        let text = serde_json::to_vec_pretty(&record)?;
        write_atomic(&path, &text).with_context(|| format!("writing {}", path.display()))?;
        Ok(FitSummary {
            record,
            interrupted_by,
        })
    }

    fn run_record(&self) -> RunRecord {
        let wall_seconds = self.started.elapsed().as_secs_f64();
        let t = &self.timestamp;
        RunRecord {
            run_name: self.config.run_name.clone(),
            tessera_version: env!("CARGO_PKG_VERSION").to_owned(),
            libtorch_version: LIBTORCH_VERSION.to_owned(),
            device: format!("{:?}", self.device),
            config: serde_json::to_value(&self.config).unwrap_or(serde_json::Value::Null),
            plugins: self.plugins.clone(),
            evals: self.evals.clone(),
            epochs: t.epoch,
            batches: t.batch,
            samples: t.sample,
            wall_seconds,
            train_seconds: self.train_seconds,
            samples_per_second: if self.train_seconds > 0.0 {
                t.sample as f64 / self.train_seconds
            } else {
                0.0
            },
            estimated_cost_usd: self
                .config
                .usd_per_hour
                .map(|usd| usd * wall_seconds / 3600.0),
            final_accuracy: self.evals.last().map(|e| e.accuracy),
            status: "completed".to_owned(),
            resumed_from: self.resumed_from.clone(),
            last_checkpoint: self.last_checkpoint.clone(),
            skipped_steps: self.skipped_steps,
        }
    }
}

/// The checkpoint a run starts from: `checkpoint.load` (must read), else with `autoresume` the
/// newest good one in the folder (corrupt or partial ones are skipped with a warning).
fn find_resume_checkpoint(
    ck: &config::CheckpointConfig,
) -> anyhow::Result<Option<(PathBuf, Checkpoint)>> {
    if let Some(path) = &ck.load {
        let c = Checkpoint::read(path).context("checkpoint.load")?;
        return Ok(Some((path.clone(), c)));
    }
    if !ck.autoresume {
        return Ok(None);
    }
    let found = checkpoint::latest_good(&ck.folder);
    if found.is_none() {
        tracing::info!(
            "autoresume: no usable checkpoint in {}; starting from the beginning",
            ck.folder.display()
        );
    }
    Ok(found)
}

/// Whether `file` lies directly in `folder` (comparing canonical paths when possible).
fn same_folder(file: &Path, folder: &Path) -> bool {
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_owned());
    file.parent().map(canon) == Some(canon(folder))
}
