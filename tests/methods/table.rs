//! The method table: one row per (method, network, settings), and the checks every row makes.
//!
//! A row names the plugin it is about (`method`), the network and run it trains on ([`Net`]),
//! the method's settings for that run (and the plugins it is loaded with), and the settings the
//! plugin refuses, each with the words its error must hold. [`rows!`] turns each row into a
//! module `table::<row>` with the checks listed for it:
//!
//! - `resume`: `killed_and_resumed_run_equals_the_straight_run_bit_for_bit`, an 8-batch run
//!   through the binary, killed (`kill -9`) after its batch-4 checkpoint and resumed, equal bit
//!   for bit to the straight run (`tessera_tests::resume::assert_killed_and_resumed_is_exact`;
//!   a child process is what this tests);
//! - `refused`: `invalid_settings_are_refused_naming_the_setting`, every refused setting in
//!   process: the row's `trainer.toml` read by the host's config parser, the plugin loaded with
//!   the host library and its method created from the entry's settings, as `tessera train`
//!   does, the error naming the plugin, "invalid settings" and the row's words; and
//!   `an_invalid_setting_stops_the_binary_naming_it`, the row's first refused setting through
//!   the real binary (exit code 1, the `error:` line, no panic);
//! - `ranks`: `two_ranks_train_what_one_process_with_twice_the_batch_trains`, the row's run on
//!   2 ranks of batch 64 and on 1 process of batch 128 (3 batches, synchronised batch norm, on
//!   the default device, through the binary: ranks are processes), the same final model and
//!   method state within float rounding;
//! - `ranks_own`: `trains_on_two_ranks_counting_the_global_batch`, for methods that draw per
//!   rank (each rank its own, as in Composer) or act on each rank's share: the 2 ranks train
//!   (the host checks at the end that their models are identical), count the global batch and
//!   evaluate.
//!
//! The export table ([`exports!`]) has a row per exported language-model network (the
//! plugins, in order, on the tiny GPT), and a module `table::<row>` with
//! `the_export_keeps_its_modules_and_the_twins_match_the_rebuilt_run`: the run trained, exported,
//! the file keeping exactly the row's modules, the PyTorch twins computing what the rebuilt run
//! computes, and the method's own assertions on the file (a function in its file).
//! [`every_exported_module_kind_has_an_export_row`] keeps that table complete.
//!
//! What the tables do not hold stays in the method's own file: its runs, refusals that only
//! come at run time (they need the model or the run's length). The goldens are each plugin
//! crate's (`plugins/<name>/tests/golden.rs`: each compares its own Composer functions, the
//! case files read by `tessera_plugin_api::testing::golden`);
//! [`every_golden_case_is_read_by_a_test`] keeps every case of `tests/golden` read.
//! [`every_plugin_has_a_row_or_an_exemption`] keeps the table complete. docs/testing.md ("The
//! method table") says how to add a method.

use gpt_surgery::kinds;
use tessera::plugin::LoadedPlugin;
use tessera_tests::dist::{
    assert_all_succeeded, assert_same_training, assert_same_training_up_to_rounding, train_ranks,
    two_ranks_and_one_process, TOLERANCE,
};
use tessera_tests::plugins::{cdylib_plugins, repository_plugins};
use tessera_tests::resume::assert_killed_and_resumed_is_exact;
use tessera_tests::*;

use crate::lm_export::{export_and_check_twins, Export};

/// The network and run a row trains: 3 batches of the [`TrainerToml`] it gives (8 for the
/// resume check).
#[derive(Clone, Copy, Debug)]
pub enum Net {
    /// [`TrainerToml::new`]: the small CNN (width 8) with SGD on Fashion-MNIST.
    Cnn,
    /// The small CNN on the CPU.
    CnnCpu,
    /// ResNet-20 of width 4 (4, 8 and 16 channels) on the CPU.
    Resnet20,
    /// ResNet-50 of width 4 on the CPU (16 bottleneck blocks).
    Resnet50,
    /// The mlp (64, 32) on the CPU.
    Mlp,
    /// The mlp (64, 32) with two dropouts of 0.5.
    MlpDropout,
    /// The mlp (64, 32) with two layer norms, under `amp_bf16`.
    MlpLayerNormBf16,
    /// The small CNN with two group norms, under `amp_bf16`.
    CnnGroupNormBf16,
    /// [`TrainerToml::tiny_gpt`]: a 2-layer GPT-2 of width 32 on synthetic text.
    TinyGpt,
    /// The tiny GPT with dropout 0.1.
    TinyGptDropout,
    /// The tiny GPT with its own (untied) language-model head.
    TinyGptUntied,
    /// airbench (widths 8, 16, 16), whose first conv can be whitened, on the CPU.
    Airbench,
}

