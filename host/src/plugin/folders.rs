//! `[plugins]` of a trainer.toml: the folders it names for plugin libraries (read by
//! `config`, searched by [`super::configured_dirs`]).

use std::path::PathBuf;

use serde::Serialize;

/// `[plugins]`, and the `plugins/` folder beside the trainer.toml.
#[derive(Debug, Clone, Default)]
pub struct PluginsConfig {
    /// Folders searched for plugin libraries, resolved against the file's folder.
    pub dirs: Vec<PathBuf>,
    /// `plugins/` beside the trainer.toml when that folder exists: searched right after `dirs`.
    pub beside: Option<PathBuf>,
}

impl PluginsConfig {
    /// The folders this configuration names, in order: `dirs`, then `plugins/` beside the
    /// trainer.toml. This is also what a run records as `plugins.dirs`, so a run re-read from
    /// its record (a sweep's run, a resumed run) searches the same folders.
    pub fn folders(&self) -> Vec<PathBuf> {
        let mut folders = self.dirs.clone();
        if let Some(beside) = &self.beside {
            if !folders.contains(beside) {
                folders.push(beside.clone());
            }
        }
        folders
    }
}

impl PartialEq for PluginsConfig {
    fn eq(&self, other: &Self) -> bool {
        self.folders() == other.folders()
    }
}

impl Serialize for PluginsConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("PluginsConfig", 1)?;
        s.serialize_field("dirs", &self.folders())?;
        s.end()
    }
}
