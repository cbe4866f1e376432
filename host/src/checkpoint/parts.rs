//! What a checkpoint holds, part by part. Each component of a run gives its own part and takes
//! it back ([`Parts`]): the model its named tensors, the optimizer an [`optim::Snapshot`], the
//! engine its methods' records, the clock its timestamp, the trainer its counters. This file
//! alone knows how the parts are named inside the file (`model/`, `optim/`, `method/<name>/`,
//! `trainer/`) and which metadata records they fill.

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::{Checkpoint, CheckpointError, FORMAT_VERSION};
use crate::engine::{MethodRecord, MethodSnapshot};
use crate::files::hex;
use crate::optim::{self, Position};
use crate::report::{EvalRecord, EvalTime, TargetReached};
use crate::time::Timestamp;

/// The state of the methods' random stream (ChaCha8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RngMeta {
    /// The 32-byte key, in hex.
    pub seed: String,
    /// The stream number.
    pub stream: u64,
    /// The word position, as a decimal string (it is a 128-bit number).
    pub word_pos: String,
}

/// The trainer's own counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerMeta {
    /// Seconds spent training so far.
    pub train_seconds: f64,
    /// Evaluations so far.
    pub evals: Vec<EvalRecord>,
    /// When each of `evals` ran (empty in checkpoints of earlier versions).
    #[serde(default)]
    pub eval_times: Vec<EvalTime>,
    /// Wall-clock seconds of the run when the checkpoint was written (0 in checkpoints of
    /// earlier versions).
    #[serde(default)]
    pub wall_seconds: f64,
    /// Batch of the last evaluation.
    pub last_eval_batch: Option<u64>,
    /// Batches summed in `trainer/running_loss` since the last metrics line.
    pub running_batches: u64,
    /// Length of `metrics.jsonl` when the checkpoint was written (a resumed run cuts the file
    /// there, so the file ends up as if the run had never stopped).
    pub metrics_bytes: u64,
    /// Methods disabled after a failure (`on_error = "disable"`).
    pub disabled: Vec<String>,
    /// Training steps skipped because the loss was not finite.
    #[serde(default)]
    pub skipped_steps: u64,
    /// Samples the model trained on (the clock counts the batches as loaded; selective
    /// backprop trains on fewer). 0 in checkpoints of earlier versions.
    #[serde(default)]
    pub trained_samples: u64,
    /// The loss scaler's state under `amp_fp16` (scale, good steps in a row, skipped steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_scaler: Option<crate::precision::GradScaler>,
    /// When an evaluation first met `train.target` (a resumed run reports that first time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_reached: Option<TargetReached>,
    /// Samples per forward/backward pass when the checkpoint was written: the size
    /// `train.microbatch_size = "auto"` found (absent in checkpoints before Tessera 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microbatch_size: Option<usize>,
    /// The number of nodes the training order was split over, when a sharded dataset was read
    /// per node (`Loader::across_nodes`; absent: one order for all ranks). The position inside
    /// an epoch holds only for the same number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_nodes: Option<usize>,
    /// The tokenizer file a text run encoded its data with (a BPE it trained into its cache,
    /// or the user's): `tessera export --format hf` copies it beside the model when it is still
    /// there unchanged. Absent for images, synthetic text and checkpoints before Tessera 0.3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerFile>,
}

/// A tokenizer file and its sha256 when the run read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerFile {
    /// Where it was (absolute, or as the run named it).
    pub path: std::path::PathBuf,
    /// The sha256 of its bytes, hex.
    pub sha256: String,
}

/// One method's entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MethodMeta {
    /// The method's name.
    pub name: String,
    /// Plugin version (empty for built-in methods).
    pub version: String,
    /// Settings it ran with.
    pub settings: serde_json::Value,
    /// The method's own state layout version.
    pub format_version: u32,
    /// Whether it saved any state.
    pub has_state: bool,
    /// The names of its state tensors, in the order the method gave them (the file stores
    /// tensors sorted by name).
    #[serde(default)]
    pub tensors: Vec<String>,
}

