//! Tests of values the loader refuses: bad values, unknown names, missing keys, bad durations, scheduler errors.

use super::*;

use super::tests::*;

#[test]
/// `[optimizer]` values out of range.
fn bad_optimizer_values() {
    use ErrorKind::InvalidValue;
    check(vec![
        case(
            "lr",
            with("[optimizer]\nlr = 0\n"),
            InvalidValue,
            "optimizer.lr",
            Some(11),
            "must be > 0, got 0",
        ),
        case(
            "momentum",
            with("[optimizer]\nmomentum = 1.0\n"),
            InvalidValue,
            "optimizer.momentum",
            Some(11),
            "must be in [0, 1), got 1.0",
        ),
        case(
            "dampening",
            with("[optimizer]\ndampening = 1.5\n"),
            InvalidValue,
            "optimizer.dampening",
            Some(11),
            "must be in [0, 1]",
        ),
        case(
            "weight decay",
            with("[optimizer]\nweight_decay = -1e-4\n"),
            InvalidValue,
            "optimizer.weight_decay",
            Some(11),
            "must be >= 0, got -0.0001",
        ),
        case(
            "nan",
            with("[optimizer]\nlr = nan\n"),
            InvalidValue,
            "optimizer.lr",
            Some(11),
            "finite",
        ),
        case(
            "nesterov",
            with("[optimizer]\nmomentum = 0\nnesterov = true\n"),
            InvalidValue,
            "optimizer.nesterov",
            Some(12),
            "needs momentum > 0",
        ),
        case(
            "betas range",
            with("[optimizer]\nname = \"adamw\"\nbetas = [0.9, 1.0]\n"),
            InvalidValue,
            "optimizer.betas.1",
            Some(12),
            "must be in [0, 1)",
        ),
        case(
            "betas length",
            with("[optimizer]\nname = \"adamw\"\nbetas = [0.9]\n"),
            InvalidValue,
            "optimizer.betas",
            Some(12),
            "2 numbers",
        ),
        case(
            "eps",
            with("[optimizer]\nname = \"adamw\"\neps = 0\n"),
            InvalidValue,
            "optimizer.eps",
            Some(12),
            "must be > 0",
        ),
    ]);
}

#[test]
/// `[data]`, `[train]` and the run's own values out of range.
fn bad_data_and_train_values() {
    use ErrorKind::InvalidValue;
    check(vec![
        case(
            "batch size",
            MINIMAL.replace("[model]", "batch_size = 0\n[model]"),
            InvalidValue,
            "data.batch_size",
            Some(5),
            "must be >= 1, got 0",
        ),
        case(
            "prefetch",
            MINIMAL.replace("[model]", "prefetch = 0\n[model]"),
            InvalidValue,
            "data.prefetch",
            Some(5),
            "must be >= 1",
        ),
        case(
            "workers",
            MINIMAL.replace("[model]", "workers = -1\n[model]"),
            InvalidValue,
            "data.workers",
            Some(5),
            "must be >= 0, got -1",
        ),
        case(
            "seed",
            format!("seed = -5\n{MINIMAL}"),
            InvalidValue,
            "seed",
            Some(1),
            "must be >= 0, got -5",
        ),
        case(
            "cost",
            format!("usd_per_hour = -1\n{MINIMAL}"),
            InvalidValue,
            "usd_per_hour",
            Some(1),
            "must be >= 0",
        ),
        case(
            "instance and price",
            format!("usd_per_hour = 1\ninstance = \"aws/p4d.24xlarge\"\n{MINIMAL}"),
            InvalidValue,
            "instance",
            Some(2),
            "not both",
        ),
        case(
            "unknown instance",
            format!("instance = \"aws/p4d.24xlarg\"\n{MINIMAL}"),
            InvalidValue,
            "instance",
            Some(1),
            "close names: aws/",
        ),
        case(
            "run name",
            format!("run_name = \"a/b\"\n{MINIMAL}"),
            InvalidValue,
            "run_name",
            Some(1),
            "not a folder name",
        ),
        case(
            "microbatch",
            with("microbatch_size = 256\n"),
            InvalidValue,
            "train.microbatch_size",
            Some(10),
            "must be <= data.batch_size (128), got 256",
        ),
        case(
            "ssr",
            with("scale_schedule_ratio = 0\n"),
            InvalidValue,
            "train.scale_schedule_ratio",
            Some(10),
            "must be > 0",
        ),
        case(
            "precision",
            with("precision = \"fp16\"\n"),
            InvalidValue,
            "train.precision",
            Some(10),
            "\"fp32\", \"amp_bf16\" or \"amp_fp16\"",
        ),
        case(
            "device",
            with("device = \"gpu\"\n"),
            InvalidValue,
            "train.device",
            Some(10),
            "unknown device \"gpu\"",
        ),
    ]);
}

