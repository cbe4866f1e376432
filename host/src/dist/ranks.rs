//! A rank's place in the run: torchrun's environment (`RankEnv`), and the process's ranks and
//! group as plugins see them.

use super::{DistError, Group};

/// Where this process stands in a data-parallel run, from torchrun-style environment variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnv {
    /// This process's rank, 0..world.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Rank on this machine (`LOCAL_RANK`, default the rank).
    pub local_rank: usize,
    /// Ranks on this machine (`LOCAL_WORLD_SIZE`, default the world).
    pub local_world: usize,
    /// Address of rank 0's store (`MASTER_ADDR`).
    pub master_addr: String,
    /// Port of rank 0's store (`MASTER_PORT`).
    pub master_port: u16,
}

impl RankEnv {
    /// This process's place on its machine (which GPU `train.device = "auto"` gives it).
    pub fn local(&self) -> crate::device::LocalRank {
        crate::device::LocalRank {
            rank: self.local_rank,
            world: self.local_world,
        }
    }

    /// Machines (nodes) in the run: ranks / ranks per node, rounded up (a run whose last
    /// node has fewer ranks still rents it). 1 when `LOCAL_WORLD_SIZE` is not set.
    pub fn nodes(&self) -> usize {
        self.world.div_ceil(self.local_world.max(1))
    }

    /// The rank this process's environment describes; `None` for a single-process run (no
    /// `WORLD_SIZE`, or `WORLD_SIZE = 1`).
    pub fn from_env() -> Result<Option<RankEnv>, DistError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`RankEnv::from_env`] over any variable lookup (for tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<RankEnv>, DistError> {
        let number = |key: &str| -> Result<Option<usize>, DistError> {
            match var(key) {
                None => Ok(None),
                Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
                    DistError::Env(format!(
                        "{key}={v:?} is not a non-negative whole number (data-parallel \
                         environment; see docs/distributed.md)"
                    ))
                }),
            }
        };
        let Some(world) = number("WORLD_SIZE")? else {
            return Ok(None);
        };
        if world == 0 {
            return Err(DistError::Env(
                "WORLD_SIZE=0: a run needs at least one rank".into(),
            ));
        }
        let rank = number("RANK")?;
        if world == 1 && rank.unwrap_or(0) == 0 {
            return Ok(None);
        }
        let rank = rank.ok_or_else(|| {
            DistError::Env(format!(
                "WORLD_SIZE={world} but RANK is not set: every process of a data-parallel run \
                 needs its RANK (tessera launch sets it)"
            ))
        })?;
        if rank >= world {
            return Err(DistError::Env(format!(
                "RANK={rank} is not below WORLD_SIZE={world}"
            )));
        }
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".to_owned());
        let master_port = match var("MASTER_PORT") {
            None => {
                return Err(DistError::Env(format!(
                    "WORLD_SIZE={world} but MASTER_PORT is not set: the ranks meet at \
                     MASTER_ADDR:MASTER_PORT (tessera launch sets both)"
                )))
            }
            Some(p) => p
                .trim()
                .parse::<u16>()
                .map_err(|_| DistError::Env(format!("MASTER_PORT={p:?} is not a port number")))?,
        };
        Ok(Some(RankEnv {
            rank,
            world,
            local_rank: number("LOCAL_RANK")?.unwrap_or(rank),
            local_world: number("LOCAL_WORLD_SIZE")?.unwrap_or(world).max(1),
            master_addr,
            master_port,
        }))
    }
}

/// This process's (rank, world size, local rank) while it is a member of a group; (0, 1, 0)
/// otherwise. What plugins see (`Context::ranks`).
pub fn process_ranks() -> (usize, usize, usize) {
    match RANKS.read() {
        Ok(r) => *r,
        Err(poisoned) => *poisoned.into_inner(),
    }
}

pub(super) fn set_process_ranks(value: (usize, usize, usize)) {
    match RANKS.write() {
        Ok(mut r) => *r = value,
        Err(poisoned) => *poisoned.into_inner() = value,
    }
}

/// Makes `group` the one plugins' collectives go through (until it is dropped).
pub fn set_plugin_group(group: &std::sync::Arc<Group>) {
    let weak = Some(std::sync::Arc::downgrade(group));
    match PLUGIN_GROUP.write() {
        Ok(mut g) => *g = weak,
        Err(poisoned) => *poisoned.into_inner() = weak,
    }
}

/// The group plugins' collectives go through, while the run holds it.
pub(crate) fn plugin_group() -> Option<std::sync::Arc<Group>> {
    match PLUGIN_GROUP.read() {
        Ok(g) => g.as_ref().and_then(std::sync::Weak::upgrade),
        Err(poisoned) => poisoned
            .into_inner()
            .as_ref()
            .and_then(std::sync::Weak::upgrade),
    }
}

static RANKS: std::sync::RwLock<(usize, usize, usize)> = std::sync::RwLock::new((0, 1, 0));

/// The run's group as plugins reach it (`Context::all_gather`, plugin-api 1.9): held weakly,
/// so the group still ends with the run that joined it.
static PLUGIN_GROUP: std::sync::RwLock<Option<std::sync::Weak<Group>>> =
    std::sync::RwLock::new(None);
