//! Tests of how the loader reports a file it cannot read: syntax, the column, unknown keys, keys of another variant, wrong types.

use super::*;

use super::tests::*;

#[test]
fn syntax_errors() {
    use ErrorKind::Syntax;
    check(vec![
        case(
            "bad value",
            with("lr = -\n"),
            Syntax,
            "train.lr",
            Some(10),
            "invalid TOML",
        ),
        case(
            "unterminated string",
            "[data]\ndataset = \"mnist\n",
            Syntax,
            "data.dataset",
            Some(2),
            "invalid TOML",
        ),
        case(
            "duplicate key",
            "[optimizer]\nlr = 1\nlr = 2\n",
            Syntax,
            "optimizer.lr",
            Some(3),
            "duplicate key",
        ),
        case(
            "in an algorithm",
            "[[algorithms]]\nplugin = \"a\"\n[[algorithms]]\nx = [1,\n",
            Syntax,
            "",
            Some(5),
            "invalid TOML",
        ),
        case(
            "bad header",
            "[data\n",
            Syntax,
            "data",
            Some(1),
            "invalid TOML",
        ),
    ]);
    let e = err("[[algorithms]]\nplugin = \"a\"\n[[algorithms]]\nsmoothing = 0..1\n");
    assert_eq!(e.key, "algorithms.1.smoothing", "{e}");
    assert_eq!(e.location.line(), Some(4), "{e}");
}

#[test]
fn column_is_reported() {
    let e = err(&with("[optimizer]\nlr = -0.1\n"));
    assert_eq!(
        e.to_string(),
        "trainer.toml:11:6: optimizer.lr: must be > 0, got -0.1"
    );
    assert_eq!(
        e.location,
        Location::File {
            line: 11,
            column: 6
        }
    );
}

#[test]
fn unknown_keys() {
    use ErrorKind::UnknownKey;
    check(vec![
        case(
            "top",
            with("[trian]\n"),
            UnknownKey,
            "trian",
            Some(10),
            "did you mean `train`?",
        ),
        case(
            "top scalar",
            format!("lr = 1\n{MINIMAL}"),
            UnknownKey,
            "lr",
            Some(1),
            "valid keys at the top level: run_name",
        ),
        case(
            "data",
            MINIMAL.replace("[model]", "batchsize = 1\n[model]"),
            UnknownKey,
            "data.batchsize",
            Some(5),
            "did you mean `batch_size`?",
        ),
        case(
            "model",
            with("[model.extra]\n").replace("name = \"cnn\"", "name = \"cnn\"\nlayers = 3"),
            UnknownKey,
            "model.layers",
            Some(7),
            "valid keys in `model`: name, torchscript, sha256, hidden, width, num_classes",
        ),
        case(
            "train",
            with("max_epochs = 3\n"),
            UnknownKey,
            "train.max_epochs",
            Some(10),
            "max_duration",
        ),
        case(
            "optimizer",
            with("[optimizer]\nlearning_rate = 0.1\n"),
            UnknownKey,
            "optimizer.learning_rate",
            Some(11),
            "valid keys in `optimizer`",
        ),
        case(
            "transforms",
            with("[data.transforms]\ncutout = 1\n"),
            UnknownKey,
            "data.transforms.cutout",
            Some(11),
            "normalize, random_crop, horizontal_flip",
        ),
        case(
            "inline table",
            with("[data.transforms]\nrandom_crop = { size = 28, pad = 4 }\n"),
            UnknownKey,
            "data.transforms.random_crop.pad",
            Some(11),
            "did you mean `padding`?",
        ),
        case(
            "synthetic",
            with("[data.synthetic]\nsamples = 1\nimages = 3\n")
                .replace("fashion-mnist", "synthetic"),
            UnknownKey,
            "data.synthetic.images",
            Some(12),
            "eval_samples",
        ),
        case(
            "plugins",
            with("[plugins]\ndir = []\n"),
            UnknownKey,
            "plugins.dir",
            Some(11),
            "did you mean `dirs`?",
        ),
        case(
            "dotted",
            with("optimizer.lrr = 1\n"),
            UnknownKey,
            "train.optimizer",
            Some(10),
            "valid keys in `train`",
        ),
    ]);
}