#[test]
/// Transforms, `[model]` and plugin values out of range.
fn bad_transform_model_and_plugin_values() {
    use ErrorKind::InvalidValue;
    check(vec![
        case(
            "std",
            with("[data.transforms]\nnormalize = { mean = 0.5, std = [0.0] }\n"),
            InvalidValue,
            "data.transforms.normalize.std.0",
            Some(11),
            "must be > 0, got 0.0",
        ),
        case(
            "normalize channels",
            with("[data.transforms]\nnormalize = { mean = [0.5, 0.5], std = 1 }\n"),
            InvalidValue,
            "data.transforms.normalize.mean",
            Some(11),
            "1 value or one per channel (1 for fashion-mnist), got 2",
        ),
        case(
            "flip p",
            with("[data.transforms]\nhorizontal_flip = { p = 1.5 }\n"),
            InvalidValue,
            "data.transforms.horizontal_flip.p",
            Some(11),
            "must be in [0, 1], got 1.5",
        ),
        case(
            "crop size",
            with("[data.transforms]\nrandom_crop = { size = 40, padding = 2 }\n"),
            InvalidValue,
            "data.transforms.random_crop.size",
            Some(11),
            "must be <= 32",
        ),
        case(
            "num classes",
            MINIMAL.replace("name = \"cnn\"", "name = \"cnn\"\nnum_classes = 5"),
            InvalidValue,
            "model.num_classes",
            Some(7),
            "must be >= 10",
        ),
        case(
            "hidden zero",
            MINIMAL.replace("name = \"cnn\"", "name = \"mlp\"\nhidden = [64, 0]"),
            InvalidValue,
            "model.hidden.1",
            Some(7),
            "must be >= 1, got 0",
        ),
        case(
            "synthetic zero",
            with("[data.synthetic]\nclasses = 0\n").replace("fashion-mnist", "synthetic"),
            InvalidValue,
            "data.synthetic.classes",
            Some(11),
            "must be >= 1",
        ),
        case(
            "sha256",
            with("[[algorithms]]\nplugin = \"x\"\nsha256 = \"abc\"\n"),
            InvalidValue,
            "algorithms.0.sha256",
            Some(12),
            "64 hexadecimal digits",
        ),
        case(
            "plugin name",
            with("[[algorithms]]\nplugin = \"../evil\"\n"),
            InvalidValue,
            "algorithms.0.plugin",
            Some(11),
            "not a plugin name",
        ),
        case(
            "on_error",
            with("[[algorithms]]\nplugin = \"x\"\non_error = \"ignore\"\n"),
            InvalidValue,
            "algorithms.0.on_error",
            Some(12),
            "\"stop\" or \"disable\"",
        ),
        case(
            "nan setting",
            with("[[algorithms]]\nplugin = \"x\"\nk = { v = [1.0, inf] }\n"),
            InvalidValue,
            "algorithms.0.k.v.1",
            Some(12),
            "JSON has no nan or inf",
        ),
    ]);
}

