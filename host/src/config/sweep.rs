//! `sweep.toml`: a base `trainer.toml` and axes whose every combination is one run.
//!
//! ```toml
//! base = "trainer.toml"                # required
//! output_dir = "runs/my-sweep"         # (runs/<file stem>) one folder per run inside
//! parallel = 1                         # runs at a time
//! set = ["train.max_duration=2ep"]     # overrides for every run
//!
//! [axes]                               # the first axis varies slowest
//! recipe = ["baseline", "recipes/mild.toml"]
//! seed = [1, 2]
//! scale_schedule_ratio = [0.5, 1.0]
//! "optimizer.lr" = [0.05, 0.1]
//!
//! [recipes.baseline]
//! algorithms = []
//! ```

use std::path::{Path, PathBuf};

use super::error::{ConfigError, ErrorKind, Location};
use super::read_text;
use super::reader::Tbl;
use super::recipe::{checked_name, from_table, load_recipe, Recipe};
use super::tree::{self, fmt_float, Node, SourceMap, Val};

/// A parsed sweep file.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    /// The sweep file, as given.
    pub file: PathBuf,
    /// The `trainer.toml` every run starts from.
    pub base: PathBuf,
    /// The folder holding one folder per run.
    pub output_dir: PathBuf,
    /// Runs at a time.
    pub parallel: usize,
    /// `--set` overrides applied to every run, before the axes' values.
    pub set: Vec<String>,
    /// The axes, in file order (the first varies slowest).
    pub axes: Vec<Axis>,
}

/// One axis of a sweep: a key and its values.
#[derive(Debug, Clone)]
pub struct Axis {
    /// `recipe`, `seed`, `scale_schedule_ratio` or a dotted `trainer.toml` key.
    pub key: String,
    /// The values, in order.
    pub values: Vec<AxisValue>,
}

/// One value of an axis.
#[derive(Debug, Clone)]
pub enum AxisValue {
    /// A recipe: its methods replace the base's.
    Recipe(Recipe),
    /// A setting, applied as `--set` would.
    Set {
        /// The dotted `trainer.toml` key.
        key: String,
        /// The value as TOML text (`0.05`, `"adamw"`).
        literal: String,
        /// Where the value is in the sweep file, for messages.
        location: Location,
    },
}

impl AxisValue {
    /// The value as a short label for run names and tables (`mild`, `0.05`, `adamw`).
    pub fn label(&self) -> String {
        match self {
            AxisValue::Recipe(r) => r.name.clone(),
            AxisValue::Set { literal, .. } => literal.trim_matches('"').to_owned(),
        }
    }

    /// The `--set` override this value stands for (none for a recipe).
    pub fn override_arg(&self) -> Option<String> {
        match self {
            AxisValue::Recipe(_) => None,
            AxisValue::Set { key, literal, .. } => Some(format!("{key}={literal}")),
        }
    }
}

const KEYS: &[&str] = &["base", "output_dir", "parallel", "set", "axes", "recipes"];

/// Axis keys that stand for a longer `trainer.toml` key.
const SHORTHANDS: &[(&str, &str)] = &[("scale_schedule_ratio", "train.scale_schedule_ratio")];

/// Reads and checks a sweep file; relative paths resolve against its folder. Recipe files are
/// read and validated here, so a bad recipe is reported before any run starts.
pub fn load_sweep(path: &Path) -> Result<SweepSpec, ConfigError> {
    let file = path.display().to_string();
    let text = read_text(path, &file)?;
    let map = SourceMap::new(&text);
    let doc = toml_edit::ImDocument::parse(text.as_str())
        .map_err(|e| super::syntax::syntax_error(&e, &map, &file))?;
    let root = tree::from_document(&doc, &map);
    let folder = path.parent().unwrap_or_else(|| Path::new(""));
    let top = Tbl::open(&file, folder, "", &root, Some(KEYS))?;

    let base = top
        .path("base")?
        .ok_or_else(|| top.missing("base", "the trainer.toml every run starts from"))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("sweep");
    let output_dir = top
        .path("output_dir")?
        .unwrap_or_else(|| folder.join("runs").join(stem));
    let parallel = top.uint("parallel", 1)?.unwrap_or(1);
    let set = top.string_list("set")?.unwrap_or_default();
    for (i, arg) in set.iter().enumerate() {
        if !arg.contains('=') {
            return Err(top.err(
                "set",
                ErrorKind::InvalidValue,
                format!("set.{i} = {arg:?} is not KEY=VALUE, such as \"optimizer.lr=0.05\""),
            ));
        }
    }
    let recipes = match top.sub("recipes", None)? {
        Some(t) => inline_recipes(&t, &file)?,
        None => Vec::new(),
    };
    let axes = match top.sub("axes", None)? {
        Some(t) => read_axes(&t, &recipes)?,
        None => Vec::new(),
    };
    Ok(SweepSpec {
        file: path.to_path_buf(),
        base,
        output_dir,
        parallel,
        set,
        axes,
    })
}