impl Net {
    /// The run `run` on this network, with no algorithms.
    pub fn toml(self, run: &str) -> TrainerToml {
        let with = |model: &str, device: Option<&str>, precision: Option<&str>| {
            let mut toml = TrainerToml::new(run);
            toml.model = model.to_owned();
            toml.device = device.map(str::to_owned);
            toml.precision = precision.map(str::to_owned);
            toml
        };
        match self {
            Net::Cnn => TrainerToml::new(run),
            Net::CnnCpu => with("name = \"cnn\"\nwidth = 8", Some("cpu"), None),
            Net::Resnet20 => with("name = \"resnet20\"\nwidth = 4", Some("cpu"), None),
            Net::Resnet50 => with("name = \"resnet50\"\nwidth = 4", Some("cpu"), None),
            Net::Mlp => with("name = \"mlp\"\nhidden = [64, 32]", Some("cpu"), None),
            Net::MlpDropout => with(
                "name = \"mlp\"\nhidden = [64, 32]\ndropout = 0.5",
                None,
                None,
            ),
            Net::MlpLayerNormBf16 => with(
                "name = \"mlp\"\nhidden = [64, 32]\nnorm = \"layer\"",
                None,
                Some("amp_bf16"),
            ),
            Net::CnnGroupNormBf16 => with(
                "name = \"cnn\"\nwidth = 8\nnorm = \"group\"",
                None,
                Some("amp_bf16"),
            ),
            Net::TinyGpt => TrainerToml::tiny_gpt(run),
            Net::TinyGptDropout => {
                let mut toml = TrainerToml::tiny_gpt(run);
                toml.model.push_str("\ndropout = 0.1");
                toml
            }
            Net::TinyGptUntied => {
                let mut toml = TrainerToml::tiny_gpt(run);
                toml.model.push_str("\ntie_embeddings = false");
                toml
            }
            Net::Airbench => with(
                "name = \"airbench\"\nwidths = [8, 16, 16]",
                Some("cpu"),
                None,
            ),
        }
    }
}

/// One (method, network, settings) of the table.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// The plugin the row is about.
    pub method: &'static str,
    /// What it trains.
    pub net: Net,
    /// The method's settings in the resumed run.
    pub settings: &'static str,
    /// Plugins loaded before it, with their settings.
    pub with: &'static [(&'static str, &'static str)],
    /// A `[scheduler]` section's lines for the run (none when empty).
    pub scheduler: &'static str,
    /// Settings the plugin refuses when its method is created, each with the words its error
    /// names (besides the plugin and "invalid settings"); the first also through the binary.
    pub refused: &'static [(&'static str, &'static [&'static str])],
    /// The samples the 2-rank run (`ranks_own`) trained on, when the method drops some.
    pub trained_on_two_ranks: Option<u64>,
}

impl Row {
    /// A row of `method` on `net` with `settings`; nothing else loaded, nothing refused.
    pub const fn new(method: &'static str, net: Net, settings: &'static str) -> Row {
        Row {
            method,
            net,
            settings,
            with: &[],
            scheduler: "",
            refused: &[],
            trained_on_two_ranks: None,
        }
    }

    /// The row's run `run` of `batches` batches with the method's `settings`.
    pub fn toml(&self, run: &str, settings: &str, batches: u32) -> TrainerToml {
        let mut toml = self.net.toml(run);
        toml.max_duration = format!("{batches}ba");
        if !self.scheduler.is_empty() {
            toml.optimizer
                .push_str(&format!("\n\n[scheduler]\n{}\n", self.scheduler));
        }
        for (plugin, s) in self.with {
            toml = toml.algorithm(plugin, s);
        }
        toml.algorithm(self.method, settings)
    }
}

/// Trains the row's run for 8 batches straight, then killed after its batch-4 checkpoint and
/// resumed: the same checkpoints, bit for bit, and the same metrics.
pub fn resume(name: &str, row: &Row) {
    assert_killed_and_resumed_is_exact(&format!("{name}-resume"), |run| {
        row.toml(run, row.settings, 8)
    });
}

/// The error of creating the row's method from `settings`, as `tessera train` creates it:
/// the row's `trainer.toml` read by the host's parser, the plugin file loaded with the host
/// library, the method made from the entry's settings (`AlgorithmConfig::settings_json`).
fn create_error(plugin: &LoadedPlugin, row: &Row, settings: &str) -> String {
    let text = row.toml("bad", settings, 3).render();
    let config = tessera::config::from_str(&text, &target_dir(), "trainer.toml")
        .unwrap_or_else(|e| panic!("{settings:?}: the row's trainer.toml: {e}"));
    let entry = config
        .algorithms
        .iter()
        .find(|a| a.plugin == row.method)
        .expect("the row's entry");
    match plugin.create(&entry.settings_json()) {
        Ok(_) => panic!(
            "plugin `{}` accepted {settings:?}: a refusal that comes only at run time belongs \
             in the method's own file",
            row.method
        ),
        Err(e) => e.to_string(),
    }
}

/// Every refused setting of the row, in process: the error names the plugin, says "invalid
/// settings" and holds the row's words.
pub fn refused(row: &Row) {
    assert!(
        !row.refused.is_empty(),
        "{}: no refused settings",
        row.method
    );
    let plugin = LoadedPlugin::load(&plugin_path(row.method), None)
        .unwrap_or_else(|e| panic!("{}: {e}", row.method));
    let named = format!("plugin `{}`", row.method);
    for (settings, words) in row.refused {
        let error = create_error(&plugin, row, settings);
        for word in [named.as_str(), "invalid settings"].iter().chain(*words) {
            assert!(
                error.contains(word),
                "{settings:?}: the error lacks {word:?}: {error}"
            );
        }
    }
}

