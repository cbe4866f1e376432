//! `[distributed] sharding` in the training loop (ZeRO; `crate::dist::shard` holds the layout
//! and the collectives): set up after rank 0's model reached every rank, the gradients handed
//! to (`optimizer`) or reduce-scattered into (`gradients`, `full`) this rank's pieces before
//! the optimizer step, the updated pieces all-gathered after it (`full`: each unit when it
//! runs), and the optimizer state gathered whole for a checkpoint — which is therefore the same
//! file DDP writes, and resumes on any number of ranks and in any sharding mode.

use std::sync::Arc;

use tch::Tensor;

use crate::dist::shard::{ShardedParams, Sharding, Wire};
use crate::dist::Group;
use crate::engine::Event;
use crate::model::layers::{Gate, Gated};
use crate::model::{Layer, Role};
use crate::optim::Snapshot;

use super::error::{fail, Result};
use super::Trainer;

impl Trainer {
    /// Lays the parameters out for `[distributed] sharding` and gives the optimizer this
    /// rank's pieces. Refuses, naming it, what the mode cannot run.
    /// `units`: the module paths of the units `full` gathers one at a time, `blocks` those of
    /// the model's blocks (both read before a method's surgery).
    pub(super) fn start_sharding(&mut self, units: &[String], blocks: &[String]) -> Result<()> {
        let mode = self.config.distributed.sharding;
        let Some(dp) = &self.dp else {
            if mode != Sharding::None {
                tracing::info!(
                    "[distributed] sharding = \"{}\" has no effect in a single process",
                    mode.name()
                );
            }
            return Ok(());
        };
        let (reduce, gather) = self.wires(mode)?;
        match mode {
            Sharding::None => return Ok(()),
            Sharding::Full if units.is_empty() => fail!(
                "[distributed] sharding = \"full\" gathers the model's parameters one unit at a \
                 time, and model {:?} has no {} (blocks are transformer, ResNet and airbench \
                 blocks; stages are containers of blocks): use sharding = \"gradients\" or \
                 another [distributed] shard_unit",
                self.config.model.name.as_str(),
                self.config.distributed.shard_unit.as_str()
            ),
            Sharding::Optimizer | Sharding::Gradients | Sharding::Full => {}
        }
        self.check_methods_fit(mode, blocks)?;
        // Every parameter the optimizer steps (frozen ones too: a method may unfreeze them);
        // those a method updates itself stay whole on every rank, all-reduced as under DDP.
        let params: Vec<(String, Tensor)> = self
            .state
            .model
            .params
            .entries()
            .iter()
            .filter(|e| e.role == Role::Parameter)
            .filter(|e| !self.state.optimizer.is_handed_over(&e.name))
            .map(|e| (e.name.clone(), e.tensor.shallow_clone()))
            .collect();
        let bytes = (self.config.distributed.bucket_mb * 1024.0 * 1024.0)
            .round()
            .max(1.0) as i64;
        let mut sharded = ShardedParams::new(mode, &params, dp.rank(), dp.world(), bytes, units)?;
        if mode.shards_gradients() {
            sharded.hook_gradients(&dp.group, reduce)?;
        }
        // `full`: each unit behind a gate that gathers its parameters while it runs.
        let gates = sharded.gate_units(&dp.group, units, gather)?;
        for gate in &gates {
            let path = gate.path().to_owned();
            let gate: Arc<dyn Gate> = gate.clone();
            let wrapped =
                self.state
                    .model
                    .wrap_module(&path, None, &[], |inner| -> Box<dyn Layer> {
                        Box::new(Gated::new(inner, gate))
                    });
            if let Err(e) = wrapped {
                fail!("[distributed] sharding = \"full\": unit `{path}`: {e}");
            }
        }
        crate::dist::full::set_prefetch(mode == Sharding::Full && self.config.distributed.prefetch);
        self.state.optimizer.shard(Box::new(sharded.view()));
        if dp.rank() == 0 {
            self.announce_sharding(mode, &sharded, gates.len(), (reduce, gather));
        }
        let sharded = std::rc::Rc::new(sharded);
        crate::dist::slices::register(&sharded);
        if let Some(dp) = &mut self.dp {
            dp.sharded = Some(sharded);
        }
        Ok(())
    }

