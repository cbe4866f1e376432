//! The recipes `tessera recipe search` tries when the user names none: Composer's ResNet
//! recipes (the files of `examples/recipes/`) for the ResNets, the same without the methods
//! that change the image size for the `cnn` (its classifier takes a fixed size), the methods
//! that need no convolutions for an MLP, ALiBi and sequence-length warmup for a GPT-2 — each kept
//! only when every plugin it needs is installed. Beside them, the record-setting methods: Muon
//! (with label smoothing and channels-last) for every convolutional network, the whole
//! Fashion-MNIST speedrun (`examples/recipes/speedrun/speedrun.toml`, patch-whitening included)
//! for `airbench`, and Muon alone and modded-nanogpt's set
//! (`examples/recipes/gpt/speedrun/speedrun.toml`) for a GPT-2.

use crate::config::{self, Config, Recipe};
use crate::model::ModelName;
use crate::plugin;

/// `(file name, text)` of the convolutional image recipes.
const CONV: [(&str, &str); 4] = [
    (
        "baseline.toml",
        include_str!("../../../examples/recipes/baseline.toml"),
    ),
    (
        "mild.toml",
        include_str!("../../../examples/recipes/mild.toml"),
    ),
    (
        "medium.toml",
        include_str!("../../../examples/recipes/medium.toml"),
    ),
    (
        "hot.toml",
        include_str!("../../../examples/recipes/hot.toml"),
    ),
];

/// For a convolutional network whose classifier takes a fixed image size (the `cnn`): the
/// ResNet recipes without the methods that change the image size (progressive resizing,
/// ColOut).
const FIXED_SIZE_CONV: [(&str, &str); 4] = [
    ("baseline.toml", "recipe = \"baseline\"\n"),
    (
        "mild.toml",
        "recipe = \"mild\"\n[[algorithms]]\nplugin = \"blurpool\"\n[[algorithms]]\nplugin = \"channels_last\"\n\
         [[algorithms]]\nplugin = \"ema\"\nhalf_life = \"100ba\"\nupdate_interval = \"20ba\"\n\
         [[algorithms]]\nplugin = \"label_smoothing\"\nsmoothing = 0.08\n",
    ),
    (
        "medium.toml",
        "recipe = \"medium\"\n[[algorithms]]\nplugin = \"blurpool\"\n[[algorithms]]\nplugin = \"channels_last\"\n\
         [[algorithms]]\nplugin = \"ema\"\nhalf_life = \"100ba\"\nupdate_interval = \"20ba\"\n\
         [[algorithms]]\nplugin = \"label_smoothing\"\nsmoothing = 0.1\n\
         [[algorithms]]\nplugin = \"mixup\"\nalpha = 0.2\n\
         [[algorithms]]\nplugin = \"sam\"\nrho = 0.5\ninterval = 10\n",
    ),
    (
        "hot.toml",
        "recipe = \"hot\"\n[[algorithms]]\nplugin = \"blurpool\"\n[[algorithms]]\nplugin = \"channels_last\"\n\
         [[algorithms]]\nplugin = \"ema\"\nhalf_life = \"100ba\"\nupdate_interval = \"20ba\"\n\
         [[algorithms]]\nplugin = \"label_smoothing\"\nsmoothing = 0.13\n\
         [[algorithms]]\nplugin = \"mixup\"\nalpha = 0.25\n\
         [[algorithms]]\nplugin = \"sam\"\nrho = 0.5\ninterval = 5\n\
         [[algorithms]]\nplugin = \"randaugment\"\ndepth = 1\nseverity = 10\n",
    ),
];

/// Muon (Keller Jordan's variant, at the speedrun's settings) on the convolution filters, with
/// label smoothing and channels-last: the speedrun's methods that fit any convolutional network.
const MUON_CONV: (&str, &str) = (
    "muon.toml",
    "recipe = \"muon\"\n[[algorithms]]\nplugin = \"channels_last\"\n\
     [[algorithms]]\nplugin = \"muon\"\nvariant = \"keller\"\nlr = 0.08\nmomentum = 0.85\n\
     [[algorithms]]\nplugin = \"label_smoothing\"\nsmoothing = 0.2\n",
);

/// The Fashion-MNIST speedrun's methods, for `airbench` (patch-whitening needs its first conv).
const AIRBENCH_SPEEDRUN: (&str, &str) = (
    "speedrun.toml",
    include_str!("../../../examples/recipes/speedrun/speedrun.toml"),
);

/// Muon alone on a GPT-2's hidden matrices (modded-nanogpt's settings).
const MUON_GPT: (&str, &str) = (
    "muon.toml",
    "recipe = \"muon\"\n[[algorithms]]\nplugin = \"muon\"\nvariant = \"keller\"\nlr = 0.02\n\
     momentum = 0.95\n",
);

/// modded-nanogpt's optimizer and architecture on the GPT-2 zoo model.
const GPT_SPEEDRUN: (&str, &str) = (
    "speedrun.toml",
    include_str!("../../../examples/recipes/gpt/speedrun/speedrun.toml"),
);

/// Methods that act on the loss, the targets, the optimizer or the weights only.
const DENSE: [(&str, &str); 3] = [
    ("baseline.toml", "recipe = \"baseline\"\n"),
    (
        "mild.toml",
        "recipe = \"mild\"\n[[algorithms]]\nplugin = \"ema\"\nhalf_life = \"100ba\"\nupdate_interval = \"20ba\"\n\
         [[algorithms]]\nplugin = \"label_smoothing\"\nsmoothing = 0.08\n",
    ),
    (
        "medium.toml",
        "recipe = \"medium\"\n[[algorithms]]\nplugin = \"ema\"\nhalf_life = \"100ba\"\nupdate_interval = \"20ba\"\n\
         [[algorithms]]\nplugin = \"label_smoothing\"\nsmoothing = 0.1\n\
         [[algorithms]]\nplugin = \"mixup\"\nalpha = 0.2\n\
         [[algorithms]]\nplugin = \"sam\"\nrho = 0.5\ninterval = 10\n",
    ),
];