/// `[recipes.NAME]` tables, each holding `algorithms`.
fn inline_recipes(t: &Tbl<'_>, file: &str) -> Result<Vec<Recipe>, ConfigError> {
    let mut out = Vec::new();
    for entry in &t.table.entries {
        let name = checked_name(t, &entry.key, entry.key.clone())?;
        let sub = Tbl::open(
            t.file,
            t.base,
            &t.key(&entry.key),
            &entry.node,
            Some(&["algorithms"]),
        )?;
        out.push(from_table(
            &sub,
            name.clone(),
            format!("{file} [recipes.{name}]"),
        )?);
    }
    Ok(out)
}

fn read_axes(t: &Tbl<'_>, recipes: &[Recipe]) -> Result<Vec<Axis>, ConfigError> {
    let mut axes = Vec::new();
    for entry in &t.table.entries {
        let key = entry.key.as_str();
        let Val::Array(items) = &entry.node.val else {
            return Err(t.err(
                key,
                ErrorKind::WrongType,
                format!(
                    "expected an array of values, got {}",
                    entry.node.val.describe()
                ),
            ));
        };
        if items.is_empty() {
            return Err(t.err(
                key,
                ErrorKind::InvalidValue,
                "an axis needs at least one value",
            ));
        }
        let values = items
            .iter()
            .enumerate()
            .map(|(i, node)| axis_value(t, key, i, node, recipes))
            .collect::<Result<Vec<_>, _>>()?;
        let labels: Vec<String> = values.iter().map(AxisValue::label).collect();
        if let Some(i) = (1..labels.len()).find(|&i| labels[..i].contains(&labels[i])) {
            return Err(ConfigError::new(
                t.file,
                items[i].loc.clone(),
                t.key(&format!("{key}.{i}")),
                ErrorKind::InvalidValue,
                format!("{:?} is already a value of this axis", labels[i]),
            ));
        }
        axes.push(Axis {
            key: key.to_owned(),
            values,
        });
    }
    Ok(axes)
}

