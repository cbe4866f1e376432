//! What a run costs: machine prices by the hour, and the instance presets that name them
//! (`host/data/instances.toml`, overridable with `TESSERA_INSTANCES`).
//!
//! The presets are on-demand list prices copied from the pages their entries name, on the date
//! they were read: prices change, so every entry carries its `source` and `read` date and users
//! override them with their own file.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The built-in presets (see the file's header for where the prices come from).
const BUILTIN: &str = include_str!("../data/instances.toml");

/// The environment variable naming a user's instances file (same format; its entries win).
pub const INSTANCES_ENV: &str = "TESSERA_INSTANCES";

/// A cloud instance (or machine) with its on-demand price.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    /// Who rents it out: `aws`, `gcp`, `lambda`, ...
    pub provider: String,
    /// The provider's name for it: `p4d.24xlarge`.
    pub name: String,
    /// What it computes on: `8x NVIDIA A100 40GB`.
    pub accelerator: String,
    /// On-demand price of the whole instance, USD per hour.
    pub usd_per_hour: f64,
    /// The page the price was copied from.
    pub source: String,
    /// When (and from what copy) the price was read.
    pub read: String,
}

impl Instance {
    /// `provider/name`, as `instance = "..."` and `--instance` spell it.
    pub fn id(&self) -> String {
        format!("{}/{}", self.provider, self.name)
    }
}

