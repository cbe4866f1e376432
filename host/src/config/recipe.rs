//! Recipes: a named set of methods (`[[algorithms]]`) that replaces a `trainer.toml`'s own.
//! A recipe is a file (`recipe = "mild"` and `[[algorithms]]` tables, nothing else) or a
//! sweep file's `[recipes.NAME]` table.

use std::path::Path;

use super::error::{ConfigError, ErrorKind, Location};
use super::reader::Tbl;
use super::tree::{self, Entry, Node, SourceMap, Val};
use super::{algorithms, build, read_text, AlgorithmConfig, Config};

/// A named set of methods, validated, ready to replace a configuration's `[[algorithms]]`.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// The recipe's name (the runs' `recipe` label).
    pub name: String,
    /// Where it was read, for messages: a file, or `sweep.toml [recipes.NAME]`.
    pub source: String,
    /// The methods, in order (validated as `[[algorithms]]` entries).
    pub algorithms: Vec<AlgorithmConfig>,
    /// The `algorithms` array as read, spliced into the configurations it is applied to.
    node: Option<Node>,
}

/// The keys a recipe file may hold.
const RECIPE_KEYS: &[&str] = &["recipe", "algorithms"];

/// Reads a recipe file: `recipe = "NAME"` (default: the file stem) and `[[algorithms]]`.
pub fn load_recipe(path: &Path) -> Result<Recipe, ConfigError> {
    let file = path.display().to_string();
    let text = read_text(path, &file)?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("recipe");
    recipe_from_str(&text, &file, stem)
}

/// A recipe from the text of a recipe file; `source` names it in messages, `default_name` is
/// its name when the text has no `recipe` key.
pub fn recipe_from_str(
    text: &str,
    source: &str,
    default_name: &str,
) -> Result<Recipe, ConfigError> {
    let map = SourceMap::new(text);
    let doc = toml_edit::ImDocument::parse(text)
        .map_err(|e| super::syntax::syntax_error(&e, &map, source))?;
    let root = tree::from_document(&doc, &map);
    let base = Path::new(source).parent().unwrap_or_else(|| Path::new(""));
    let top = Tbl::open(source, base, "", &root, Some(RECIPE_KEYS))?;
    let name = match top.string("recipe")? {
        Some(name) => checked_name(&top, "recipe", name)?,
        None => default_name.to_owned(),
    };
    from_table(&top, name, source.to_owned())
}

/// A recipe from a table holding `algorithms` (a recipe file's top level, or a sweep's
/// `[recipes.NAME]`).
pub(super) fn from_table(
    top: &Tbl<'_>,
    name: String,
    source: String,
) -> Result<Recipe, ConfigError> {
    Ok(Recipe {
        name,
        source,
        algorithms: algorithms::read(top)?,
        node: top.entry("algorithms").map(|e| e.node.clone()),
    })
}

/// `name` when it can label runs and name folders (letters, digits, `-`, `_`, `.`, `+`).
pub(super) fn checked_name(top: &Tbl<'_>, key: &str, name: String) -> Result<String, ConfigError> {
    let fine = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'));
    if fine {
        Ok(name)
    } else {
        Err(top.err(
            key,
            ErrorKind::InvalidValue,
            format!("{name:?} is not a recipe name; use letters, digits, '-', '_', '.' or '+'"),
        ))
    }
}

impl Recipe {
    /// The recipe as the text of a recipe file (reads back as the same recipe).
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        let algorithms =
            serde_json::to_value(&self.algorithms).map_err(serde::ser::Error::custom)?;
        let text = super::recorded_toml(&serde_json::json!({ "algorithms": algorithms }))?;
        Ok(format!(
            "recipe = {}\n{text}",
            toml_edit::Value::from(self.name.as_str())
        ))
    }

    /// Replaces `root`'s `recipe` and `[[algorithms]]` with this recipe's.
    fn apply(&self, root: &mut Node) {
        let Val::Table(table) = &mut root.val else {
            return;
        };
        table
            .entries
            .retain(|e| e.key != "algorithms" && e.key != "recipe");
        let loc = Location::Unknown;
        table.entries.insert(
            0,
            Entry {
                key: "recipe".to_owned(),
                key_loc: loc.clone(),
                node: Node {
                    val: Val::Str(self.name.clone()),
                    loc: loc.clone(),
                },
            },
        );
        if let Some(node) = &self.node {
            table.entries.push(Entry {
                key: "algorithms".to_owned(),
                key_loc: loc,
                node: node.clone(),
            });
        }
    }
}