    /// Refuses the methods `mode` cannot run with: a method's module in a block's place under
    /// `full`, a method reading gradients after each backward pass when they are sharded.
    fn check_methods_fit(&self, mode: Sharding, blocks: &[String]) -> Result<()> {
        // `full`: every rank gathers the units in the same order, so the blocks must run alike
        // on every rank; a method's module in a block's place (stochastic depth's block, which
        // each rank skips on its own draws) may not.
        if mode == Sharding::Full {
            let plugin = self.state.model.root.plugin_layers();
            if let Some((path, kind)) = plugin.iter().find(|(p, _)| blocks.contains(p)) {
                fail!(
                    "[distributed] sharding = \"full\": block `{path}` is a method's module \
                     (`{kind}`), which may run its layers on some ranks and not on others \
                     (stochastic depth skips blocks on each rank's own draws), while every rank \
                     must gather the units in the same order; use sharding = \"gradients\" with \
                     this method"
                );
            }
        }
        // Methods at `after_train_batch` see whole gradients, gathered for them; after each
        // microbatch's backward pass there are only this rank's slices of its gradients.
        if mode.shards_gradients() {
            if let Some(method) = self.engine.methods_at(Event::AFTER_BACKWARD).first() {
                fail!(
                    "method `{method}` runs at `{}`, after each microbatch's backward pass, where \
                     it may read the gradients: with [distributed] sharding = \"{}\" each rank \
                     holds only its slice of them there; use sharding = \"optimizer\" (whole \
                     gradients, sharded optimizer state) with it",
                    Event::AFTER_BACKWARD.name(),
                    mode.name()
                );
            }
        }
        Ok(())
    }

    /// Logs (on rank 0) what each rank keeps and steps under `mode`.
    fn announce_sharding(
        &self,
        mode: Sharding,
        sharded: &ShardedParams,
        units: usize,
        (reduce, gather): (Wire, Wire),
    ) {
        let world = self.dp.as_ref().map_or(1, |d| d.world());
        let (mine, all) = sharded.elements();
        tracing::info!(
            "sharding = \"{}\": each rank steps about 1/{} of the {} parameter elements \
             ({} on rank 0) and keeps their optimizer state{}",
            mode.name(),
            world,
            all,
            mine,
            match mode {
                Sharding::Full => format!(
                    ", reduced gradients and parameters ({} units gathered as they run{}, \
                     in {}; gradients reduced in {})",
                    units,
                    if self.config.distributed.prefetch {
                        ", the next one prefetched"
                    } else {
                        ""
                    },
                    gather.name(),
                    reduce.name()
                ),
                Sharding::Gradients =>
                    format!(" and reduced gradients (reduced in {})", reduce.name()),
                _ => String::new(),
            }
        );
    }

    /// The dtypes of the gradients' reduce-scatter and of `full`'s gathers under `mode`
    /// (`[distributed] reduce_dtype`, `gather_dtype`; `auto` resolved by the precision).
    /// Refuses, naming the key, a bfloat16 wire where the mode has no such collective.
    fn wires(&self, mode: Sharding) -> Result<(Wire, Wire)> {
        let d = &self.config.distributed;
        if d.reduce_dtype == Wire::Bf16 && !mode.shards_gradients() {
            fail!(
                "[distributed] reduce_dtype = \"bf16\" applies to the gradients' reduce-scatter \
                 under sharding = \"gradients\" or \"full\"; with sharding = \"{}\" c10d's \
                 reducer all-reduces them in their own dtype: use sharding = \"gradients\", or \
                 leave reduce_dtype at \"fp32\"",
                mode.name()
            );
        }
        if d.gather_dtype == Wire::Bf16 && mode != Sharding::Full {
            fail!(
                "[distributed] gather_dtype = \"bf16\" applies to sharding = \"full\", where the \
                 parameters are gathered for each pass; with sharding = \"{}\" every rank holds \
                 them whole: use sharding = \"full\", or leave gather_dtype at \"auto\"",
                mode.name()
            );
        }
        let gather = match d.gather_dtype {
            Wire::Auto if self.config.train.precision == crate::precision::Precision::AmpBf16 => {
                Wire::Bf16
            }
            Wire::Auto => Wire::Fp32,
            chosen => chosen,
        };
        Ok((d.reduce_dtype, gather))
    }

    /// The parameters c10d's reducer all-reduces: every trainable one, except those whose
    /// gradients are reduce-scattered instead.
    pub(super) fn all_reduced(&self, name: &str) -> bool {
        match self.sharded() {
            Some(s) if s.mode().shards_gradients() => !s.names().any(|n| n == name),
            _ => true,
        }
    }

    /// Before the optimizer step: this rank's pieces get their gradients (`full`: and what a
    /// method wrote into whole parameters).
    pub(super) fn shard_gradients(&self) -> Result<()> {
        let Some((group, sharded)) = self.sharded_in_group() else {
            return Ok(());
        };
        let _guard = tch::no_grad_guard();
        sharded.release()?;
        if sharded.mode().shards_gradients() {
            sharded.take_reduced_grads(group)?;
        } else {
            sharded.take_whole_grads()?;
        }
        Ok(())
    }

