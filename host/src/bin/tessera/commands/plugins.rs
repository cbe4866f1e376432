//! `tessera plugins`: list, inspect, install and remove plugins.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Subcommand;
use tessera::{config, plugin};

use crate::Exit;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: PluginsCommand,
}

#[derive(Subcommand)]
enum PluginsCommand {
    /// List every plugin found, with its folder and where that folder comes from, in search
    /// order: --dir folders (or a trainer.toml's [plugins] dirs and plugins/ beside it),
    /// TESSERA_PLUGIN_PATH, the user's folder, the installation's.
    List {
        /// A folder to search first (repeatable).
        #[arg(long = "dir")]
        dirs: Vec<PathBuf>,
        /// Also search the folders this trainer.toml names.
        #[arg(long, value_name = "TRAINER_TOML")]
        config: Option<PathBuf>,
    },
    /// Show everything about one plugin file.
    Inspect {
        /// The plugin file.
        file: PathBuf,
    },
    /// Install a plugin: a `.so` file (checked like at load: ELF for this machine, Tessera's
    /// root module, plugin-api and libtorch versions), or a plugin crate's folder (built with
    /// cargo against this tessera's libtorch, then checked). Into the user's folder
    /// ($XDG_DATA_HOME/tessera/plugins) unless --to is given.
    #[command(
        after_help = "Examples:\n  tessera plugins install ./libmy_method.so\n  tessera plugins install ./my_method\n  tessera plugins install ./libmy_method.so --to examples/fashion-mnist/plugins"
    )]
    Install {
        /// A plugin file (`lib<name>.so`) or a plugin crate folder (with Cargo.toml).
        path: PathBuf,
        /// The folder to install into (default: the user's plugin folder).
        #[arg(long, value_name = "DIR")]
        to: Option<PathBuf>,
    },
    /// Remove an installed plugin from the user's folder (or --to DIR).
    Remove {
        /// The plugin's name.
        name: String,
        /// The folder to remove it from (default: the user's plugin folder).
        #[arg(long, value_name = "DIR")]
        to: Option<PathBuf>,
    },
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    match args.command {
        PluginsCommand::List { dirs, config } => list_plugins(dirs, config.as_deref())?,
        PluginsCommand::Inspect { file } => {
            let p = plugin::LoadedPlugin::load(&file, None)
                .with_context(|| format!("inspecting {}", file.display()))?;
            print_plugin(&p);
            println!("  default settings:");
            for line in p.default_settings.lines() {
                println!("    {line}");
            }
        }
        PluginsCommand::Install { path, to } => {
            let dest = plugin::install::destination(to.as_deref())?;
            let file = if path.is_dir() {
                eprintln!("building the plugin crate in {}", path.display());
                plugin::install::build_crate(&path)?
            } else if path.exists() {
                path.clone()
            } else {
                return Err(plugin::install::InstallError::Missing(path).into());
            };
            let installed = plugin::install::install_file(&file, &dest)?;
            println!(
                "{} {} {} {}",
                if installed.replaced {
                    "replaced"
                } else {
                    "installed"
                },
                installed.name,
                installed.version,
                installed.path.display()
            );
            let dirs = plugin::search_dirs(Vec::new());
            if let Ok(found) = plugin::find(&installed.name, &dirs) {
                if !tessera::files::same_file(&found, &installed.path) {
                    eprintln!(
                        "note: {} comes earlier in the search order and is the one loaded \
                         (`tessera plugins list` shows the order)",
                        found.display()
                    );
                }
            }
        }
        PluginsCommand::Remove { name, to } => {
            let dest = plugin::install::destination(to.as_deref())?;
            let others = plugin::search_dirs(Vec::new());
            let removed = plugin::install::remove(&name, &dest, &others)?;
            println!("removed {name} ({})", removed.display());
        }
    }
    Ok(Exit::SUCCESS)
}

/// `tessera plugins list`: every plugin file in search order, the first of each name being the
/// one `tessera train` loads.
fn list_plugins(dirs: Vec<PathBuf>, config: Option<&Path>) -> anyhow::Result<()> {
    let mut configured: Vec<plugin::SearchDir> = dirs
        .into_iter()
        .map(|path| plugin::SearchDir {
            path,
            origin: plugin::Origin::Configured,
        })
        .collect();
    if let Some(file) = config {
        let config = config::load(file, &[])?;
        configured.extend(plugin::configured_dirs(&config.plugins));
    }
    let dirs = plugin::search_dirs(configured);
    println!("searched, in order:");
    for dir in &dirs {
        let state = if dir.path.is_dir() {
            ""
        } else {
            " — no such folder"
        };
        println!("  {dir}{state}");
    }
    let files = plugin::list_files(&dirs);
    if files.is_empty() {
        println!("no plugin files (*.so) there");
    }
    let mut first: std::collections::BTreeMap<String, PathBuf> = Default::default();
    for (file, dir) in files {
        println!();
        match plugin::LoadedPlugin::load(&file, None) {
            Ok(p) => {
                print_plugin(&p);
                println!("  folder:     {dir}");
                match first.get(&p.name) {
                    Some(winner) => println!(
                        "  shadowed:   by {}, found first (that one is loaded)",
                        winner.display()
                    ),
                    None => {
                        first.insert(p.name.clone(), file.clone());
                    }
                }
            }
            Err(e) => println!("{}: skipped: {e}", file.display()),
        }
    }
    Ok(())
}

fn print_plugin(p: &plugin::LoadedPlugin) {
    let events: Vec<String> = p
        .hooks
        .iter()
        .map(|h| {
            if h.priority == 0 {
                h.event.name().to_owned()
            } else {
                format!("{}({:+})", h.event.name(), h.priority)
            }
        })
        .collect();
    println!("{} {}", p.name, p.version);
    println!("  {}", p.description);
    println!("  events:     {}", events.join(", "));
    println!("  path:       {}", p.path.display());
    println!("  sha256:     {}", p.sha256);
    println!(
        "  plugin-api: {}, libtorch {}",
        p.api_version, p.libtorch_version
    );
}