/// Everything in a checkpoint besides tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Layout version ([`FORMAT_VERSION`]).
    pub format: u32,
    /// Tessera version that wrote it.
    pub tessera_version: String,
    /// libtorch version that wrote it.
    pub libtorch_version: String,
    /// Seconds since the Unix epoch at writing.
    pub created_unix: u64,
    /// The run's name.
    pub run_name: String,
    /// The training clock.
    pub timestamp: Timestamp,
    /// Batches per epoch of the run that wrote it (the data position is `timestamp.epoch`,
    /// `timestamp.batch_in_epoch`).
    pub batches_per_epoch: u64,
    /// The optimizer's position.
    pub optimizer: Position,
    /// The methods' random stream.
    pub rng: RngMeta,
    /// Trainer counters.
    pub trainer: TrainerMeta,
    /// Methods in the order they were configured.
    pub methods: Vec<MethodMeta>,
    /// The resolved configuration.
    pub config: serde_json::Value,
    /// Ranks of the data-parallel run that wrote it (1 for a single process).
    #[serde(default = "one")]
    pub world_size: usize,
    /// The random streams of ranks 1.. (rank 0's are `rng` and `trainer/torch_cpu_rng`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RngMeta>,
    /// A sharded checkpoint's index (this file is then the folder's `index.ckpt`): the tensors
    /// the ranks wrote in slices, in their own files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<super::sharded::ShardIndex>,
}

fn one() -> usize {
    1
}

/// What a rank other than 0 adds to a checkpoint of a data-parallel run: its own random
/// streams (everything else is the same on every rank).
pub struct RankPart {
    /// The methods' random stream.
    pub rng: ChaCha8Rng,
    /// libtorch's CPU generator (`u8` state).
    pub torch_rng: Tensor,
    /// Its CUDA devices' generators, in device order (empty without CUDA).
    pub torch_cuda_rng: Vec<Tensor>,
}

/// The methods' random stream as metadata.
pub fn rng_meta(rng: &ChaCha8Rng) -> RngMeta {
    RngMeta {
        seed: hex(&rng.get_seed()),
        stream: rng.get_stream(),
        word_pos: rng.get_word_pos().to_string(),
    }
}

/// The random stream saved by [`rng_meta`].
pub fn rng_from_meta(m: &RngMeta) -> Result<ChaCha8Rng, CheckpointError> {
    let bad = |what: &str, value: &str| CheckpointError::Part(format!("bad RNG {what} {value:?}"));
    if m.seed.len() != 64 || !m.seed.is_ascii() {
        return Err(bad("seed", &m.seed));
    }
    let mut seed = [0u8; 32];
    for (i, b) in seed.iter_mut().enumerate() {
        *b = u8::from_str_radix(&m.seed[2 * i..2 * i + 2], 16).map_err(|_| bad("seed", &m.seed))?;
    }
    let word_pos: u128 = m
        .word_pos
        .parse()
        .map_err(|_| bad("position", &m.word_pos))?;
    let mut rng = ChaCha8Rng::from_seed(seed);
    rng.set_stream(m.stream);
    rng.set_word_pos(word_pos);
    Ok(rng)
}

/// The clock: where the run is, and how long its epochs are (the data position is
/// `timestamp.epoch`, `timestamp.batch_in_epoch`).
#[derive(Debug, Clone, PartialEq)]
pub struct SavedClock {
    /// The training clock.
    pub timestamp: Timestamp,
    /// Batches per epoch of the run.
    pub batches_per_epoch: u64,
}

/// Everything a run saves, as the components that own it hand it over.
pub struct Parts {
    /// The run's name.
    pub run_name: String,
    /// The resolved configuration.
    pub config: serde_json::Value,
    /// The clock.
    pub clock: SavedClock,
    /// The model's weights and buffers by (PyTorch) name.
    pub model: Vec<(String, Tensor)>,
    /// The optimizer's position and state tensors.
    pub optimizer: optim::Snapshot,
    /// Every method, in configuration order, with its state.
    pub methods: Vec<MethodRecord>,
    /// Methods disabled after a failure (`on_error = "disable"`).
    pub disabled_methods: Vec<String>,
    /// The methods' random stream.
    pub rng: ChaCha8Rng,
    /// The trainer's counters (`disabled` is filled from `disabled_methods`).
    pub trainer: TrainerMeta,
    /// The training loss summed since the last metrics line.
    pub running_loss: Option<Tensor>,
    /// libtorch's CPU generator (`u8` state; absent in checkpoints written before it was
    /// saved).
    pub torch_rng: Option<Tensor>,
    /// libtorch's CUDA generators, one per device of the machine that wrote it, in device
    /// order (empty without CUDA, and in checkpoints written before they were saved).
    pub torch_cuda_rng: Vec<Tensor>,
    /// Ranks of the run (1 for a single process).
    pub world_size: usize,
    /// Ranks 1..world_size's own parts, in rank order (empty for a single process).
    pub ranks: Vec<RankPart>,
}