/// [`super::load`] with `recipe` (when given) in place of the file's own `recipe` and
/// `[[algorithms]]`, applied before the overrides.
pub fn load_with_recipe(
    path: &Path,
    overrides: &[String],
    recipe: Option<&Recipe>,
) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let text = read_text(path, &file)?;
    let map = SourceMap::new(&text);
    let doc = toml_edit::ImDocument::parse(text.as_str())
        .map_err(|e| super::syntax::syntax_error(&e, &map, &file))?;
    let mut root = tree::from_document(&doc, &map);
    if let Some(recipe) = recipe {
        recipe.apply(&mut root);
    }
    for arg in overrides {
        tree::apply_override(&mut root, arg, &file)?;
    }
    let base = path.parent().unwrap_or_else(|| Path::new(""));
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("run");
    build(&root, base, &file, stem)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder, removed when the returned value is dropped.
    fn temp(tag: &str) -> crate::data::idx::tests::TempDir {
        crate::data::idx::tests::TempDir::new(&format!("recipe-{tag}"))
    }

    const BASE: &str = r#"
recipe = "old"
[data]
dataset = "synthetic"
[model]
name = "mlp"
[train]
max_duration = "1ba"
[[algorithms]]
plugin = "cutout"
"#;

    #[test]
    fn a_recipe_replaces_the_methods_and_names_the_run() {
        let dir = temp("apply");
        std::fs::write(dir.join("trainer.toml"), BASE).expect("write");
        std::fs::write(
            dir.join("mild.toml"),
            "recipe = \"mild\"\n[[algorithms]]\nplugin = \"label_smoothing\"\nsmoothing = 0.1\n",
        )
        .expect("write");
        let recipe = load_recipe(&dir.join("mild.toml")).expect("recipe");
        assert_eq!(recipe.name, "mild");
        let config = load_with_recipe(
            &dir.join("trainer.toml"),
            &["seed=3".to_owned()],
            Some(&recipe),
        )
        .expect("config");
        assert_eq!(config.recipe.as_deref(), Some("mild"));
        assert_eq!(config.seed, 3);
        let plugins: Vec<&str> = config
            .algorithms
            .iter()
            .map(|a| a.plugin.as_str())
            .collect();
        assert_eq!(plugins, ["label_smoothing"]);
        assert_eq!(config.algorithms[0].settings["smoothing"], 0.1);

        // A recipe without methods is the baseline: the file's methods are gone.
        std::fs::write(dir.join("baseline.toml"), "").expect("write");
        let baseline = load_recipe(&dir.join("baseline.toml")).expect("recipe");
        assert_eq!(baseline.name, "baseline");
        let config =
            load_with_recipe(&dir.join("trainer.toml"), &[], Some(&baseline)).expect("config");
        assert!(config.algorithms.is_empty());
        assert_eq!(config.recipe_label(), "baseline");
    }

    #[test]
    fn a_recipe_written_as_toml_reads_back_the_same() {
        let text = "recipe = \"mild\"\n[[algorithms]]\nplugin = \"ema\"\nhalf_life = \"100ba\"\n\n[[algorithms]]\nplugin = \"label_smoothing\"\nsmoothing = 0.08\n";
        let recipe = recipe_from_str(text, "mild.toml", "x").expect("recipe");
        let written = recipe.to_toml().expect("toml");
        let again = recipe_from_str(&written, "again.toml", "x").expect("reads back");
        assert_eq!(again.name, "mild");
        let strip = |r: &Recipe| -> Vec<(String, serde_json::Value)> {
            r.algorithms
                .iter()
                .map(|a| {
                    (
                        a.plugin.clone(),
                        serde_json::Value::Object(a.settings.clone()),
                    )
                })
                .collect()
        };
        assert_eq!(strip(&again), strip(&recipe), "{written}");
    }

    #[test]
    fn a_bad_recipe_file_is_refused_naming_its_file_key_and_line() {
        let dir = temp("bad");
        for (text, fragment) in [
            (
                "recipe = \"x\"\nmax_duration = \"1ep\"\n",
                "mild.toml:2:1: max_duration: unknown key",
            ),
            (
                "recipe = \"a b\"\n",
                "mild.toml:1:10: recipe: \"a b\" is not a recipe name",
            ),
            (
                "[[algorithms]]\nsmoothing = 0.1\n",
                "mild.toml:1:1: algorithms.0.plugin: missing",
            ),
        ] {
            std::fs::write(dir.join("mild.toml"), text).expect("write");
            let err = load_recipe(&dir.join("mild.toml"))
                .expect_err("refused")
                .to_string();
            assert!(err.contains(fragment), "{err} lacks {fragment}");
        }
    }
}