/// Why the instance presets could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InstancesError {
    /// The user's file could not be read.
    #[error("cannot read {path} (named by {INSTANCES_ENV}): {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The reason.
        source: std::io::Error,
    },
    /// A file is not a valid instances file.
    #[error("{origin}: {message}")]
    Invalid {
        /// The file (or `built-in presets`).
        origin: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InstancesFile {
    #[serde(default)]
    instance: Vec<Instance>,
}

/// A set of instance presets, sorted by [`Instance::id`].
#[derive(Debug, Clone, Default)]
pub struct Instances {
    list: Vec<Instance>,
}

impl Instances {
    /// The built-in presets only.
    pub fn builtin() -> Result<Instances, InstancesError> {
        Instances::default().merge(BUILTIN, "built-in presets (host/data/instances.toml)")
    }

    /// The built-in presets with the file named by `TESSERA_INSTANCES` (when set) on top.
    pub fn load() -> Result<Instances, InstancesError> {
        let builtin = Instances::builtin()?;
        match std::env::var_os(INSTANCES_ENV).filter(|v| !v.is_empty()) {
            Some(path) => builtin.with_file(Path::new(&path)),
            None => Ok(builtin),
        }
    }

    /// These presets with the entries of the instances file at `path` added; an entry with the
    /// id of an existing one replaces it.
    pub fn with_file(self, path: &Path) -> Result<Instances, InstancesError> {
        let text = std::fs::read_to_string(path).map_err(|source| InstancesError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.merge(&text, &path.display().to_string())
    }

    fn merge(mut self, text: &str, origin: &str) -> Result<Instances, InstancesError> {
        let invalid = |message: String| InstancesError::Invalid {
            origin: origin.to_owned(),
            message,
        };
        let file: InstancesFile = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        for entry in file.instance {
            if !(entry.usd_per_hour.is_finite() && entry.usd_per_hour >= 0.0) {
                return Err(invalid(format!(
                    "{}: usd_per_hour must be a number >= 0, got {}",
                    entry.id(),
                    entry.usd_per_hour
                )));
            }
            let id = entry.id();
            self.list.retain(|i| i.id() != id);
            self.list.push(entry);
        }
        self.list.sort_by_key(Instance::id);
        Ok(self)
    }

    /// The preset called `id` (`provider/name`).
    pub fn get(&self, id: &str) -> Option<&Instance> {
        self.list.iter().find(|i| i.id() == id)
    }

    /// Every preset, sorted by id.
    pub fn iter(&self) -> impl Iterator<Item = &Instance> {
        self.list.iter()
    }

    /// Ids that look like `id`, for an error about an unknown one: same provider or same family
    /// (the name up to its first `.` or `-`), else every id.
    pub fn close_ids(&self, id: &str) -> Vec<String> {
        let (provider, name) = id.split_once('/').unwrap_or(("", id));
        let family = |n: &str| n.split(['.', '-']).next().unwrap_or("").to_lowercase();
        let wanted = family(name);
        let close: Vec<String> = self
            .list
            .iter()
            .filter(|i| {
                i.provider.eq_ignore_ascii_case(provider)
                    || (!wanted.is_empty() && family(&i.name) == wanted)
            })
            .map(Instance::id)
            .collect();
        if close.is_empty() {
            self.list.iter().map(Instance::id).collect()
        } else {
            close
        }
    }

    /// The preset called `id`, or an error message naming the close ids.
    pub fn find(&self, id: &str) -> Result<&Instance, String> {
        self.get(id).ok_or_else(|| {
            format!(
                "unknown instance {id:?}; close names: {} (`tessera explore --list-instances` \
                 lists all; add your own with {INSTANCES_ENV})",
                self.close_ids(id).join(", ")
            )
        })
    }
}

/// The cost in USD of `wall_seconds` on `nodes` machines at `usd_per_hour` each: a price is
/// per instance (node), and a run over several nodes rents every one of them for its whole
/// wall time.
pub fn cost_usd(usd_per_hour: f64, wall_seconds: f64, nodes: usize) -> f64 {
    usd_per_hour * wall_seconds / 3600.0 * nodes.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_presets_parse_and_name_their_sources() {
        let presets = Instances::builtin().expect("the built-in presets parse");
        assert!(presets.iter().count() >= 3);
        for i in presets.iter() {
            assert!(i.usd_per_hour > 0.0, "{i:?}");
            assert!(i.source.starts_with("https://"), "{i:?}");
            assert!(
                i.read.contains(&i.source),
                "the read note names the copy: {i:?}"
            );
        }
        assert!(presets.get("aws/p4d.24xlarge").is_some());
    }

    #[test]
    fn a_user_file_overrides_and_adds() {
        let dir = std::env::temp_dir().join(format!("tessera-instances-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mine.toml");
        std::fs::write(
            &path,
            r#"
[[instance]]
provider = "aws"
name = "p4d.24xlarge"
accelerator = "8x A100"
usd_per_hour = 20.0
source = "our contract"
read = "2026-11-01"

[[instance]]
provider = "onprem"
name = "box"
accelerator = "1x RTX 4090"
usd_per_hour = 0.4
source = "electricity bill"
read = "2026-11-01"
"#,
        )
        .unwrap();
        let presets = Instances::builtin().unwrap().with_file(&path).unwrap();
        assert_eq!(
            presets.find("aws/p4d.24xlarge").map(|i| i.usd_per_hour),
            Ok(20.0)
        );
        assert_eq!(presets.find("onprem/box").map(|i| i.usd_per_hour), Ok(0.4));
        let err = presets.find("aws/p4d.24xlarg").unwrap_err();
        assert!(err.contains("aws/p4d.24xlarge"), "{err}");
        std::fs::write(&path, "[[instance]]\nprovider = \"x\"\n").unwrap();
        let err = Instances::builtin().unwrap().with_file(&path).unwrap_err();
        assert!(err.to_string().contains("mine.toml"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cost_is_price_times_hours_times_nodes() {
        assert!((cost_usd(3.6, 100.0, 1) - 0.1).abs() < 1e-12);
        // Two nodes of 8 GPUs at $32.77/h each, for half an hour: both instances are paid.
        assert!((cost_usd(32.77, 1800.0, 2) - 32.77).abs() < 1e-9);
        assert!((cost_usd(3.6, 100.0, 3) - 0.3).abs() < 1e-12);
        // No run has zero nodes; a zero read from somewhere counts as one.
        assert!((cost_usd(3.6, 100.0, 0) - 0.1).abs() < 1e-12);
    }
}