/// The row's first refused setting through the real binary: exit code 1, an `error:` line
/// naming the plugin, "invalid settings" and the words, no panic.
pub fn refused_by_the_binary(name: &str, row: &Row) {
    let (settings, words) = row.refused.first().expect("a refused setting");
    let dir = TempDir::new(&format!("{name}-bad"));
    row.toml("bad", settings, 3).write_to(&dir);
    let named = format!("plugin `{}`", row.method);
    let mut all = vec![named.as_str(), "invalid settings"];
    all.extend_from_slice(words);
    train(&dir, &[], &[]).assert_failure(&all);
}

/// The row's 3-batch run for the 2-rank checks, on the default device (the ranks run on
/// c10d's Gloo backend).
fn ranks_toml(row: &Row) -> TrainerToml {
    let mut toml = row.toml(&format!("dp-{}", row.method), row.settings, 3);
    toml.device = None;
    toml
}

/// The row's run on 2 ranks of batch 64 (run `ranks`) and on 1 process of batch 128 (run
/// `one`), with synchronised batch norm: the same final model and method state within float
/// rounding (1e-6 on the mlp; on a network with normalisations, twice what changing one
/// process's thread count moves it, and at least 2e-5).
pub fn ranks(name: &str, row: &Row) {
    let dir = two_ranks_and_one_process(
        &format!("{name}-ranks"),
        &ranks_toml(row),
        "[distributed]\nsync_batchnorm = true\n",
        64,
    );
    if matches!(row.net, Net::Mlp) {
        assert_same_training(&dir, row.method, TOLERANCE);
    } else {
        assert_same_training_up_to_rounding(&dir, 64, row.method);
    }
}

/// The row's run on 2 ranks: every rank succeeds (the host compares the ranks' models at the
/// end of the run), the run record counts 3 batches of the global batch of 128 and an
/// evaluation, and the trained samples are [`Row::trained_on_two_ranks`] when given.
pub fn ranks_own(name: &str, row: &Row) {
    let dir = TempDir::new(&format!("{name}-ranks"));
    ranks_toml(row).write_to(&dir);
    let outputs = train_ranks(&dir, 2, &["run_name=ranks"]);
    assert_all_succeeded(&outputs);
    let record = read_json(&run_dir(&dir, "ranks").join("run.json"));
    assert_eq!(record["batches"], 3, "{record:#}");
    assert_eq!(record["samples"], 3 * 128, "{record:#}");
    assert!(
        record["evals"][0]["cross_entropy"]
            .as_f64()
            .is_some_and(f64::is_finite),
        "{record:#}"
    );
    if let Some(trained) = row.trained_on_two_ranks {
        assert_eq!(record["trained_samples"], trained, "{record:#}");
    }
}

/// A module per row (`table::<row>`) with a test for each check listed: `resume` (the kill -9
/// resume through the binary), `refused` (every refused setting in process, the first through
/// the binary), `ranks` and `ranks_own` (2 ranks through the binary).
macro_rules! rows {
    ($($name:ident: $row:expr => [$($check:ident),+];)+) => {
        /// Every row, by its module's name, with its checks.
        pub const ROWS: &[(&str, Row, &[&str])] =
            &[$((stringify!($name), $row, &[$(stringify!($check)),+])),+];
        $(
            mod $name {
                #[allow(unused_imports)]
                use super::*;
                $(rows!(@check $check, $name, $row);)+
            }
        )+
    };
    (@check resume, $name:ident, $row:expr) => {
        #[test]
        fn killed_and_resumed_run_equals_the_straight_run_bit_for_bit() {
            super::resume(stringify!($name), &$row);
        }
    };
    (@check refused, $name:ident, $row:expr) => {
        #[test]
        fn invalid_settings_are_refused_naming_the_setting() {
            super::refused(&$row);
        }

        #[test]
        fn an_invalid_setting_stops_the_binary_naming_it() {
            super::refused_by_the_binary(stringify!($name), &$row);
        }
    };
    (@check ranks, $name:ident, $row:expr) => {
        #[test]
        fn two_ranks_train_what_one_process_with_twice_the_batch_trains() {
            super::ranks(stringify!($name), &$row);
        }
    };
    (@check ranks_own, $name:ident, $row:expr) => {
        #[test]
        fn trains_on_two_ranks_counting_the_global_batch() {
            super::ranks_own(stringify!($name), &$row);
        }
    };
}

const SEVERITY: (&str, &[&str]) = ("severity = 11", &["`severity` must be in [0, 10]"]);
const AUGMENTATION_SET: (&str, &[&str]) = (
    "augmentation_set = \"most\"",
    &["`augmentation_set` must be \"all\", \"safe\" or \"original\""],
);

