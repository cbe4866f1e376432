//! `tessera new-plugin`: a plugin crate that builds and works at once.

use std::path::PathBuf;

use tessera::scaffold;

use crate::Exit;

#[derive(clap::Args)]
pub struct Args {
    /// The plugin's name, a snake_case crate name (`my_method`).
    name: String,
    /// The folder to create (default: ./NAME); must not exist or be empty.
    dir: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let Args { name, dir } = args;
    let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
    let files = scaffold::create(&name, &dir)?;
    eprintln!("created plugin crate `{name}` in {}:", dir.display());
    for f in &files {
        eprintln!("  {}", f.display());
    }
    eprintln!(
        "next: cd {} && cargo test --release, then `tessera plugins install {}` (builds it \
         against this tessera's libtorch and installs it where every run finds it; see \
         README.md there)",
        dir.display(),
        dir.display()
    );
    Ok(Exit::SUCCESS)
}