pub(crate) const MODEL: &str = "model/";
pub(crate) const OPTIMIZER: &str = "optim/";
const METHOD: &str = "method/";
const RUNNING_LOSS: &str = "trainer/running_loss";
const TORCH_RNG: &str = "trainer/torch_cpu_rng";
/// `trainer/torch_cuda_rng/<i>`: libtorch's generator of CUDA device i.
const TORCH_CUDA_RNG: &str = "trainer/torch_cuda_rng/";
/// `rank/<r>/torch_cpu_rng` and `rank/<r>/torch_cuda_rng/<i>`: libtorch's generators of rank
/// r >= 1.
const RANK: &str = "rank/";

/// `prefix<i>` for each state, in order.
fn numbered(prefix: &str, states: Vec<Tensor>) -> impl Iterator<Item = (String, Tensor)> + '_ {
    states
        .into_iter()
        .enumerate()
        .map(move |(i, t)| (format!("{prefix}{i}"), t))
}

/// The tensors named `prefix<i>` for i = 0, 1, ... (removed from `tensors`), in order; an error
/// when the numbers have a gap.
fn take_numbered(
    tensors: &mut std::collections::HashMap<String, Tensor>,
    prefix: &str,
) -> Result<Vec<Tensor>, CheckpointError> {
    let count = tensors.keys().filter(|n| n.starts_with(prefix)).count();
    (0..count)
        .map(|i| {
            let name = format!("{prefix}{i}");
            tensors.remove(&name).ok_or_else(|| {
                CheckpointError::Part(format!(
                    "{count} tensors `{prefix}<i>` but `{name}` is missing"
                ))
            })
        })
        .collect()
}
/// A method's serialized counters, beside its named tensors.
const METHOD_BYTES: &str = "__bytes__";

impl Checkpoint {
    /// Packs a run's parts into one checkpoint.
    pub fn from_parts(parts: Parts) -> Result<Checkpoint, CheckpointError> {
        let Parts {
            run_name,
            config,
            clock,
            model,
            optimizer,
            methods,
            disabled_methods,
            rng,
            mut trainer,
            running_loss,
            torch_rng,
            torch_cuda_rng,
            world_size,
            ranks,
        } = parts;
        let prefixed = |prefix: &str, name: &str| format!("{prefix}{name}");
        let mut tensors: Vec<(String, Tensor)> = model
            .into_iter()
            .map(|(n, t)| (prefixed(MODEL, &n), t))
            .collect();
        tensors.extend(
            optimizer
                .tensors
                .into_iter()
                .map(|(n, t)| (prefixed(OPTIMIZER, &n), t)),
        );
        let mut method_metas = Vec::with_capacity(methods.len());
        for m in methods {
            let mut meta = MethodMeta {
                name: m.name,
                version: m.version,
                settings: m.settings,
                format_version: 0,
                has_state: m.snapshot.is_some(),
                tensors: Vec::new(),
            };
            if let Some(s) = m.snapshot {
                let prefix = format!("{METHOD}{}/", meta.name);
                meta.format_version = s.format_version;
                tensors.push((
                    prefixed(&prefix, METHOD_BYTES),
                    Tensor::from_slice(&s.bytes),
                ));
                for (n, t) in s.tensors {
                    if n == METHOD_BYTES {
                        return Err(CheckpointError::Part(format!(
                            "method `{}` saved a tensor named `{METHOD_BYTES}`, a reserved name",
                            meta.name
                        )));
                    }
                    tensors.push((prefixed(&prefix, &n), t));
                    meta.tensors.push(n);
                }
            }
            method_metas.push(meta);
        }
        if let Some(l) = running_loss {
            tensors.push((RUNNING_LOSS.to_owned(), l));
        }
        if let Some(r) = torch_rng {
            tensors.push((TORCH_RNG.to_owned(), r));
        }
        tensors.extend(numbered(TORCH_CUDA_RNG, torch_cuda_rng));
        let mut rank_rngs = Vec::with_capacity(ranks.len());
        for (i, part) in ranks.into_iter().enumerate() {
            tensors.push((format!("{RANK}{}/torch_cpu_rng", i + 1), part.torch_rng));
            tensors.extend(numbered(
                &format!("{RANK}{}/torch_cuda_rng/", i + 1),
                part.torch_cuda_rng,
            ));
            rank_rngs.push(rng_meta(&part.rng));
        }
        trainer.disabled = disabled_methods;
        let meta = Meta {
            format: FORMAT_VERSION,
            tessera_version: env!("CARGO_PKG_VERSION").to_owned(),
            libtorch_version: tessera_plugin_api::LIBTORCH_VERSION.to_owned(),
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            run_name,
            timestamp: clock.timestamp,
            batches_per_epoch: clock.batches_per_epoch,
            optimizer: optimizer.position,
            rng: rng_meta(&rng),
            trainer,
            methods: method_metas,
            config,
            world_size,
            ranks: rank_rngs,
            shards: None,
        };
        Ok(Checkpoint { meta, tensors })
    }