rows! {
    alibi: Row {
        refused: &[
            ("", &["max_sequence_length", "required"]),
            ("max_sequence_length = 0", &["max_sequence_length", "positive integer"]),
            (
                "max_sequence_length = 64\ntrain_sequence_length_scaling = -0.5",
                &["train_sequence_length_scaling", "-0.5"],
            ),
            ("max_sequence_length = 64\nmax_seq_len = 3", &["max_seq_len"]),
        ],
        ..Row::new("alibi", Net::TinyGptDropout, "max_sequence_length = 64")
    } => [resume, refused];
    alternating_flip: Row::new("alternating_flip", Net::Cnn, "") => [resume, ranks];
    augmix: Row {
        refused: &[
            SEVERITY,
            ("width = 0", &["`width` must be at least 1"]),
            ("alpha = -1.0", &["`alpha` must be a positive number"]),
            ("depth = 1.5", &["depth"]),
            AUGMENTATION_SET,
            ("sevrity = 3", &["`sevrity`"]),
        ],
        ..Row::new("augmix", Net::Cnn, "width = 2")
    } => [resume, refused];
    blurpool: Row {
        refused: &[
            ("min_channels = -3", &["min_channels"]),
            ("blur_frist = false", &["blur_frist"]),
        ],
        ..Row::new("blurpool", Net::Cnn, "")
    } => [refused, ranks];
    channels_last: Row {
        refused: &[("memory_format = \"nhwc\"", &["memory_format"])],
        ..Row::new("channels_last", Net::Resnet20, "")
    } => [resume, refused];
    colout: Row {
        refused: &[
            ("p_row = 1.0", &["`p_row` must be in [0, 1)"]),
            ("p_col = -0.5", &["`p_col` must be in [0, 1)"]),
            (
                "batch = false\nresize_target = true",
                &["`resize_target = true` needs `batch = true`"],
            ),
            ("resize_target = \"yes\"", &["`resize_target` must be"]),
            ("p_rows = 0.2", &["`p_rows`"]),
        ],
        ..Row::new("colout", Net::Resnet20, "p_row = 0.2\np_col = 0.1")
    } => [resume, refused];
    cutmix: Row {
        refused: &[
            ("alpha = -1.0", &["`alpha` must be a finite number >= 0"]),
            ("uniform_sampling = 1", &["uniform_sampling"]),
            ("lenght = 0.5", &["lenght"]),
        ],
        ..Row::new("cutmix", Net::CnnCpu, "alpha = 0.5")
    } => [refused];
    early_stopping: Row {
        refused: &[("monitor = \"accuracy\"\npatience = \"3sp\"", &["`patience`"])],
        ..Row::new("early_stopping", Net::Cnn, "")
    } => [refused];
    ema: Row {
        refused: &[
            (
                "half_life = \"2xx\"",
                &["setting `half_life`: invalid time \"2xx\": it does not end in a known unit"],
            ),
            (
                "half_life = \"2ba\"\nsmoothing = 0.9",
                &["give either `half_life` or `smoothing`"],
            ),
            ("half_life = \"2ba\"\nupdate_interval = \"1ep\"", &["same unit"]),
        ],
        ..Row::new("ema", Net::Cnn, "half_life = \"2ba\"")
    } => [refused];
    factorize: Row {
        refused: &[
            ("latent_channels = 0", &["latent_channels"]),
            ("min_features = -4", &["min_features"]),
            ("factorize_conv = false", &["factorize_conv"]),
        ],
        ..Row::new("factorize", Net::Resnet20, "min_channels = 8\nlatent_channels = 0.25")
    } => [resume, refused];
    gated_linear_units: Row {
        refused: &[
            ("act_fn = \"nope\"", &["act_fn", "nope", "gelu_new"]),
            ("gated_layer_bias = 3", &["gated_layer_bias"]),
            ("non_gated_layer_bias = \"yes\"", &["non_gated_layer_bias"]),
            ("gated_bias = true", &["gated_bias"]),
        ],
        ..Row::new("gated_linear_units", Net::TinyGptDropout, "gated_layer_bias = true")
    } => [resume, refused];
    ghost_batchnorm: Row::new("ghost_batchnorm", Net::Resnet20, "ghost_batch_size = 16")
        => [resume];
    gradient_clipping: Row::new(
        "gradient_clipping",
        Net::Cnn,
        "clipping_type = \"adaptive\"\nclipping_threshold = 0.01",
    ) => [resume];
    gyro_dropout: Row {
        refused: &[("p = 1.5", &["`p` must be in [0, 1)"])],
        ..Row::new("gyro_dropout", Net::MlpDropout, "sigma = 4\ntau = 2")
    } => [resume, refused];
    layer_freezing: Row {
        refused: &[("freeze_level = 1.5", &["freeze_level"])],
        ..Row::new("layer_freezing", Net::Cnn, "")
    } => [refused];
    logit_softcap: Row {
        refused: &[
            ("cap = 0.0", &["cap", "positive"]),
            ("cap = -15", &["cap", "-15"]),
            ("cap = \"thirty\"", &["cap"]),
            ("softcap = 30", &["softcap"]),
        ],
        ..Row::new("logit_softcap", Net::TinyGpt, "")
    } => [refused];
    lookahead: Row {
        refused: &[
            ("k = 0", &["setting `k`"]),
            ("alpha = 2.0", &["setting `alpha` must be in (0, 1]"]),
            (
                "variant = \"ema\"\nalpha = 0.5",
                &["setting `alpha` applies only to variant = \"lookahead\""],
            ),
            ("variant = \"slow\"", &["setting `variant`"]),
        ],
        ..Row::new("lookahead", Net::Mlp, "k = 3\nalpha = 0.5")
    } => [resume, refused];
    lookahead_ema: Row::new("lookahead", Net::Mlp, "variant = \"ema\"\nk = 3") => [resume];
    low_precision_layernorm: Row::new("low_precision_layernorm", Net::MlpLayerNormBf16, "")
        => [resume];
    low_precision_groupnorm: Row::new("low_precision_groupnorm", Net::CnnGroupNormBf16, "")
        => [resume];
    mixup: Row {
        refused: &[
            ("alpha = -0.5", &["`alpha` must be a finite number >= 0"]),
            ("interpolate_loss = \"yes\"", &["interpolate_loss"]),
            ("alhpa = 0.2", &["alhpa"]),
        ],
        ..Row::new("mixup", Net::CnnCpu, "alpha = 0.4")
    } => [refused];
    // modded-nanogpt's five architecture changes together, in an order that is not the one
    // they run in at `init`.
    modded_nanogpt: Row {
        with: &[
            ("zero_init_projections", ""),
            ("logit_softcap", "cap = 15.0"),
            ("qk_norm", ""),
            ("relu_squared", ""),
        ],
        ..Row::new("rotary", Net::TinyGptDropout, "")
    } => [resume];
    muon: Row {
        refused: &[
            ("variant = \"adam\"", &["variant", "adam"]),
            ("variant = \"keller\"\nadjust_lr = \"original\"", &["adjust_lr"]),
            ("momentum = 1.5", &["momentum"]),
        ],
        ..Row::new("muon", Net::CnnCpu, "lr = 0.02\nweight_decay = 0.01")
    } => [resume, refused];
    progressive_resizing: Row {
        refused: &[
            ("mode = \"bilinear\"", &["`mode` must be \"resize\" or \"crop\""]),
            ("initial_scale = 0.0", &["`initial_scale` must be in (0, 1]"]),
            ("delay_fraction = 0.9\nfinetune_fraction = 0.1", &["must be below 1"]),
            ("size_increment = 0", &["`size_increment` must be a positive"]),
            ("resize_target = true", &["`resize_target`"]),
        ],
        // Crop mode draws from the host's RNG and the schedule reads the restored clock.
        ..Row::new("progressive_resizing", Net::Resnet20, "mode = \"crop\"\ndelay_fraction = 0.25")
    } => [resume, refused];
    qk_norm: Row {
        refused: &[("eps = 1e-6", &["eps"])],
        ..Row::new("qk_norm", Net::TinyGpt, "")
    } => [refused];
    randaugment: Row {
        refused: &[
            SEVERITY,
            ("depth = -1", &["depth"]),
            AUGMENTATION_SET,
            ("sevrity = 3", &["`sevrity`"]),
        ],
        ..Row::new("randaugment", Net::Cnn, "depth = 3")
    } => [resume, refused];
    relu_squared: Row {
        refused: &[("power = 3", &["power"])],
        ..Row::new("relu_squared", Net::TinyGpt, "")
    } => [refused];
    rotary: Row {
        refused: &[
            ("base = 0.0", &["base", "positive"]),
            ("base = \"big\"", &["base"]),
            ("fraction = 0.0", &["fraction", "(0, 1]"]),
            ("fraction = 1.5", &["fraction", "1.5"]),
            ("max_sequence_length = 0", &["max_sequence_length", "positive"]),
            ("theta = 3", &["theta"]),
        ],
        ..Row::new("rotary", Net::TinyGpt, "")
    } => [refused];
    sam: Row {
        refused: &[("interval = 0", &["interval"])],
        ..Row::new("sam", Net::Cnn, "")
    } => [refused];
    seq_length_warmup: Row {
        refused: &[
            ("duration = 1.5", &["duration", "1.5"]),
            (
                "min_seq_length = 16\nmax_seq_length = 8",
                &["max_seq_length", "min_seq_length"],
            ),
            ("step_size = 0", &["step_size"]),
            ("truncate = 1", &["truncate"]),
            ("max_len = 32", &["max_len"]),
        ],
        ..Row::new(
            "seq_length_warmup",
            Net::TinyGptDropout,
            "duration = 1.0\nmin_seq_length = 8\nmax_seq_length = 32\nstep_size = 8",
        )
    } => [resume, refused];
    squeeze_excite: Row::new(
        "squeeze_excite",
        Net::Resnet20,
        "latent_channels = 0.5\nmin_channels = 8",
    ) => [resume];
    stochastic_depth: Row::new(
        "stochastic_depth",
        Net::Resnet50,
        "drop_rate = 0.5\ndrop_warmup = 0.5",
    ) => [resume];
    // The kill comes after the batch-4 checkpoint: SWALR has stepped 3 of its 6 annealing
    // steps (updates at 2, 3, 4), and the next ones back-solve from the held rate in the
    // method's state (a resumed run that lost it anneals from the optimizer's rate instead).
    swa: Row {
        refused: &[
            ("swa_start = \"10ba\"", &["setting `swa_start`"]),
            ("anneal_steps = 0", &["setting `anneal_steps`"]),
            (
                "swa_lr_mode = \"hold\"\nschedule_swa_lr = true",
                &["setting `swa_lr` is required"],
            ),
        ],
        ..Row::new(
            "swa",
            Net::CnnCpu,
            "swa_start = \"0.25dur\"\nswa_end = \"0.75dur\"\nupdate_interval = \"1ba\"\n\
             schedule_swa_lr = true\nanneal_steps = 6\nswa_lr = 0.01\nswa_lr_mode = \"hold\"",
        )
    } => [resume, refused];
    // The batch-4 checkpoint holds the one-step rate SWALR set at that update (the optimizer's
    // pending scale) under a decaying schedule; annealing runs over updates 2 and 4.
    swa_composer: Row {
        scheduler: "name = \"linear\"\nalpha_i = 1.0\nalpha_f = 0.2",
        ..Row::new(
            "swa",
            Net::CnnCpu,
            "swa_start = \"0.25dur\"\nswa_end = \"0.75dur\"\nupdate_interval = \"2ba\"\n\
             schedule_swa_lr = true\nanneal_steps = 3",
        )
    } => [resume];
    // Level 2 in selective mode: the run record's evaluations and the logged fraction must
    // match.
    test_time_augmentation: Row::new(
        "test_time_augmentation",
        Net::Cnn,
        "level = 2\nconfidence = 0.9",
    ) => [resume];
    weight_standardization: Row {
        refused: &[
            ("n_last_layers_ignore = -2", &["n_last_layers_ignore"]),
            ("n_last_layer_ignore = 2", &["n_last_layer_ignore"]),
        ],
        ..Row::new("weight_standardization", Net::Resnet20, "")
    } => [resume, refused];
    zero_init_projections: Row {
        refused: &[
            ("attention = 1", &["attention"]),
            ("embeddings = true", &["embeddings"]),
        ],
        ..Row::new("zero_init_projections", Net::TinyGpt, "")
    } => [refused];

    // The 2-rank runs of the vision methods (the language methods are checked together in
    // tests/distributed/distributed.rs). Methods that act on the data, the loss, the gradients
    // or the optimizer train the mlp, where 2 ranks and 1 process agree to 1e-8 (no batch norm
    // or convolution to amplify rounding); the settings are those that make each act on a
    // 3-batch run (`tessera_tests::plugins::plugin_settings`).
    augmix_ranks: Row::new("augmix", Net::Mlp, "") => [ranks];
    batchnorm_tricks_ranks: Row::new("batchnorm_tricks", Net::Cnn, "") => [ranks];
    channels_last_ranks: Row::new("channels_last", Net::Cnn, "") => [ranks];
    dirac_init_ranks: Row::new("dirac_init", Net::Cnn, "") => [ranks];
    early_stopping_ranks: Row::new("early_stopping", Net::Mlp, "") => [ranks];
    ema_ranks: Row::new("ema", Net::Mlp, "half_life = \"2ba\"") => [ranks];
    factorize_ranks: Row::new("factorize", Net::Cnn, "") => [ranks];
    gradient_clipping_ranks: Row::new(
        "gradient_clipping",
        Net::Mlp,
        "clipping_type = \"norm\"\nclipping_threshold = 1.0",
    ) => [ranks];
    label_smoothing_ranks: Row::new("label_smoothing", Net::Mlp, "") => [ranks];
    layer_freezing_ranks: Row::new("layer_freezing", Net::Mlp, "") => [ranks];
    // Syncs at batch 2; the slow weights go into the model at batch 3 (the end).
    lookahead_ranks: Row::new("lookahead", Net::Mlp, "k = 2") => [ranks];
    low_precision_groupnorm_ranks: Row::new("low_precision_groupnorm", Net::Cnn, "") => [ranks];
    low_precision_layernorm_ranks: Row::new("low_precision_layernorm", Net::Cnn, "") => [ranks];
    muon_ranks: Row::new("muon", Net::Cnn, "") => [ranks];
    // Methods that change the image size need a network that pools globally.
    progressive_resizing_ranks: Row::new("progressive_resizing", Net::Resnet20, "") => [ranks];
    // Per-sample transforms are keyed by the sample's position in the epoch, so they are the
    // same whichever rank draws them.
    randaugment_ranks: Row::new("randaugment", Net::Mlp, "") => [ranks];
    sam_ranks: Row::new("sam", Net::Mlp, "") => [ranks];
    squeeze_excite_ranks: Row::new("squeeze_excite", Net::Cnn, "") => [ranks];
    // Updates at batches 1, 2 and 3; the average replaces the model at batch 3.
    swa_ranks: Row::new(
        "swa",
        Net::Mlp,
        "swa_start = \"0.3dur\"\nswa_end = \"0.9dur\"\nupdate_interval = \"1ba\"",
    ) => [ranks];
    test_time_augmentation_ranks: Row::new("test_time_augmentation", Net::Cnn, "") => [ranks];
    weight_standardization_ranks: Row::new(
        "weight_standardization",
        Net::Cnn,
        "n_last_layers_ignore = 10",
    ) => [ranks];
    colout_ranks: Row::new("colout", Net::Resnet20, "") => [ranks_own];
    cutmix_ranks: Row::new("cutmix", Net::Cnn, "") => [ranks_own];
    cutout_ranks: Row::new("cutout", Net::Cnn, "") => [ranks_own];
    // Each rank splits its own share into ghost batches.
    ghost_batchnorm_ranks: Row::new("ghost_batchnorm", Net::Cnn, "ghost_batch_size = 16")
        => [ranks_own];
    gyro_dropout_ranks: Row::new("gyro_dropout", Net::Cnn, "") => [ranks_own];
    mixup_ranks: Row::new("mixup", Net::Cnn, "") => [ranks_own];
    // Each rank whitens from its own share of the sample; rank 0's filters go to all.
    patch_whitening_ranks: Row::new("patch_whitening", Net::Airbench, "") => [ranks_own];
    // Each rank keeps half of its own 64 samples: the run trained on 2 x 32 per step.
    selective_backprop_ranks: Row {
        trained_on_two_ranks: Some(3 * 64),
        ..Row::new("selective_backprop", Net::Cnn, "start = 0.0\nend = 1.0\ninterrupt = 0")
    } => [ranks_own];
    stochastic_depth_ranks: Row::new("stochastic_depth", Net::Cnn, "") => [ranks_own];
}