/// A built-in recipe left out, and why.
#[derive(Debug, Clone)]
pub struct Skipped {
    /// The recipe's name.
    pub name: String,
    /// Why it is not tried.
    pub why: String,
}

/// The built-in recipes for `config`'s model whose plugins are all installed (in the
/// configuration's plugin folders), and those left out.
pub fn builtin(config: &Config) -> Result<(Vec<Recipe>, Vec<Skipped>), config::ConfigError> {
    let texts: Vec<(String, String)> = match config.model.name {
        // The ViTs' methods are those of dense models (their patch convolution is no
        // convolutional network's): smoothing, mixing, averaging.
        ModelName::Mlp | ModelName::VitTiny | ModelName::VitSmall | ModelName::VitBase => {
            owned(&DENSE)
        }
        ModelName::Gpt2 => language_recipes(config),
        // No built-in BERT recipe yet: its methods (gated_linear_units, alibi, the
        // low-precision layer norms) are listed in docs/models.md for a user's own recipes.
        ModelName::Bert => Vec::new(),
        // No built-in llama recipe yet (issue 37 brings its fine-tuning methods).
        ModelName::Llama => Vec::new(),
        ModelName::Cnn => owned(&[&FIXED_SIZE_CONV[..], &[MUON_CONV]].concat()),
        ModelName::Torchscript => Vec::new(),
        ModelName::Resnet20 | ModelName::Resnet56 | ModelName::Resnet18 | ModelName::Resnet50 => {
            owned(&[&CONV[..], &[MUON_CONV]].concat())
        }
        ModelName::Airbench => owned(&[&CONV[..], &[MUON_CONV, AIRBENCH_SPEEDRUN]].concat()),
    };
    let dirs = plugin::search_dirs(plugin::configured_dirs(&config.plugins));
    let mut recipes = Vec::new();
    let mut skipped = Vec::new();
    for (file, text) in texts {
        let stem = file.trim_end_matches(".toml");
        let recipe = config::recipe_from_str(&text, &format!("built-in recipe {file}"), stem)?;
        let missing: Vec<&str> = recipe
            .algorithms
            .iter()
            .map(|a| a.plugin.as_str())
            .filter(|name| plugin::find(name, &dirs).is_err())
            .collect();
        if missing.is_empty() {
            recipes.push(recipe);
        } else {
            skipped.push(Skipped {
                name: recipe.name.clone(),
                why: format!("plugin(s) not installed: {}", missing.join(", ")),
            });
        }
    }
    Ok((recipes, skipped))
}

fn owned(texts: &[(&str, &str)]) -> Vec<(String, String)> {
    texts
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect()
}

/// ALiBi (sized for the model's context) and sequence-length warmup (to the data's sequence
/// length), alone and together: Composer's GPT-2 speed-ups.
fn language_recipes(config: &Config) -> Vec<(String, String)> {
    let context = config.model.gpt2.as_ref().map_or(1024, |g| g.n_positions);
    let seq_len = config
        .data
        .text
        .as_ref()
        .map_or(context, |t| t.seq_len)
        .max(8);
    let alibi = format!(
        "[[algorithms]]\nplugin = \"alibi\"\nmax_sequence_length = {context}\n\
         train_sequence_length_scaling = 1.0\n"
    );
    let warmup = format!(
        "[[algorithms]]\nplugin = \"seq_length_warmup\"\nduration = 0.3\nmin_seq_length = 8\n\
         max_seq_length = {seq_len}\nstep_size = 8\n"
    );
    vec![
        ("baseline.toml".into(), "recipe = \"baseline\"\n".into()),
        ("alibi.toml".into(), format!("recipe = \"alibi\"\n{alibi}")),
        (
            "seq_length_warmup.toml".into(),
            format!("recipe = \"seq_length_warmup\"\n{warmup}"),
        ),
        (
            "alibi+seq_length_warmup.toml".into(),
            format!("recipe = \"alibi+seq_length_warmup\"\n{alibi}{warmup}"),
        ),
        (MUON_GPT.0.into(), MUON_GPT.1.into()),
        (GPT_SPEEDRUN.0.into(), GPT_SPEEDRUN.1.into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fixed built-in recipe parses, names itself after its file, and uses only plugins
    /// this repository builds (a typo in a plugin's name would silently drop the recipe).
    #[test]
    fn the_built_in_recipes_parse_and_name_plugins_that_exist() {
        let plugins = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins");
        let mut all: Vec<(&str, &str)> = Vec::new();
        all.extend(CONV);
        all.extend(FIXED_SIZE_CONV);
        all.extend(DENSE);
        all.extend([MUON_CONV, AIRBENCH_SPEEDRUN, MUON_GPT, GPT_SPEEDRUN]);
        for (file, text) in all {
            let stem = file.trim_end_matches(".toml");
            let recipe =
                config::recipe_from_str(text, file, stem).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(recipe.name, stem, "{file}");
            for a in &recipe.algorithms {
                assert!(
                    plugins.join(&a.plugin).join("Cargo.toml").is_file(),
                    "{file}: no plugin crate plugins/{}",
                    a.plugin
                );
            }
        }
    }
}
