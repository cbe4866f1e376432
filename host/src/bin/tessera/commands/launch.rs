//! `tessera launch`: the ranks of a data-parallel run on this node, supervised.

use std::ffi::OsString;
use std::time::Duration;

use anyhow::Context as _;
use tessera::launch;

use crate::Exit;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    options: launch::LaunchOptions,
    /// Seconds the other ranks get to stop after a rank fails (or after a second signal)
    /// before they are killed.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    grace_seconds: u64,
    /// The tessera command every rank runs, with its arguments, passed on verbatim:
    /// `train trainer.toml --set k=v`.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<OsString>,
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let Args {
        options,
        grace_seconds,
        command,
    } = args;
    use signal_hook::consts::{SIGINT, SIGTERM};
    let topology =
        options.resolve(|name| Some(std::env::var_os(name)?.to_string_lossy().into()))?;
    let program =
        std::env::current_exe().context("finding the tessera binary that the ranks run")?;
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing signal handlers")?;
    eprintln!("tessera launch: {topology}");
    let outcome = launch::supervise(
        program.as_os_str(),
        &command,
        &topology,
        Duration::from_secs(grace_seconds),
        || signals.pending().collect(),
    )?;
    Ok(Exit::from(outcome.exit_code()))
}