/// Plugins of the repository with no row, each with why and the file that covers it.
const EXEMPT: &[(&str, &str)] = &[(
    "lora",
    "a fine-tuning method of the language models: tests/models/lora.rs",
)];

#[test]
fn every_plugin_has_a_row_or_an_exemption() {
    let plugins = cdylib_plugins();
    let rowed = |p: &str| ROWS.iter().any(|(_, row, _)| row.method == p);
    let missing: Vec<&String> = plugins
        .iter()
        .filter(|p| !rowed(p) && !EXEMPT.iter().any(|(e, _)| e == p))
        .collect();
    assert!(
        missing.is_empty(),
        "plugins with no row in tests/methods/table.rs and no exemption: {missing:?}"
    );
    for (exempt, why) in EXEMPT {
        assert!(
            plugins.contains(&(*exempt).to_owned()),
            "`{exempt}` is exempt but is no plugin of the repository"
        );
        assert!(!rowed(exempt), "`{exempt}` has a row and an exemption");
        assert!(
            why.contains("tests/"),
            "`{exempt}`: name the file that covers it"
        );
    }
}

#[test]
fn every_vision_plugin_has_a_two_rank_row() {
    let on_two_ranks = |p: &str| {
        ROWS.iter().any(|(_, row, checks)| {
            row.method == p && checks.iter().any(|c| ["ranks", "ranks_own"].contains(c))
        })
    };
    let missing: Vec<String> = repository_plugins()
        .into_iter()
        .filter(|p| !on_two_ranks(p))
        .collect();
    assert!(
        missing.is_empty(),
        "plugins with no `ranks` or `ranks_own` row in tests/methods/table.rs: {missing:?}"
    );
}