#[test]
fn unknown_names() {
    use ErrorKind::InvalidValue;
    check(vec![
        case(
            "dataset",
            MINIMAL.replace("fashion-mnist", "cifar10"),
            InvalidValue,
            "data.dataset",
            Some(3),
            "unknown dataset \"cifar10\"; expected \"fashion-mnist\", \"mnist\", \"synthetic\", \"folder\", \"mds\", \"wds\", \"sotu\", \"shakespeare\", \"synthetic-text\", \"text\", \"labelled-text\" or \"chat\"",
        ),
        case(
            "dataset typo",
            MINIMAL.replace("fashion-mnist", "fashion_mnist"),
            InvalidValue,
            "data.dataset",
            Some(3),
            "did you mean \"fashion-mnist\"?",
        ),
        case(
            "model",
            MINIMAL.replace("\"cnn\"", "\"transformer\""),
            InvalidValue,
            "model.name",
            Some(6),
            "unknown model \"transformer\"; expected \"mlp\", \"cnn\", \"resnet20\", \"resnet56\", \"resnet18\", \"resnet50\", \"gpt2\", \"llama\", \"bert\", \"airbench\", \"vit_tiny\", \"vit_small\" or \"vit_base\"",
        ),
        case(
            "optimizer",
            with("[optimizer]\nname = \"lionn\"\n"),
            InvalidValue,
            "optimizer.name",
            Some(11),
            "unknown optimizer \"lionn\" (did you mean \"lion\"?)",
        ),
        case(
            "scheduler",
            with("[scheduler]\nname = \"linear-ish\"\n"),
            InvalidValue,
            "scheduler.name",
            Some(11),
            "linear-ish",
        ),
    ]);
}

#[test]
fn missing_required() {
    use ErrorKind::MissingKey;
    check(vec![
        case(
            "data table",
            MINIMAL.replace("[data]\ndataset = \"fashion-mnist\"\n", ""),
            MissingKey,
            "data",
            None,
            "missing required table [data]",
        ),
        case(
            "model table",
            MINIMAL.replace("[model]\nname = \"cnn\"\n", ""),
            MissingKey,
            "model",
            None,
            "missing required table [model]",
        ),
        case(
            "train table",
            MINIMAL.replace("[train]\nmax_duration = \"3ep\"\n", ""),
            MissingKey,
            "train",
            None,
            "missing required table [train]",
        ),
        case(
            "dataset",
            MINIMAL.replace("dataset = \"fashion-mnist\"", "batch_size = 2"),
            MissingKey,
            "data.dataset",
            Some(2),
            "expected \"fashion-mnist\", \"mnist\", \"synthetic\", \"folder\", \"mds\", \"wds\", \"sotu\", \"shakespeare\", \"synthetic-text\", \"text\", \"labelled-text\" or \"chat\"",
        ),
        case(
            "model name",
            MINIMAL.replace("name = \"cnn\"", ""),
            MissingKey,
            "model.name",
            Some(5),
            "missing required key in `model`",
        ),
        case(
            "max_duration",
            MINIMAL.replace("max_duration = \"3ep\"", ""),
            MissingKey,
            "train.max_duration",
            Some(8),
            "such as \"3ep\"",
        ),
        case(
            "plugin",
            with("[[algorithms]]\nplugin = \"a\"\n[[algorithms]]\nsmoothing = 0.1\n"),
            MissingKey,
            "algorithms.1.plugin",
            Some(12),
            "plugin's name",
        ),
        case(
            "normalize std",
            with("[data.transforms]\nnormalize = { mean = 0.5 }\n"),
            MissingKey,
            "data.transforms.normalize.std",
            Some(11),
            "each > 0",
        ),
        case(
            "scheduler field",
            with("[scheduler]\nname = \"step\"\n"),
            MissingKey,
            "scheduler.step_size",
            Some(10),
            "missing required key in `scheduler`",
        ),
    ]);
}

#[test]
fn bad_durations() {
    use ErrorKind::InvalidValue;
    check(vec![
        case(
            "garbage",
            MINIMAL.replace("\"3ep\"", "\"three epochs\""),
            InvalidValue,
            "train.max_duration",
            Some(9),
            "invalid time \"three epochs\"",
        ),
        case(
            "no unit",
            MINIMAL.replace("\"3ep\"", "\"3\""),
            InvalidValue,
            "train.max_duration",
            Some(9),
            "invalid time",
        ),
        case(
            "dur for max",
            MINIMAL.replace("\"3ep\"", "\"1dur\""),
            InvalidValue,
            "train.max_duration",
            Some(9),
            "unit \"dur\" is not allowed here; use \"ep\", \"ba\", \"sp\", \"tok\" or \"iter\"",
        ),
        case(
            "sec for max",
            MINIMAL.replace("\"3ep\"", "\"60sec\""),
            InvalidValue,
            "train.max_duration",
            Some(9),
            "unit \"sec\" is not allowed",
        ),
        case(
            "sec for eval",
            with("eval_interval = \"10sec\"\n"),
            InvalidValue,
            "train.eval_interval",
            Some(10),
            "\"iter\" or \"dur\"",
        ),
        case(
            "bad log",
            with("log_interval = \"5 bats\"\n"),
            InvalidValue,
            "train.log_interval",
            Some(10),
            "invalid time",
        ),
    ]);
}