    /// Takes a checkpoint apart into the parts a run restores (tensors stay on the CPU).
    pub fn into_parts(self) -> Result<Parts, CheckpointError> {
        let Checkpoint { meta, tensors } = self;
        let mut model = Vec::new();
        let mut optimizer_tensors = Vec::new();
        let mut method_tensors = std::collections::HashMap::new();
        let mut running_loss = None;
        let mut torch_rng = None;
        let mut cuda_rng = std::collections::HashMap::new();
        let mut rank_torch = std::collections::HashMap::new();
        for (name, t) in tensors {
            if let Some(n) = name.strip_prefix(MODEL) {
                model.push((n.to_owned(), t));
            } else if let Some(n) = name.strip_prefix(OPTIMIZER) {
                optimizer_tensors.push((n.to_owned(), t));
            } else if name.starts_with(METHOD) {
                method_tensors.insert(name, t);
            } else if name == RUNNING_LOSS {
                running_loss = Some(t);
            } else if name == TORCH_RNG {
                torch_rng = Some(t);
            } else if name.starts_with(TORCH_CUDA_RNG) {
                cuda_rng.insert(name, t);
            } else if name.starts_with(RANK) {
                rank_torch.insert(name, t);
            }
        }
        let mut ranks = Vec::with_capacity(meta.ranks.len());
        for (i, rng) in meta.ranks.iter().enumerate() {
            let name = format!("{RANK}{}/torch_cpu_rng", i + 1);
            let torch_rng = rank_torch.remove(&name).ok_or_else(|| {
                CheckpointError::Part(format!("rank {}: `{name}` is missing", i + 1))
            })?;
            let torch_cuda_rng =
                take_numbered(&mut rank_torch, &format!("{RANK}{}/torch_cuda_rng/", i + 1))?;
            ranks.push(RankPart {
                rng: rng_from_meta(rng)?,
                torch_rng,
                torch_cuda_rng,
            });
        }
        let torch_cuda_rng = take_numbered(&mut cuda_rng, TORCH_CUDA_RNG)?;
        let mut methods = Vec::with_capacity(meta.methods.len());
        for m in meta.methods {
            let prefix = format!("{METHOD}{}/", m.name);
            let snapshot = if m.has_state {
                let mut s = MethodSnapshot {
                    format_version: m.format_version,
                    ..Default::default()
                };
                if let Some(bytes) = method_tensors.remove(&format!("{prefix}{METHOD_BYTES}")) {
                    s.bytes = Vec::<u8>::try_from(&bytes).map_err(|e| {
                        CheckpointError::Part(format!("method `{}`: its bytes: {e}", m.name))
                    })?;
                }
                for n in &m.tensors {
                    let t = method_tensors
                        .remove(&format!("{prefix}{n}"))
                        .ok_or_else(|| {
                            CheckpointError::Part(format!(
                                "method `{}`: state tensor `{n}` is missing",
                                m.name
                            ))
                        })?;
                    s.tensors.push((n.clone(), t));
                }
                Some(s)
            } else {
                None
            };
            methods.push(MethodRecord {
                name: m.name,
                version: m.version,
                settings: m.settings,
                snapshot,
            });
        }
        let mut trainer = meta.trainer;
        Ok(Parts {
            run_name: meta.run_name,
            config: meta.config,
            clock: SavedClock {
                timestamp: meta.timestamp,
                batches_per_epoch: meta.batches_per_epoch,
            },
            model,
            optimizer: optim::Snapshot {
                position: meta.optimizer,
                tensors: optimizer_tensors,
            },
            methods,
            disabled_methods: std::mem::take(&mut trainer.disabled),
            rng: rng_from_meta(&meta.rng)?,
            trainer,
            running_loss,
            torch_rng,
            torch_cuda_rng,
            world_size: meta.world_size,
            ranks,
        })
    }
}