// ---- exports -------------------------------------------------------------------------------

/// One export of a language-model method's network: the run (6 batches of the [`Net`] with the
/// plugins, in order), the modules its export keeps, the tokens the twins are compared on, and
/// the method's own assertions on the file (a function in the method's file).
#[derive(Clone, Copy)]
pub struct ExportRow {
    /// What it trains.
    pub net: Net,
    /// The plugins, in `trainer.toml` order, with their settings.
    pub plugins: &'static [(&'static str, &'static str)],
    /// The `[optimizer]` section's lines, when not the network's.
    pub optimizer: Option<&'static str>,
    /// The modules the export keeps: `(path, kind)`, in order.
    pub kept: &'static [(&'static str, &'static str)],
    /// The length of the token sequence the twins compute on.
    pub tokens: i64,
    /// The case, in messages.
    pub label: &'static str,
    /// What the export must hold besides.
    pub check: fn(&Export),
}

/// Trains the row's run, exports it and checks the file (`export_and_check_twins`: exactly the
/// modules kept; on the tokens, what the rebuilt run computes, through Hugging Face's class,
/// and so does the plain-PyTorch twin), then the method's own assertions.
pub fn export(name: &str, row: &ExportRow) {
    let dir = TempDir::new(&format!("{name}-export"));
    let mut toml = row.net.toml("exported");
    toml.max_duration = "6ba".to_owned();
    if let Some(optimizer) = row.optimizer {
        toml.optimizer = optimizer.to_owned();
    }
    for (plugin, settings) in row.plugins {
        toml = toml.algorithm(plugin, settings);
    }
    let export = export_and_check_twins(&dir, &toml, row.kept, row.tokens, row.label);
    (row.check)(&export);
}