#[test]
fn keys_of_another_variant() {
    use ErrorKind::UnknownKey;
    check(vec![
        case(
            "momentum for adamw",
            with("[optimizer]\nname = \"adamw\"\nmomentum = 0.9\n"),
            UnknownKey,
            "optimizer.momentum",
            Some(12),
            "setting of optimizer \"sgd\", not \"adamw\"",
        ),
        case(
            "betas for sgd",
            with("[optimizer]\nbetas = [0.9, 0.99]\n"),
            UnknownKey,
            "optimizer.betas",
            Some(11),
            "valid keys for \"sgd\": name, lr, weight_decay, momentum",
        ),
        case(
            "hidden for cnn",
            MINIMAL.replace("name = \"cnn\"", "name = \"cnn\"\nhidden = [1]"),
            UnknownKey,
            "model.hidden",
            Some(7),
            "only applies to model \"mlp\"",
        ),
        case(
            "width for mlp",
            MINIMAL.replace("name = \"cnn\"", "name = \"mlp\"\nwidth = 3"),
            UnknownKey,
            "model.width",
            Some(7),
            "not \"mlp\"",
        ),
        case(
            "synthetic for mnist",
            with("[data.synthetic]\n"),
            UnknownKey,
            "data.synthetic",
            Some(10),
            "only applies to dataset = \"synthetic\"",
        ),
    ]);
}

/// Values of the wrong TOML type.
#[test]
fn wrong_types() {
    use ErrorKind::WrongType;
    check(vec![
        case(
            "string for int",
            MINIMAL.replace("[model]", "batch_size = \"128\"\n[model]"),
            WrongType,
            "data.batch_size",
            Some(5),
            "expected an integer >= 1, got a string (\"128\")",
        ),
        case(
            "float for int",
            MINIMAL.replace("[model]", "workers = 2.0\n[model]"),
            WrongType,
            "data.workers",
            Some(5),
            "got a float (2.0)",
        ),
        case(
            "string for float",
            with("[optimizer]\nlr = \"0.1\"\n"),
            WrongType,
            "optimizer.lr",
            Some(11),
            "expected a number",
        ),
        case(
            "int for bool",
            with("progress = 1\n"),
            WrongType,
            "train.progress",
            Some(10),
            "expected true or false",
        ),
        case(
            "number for string",
            format!("run_name = 5\n{MINIMAL}"),
            WrongType,
            "run_name",
            Some(1),
            "expected a string",
        ),
        case(
            "table for value",
            format!("seed = {{ a = 1 }}\n{MINIMAL}"),
            WrongType,
            "seed",
            Some(1),
            "got a table",
        ),
        case(
            "value for table",
            format!("plugins = 3\n{MINIMAL}"),
            WrongType,
            "plugins",
            Some(1),
            "expected a table, got an integer (3)",
        ),
    ]);
}

/// Items of a list, named values and tables of the wrong type.
#[test]
fn wrong_types_of_items_and_tables() {
    use ErrorKind::WrongType;
    check(vec![
        case(
            "list item",
            with("[plugins]\ndirs = [\"a\", 3]\n"),
            WrongType,
            "plugins.dirs.1",
            Some(11),
            "expected a string",
        ),
        case(
            "hidden item",
            MINIMAL.replace("name = \"cnn\"", "name = \"mlp\"\nhidden = [64, \"x\"]"),
            WrongType,
            "model.hidden.1",
            Some(7),
            "expected an integer >= 1",
        ),
        case(
            "duration number",
            MINIMAL.replace("\"3ep\"", "3"),
            WrongType,
            "train.max_duration",
            Some(9),
            "expected a duration string",
        ),
        case(
            "device number",
            with("device = 0\n"),
            WrongType,
            "train.device",
            Some(10),
            "\"cuda:N\"",
        ),
        case(
            "dataset number",
            MINIMAL.replace("\"fashion-mnist\"", "1"),
            WrongType,
            "data.dataset",
            Some(3),
            "expected one of \"fashion-mnist\", \"mnist\", \"synthetic\", \"folder\", \"mds\", \"wds\", \"sotu\", \"shakespeare\", \"synthetic-text\", \"text\", \"labelled-text\" or \"chat\"",
        ),
        case(
            "algorithms table",
            format!("algorithms = {{ plugin = \"x\" }}\n{MINIMAL}"),
            WrongType,
            "algorithms",
            Some(1),
            "expected [[algorithms]]",
        ),
        case(
            "algorithm item",
            format!("algorithms = [1]\n{MINIMAL}"),
            WrongType,
            "algorithms.0",
            Some(1),
            "expected a table",
        ),
        case(
            "scheduler",
            format!("scheduler = \"cosine\"\n{MINIMAL}"),
            WrongType,
            "scheduler",
            Some(1),
            "expected a table",
        ),
    ]);
}
