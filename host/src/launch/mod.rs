//! `tessera launch`: starts the ranks of a data-parallel run on this node and supervises them,
//! as `torchrun` does for PyTorch.
//!
//! Each rank is a `tessera` process (usually `tessera train`) that finds its place in the run in
//! torchrun's variables: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,
//! `MASTER_ADDR`, `MASTER_PORT`. The node's local rank 0 writes to the launcher's stdout and
//! stderr as a single-process run would; the other ranks' lines come out on the launcher's
//! stderr prefixed `[rank R] `. The first rank to fail stops the others (SIGTERM, a grace
//! period, then SIGKILL); SIGINT or SIGTERM to the launcher is passed on as SIGTERM, which makes
//! `tessera train` write a checkpoint and stop. See docs/distributed.md.
//!
//! `mod.rs` holds what is launched (the options, the topology, each rank's variables),
//! `rank.rs` one rank's process and its output, `supervise.rs` the loop that watches them.

use std::fmt;
use std::io;
use std::net::TcpListener;

mod rank;
mod supervise;

pub use rank::STDERR_TAIL_LINES;
pub use supervise::{supervise, Outcome, RankFailure};

/// The master address when none is given: this machine.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
/// The master port of a run over several nodes when none is given (torchrun's). A one-node run
/// takes a free port instead.
pub const DEFAULT_MULTI_NODE_MASTER_PORT: u16 = 29500;
/// Variables that say this process already is one rank of a distributed run.
const RANK_VARIABLES: [&str; 2] = ["RANK", "WORLD_SIZE"];

/// Why the ranks could not be started or supervised.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// `--nproc 0`.
    #[error("--nproc is 0: start at least 1 rank on this node")]
    NoRanks,
    /// `--nnodes 0`.
    #[error("--nnodes is 0: a run has at least 1 node")]
    NoNodes,
    /// `--node-rank` is not below `--nnodes`.
    #[error(
        "--node-rank {node_rank} is out of range for --nnodes {nnodes}: node ranks count from 0, \
         so it must be below {nnodes}"
    )]
    NodeRankOutOfRange {
        /// `--node-rank`.
        node_rank: u32,
        /// `--nnodes`.
        nnodes: u32,
    },
    /// The world size does not fit in 32 bits.
    #[error("--nproc {nproc} times --nnodes {nnodes} is more ranks than can be numbered")]
    TooManyRanks {
        /// `--nproc`.
        nproc: u32,
        /// `--nnodes`.
        nnodes: u32,
    },
    /// The launcher itself runs as one rank of a distributed run.
    #[error(
        "{variable}={value} is already set: this process already runs as one rank of a \
         distributed run (under torchrun, Slurm or another launcher), which sets the variables \
         `tessera train` reads; run `tessera train ...` directly there instead of `tessera launch`"
    )]
    AlreadyDistributed {
        /// `RANK` or `WORLD_SIZE`.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// No free port on the master address (for a one-node run without `--master-port`).
    #[error("cannot find a free master port on {master_addr} (give one with --master-port)")]
    NoFreePort {
        /// `--master-addr`.
        master_addr: String,
        /// Why binding port 0 there failed.
        #[source]
        cause: io::Error,
    },
    /// A rank's process could not be started.
    #[error("cannot start rank {rank} ({program})")]
    Spawn {
        /// The global rank.
        rank: u32,
        /// The program.
        program: String,
        /// Why.
        #[source]
        cause: io::Error,
    },
    /// A rank's status could not be read.
    #[error("cannot wait for rank {rank} (pid {pid})")]
    Wait {
        /// The global rank.
        rank: u32,
        /// Its process id.
        pid: u32,
        /// Why.
        #[source]
        cause: io::Error,
    },
}

