//! The method: claims the hidden matrices at `init`, steps them at `optimizer_step`, and keeps
//! their momentum in its state.

use std::collections::HashMap;

use tessera_plugin_api::kit::StateReader;
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::{keys, Context, Error, Event, Method, State};

use crate::config::MuonConfig;
use crate::select::select_parameters;
use crate::share::Plan;
use crate::update::{newton_schulz, MatrixGroup};

/// The current layout of [`Method::state`]: one tensor per parameter, its momentum buffer in
/// the parameter's shape, named as the parameter; the bytes list the claimed names, one a line.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// Priority at `init`: after model surgery by other methods (which hook `init` at 0), so that
/// Muon selects from the final model.
pub const INIT_PRIORITY: i32 = -1000;

/// The Muon method.
pub struct Muon {
    config: MuonConfig,
    /// The parameters claimed at `init`, in the model's order.
    claimed: Vec<String>,
    /// The claimed parameters by shape, kind and device, with their momentum; built at the
    /// first step.
    groups: Vec<MatrixGroup>,
    /// Momentum restored by `load_state` before the groups exist.
    loaded: HashMap<String, Tensor>,
    /// Who orthogonalizes which matrix when the ranks share the work (built at the first
    /// step).
    plan: Option<Plan>,
}

impl Muon {
    /// A method with these settings (parameters are chosen at `init`).
    pub fn new(config: MuonConfig) -> Muon {
        Muon {
            config,
            claimed: Vec::new(),
            groups: Vec::new(),
            loaded: HashMap::new(),
            plan: None,
        }
    }

    /// The resolved settings.
    pub fn config(&self) -> &MuonConfig {
        &self.config
    }

    /// The parameters Muon trains.
    pub fn claimed(&self) -> &[String] {
        &self.claimed
    }

    fn parameter(ctx: &Context<'_>, name: &str) -> Result<Tensor, Error> {
        ctx.parameter(name)?.ok_or_else(|| {
            Error::from(format!("the model no longer has `{name}` (Muon trains it)"))
        })
    }

    /// Groups the claimed parameters by shape, kind and device (first appearance order) with
    /// zero momentum, or the momentum `load_state` restored.
    fn build_groups(&mut self, ctx: &Context<'_>) -> Result<(), Error> {
        type Key = (Vec<i64>, Kind, Device);
        let mut members: Vec<(Key, Vec<String>)> = Vec::new();
        for name in &self.claimed {
            let p = Self::parameter(ctx, name)?;
            let key = (p.size(), p.kind(), p.device());
            match members.iter_mut().find(|(k, _)| *k == key) {
                Some((_, names)) => names.push(name.clone()),
                None => members.push((key, vec![name.clone()])),
            }
        }
        let groups = members
            .into_iter()
            .map(|((shape, kind, device), names)| MatrixGroup::new(names, shape, kind, device))
            .collect::<Result<Vec<_>, Error>>()?;
        self.groups = groups;
        if !self.loaded.is_empty() {
            let loaded = std::mem::take(&mut self.loaded);
            self.restore(loaded)?;
        }
        Ok(())
    }

    /// Copies checkpointed momentum (by parameter name) into the groups.
    fn restore(&mut self, mut loaded: HashMap<String, Tensor>) -> Result<(), Error> {
        let _no_grad = tessera_plugin_api::tch::no_grad_guard();
        for g in &self.groups {
            for (i, name) in g.names.iter().enumerate() {
                let saved = loaded.remove(name).ok_or_else(|| {
                    Error::from(format!(
                        "the checkpoint has no Muon momentum for `{name}` (were the settings changed?)"
                    ))
                })?;
                let mut buffer = g.momentum_of(i)?;
                if saved.size() != buffer.size() {
                    return Err(format!(
                        "the checkpoint's Muon momentum for `{name}` has shape {:?}, the parameter {:?}",
                        saved.size(),
                        buffer.size()
                    )
                    .into());
                }
                buffer.f_copy_(&saved)?;
            }
        }
        if let Some(name) = loaded.keys().next() {
            return Err(format!(
                "the checkpoint has Muon momentum for `{name}`, which Muon does not train in this run (were the settings changed?)"
            )
            .into());
        }
        Ok(())
    }

    fn init(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let names = select_parameters(&ctx.parameters()?, &ctx.modules()?, &self.config)?;
        ctx.claim_parameters(&names)?;
        ctx.info(&format!(
            "muon ({:?}): trains {} parameters: {}",
            self.config.variant,
            names.len(),
            names.join(", ")
        ));
        ctx.log_metric("muon/parameters", names.len() as f64);
        self.claimed = names;
        Ok(())
    }