#[test]
fn scheduler_errors() {
    check(vec![
        case(
            "wrong type",
            with("[scheduler]\nname = \"step\"\ngamma = \"big\"\nstep_size = \"1ep\"\n"),
            ErrorKind::InvalidValue,
            "scheduler.gamma",
            Some(12),
            "invalid type",
        ),
        case(
            "bad time",
            with("[scheduler]\nname = \"multistep\"\nmilestones = [\"1ep\", \"2 epochs\"]\n"),
            ErrorKind::InvalidValue,
            "scheduler.milestones",
            Some(12),
            "2 epochs",
        ),
        case(
            "number time",
            with("[scheduler]\nname = \"step\"\nstep_size = 30\n"),
            ErrorKind::InvalidValue,
            "scheduler.step_size",
            Some(12),
            "number 30",
        ),
        case(
            "validate",
            with("[scheduler]\nname = \"step\"\nstep_size = \"1ep\"\ngamma = -1\n"),
            ErrorKind::InvalidValue,
            "scheduler.gamma",
            Some(13),
            "must be a finite number",
        ),
        case(
            "default table name",
            with("[scheduler]\nname = \"cosin\"\n"),
            ErrorKind::InvalidValue,
            "scheduler.name",
            Some(11),
            "did you mean",
        ),
        case(
            "unknown key",
            with("[scheduler]\nname = \"cosine\"\nt_maxx = \"1ep\"\n"),
            ErrorKind::UnknownKey,
            "scheduler.t_maxx",
            Some(12),
            "unknown key for this schedule",
        ),
        case(
            "no name",
            with("[scheduler]\nwarmup = \"1ep\"\n"),
            ErrorKind::MissingKey,
            "scheduler.name",
            Some(10),
            "missing required key",
        ),
    ]);
}

#[test]
fn warmup_stable_decay_scheduler_errors() {
    let wsd = "[scheduler]\nname = \"warmup_stable_decay\"\nt_warmup = \"1ba\"\n";
    check(vec![
        case(
            "unknown decay shape",
            with(&format!("{wsd}decay_shape = \"quadratic\"\n")),
            ErrorKind::InvalidValue,
            "scheduler.decay_shape",
            Some(13),
            "unknown value \"quadratic\" for schedule \"warmup_stable_decay\"; expected",
        ),
        case(
            "misspelt decay shape",
            with(&format!("{wsd}decay_shape = \"sqrtt\"\n")),
            ErrorKind::InvalidValue,
            "scheduler.decay_shape",
            Some(13),
            "did you mean \"sqrt\"",
        ),
        case(
            "decay fraction above 1",
            with(&format!("{wsd}decay_fraction = 1.5\n")),
            ErrorKind::InvalidValue,
            "scheduler.decay_fraction",
            Some(13),
            "decay_fraction must be in [0, 1], got 1.5",
        ),
        case(
            "negative floor",
            with(&format!("{wsd}alpha_f = -0.1\n")),
            ErrorKind::InvalidValue,
            "scheduler.alpha_f",
            Some(13),
            "must be a finite number",
        ),
        case(
            "no warmup given",
            with("[scheduler]\nname = \"warmup_stable_decay\"\n"),
            ErrorKind::MissingKey,
            "scheduler.t_warmup",
            Some(10),
            "missing required key",
        ),
        case(
            "bad time",
            with(&format!("{wsd}t_max = \"1 epoch\"\n")),
            ErrorKind::InvalidValue,
            "scheduler.t_max",
            Some(13),
            "1 epoch",
        ),
    ]);
    let c = ok(&with(&format!(
        "{wsd}decay_fraction = 0.6\nalpha_f = 0.15\ndecay_shape = \"sqrt\"\n"
    )));
    assert_eq!(c.scheduler.name(), "warmup_stable_decay");
}