/// What `tessera launch` is asked for: the node's share of the run and where the ranks meet.
#[derive(Debug, Clone, clap::Args)]
pub struct LaunchOptions {
    /// Ranks (processes) to start on this node.
    #[arg(long, value_name = "N")]
    pub nproc: u32,
    /// Nodes (machines) in the run; each runs `tessera launch` with its own --node-rank.
    #[arg(long, value_name = "M", default_value_t = 1)]
    pub nnodes: u32,
    /// This node's place among the nodes, from 0; node 0 hosts the master.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub node_rank: u32,
    /// The address of node 0, where the ranks meet; every node must reach it.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_MASTER_ADDR)]
    pub master_addr: String,
    /// The port the ranks meet on [default: a free port with --nnodes 1; 29500, as torchrun,
    /// with several nodes].
    #[arg(long, value_name = "PORT")]
    pub master_port: Option<u16>,
}

impl LaunchOptions {
    /// Checks the options and the environment (`env` reads a variable), and picks the master
    /// port when none is given.
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> Result<Topology, LaunchError> {
        for variable in RANK_VARIABLES {
            if let Some(value) = env(variable).filter(|v| !v.is_empty()) {
                return Err(LaunchError::AlreadyDistributed { variable, value });
            }
        }
        if self.nproc == 0 {
            return Err(LaunchError::NoRanks);
        }
        if self.nnodes == 0 {
            return Err(LaunchError::NoNodes);
        }
        if self.node_rank >= self.nnodes {
            return Err(LaunchError::NodeRankOutOfRange {
                node_rank: self.node_rank,
                nnodes: self.nnodes,
            });
        }
        let world_size = self
            .nproc
            .checked_mul(self.nnodes)
            .ok_or(LaunchError::TooManyRanks {
                nproc: self.nproc,
                nnodes: self.nnodes,
            })?;
        let master_port = match self.master_port {
            Some(port) => port,
            None if self.nnodes > 1 => DEFAULT_MULTI_NODE_MASTER_PORT,
            // Another process may take the port before rank 0 binds it; torchrun takes the
            // same chance.
            None => TcpListener::bind((self.master_addr.as_str(), 0))
                .and_then(|listener| listener.local_addr())
                .map(|address| address.port())
                .map_err(|cause| LaunchError::NoFreePort {
                    master_addr: self.master_addr.clone(),
                    cause,
                })?,
        };
        Ok(Topology {
            nproc: self.nproc,
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            world_size,
            master_addr: self.master_addr.clone(),
            master_port,
        })
    }
}

/// Where this node's ranks sit in the run; every rank's variables follow from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Ranks on this node.
    pub nproc: u32,
    /// Nodes in the run.
    pub nnodes: u32,
    /// This node's place, from 0.
    pub node_rank: u32,
    /// Ranks in the run: `nproc * nnodes`.
    pub world_size: u32,
    /// Where the ranks meet.
    pub master_addr: String,
    /// The port they meet on.
    pub master_port: u16,
}

impl Topology {
    /// The rank in the whole run of this node's `local_rank`.
    pub fn global_rank(&self, local_rank: u32) -> u32 {
        self.node_rank * self.nproc + local_rank
    }

    /// The variables `local_rank`'s process gets, as torchrun sets them.
    pub fn rank_env(&self, local_rank: u32) -> [(&'static str, String); 7] {
        [
            ("RANK", self.global_rank(local_rank).to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
        ]
    }
}

/// `N ranks on this node (world size W, node K of M), master A:P`.
impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ranks = if self.nproc == 1 { "rank" } else { "ranks" };
        write!(
            f,
            "{} {ranks} on this node (world size {}, node {} of {}), master {}:{}",
            self.nproc,
            self.world_size,
            self.node_rank,
            self.nnodes,
            self.master_addr,
            self.master_port
        )
    }
}

#[cfg(test)]
mod tests;

/// Has Linux send the child SIGTERM when this process dies (killed, out of memory), so that a
/// training run writes a checkpoint and stops instead of running on unsupervised. Used for the
/// ranks of `tessera launch` and the runs of `tessera sweep`.
#[cfg(target_os = "linux")]
pub(crate) fn stop_with_parent(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: between fork and exec the closure only calls async-signal-safe functions
    // (prctl, getppid) and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl; then no signal would come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// See the Linux version: elsewhere the child is not tied to this process.
#[cfg(not(target_os = "linux"))]
pub(crate) fn stop_with_parent(_command: &mut std::process::Command) {}