fn axis_value(
    t: &Tbl<'_>,
    key: &str,
    i: usize,
    node: &Node,
    recipes: &[Recipe],
) -> Result<AxisValue, ConfigError> {
    let err = |kind, msg: String| {
        ConfigError::new(
            t.file,
            node.loc.clone(),
            t.key(&format!("{key}.{i}")),
            kind,
            msg,
        )
    };
    if key == "recipe" {
        let Val::Str(name) = &node.val else {
            return Err(err(
                ErrorKind::WrongType,
                format!(
                    "expected a recipe name ([recipes.NAME]) or a recipe file, got {}",
                    node.val.describe()
                ),
            ));
        };
        if let Some(r) = recipes.iter().find(|r| &r.name == name) {
            return Ok(AxisValue::Recipe(r.clone()));
        }
        if name.ends_with(".toml") {
            return load_recipe(&t.base.join(name)).map(AxisValue::Recipe);
        }
        let known: Vec<&str> = recipes.iter().map(|r| r.name.as_str()).collect();
        return Err(err(
            ErrorKind::InvalidValue,
            format!(
                "no recipe {name:?}: name a [recipes.NAME] table ({}) or a .toml recipe file",
                if known.is_empty() {
                    "none defined".to_owned()
                } else {
                    known.join(", ")
                }
            ),
        ));
    }
    let literal = match &node.val {
        Val::Str(s) => toml_edit::Value::from(s.as_str()).to_string(),
        Val::Int(n) => n.to_string(),
        Val::Float(f) => fmt_float(*f),
        Val::Bool(b) => b.to_string(),
        other => {
            return Err(err(
                ErrorKind::WrongType,
                format!(
                    "an axis value must be a string, number or boolean, got {}",
                    other.describe()
                ),
            ))
        }
    };
    let target = SHORTHANDS
        .iter()
        .find(|(short, _)| *short == key)
        .map_or(key, |(_, long)| *long);
    Ok(AxisValue::Set {
        key: target.to_owned(),
        literal: literal.trim().to_owned(),
        location: node.loc.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `files` in a fresh folder, removed when the returned value is dropped.
    fn write(tag: &str, files: &[(&str, &str)]) -> crate::data::idx::tests::TempDir {
        let dir = crate::data::idx::tests::TempDir::new(&format!("sweep-{tag}"));
        for (name, text) in files {
            std::fs::write(dir.join(name), text).expect("write");
        }
        dir
    }

    #[test]
    fn axes_recipes_and_defaults_are_read() {
        let dir = write(
            "read",
            &[
                (
                    "sweep.toml",
                    r#"
base = "trainer.toml"
set = ["train.max_duration=2ba"]
[axes]
recipe = ["baseline", "mild.toml"]
seed = [1, 2]
scale_schedule_ratio = [0.5]
"optimizer.name" = ["adamw"]
[recipes.baseline]
algorithms = []
"#,
                ),
                ("mild.toml", "[[algorithms]]\nplugin = \"cutout\"\n"),
            ],
        );
        let spec = load_sweep(&dir.join("sweep.toml")).expect("spec");
        assert_eq!(spec.base, dir.join("trainer.toml"));
        assert_eq!(spec.output_dir, dir.join("runs").join("sweep"));
        assert_eq!(spec.parallel, 1);
        let keys: Vec<&str> = spec.axes.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(
            keys,
            ["recipe", "seed", "scale_schedule_ratio", "optimizer.name"]
        );
        let labels: Vec<String> = spec.axes[0].values.iter().map(AxisValue::label).collect();
        assert_eq!(labels, ["baseline", "mild"]);
        assert_eq!(
            spec.axes[2].values[0].override_arg().as_deref(),
            Some("train.scale_schedule_ratio=0.5")
        );
        assert_eq!(
            spec.axes[3].values[0].override_arg().as_deref(),
            Some("optimizer.name=\"adamw\"")
        );
        assert_eq!(spec.axes[3].values[0].label(), "adamw");
    }

    #[test]
    fn mistakes_name_the_key_and_line() {
        for (text, fragment) in [
            ("[axes]\nseed = [1]\n", "base: missing"),
            (
                "base = \"t.toml\"\nparalel = 2\n",
                "sweep.toml:2:1: paralel: unknown key; did you mean `parallel`?",
            ),
            (
                "base = \"t.toml\"\n[axes]\nseed = 1\n",
                "sweep.toml:3:8: axes.seed: expected an array",
            ),
            (
                "base = \"t.toml\"\n[axes]\nseed = []\n",
                "axes.seed: an axis needs at least one value",
            ),
            (
                "base = \"t.toml\"\n[axes]\nseed = [1, 1]\n",
                "sweep.toml:3:12: axes.seed.1: \"1\" is already a value",
            ),
            (
                "base = \"t.toml\"\n[axes]\nrecipe = [\"hot\"]\n",
                "axes.recipe.0: no recipe \"hot\"",
            ),
            (
                "base = \"t.toml\"\n[axes]\nrecipe = [\"gone.toml\"]\n",
                "gone.toml: cannot read",
            ),
            (
                "base = \"t.toml\"\nset = [\"lr\"]\n",
                "set: set.0 = \"lr\" is not KEY=VALUE",
            ),
            (
                "base = \"t.toml\"\n[axes]\nlr = [[1]]\n",
                "axes.lr.0: an axis value must be",
            ),
        ] {
            let dir = write("bad", &[("sweep.toml", text)]);
            let err = load_sweep(&dir.join("sweep.toml"))
                .expect_err(text)
                .to_string();
            assert!(err.contains(fragment), "{err}\n  lacks: {fragment}");
        }
    }
}