    fn step(&mut self, ctx: &mut Context<'_>) -> Result<(), Error> {
        if self.groups.is_empty() {
            self.build_groups(ctx)?;
            self.plan = self.sharing(ctx)?;
        }
        let lr = self.config.lr * ctx.step_info()?.lr_factor;
        let skip = ctx.tensor(keys::FOUND_INF);
        let mut steps = Vec::with_capacity(self.groups.len());
        for g in &mut self.groups {
            let params = g
                .names
                .iter()
                .map(|n| Self::parameter(ctx, n))
                .collect::<Result<Vec<_>, Error>>()?;
            let grads: Vec<Tensor> = params.iter().map(Tensor::grad).collect();
            let update = g.advance(&grads, &self.config, skip.as_ref())?;
            steps.push((params, grads, update));
        }
        let orthos = match &self.plan {
            Some(plan) => {
                let updates: Vec<Tensor> = steps.iter().map(|s| s.2.shallow_clone()).collect();
                plan.orthogonalize(&updates, &self.config, &mut |t| ctx.all_gather(t))?
            }
            None => steps
                .iter()
                .map(|s| newton_schulz(&s.2, &self.config))
                .collect::<Result<Vec<_>, Error>>()?,
        };
        for (g, ((params, grads, _), ortho)) in self.groups.iter().zip(steps.iter().zip(&orthos)) {
            g.apply(params, grads, ortho, &self.config, lr, skip.as_ref())?;
        }
        Ok(())
    }

    /// The plan sharing the orthogonalization between the ranks, when they share it: a
    /// data-parallel run, with `share_across_ranks` on, in a host that gathers (1.9). Says
    /// each rank's share.
    fn sharing(&self, ctx: &mut Context<'_>) -> Result<Option<Plan>, Error> {
        let r = ctx.ranks();
        let (rank, world) = (r.rank as usize, r.world_size as usize);
        let total: usize = self.groups.iter().map(|g| g.names.len()).sum();
        let shared = world > 1 && self.config.share_across_ranks && ctx.supports_all_gather();
        let plan = match (shared, self.groups.first()) {
            (true, Some(first)) => {
                let shapes: Vec<(i64, i64, i64)> = self
                    .groups
                    .iter()
                    .map(|g| (g.names.len() as i64, g.rows, g.cols))
                    .collect();
                Some(Plan::new(&shapes, rank, world, first.momentum.device())?)
            }
            _ => None,
        };
        let mine = plan.as_ref().map_or(total, Plan::mine);
        if world > 1 {
            ctx.info(&format!(
                "muon: rank {rank} orthogonalizes {mine} of the {total} matrices{}",
                if plan.is_some() {
                    format!(" (shared by the {world} ranks)")
                } else if !self.config.share_across_ranks {
                    " (share_across_ranks = false)".to_owned()
                } else {
                    " (this tessera cannot gather for plugins: it predates plugin-api 1.9)"
                        .to_owned()
                }
            ));
        }
        // Logged at a run's first step; a resumed run's metrics continue the file that has it
        // (a resume on another rank count says its share in the log).
        if ctx.time().batch == 0 {
            ctx.log_metric("muon/orthogonalized", mine as f64);
        }
        Ok(plan)
    }
}

impl Method for Muon {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        match event {
            Event::INIT => self.init(ctx),
            Event::OPTIMIZER_STEP => self.step(ctx),
            _ => Ok(()),
        }
    }

    fn state(&self) -> Result<State, Error> {
        let mut tensors = Vec::new();
        if self.groups.is_empty() {
            for name in &self.claimed {
                if let Some(t) = self.loaded.get(name) {
                    tensors.push((name.clone(), t.f_detach_copy()?));
                }
            }
        }
        for g in &self.groups {
            for (i, name) in g.names.iter().enumerate() {
                tensors.push((name.clone(), g.momentum_of(i)?.f_detach_copy()?));
            }
        }
        Ok(State {
            format_version: STATE_FORMAT_VERSION,
            // The claimed names, one a line: for a reader of the checkpoint (the tensors
            // carry the same names); never empty, as tools expect some bytes.
            bytes: self.claimed.join("\n").into_bytes(),
            tensors,
        })
    }

    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let loaded: HashMap<String, Tensor> =
            StateReader::open("Muon", state, STATE_FORMAT_VERSION)?
                .take_all()
                .into_iter()
                .collect();
        if self.groups.is_empty() {
            self.loaded = loaded;
            Ok(())
        } else {
            self.restore(loaded)
        }
    }
}