    /// Under sharded gradients, before amp_fp16's loss scaler unscales and checks them and the
    /// methods at `after_train_batch` (gradient clipping, SAM) read them: the parameters get
    /// their whole reduced gradients. Returns whether it gathered.
    pub(super) fn gradients_for_methods(&self) -> Result<bool> {
        let Some((group, sharded)) = self.sharded_in_group() else {
            return Ok(false);
        };
        let wanted = self.state.scaler.is_some()
            || !self.engine.methods_at(Event::AFTER_TRAIN_BATCH).is_empty();
        if !sharded.mode().shards_gradients() || !wanted {
            return Ok(false);
        }
        sharded.gather_gradients(group)?;
        Ok(true)
    }

    /// After those methods: this rank's slices keep what they left.
    pub(super) fn gradients_after_methods(&self) -> Result<()> {
        if let Some(s) = self.sharded() {
            s.scatter_gradients()?;
        }
        Ok(())
    }

    /// After an event: what the methods wrote into their slices reaches the whole parameters
    /// (`crate::dist::slices::after_event`).
    pub(super) fn after_slices(&self) -> Result<()> {
        if let Some((group, sharded)) = self.sharded_in_group() {
            crate::dist::slices::after_event(group, sharded)?;
        }
        Ok(())
    }

    /// The group and the layout under sharding.
    fn sharded_in_group(&self) -> Option<(&Group, &ShardedParams)> {
        let dp = self.dp.as_ref()?;
        Some((&dp.group, dp.sharded.as_deref()?))
    }

    fn sharded(&self) -> Option<&ShardedParams> {
        self.sharded_in_group().map(|(_, s)| s)
    }

    /// At the start of a forward/backward pass over the batch (`gradients`: nothing reduced
    /// yet; `full`: the parameters made whole since the last step let go, keeping what a method
    /// wrote, and those outside the units gathered for the pass).
    pub(super) fn start_sharded_pass(&self) -> Result<()> {
        if let Some(s) = self.sharded() {
            crate::dist::full::set_in_backward(false);
            s.start_step();
            s.release()?;
            s.gather_root()?;
        }
        Ok(())
    }

    /// `full`: makes every unit's parameters whole, for what reads them outside the training
    /// step (the evaluation, a checkpoint, the check that the ranks agree). Collective.
    pub(super) fn whole_parameters(&self) -> Result<()> {
        if let Some(s) = self.sharded() {
            s.summon()?;
        }
        Ok(())
    }

    /// Before each microbatch's backward pass (`gradients`: the hooks count its gradients).
    pub(super) fn before_sharded_backward(&self) -> Result<()> {
        if let Some(s) = self.sharded() {
            crate::dist::full::set_in_backward(true);
            s.before_backward()?;
        }
        Ok(())
    }

    /// After each microbatch's backward pass (`gradients`: its reduce-scatters finished).
    pub(super) fn after_sharded_backward(&self) -> Result<()> {
        if let Some(s) = self.sharded() {
            crate::dist::full::set_in_backward(false);
            s.after_backward()?;
        }
        Ok(())
    }

    /// After the optimizer step: every rank's updated pieces reach every rank.
    pub(super) fn gather_parameters(&self) -> Result<()> {
        if let Some((group, sharded)) = self.sharded_in_group() {
            sharded.all_gather(group)?;
        }
        Ok(())
    }

    /// Whether the gradients' non-finite flag must be agreed over the ranks (each rank
    /// unscaled its own, unreduced gradients).
    pub(super) fn local_gradients(&self) -> bool {
        self.sharded().is_some_and(|s| s.mode().shards_gradients())
    }

    /// The optimizer's state for rank 0's checkpoint: under sharding, every rank's pieces
    /// gathered into whole tensors (collective: every rank calls it); `None` on the other ranks.
    pub(super) fn optimizer_snapshot(&self) -> Result<Option<Snapshot>> {
        let Some((group, sharded)) = self.sharded_in_group() else {
            return Ok(self.is_rank0().then(|| self.state.optimizer.snapshot()));
        };
        let mut snapshot = self.state.optimizer.snapshot();
        for buffer in self.state.optimizer.buffer_names() {
            let key = |name: &str| format!("{name}.{buffer}");
            let gathered = sharded.gather_pieces(group, |name| {
                let k = key(name);
                snapshot
                    .tensors
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, t)| t.shallow_clone())
            })?;
            for (name, whole) in gathered {
                let k = key(&name);
                if let Some(entry) = snapshot.tensors.iter_mut().find(|(n, _)| *n == k) {
                    entry.1 = whole;
                }
            }
        }
        Ok(self.is_rank0().then_some(snapshot))
    }
}
