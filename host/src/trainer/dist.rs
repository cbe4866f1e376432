//! Data-parallel training: what the loops do differently when the run has several ranks
//! (docs/distributed.md). Each rank trains on its share of every batch; c10d's reducer averages
//! the gradients during the backward pass, so every rank takes the same optimizer step; the
//! clock, the logged loss, the evaluation and the decision to stop are agreed over the ranks;
//! rank 0 writes the logs, the run record and the checkpoints.

use std::sync::Arc;
use std::time::Duration;

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::{Kind, Tensor};

use crate::checkpoint::{self, RankPart};
use crate::config::Config;
use crate::dist::{GradReducer, Group, Op, RankEnv};
use crate::model::Role;

use super::error::{fail, Context as _, Result};
use super::Trainer;

/// A rank's membership of a data-parallel run.
pub(super) struct DataParallel {
    pub group: Arc<Group>,
    /// Ranks on this machine (they share its cores).
    pub local_world: usize,
    /// Machines in the run (each priced at `usd_per_hour`).
    pub nodes: usize,
    /// Gradient averaging (c10d's reducer), set up once the parameters are final.
    pub reducer: Option<GradReducer>,
    /// Checkpoints this rank took part in: every rank counts the same, so the count names a
    /// checkpoint's store keys uniquely (two checkpoints can share a batch: the last batch's
    /// and the epoch end's).
    pub checkpoints: u64,
    /// `[distributed] sharding`: the parameters' layout and this rank's pieces.
    pub sharded: Option<std::rc::Rc<crate::dist::shard::ShardedParams>>,
    /// This rank's position, published for the report of a hang (its thread holds the group
    /// too, and stops when this is dropped).
    pub watch: crate::dist::watch::Watch,
}

impl DataParallel {
    pub fn rank(&self) -> usize {
        self.group.rank
    }

    pub fn world(&self) -> usize {
        self.group.world
    }
}

/// A rank's random streams on their way to rank 0 through the store (see
/// `Trainer::gather_rank_parts`).
#[derive(serde::Serialize, serde::Deserialize)]
struct RankStreams {
    rng: checkpoint::RngMeta,
    torch_rng: Vec<u8>,
    /// One state per CUDA device.
    #[serde(default)]
    torch_cuda_rng: Vec<Vec<u8>>,
}

/// Joins the group `env` describes (see `crate::dist::RankEnv`), CUDA tensors through the
/// backend `[distributed] backend` chooses for `device`.
pub(super) fn join(config: &Config, env: &RankEnv, device: tch::Device) -> Result<DataParallel> {
    let d = &config.distributed;
    let (collectives, warning) = d.backend.choose(device, crate::dist::nccl_built())?;
    if let Some(w) = warning.filter(|_| env.rank == 0) {
        tracing::warn!("{w}");
    }
    let group = Group::join(
        env,
        Duration::from_secs_f64(d.rendezvous_timeout),
        Duration::from_secs_f64(d.timeout),
        collectives,
        device,
    )?;
    let group = Arc::new(group);
    crate::dist::set_plugin_group(&group);
    if d.sync_batchnorm {
        let g = Arc::clone(&group);
        crate::model::layers::set_batch_norm_sync(Some(Arc::new(move |t: &Tensor| {
            g.all_reduce_autograd(t)
                .map_err(|e| tch::TchError::Torch(e.to_string()))
        })));
    }
    Ok(DataParallel {
        watch: crate::dist::watch::Watch::start(Arc::clone(&group)),
        group,
        local_world: env.local_world,
        nodes: env.nodes(),
        reducer: None,
        checkpoints: 0,
        sharded: None,
    })
}

/// Checks that every rank found the same checkpoint to resume from (the checkpoint folder
/// must be one folder that every rank reads, on a shared file system across machines).
pub(super) fn agree_on_resume(
    dp: &DataParallel,
    resume: Option<&(std::path::PathBuf, checkpoint::Checkpoint)>,
) -> Result<()> {
    let batch = [resume.map_or(-1.0, |(_, c)| c.meta.timestamp.batch as f64)];
    let high = dp.group.all_reduce_values(&batch, Op::Max)?[0];
    let low = dp.group.all_reduce_values(&batch, Op::Min)?[0];
    if high != low {
        let what = |b: f64| {
            if b < 0.0 {
                "no checkpoint".to_owned()
            } else {
                format!("the checkpoint of batch {b}")
            }
        };
        fail!(
            "the ranks would resume from different points ({} on one rank, {} on another; this rank {}): every rank must read the same checkpoint folder (a shared file system when the ranks run on several machines)",
            what(high),
            what(low),
            match resume {
                Some((p, _)) => format!("found {}", p.display()),
                None => "found none".to_owned(),
            }
        );
    }
    Ok(())
}