/// Nothing besides the modules and the twins.
fn nothing_more(_: &Export) {}

/// A module per export row (`table::<row>`) with its test.
macro_rules! exports {
    ($($name:ident: $row:expr;)+) => {
        /// Every export row, by its module's name.
        pub const EXPORTS: &[(&str, ExportRow)] = &[$((stringify!($name), $row)),+];
        $(
            mod $name {
                use super::*;

                #[test]
                fn the_export_keeps_its_modules_and_the_twins_match_the_rebuilt_run() {
                    super::export(stringify!($name), &$row);
                }
            }
        )+
    };
}

const ATTENTION_EXT: &[(&str, &str)] = &[
    ("transformer.h.0.attn", kinds::EXT_ATTENTION),
    ("transformer.h.1.attn", kinds::EXT_ATTENTION),
];

exports! {
    alibi_export: ExportRow {
        net: Net::TinyGptDropout,
        plugins: &[("alibi", "max_sequence_length = 96")],
        optimizer: None,
        kept: &[
            ("transformer.h.0.attn", kinds::ALIBI_ATTENTION),
            ("transformer.h.1.attn", kinds::ALIBI_ATTENTION),
        ],
        // Beyond n_positions (64), within max_sequence_length.
        tokens: 80,
        label: "gpt2 with alibi",
        check: crate::alibi::exported,
    };
    gated_linear_units_export: ExportRow {
        net: Net::TinyGptDropout,
        plugins: &[(
            "gated_linear_units",
            "act_fn = \"silu\"\nnon_gated_layer_bias = true",
        )],
        optimizer: None,
        kept: &[
            ("transformer.h.0.mlp", kinds::GLU_MLP),
            ("transformer.h.1.mlp", kinds::GLU_MLP),
        ],
        tokens: 24,
        label: "gpt2 with gated linear units",
        check: crate::gated_linear_units::exported,
    };
    logit_softcap_export_tied: ExportRow {
        net: Net::TinyGpt,
        plugins: &[("logit_softcap", "cap = 2.0")],
        optimizer: None,
        kept: &[("lm_head", kinds::SOFTCAP_LM_HEAD)],
        tokens: 24,
        label: "gpt2 with logit_softcap (tied)",
        check: crate::logit_softcap::exported_tied,
    };
    logit_softcap_export_untied: ExportRow {
        net: Net::TinyGptUntied,
        plugins: &[("logit_softcap", "cap = 2.0")],
        optimizer: None,
        kept: &[("lm_head", kinds::SOFTCAP_LM_HEAD)],
        tokens: 24,
        label: "gpt2 with logit_softcap (untied)",
        check: crate::logit_softcap::exported_untied,
    };
    // A small cap and a larger learning rate: from the zero projections, 6 steps at 3e-3 leave
    // logits too small for the cap (or the blocks) to move them much; these make every
    // difference of a twin show.
    modded_nanogpt_export: ExportRow {
        net: Net::TinyGptDropout,
        plugins: &[
            ("zero_init_projections", ""),
            ("logit_softcap", "cap = 2.0"),
            ("qk_norm", ""),
            ("relu_squared", ""),
            ("rotary", ""),
        ],
        optimizer: Some("name = \"adamw\"\nlr = 0.03"),
        kept: &[
            ("transformer.h.0.attn", kinds::EXT_ATTENTION),
            ("transformer.h.0.mlp", kinds::RELU_SQUARED_MLP),
            ("transformer.h.1.attn", kinds::EXT_ATTENTION),
            ("transformer.h.1.mlp", kinds::RELU_SQUARED_MLP),
            ("lm_head", kinds::SOFTCAP_LM_HEAD),
        ],
        tokens: 40,
        label: "gpt2 with the five modded-nanogpt methods",
        check: nothing_more,
    };
    qk_norm_export: ExportRow {
        net: Net::TinyGptDropout,
        plugins: &[("qk_norm", ""), ("rotary", "")],
        optimizer: None,
        kept: ATTENTION_EXT,
        tokens: 24,
        label: "gpt2 with qk_norm and rotary",
        check: crate::qk_norm::exported,
    };
    relu_squared_export: ExportRow {
        net: Net::TinyGptDropout,
        plugins: &[("relu_squared", "")],
        optimizer: None,
        kept: &[
            ("transformer.h.0.mlp", kinds::RELU_SQUARED_MLP),
            ("transformer.h.1.mlp", kinds::RELU_SQUARED_MLP),
        ],
        tokens: 24,
        label: "gpt2 with relu_squared",
        check: crate::relu_squared::exported,
    };
    rotary_export: ExportRow {
        net: Net::TinyGptDropout,
        plugins: &[("rotary", "fraction = 0.5\nmax_sequence_length = 96")],
        optimizer: None,
        kept: ATTENTION_EXT,
        // Beyond n_positions (64), within max_sequence_length.
        tokens: 80,
        label: "gpt2 with rotary",
        check: crate::rotary::exported,
    };
}