/// The seed of rank `rank`'s own random streams (dropout, methods' draws): the run seed on rank
/// 0, so that rank 0 of a data-parallel run draws what a single process draws; as Composer, a
/// different seed per rank.
pub(super) fn rank_seed(seed: u64, rank: usize) -> u64 {
    seed.wrapping_add(rank as u64)
}

impl Trainer {
    pub(super) fn rank(&self) -> usize {
        self.dp.as_ref().map_or(0, DataParallel::rank)
    }

    pub(super) fn world(&self) -> usize {
        self.dp.as_ref().map_or(1, DataParallel::world)
    }

    /// Machines the run uses: 1 for a single process.
    pub(super) fn nodes(&self) -> usize {
        self.dp.as_ref().map_or(1, |dp| dp.nodes)
    }

    /// Rank 0 writes files and logs; every rank of a single-process run is rank 0.
    pub(super) fn is_rank0(&self) -> bool {
        self.rank() == 0
    }

    /// Says on rank 0 how the run is split: ranks, per-rank and global batch.
    pub(super) fn announce_data_parallel(&self) {
        let Some(dp) = &self.dp else {
            return;
        };
        if dp.rank() != 0 {
            return;
        }
        let per_rank = self.config.data.batch_size;
        tracing::info!(
            "data-parallel: {} ranks (c10d {}), global batch {} = {} per rank x {} ranks, {} batches per epoch on each rank",
            dp.world(),
            match dp.group.collectives {
                crate::dist::Collectives::Nccl => "NCCL, Gloo for host values",
                crate::dist::Collectives::Gloo => "Gloo",
            },
            per_rank * dp.world(),
            per_rank,
            dp.world(),
            self.state.clock.run.batches_per_epoch
        );
    }

    /// The data-parallel part of the run record.
    pub(super) fn data_parallel_record(&self) -> Option<crate::report::DataParallelRecord> {
        let dp = self.dp.as_ref()?;
        let timing = dp
            .reducer
            .as_ref()
            .and_then(|r| r.stats().ok())
            .filter(|s| s.backward_compute > 0.0)
            .map(|s| crate::report::AllReduceTiming {
                forward_seconds: s.forward,
                backward_compute_seconds: s.backward_compute,
                backward_comm_seconds: s.backward_comm,
                overlap_seconds: s.overlap,
            });
        let per_rank = self.config.data.batch_size;
        let prefetched = dp
            .sharded
            .as_ref()
            .filter(|s| s.mode() == crate::dist::shard::Sharding::Full)
            .map(|_| crate::dist::full::prefetch_counts());
        Some(crate::report::DataParallelRecord {
            world_size: dp.world(),
            per_rank_batch_size: per_rank,
            global_batch_size: per_rank * dp.world(),
            backend: "gloo".to_owned(),
            timing,
            sharding: self.config.distributed.sharding.name().to_owned(),
            sharded_elements: dp.sharded.as_ref().map(|s| s.elements().1),
            sharded_elements_rank0: dp.sharded.as_ref().map(|s| s.elements().0),
            prefetched_units: prefetched.map(|p| p.0),
            prefetched_units_used: prefetched.map(|p| p.1),
        })
    }