/// Every kind of module a language-model plugin puts into GPT-2 and the export keeps is kept by
/// some export row, so a new one comes with its export check.
#[test]
fn every_exported_module_kind_has_an_export_row() {
    let covered: Vec<&str> = EXPORTS
        .iter()
        .flat_map(|(_, row)| row.kept.iter().map(|(_, kind)| *kind))
        .collect();
    for kind in [
        kinds::ALIBI_ATTENTION,
        kinds::EXT_ATTENTION,
        kinds::GLU_MLP,
        kinds::RELU_SQUARED_MLP,
        kinds::SOFTCAP_LM_HEAD,
    ] {
        assert!(
            covered.contains(&kind),
            "no export row keeps a `{kind}` module"
        );
    }
}

/// Every case of Composer's golden outputs (`tests/golden/index.json`) is read by a test: a
/// plugin crate's (`plugins/<name>/tests/`, `Golden::load` of the case or of a `CASE` naming
/// it) or one of these binaries' (`tests/`), so no case is left unchecked.
#[test]
fn every_golden_case_is_read_by_a_test() {
    let root = repo_root();
    let index = read_json(&root.join("tests/golden/index.json"));
    let cases: Vec<&str> = index["cases"]
        .as_array()
        .expect("index.json lists `cases`")
        .iter()
        .map(|c| c["case"].as_str().expect("each case names itself"))
        .collect();
    assert!(!cases.is_empty(), "index.json lists no case");
    // The test sources: every .rs file under plugins/*/tests and tests/.
    let mut files = rust_files(&root.join("tests"));
    for entry in std::fs::read_dir(root.join("plugins"))
        .expect("plugins/")
        .flatten()
    {
        let tests = entry.path().join("tests");
        if tests.is_dir() {
            files.extend(rust_files(&tests));
        }
    }
    let texts: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
        .collect();
    for case in cases {
        let by_name = format!("Golden::load(\"{case}\")");
        let by_const = format!("const CASE: &str = \"{case}\";");
        assert!(
            texts.iter().any(|t| t.contains(&by_name)
                || (t.contains(&by_const) && t.contains("Golden::load(CASE)"))),
            "golden case `{case}` is read by no test"
        );
    }
}