    /// Overwrites every rank's model tensors (`which`: parameters, buffers or both) with rank
    /// 0's.
    pub(super) fn broadcast_model(&self, params: bool, buffers: bool) -> Result<()> {
        let Some(dp) = &self.dp else {
            return Ok(());
        };
        let _guard = tch::no_grad_guard();
        // One broadcast per dtype: the tensors flattened into one buffer, then copied back.
        let mut by_kind: Vec<(Kind, Vec<Tensor>)> = Vec::new();
        for e in self.state.model.params.entries() {
            let wanted = match e.role {
                Role::Parameter => params,
                _ => buffers,
            };
            if !wanted {
                continue;
            }
            let kind = e.tensor.kind();
            match by_kind.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, list)) => list.push(e.tensor.shallow_clone()),
                None => by_kind.push((kind, vec![e.tensor.shallow_clone()])),
            }
        }
        for (_, tensors) in by_kind {
            let flat: Vec<Tensor> = tensors
                .iter()
                .map(|t| t.f_reshape([-1]))
                .collect::<std::result::Result<_, _>>()?;
            let buffer = Tensor::f_cat(&flat, 0)?;
            dp.group
                .broadcast(&buffer, 0)
                .context("sending rank 0's model to the other ranks")?;
            let mut offset = 0;
            for mut t in tensors {
                let n = t.numel() as i64;
                let part = buffer.f_narrow(0, offset, n)?.f_view(t.size().as_slice())?;
                t.f_copy_(&part)?;
                offset += n;
            }
        }
        Ok(())
    }

    /// Sets up the gradient averaging over the trainable parameters as surgery left them.
    pub(super) fn start_reducer(&mut self) -> Result<()> {
        if self.dp.is_none() {
            return Ok(());
        }
        // Under `sharding = "gradients"`, only the parameters a method updates itself.
        let params: Vec<Tensor> = self
            .state
            .model
            .params
            .trainable()
            .filter(|e| self.all_reduced(&e.name))
            .map(|e| e.tensor.shallow_clone())
            .collect();
        let Some(dp) = &mut self.dp else {
            return Ok(());
        };
        if params.is_empty() {
            return Ok(());
        }
        let params: Vec<&Tensor> = params.iter().collect();
        let d = &self.config.distributed;
        let bytes = (d.bucket_mb * 1024.0 * 1024.0).round().max(1.0) as i64;
        // The gradients live in the buckets: no second copy (4 bytes a parameter in fp32).
        let bucket_view = true;
        dp.reducer =
            Some(
                dp.group
                    .reducer(&params, bytes, d.find_unused_parameters, bucket_view)?,
            );
        Ok(())
    }

    /// Announces the forward pass of a microbatch whose backward pass all-reduces.
    pub(super) fn before_synced_forward(&self) -> Result<()> {
        if let Some(r) = self.dp.as_ref().and_then(|d| d.reducer.as_ref()) {
            r.prepare_forward()?;
        }
        Ok(())
    }

    /// Announces that the backward pass from `root` averages the gradients over the ranks.
    pub(super) fn before_synced_backward(&self, root: &Tensor) -> Result<()> {
        if let Some(r) = self.dp.as_ref().and_then(|d| d.reducer.as_ref()) {
            r.prepare_backward(root)?;
        }
        Ok(())
    }

    /// The step's host values agreed over the ranks: a stop signal if any rank got one, and the
    /// samples trained on (summed). One all-reduce of two host numbers per step (Gloo, on the
    /// CPU: it waits for the other ranks, never for the device).
    pub(super) fn agree_step(&mut self, trained: u64) -> Result<(Option<i32>, u64)> {
        let local_stop = self.stop_requested_locally();
        let Some(dp) = &self.dp else {
            return Ok((local_stop, trained));
        };
        let values = [f64::from(u8::from(local_stop.is_some())), trained as f64];
        let v = dp.group.all_reduce_values(&values, Op::Sum)?;
        // A rank that got no signal itself stops as if it had got SIGTERM (the launcher's).
        let stop = (v[0] > 0.0).then(|| local_stop.unwrap_or(15));
        Ok((stop, v[1].round() as u64))
    }

    /// The step's non-finite flag (a device tensor, 1 when this rank's loss was not finite)
    /// agreed over the ranks: the maximum, so that every rank skips the update alike. A device
    /// collective, no host read.
    pub(super) fn agree_flag(&self, flag: Tensor) -> Result<Tensor> {
        let Some(dp) = &self.dp else {
            return Ok(flag);
        };
        let flag = flag.f_contiguous()?;
        dp.group.all_reduce(&flag, Op::Max)?;
        Ok(flag)
    }

    /// Averages `sum` (this rank's loss summed over `count` finite steps) over the ranks:
    /// `(Σ sums) / world`, so every rank holds the same running loss (the mean over the global
    /// batch). The ranks take the same steps, so their counts agree.
    pub(super) fn mean_over_ranks(&self, sum: f64) -> Result<f64> {
        let Some(dp) = &self.dp else {
            return Ok(sum);
        };
        let v = dp.group.all_reduce_values(&[sum], Op::Sum)?;
        Ok(v[0] / self.world() as f64)
    }

    /// `value` (a device tensor) summed over the ranks: a device collective, no host read.
    pub(super) fn sum_tensor_over_ranks(&self, value: Tensor) -> Result<Tensor> {
        let Some(dp) = &self.dp else {
            return Ok(value);
        };
        let value = value.f_contiguous()?;
        dp.group.all_reduce(&value, Op::Sum)?;
        Ok(value)
    }

    /// Sums per-rank evaluation totals over the ranks.
    pub(super) fn sum_over_ranks(&self, values: &mut [f64]) -> Result<()> {
        let Some(dp) = &self.dp else {
            return Ok(());
        };
        let summed = dp.group.all_reduce_values(values, Op::Sum)?;
        values.copy_from_slice(&summed);
        Ok(())
    }

    /// Checks that every rank holds the same model (a method or a bug that made ranks diverge
    /// would silently train W different models): per-tensor sums compared over the ranks.
    pub(super) fn check_ranks_agree(&self) -> Result<()> {
        let Some(dp) = &self.dp else {
            return Ok(());
        };
        self.whole_parameters()?;
        let entries = self.state.model.params.entries();
        let mut sums = Vec::with_capacity(entries.len());
        for e in entries {
            sums.push(
                e.tensor
                    .f_to_kind(Kind::Double)?
                    .f_sum(Kind::Double)?
                    .f_double_value(&[])?,
            );
        }
        if sums.is_empty() {
            return Ok(());
        }
        let high = dp.group.all_reduce_values(&sums, Op::Max)?;
        let low = dp.group.all_reduce_values(&sums, Op::Min)?;
        let differ: Vec<&str> = entries
            .iter()
            .zip(high.iter().zip(&low))
            .filter(|(_, (h, l))| h.to_bits() != l.to_bits())
            .map(|(e, _)| e.name.as_str())
            .collect();
        if !differ.is_empty() {
            fail!(
                "the ranks' models differ after batch {} ({} of {} tensors, first `{}`): a \
                 method changed the model on some ranks only, or a rank skipped a step",
                self.state.clock.timestamp.batch,
                differ.len(),
                entries.len(),
                differ[0]
            );
        }
        Ok(())
    }

    /// The random streams of ranks 1.. for rank 0's checkpoint (the other ranks publish theirs
    /// through the group's store and return an empty list).
    pub(super) fn gather_rank_parts(&mut self) -> Result<Vec<RankPart>> {
        let Some(dp) = &mut self.dp else {
            return Ok(Vec::new());
        };
        dp.checkpoints += 1;
        let dp = &*dp;
        let n = dp.checkpoints;
        let key = |r: usize| format!("tessera/checkpoint/{n}/rank{r}");
        if dp.rank() != 0 {
            let part = RankStreams {
                rng: checkpoint::rng_meta(self.state.rng()),
                torch_rng: Vec::<u8>::try_from(&checkpoint::torch_rng::cpu_state()?)?,
                torch_cuda_rng: checkpoint::torch_rng::cuda_states()?
                    .iter()
                    .map(Vec::<u8>::try_from)
                    .collect::<std::result::Result<_, _>>()?,
            };
            dp.group
                .store_set(&key(dp.rank()), &serde_json::to_vec(&part)?)?;
            return Ok(Vec::new());
        }
        let mut parts = Vec::with_capacity(dp.world() - 1);
        for r in 1..dp.world() {
            let bytes = dp.group.store_get(&key(r))?;
            dp.group.store_delete(&key(r))?;
            let part: RankStreams = serde_json::from_slice(&bytes)?;
            parts.push(RankPart {
                rng: checkpoint::rng_from_meta(&part.rng)?,
                torch_rng: Tensor::from_slice(&part.torch_rng),
                torch_cuda_rng: part
                    .torch_cuda_rng
                    .iter()
                    .map(|b| Tensor::from_slice(b))
                    .collect(),
            });
        }
        Ok(parts)
    }

    /// Gives this rank its own random streams after set-up (rank 0 keeps the run's).
    pub(super) fn seed_rank(&mut self) {
        let rank = self.rank();
        if rank == 0 {
            return;
        }
        let seed = rank_seed(self.config.seed, rank);
        tch::manual_seed(seed as i64);
        self.state
            .set_rng(ChaCha8Rng::seed_from_u64(seed ^ 0x7e55_e4a0_0000_0001));
    }

    /// Restores this rank's random streams from a checkpoint's rank parts (rank 0's were
    /// restored with the rest); a rank the checkpoint has none for starts fresh ones.
    pub(super) fn restore_rank_streams(&mut self, ranks: Vec<RankPart>) -> Result<()> {
        let rank = self.rank();
        if rank == 0 {
            return Ok(());
        }
        match ranks.into_iter().nth(rank - 1) {
            Some(part) => {
                self.state.set_rng(part.rng);
                checkpoint::torch_rng::set_cpu_state(&part.torch_rng)?;
                // Rank 0's CUDA states, restored with the rest, are replaced by this rank's.
                let on_cuda = self.state.device().is_cuda();
                checkpoint::torch_rng::set_cuda_states(&part.torch_cuda_rng, on_cuda)?;
            }
            None => self.seed_rank(),
        }
        Ok(())
    }

    /// Refuses to continue mid-epoch from a checkpoint whose training order was split over
    /// another number of nodes (`saved`, as `TrainerMeta::data_nodes` records it): the order
    /// inside an epoch depends on it (docs/data.md, "Over several nodes").
    pub(super) fn check_node_change(
        &self,
        saved: Option<usize>,
        at: &crate::time::Timestamp,
    ) -> Result<()> {
        let ours = self.data.train_loader.node_split();
        if saved == ours || at.batch_in_epoch == 0 {
            return Ok(());
        }
        let order = |nodes: Option<usize>| match nodes {
            Some(n) => format!("split over {n} nodes"),
            None => "in one order for all ranks (one node, or data not split by node)".to_owned(),
        };
        fail!(
            "the checkpoint was written in the middle of epoch {} (batch {} of the epoch) by a \
             run that read its training data {}, and this run reads it {}: the order inside an \
             epoch depends on the number of nodes, so the position would not carry over. Resume \
             on {} node(s), or from a checkpoint written at the end of an epoch \
             (checkpoint.interval = \"1ep\")",
            at.epoch,
            at.batch_in_epoch,
            order(saved),
            order(ours),
            saved.unwrap_or(1)
        );
    }

    /// Whether a checkpoint written by `saved` ranks of batch `saved_batch` each can continue
    /// on this run's ranks, and whether the global batch changes (`true`). The same number of
    /// ranks continues exactly; another number with the same global batch too (batch b of W
    /// ranks of batch B is batch b of one loader of batch W·B), except for the ranks' own random
    /// draws; another global batch only from the end of an epoch. Says what changes.
    pub(super) fn check_world_change(
        &self,
        saved: usize,
        saved_batch: Option<u64>,
        at: &crate::time::Timestamp,
    ) -> Result<bool> {
        let world = self.world();
        if saved == world {
            return Ok(false);
        }
        let global = self.config.data.batch_size as u64 * world as u64;
        if saved_batch.is_some_and(|b| b * saved as u64 == global) {
            if self.is_rank0() {
                tracing::info!(
                    "the checkpoint was written by {saved} rank(s), this run has {world}: the \
                     global batch is the same ({global}), so the data continues where it \
                     stopped; the ranks' own random draws (dropout, per-rank methods) start \
                     from their saved streams where there are some, fresh ones otherwise"
                );
            }
            return Ok(false);
        }
        if at.batch_in_epoch != 0 {
            fail!(
                "the checkpoint was written by {saved} rank(s) in the middle of epoch {} (batch {} \
                 of the epoch), and this run has {world} with another global batch ({global} \
                 instead of {}): the position inside an epoch depends on the global batch. Resume \
                 with {saved} rank(s) (tessera launch --nproc {saved}), with a data.batch_size \
                 that keeps the global batch, or from a checkpoint written at the end of an epoch \
                 (checkpoint.interval = \"1ep\")",
                at.epoch,
                at.batch_in_epoch,
                saved_batch.map_or_else(|| "unknown".to_owned(), |b| (b * saved as u64).to_string())
            );
        }
        if self.is_rank0() {
            let b = self.config.data.batch_size;
            tracing::warn!(
                "the checkpoint was written by {saved} rank(s), this run has {world}: the weights, \
                 the optimizer state, the schedule's position, the clock and the methods' states \
                 carry over; from epoch {} on, the global batch is {} ({b} x {world}) instead of \
                 {} and each rank sees a different share of the data, so the run no longer \
                 repeats what {saved} rank(s) would have done (ranks without saved random \
                 streams start fresh ones)",
                at.epoch,
                b * world,
                b * saved
            );
        }
        Ok(true)
    }
}

impl Drop for DataParallel {
    fn drop(&mut self) {
        // The batch norms of a later run in this process must not reach a group that is gone.
        crate::model::layers::set_batch_norm_sync(None);
    }
}
