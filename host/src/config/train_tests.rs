//! Tests of `[train]`: activation checkpointing, iteration lengths, the target, the loss and metrics, the instance's price; and `[logging] mlflow`.

use super::*;
use crate::time::{Time, TimeUnit};

use super::tests::*;

#[test]
fn activation_checkpointing_is_read_checked_and_recorded() {
    use crate::model::{ActivationCheckpointing, Unit};
    assert_eq!(
        ok(MINIMAL).train.activation_checkpointing,
        None,
        "off by default"
    );
    let with_key = |value: &str| {
        MINIMAL.replace(
            "\"3ep\"\n",
            &format!("\"3ep\"\nactivation_checkpointing = {value}\n"),
        )
    };
    let c = ok(&with_key("{}"));
    assert_eq!(
        c.train.activation_checkpointing,
        Some(ActivationCheckpointing::default())
    );
    let stages = ActivationCheckpointing {
        unit: Unit::Stage,
        every: 2,
    };
    let c = ok(&with_key("{ unit = \"stage\", every = 2 }"));
    assert_eq!(c.train.activation_checkpointing, Some(stages));
    let recorded = serde_json::to_value(&c).unwrap();
    assert_eq!(
        recorded["train"]["activation_checkpointing"],
        serde_json::json!({"unit": "stage", "every": 2})
    );
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.train.activation_checkpointing, Some(stages));
    let set = parse_with(MINIMAL, &["train.activation_checkpointing.every=3"]).unwrap();
    assert_eq!(set.train.activation_checkpointing.map(|a| a.every), Some(3));
    for (value, key, kind, fragment) in [
        (
            "{ unit = \"layer\" }",
            "train.activation_checkpointing.unit",
            ErrorKind::InvalidValue,
            "unknown unit \"layer\"",
        ),
        (
            "{ every = 0 }",
            "train.activation_checkpointing.every",
            ErrorKind::InvalidValue,
            "must be >= 1",
        ),
        (
            "{ every = \"2\" }",
            "train.activation_checkpointing.every",
            ErrorKind::WrongType,
            "an integer >= 1",
        ),
        (
            "{ units = \"block\" }",
            "train.activation_checkpointing.units",
            ErrorKind::UnknownKey,
            "unit",
        ),
        (
            "true",
            "train.activation_checkpointing",
            ErrorKind::WrongType,
            "expected a table",
        ),
    ] {
        let e = err(&with_key(value));
        assert_eq!((e.key.as_str(), e.kind), (key, kind), "{value}: {e}");
        assert_eq!(e.location.line(), Some(10), "{value}: {e}");
        assert!(e.message.contains(fragment), "{value}: {e}");
    }
}

#[test]
fn iteration_length_in_epochs_and_iter_durations_need_it() {
    assert_eq!(ok(MINIMAL).train.iteration_length, None);
    let two = MINIMAL.replace("\"3ep\"\n", "\"3ep\"\niteration_length = \"2ep\"\n");
    assert_eq!(
        ok(&two).train.iteration_length,
        Some(Time::new(2, TimeUnit::Epoch))
    );
    let two_iterations = two.replace("\"3ep\"", "\"2iter\"");
    assert_eq!(
        ok(&two_iterations).train.max_duration,
        Time::new(2, TimeUnit::Iteration)
    );
    use ErrorKind::InvalidValue;
    check(vec![
        case(
            "iteration in batches",
            MINIMAL.replace("\"3ep\"\n", "\"3ep\"\niteration_length = \"100ba\"\n"),
            InvalidValue,
            "train.iteration_length",
            Some(10),
            "unit \"ba\" is not allowed here; use \"ep\"",
        ),
        case(
            "iter without a length",
            MINIMAL.replace("\"3ep\"", "\"2iter\""),
            InvalidValue,
            "train.max_duration",
            Some(9),
            "train.iteration_length is set",
        ),
    ]);
}

#[test]
fn a_target_is_a_metric_a_comparison_and_a_number() {
    use crate::report::{Comparison, Metric, Target};
    let c = ok(MINIMAL);
    assert_eq!(c.train.target, None);
    assert!(c.train.stop_at_target);
    let target = |line: &str| MINIMAL.replace("\"3ep\"\n", &format!("\"3ep\"\n{line}\n"));
    let c = ok(&target(
        "target = \"accuracy >= 0.9\"\nstop_at_target = false",
    ));
    assert_eq!(
        c.train.target,
        Some(Target {
            metric: Metric::Accuracy,
            op: Comparison::AtLeast,
            value: 0.9
        })
    );
    assert!(!c.train.stop_at_target);
    // Written back as in the file, so a recorded config reads back.
    assert_eq!(
        serde_json::to_value(&c.train).unwrap()["target"],
        "accuracy >= 0.9"
    );
    let c = ok(&target("target = \"cross_entropy<0.4\""));
    assert_eq!(
        c.train.target.map(|t| (t.metric, t.op, t.value)),
        Some((Metric::CrossEntropy, Comparison::Below, 0.4))
    );
    let text = target("target = \"perplexity <= 20\"")
        .replace("\"fashion-mnist\"", "\"synthetic-text\"")
        .replace("\"cnn\"", "\"gpt2\"");
    assert_eq!(
        ok(&text).train.target.map(|t| t.metric),
        Some(Metric::Perplexity)
    );
    let c = parse_with(MINIMAL, &["train.target=accuracy > 0.5"]).unwrap();
    assert_eq!(c.train.target.map(|t| t.op), Some(Comparison::Above));
}

/// A target that is not a metric, a comparison and a number names `train.target`.
#[test]
fn a_bad_target_names_the_key() {
    let target = |line: &str| MINIMAL.replace("\"3ep\"\n", &format!("\"3ep\"\n{line}\n"));
    use ErrorKind::{InvalidValue, WrongType};
    check(vec![
        case(
            "unknown metric",
            target("target = \"acc >= 0.9\""),
            InvalidValue,
            "train.target",
            Some(10),
            "train.target: unknown metric \"acc\"; use accuracy (or top1), top2, top3, ... (topK), f1, cross_entropy or perplexity",
        ),
        case(
            "unknown comparison",
            target("target = \"accuracy == 0.9\""),
            InvalidValue,
            "train.target",
            Some(10),
            "unknown comparison \"==\"; use >=, >, <= or <",
        ),
        case(
            "no comparison",
            target("target = \"accuracy 0.9\""),
            InvalidValue,
            "train.target",
            Some(10),
            "no comparison after \"accuracy\"",
        ),
        case(
            "not a number",
            target("target = \"accuracy >= ninety\""),
            InvalidValue,
            "train.target",
            Some(10),
            "\"ninety\" is not a number",
        ),
        case(
            "no number",
            target("target = \"accuracy >=\""),
            InvalidValue,
            "train.target",
            Some(10),
            "no number after \">=\"",
        ),
        case(
            "no metric",
            target("target = \">= 0.9\""),
            InvalidValue,
            "train.target",
            Some(10),
            "expected \"<metric> <comparison> <number>\", such as \"accuracy >= 0.9\"",
        ),
        case(
            "accuracy out of range",
            target("target = \"accuracy >= 90\""),
            InvalidValue,
            "train.target",
            Some(10),
            "accuracy is between 0 and 1, so a target of 90 can never be met",
        ),
        case(
            "perplexity of images",
            target("target = \"perplexity < 5\""),
            InvalidValue,
            "train.target",
            Some(10),
            "perplexity exists only for language models, and data.dataset \"fashion-mnist\" is image data; use accuracy, a top-k accuracy (top5), f1 or cross_entropy",
        ),
        case(
            "a number instead of a string",
            target("target = 0.9"),
            WrongType,
            "train.target",
            Some(10),
            "expected a string such as \"accuracy >= 0.9\", got",
        ),
        case(
            "stop_at_target not a bool",
            target("target = \"accuracy >= 0.9\"\nstop_at_target = \"yes\""),
            WrongType,
            "train.stop_at_target",
            Some(11),
            "expected true or false",
        ),
    ]);
}

#[test]
fn loss_ignore_index_and_metrics() {
    use crate::model::{Loss, LossKind};
    use crate::report::Metric;
    let c = ok(MINIMAL);
    assert_eq!(c.train.loss_fn(), Loss::default());
    assert_eq!(c.train.loss_fn().ignore_index, -100);
    assert_eq!(c.train.metrics, None);
    let train = |lines: &str| MINIMAL.replace("\"3ep\"\n", &format!("\"3ep\"\n{lines}\n"));
    let c = ok(&train(
        "loss = \"binary_cross_entropy\"\nmetrics = [\"top5\", \"f1\"]\ntarget = \"top5 >= 0.9\"",
    ));
    assert_eq!(c.train.loss, LossKind::BinaryCrossEntropy);
    assert_eq!(c.train.metrics, Some(vec![Metric::TopK(5), Metric::F1]));
    assert_eq!(c.train.target.map(|t| t.metric), Some(Metric::TopK(5)));
    // Recorded as written.
    let recorded = serde_json::to_value(&c.train).unwrap();
    assert_eq!(recorded["loss"], "binary_cross_entropy");
    assert_eq!(recorded["metrics"], serde_json::json!(["top5", "f1"]));
    let c = ok(&train(
        "ignore_index = 3\nmetrics = [\"top1\", \"top3\"]\ntarget = \"f1 >= 0.8\"",
    ));
    assert_eq!(c.train.loss_fn().ignore_index, 3);
    assert_eq!(
        c.train.metrics,
        Some(vec![Metric::Accuracy, Metric::TopK(3)])
    );
    assert_eq!(c.train.target.map(|t| t.metric), Some(Metric::F1));
    let text = |lines: &str| {
        train(lines)
            .replace("\"fashion-mnist\"", "\"synthetic-text\"")
            .replace("\"cnn\"", "\"gpt2\"")
    };
    assert_eq!(
        ok(&text("metrics = [\"top5\"]")).train.metrics,
        Some(vec![Metric::TopK(5)])
    );
}

/// A loss, metric or ignore index the trainer does not know names its key.
#[test]
fn bad_losses_and_metrics_name_the_key() {
    let train = |lines: &str| MINIMAL.replace("\"3ep\"\n", &format!("\"3ep\"\n{lines}\n"));
    let text = |lines: &str| {
        train(lines)
            .replace("\"fashion-mnist\"", "\"synthetic-text\"")
            .replace("\"cnn\"", "\"gpt2\"")
    };
    use ErrorKind::{InvalidValue, WrongType};
    check(vec![
        case(
            "unknown loss",
            train("loss = \"bce\""),
            InvalidValue,
            "train.loss",
            Some(10),
            "unknown loss \"bce\"; expected \"cross_entropy\" or \"binary_cross_entropy\"",
        ),
        case(
            "binary cross-entropy of a language model",
            text("loss = \"binary_cross_entropy\""),
            InvalidValue,
            "train.loss",
            Some(10),
            "binary_cross_entropy is for image classifiers, and data.dataset \"synthetic-text\" is text",
        ),
        case(
            "ignore_index with binary cross-entropy",
            train("loss = \"binary_cross_entropy\"\nignore_index = 0"),
            InvalidValue,
            "train.ignore_index",
            Some(11),
            "applies to loss = \"cross_entropy\" only",
        ),
        case(
            "ignore_index not an integer",
            train("ignore_index = \"none\""),
            WrongType,
            "train.ignore_index",
            Some(10),
            "expected an integer, got",
        ),
        case(
            "unknown metric in the list",
            train("metrics = [\"top5\", \"precision\"]"),
            InvalidValue,
            "train.metrics",
            Some(10),
            "unknown metric \"precision\"; use accuracy (or top1)",
        ),
        case(
            "top0",
            train("metrics = [\"top0\"]"),
            InvalidValue,
            "train.metrics",
            Some(10),
            "unknown metric \"top0\"",
        ),
        case(
            "a metric twice",
            train("metrics = [\"f1\", \"f1\"]"),
            InvalidValue,
            "train.metrics",
            Some(10),
            "f1 is listed twice",
        ),
        case(
            "metrics not a list",
            train("metrics = \"top5\""),
            WrongType,
            "train.metrics",
            Some(10),
            "expected an array of strings",
        ),
        case(
            "f1 of a language model",
            text("metrics = [\"f1\"]"),
            InvalidValue,
            "train.metrics",
            Some(10),
            "f1 is for classification, and data.dataset \"synthetic-text\" is text",
        ),
        case(
            "f1 target of a language model",
            text("target = \"f1 >= 0.5\""),
            InvalidValue,
            "train.target",
            Some(10),
            "f1 is for classification",
        ),
        case(
            "perplexity listed for images",
            train("metrics = [\"perplexity\"]"),
            InvalidValue,
            "train.metrics",
            Some(10),
            "perplexity exists only for language models",
        ),
        case(
            "top-k target out of range",
            train("target = \"top5 >= 1.5\""),
            InvalidValue,
            "train.target",
            Some(10),
            "top5 is between 0 and 1, so a target of 1.5 can never be met",
        ),
    ]);
}

#[test]
fn an_instance_sets_the_price_and_survives_the_recorded_config() {
    let c = parse(&format!("instance = \"aws/p4d.24xlarge\"\n{MINIMAL}")).unwrap();
    let presets = crate::cost::Instances::load().unwrap();
    assert_eq!(
        c.usd_per_hour,
        presets.get("aws/p4d.24xlarge").map(|i| i.usd_per_hour)
    );
    assert_eq!(c.instance.as_deref(), Some("aws/p4d.24xlarge"));
    let recorded = serde_json::to_value(&c).unwrap();
    let again = from_recorded(&recorded, "run.json", &[]).unwrap();
    assert_eq!(again.usd_per_hour, c.usd_per_hour);
    assert_eq!(again.instance, c.instance);
}

#[test]
fn logging_mlflow_is_read_and_checked() {
    let c = ok(&with(
        "[logging]\nmlflow = { uri = \"http://127.0.0.1:5000/\", experiment = \"fmnist\", flush_timeout = \"2s\" }\n",
    ));
    let m = c.logging.mlflow.expect("mlflow");
    assert_eq!(m.uri, "http://127.0.0.1:5000");
    assert_eq!(m.experiment, "fmnist");
    assert_eq!(m.run_name, None);
    assert_eq!(m.flush_timeout(), std::time::Duration::from_secs(2));
    assert!(m.weights);
    assert_eq!(ok(MINIMAL).logging, LoggingConfig::default());
    // The recorded config reads back the same.
    let recorded = serde_json::to_value(ok(&with(
        "[logging]\nmlflow = { uri = \"https://h\", experiment = \"e\", run_name = \"r\", weights = false }\n",
    )))
    .unwrap();
    let back = from_recorded(&recorded, "run.json", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(serde_json::to_value(back).unwrap(), recorded);
    for (extra, key, fragment) in [
        (
            "mlflow = { uri = \"http://h\", experiment = \"e\", urll = 1 }",
            "logging.mlflow.urll",
            "did you mean `uri`?",
        ),
        (
            "mlflow = { uri = \"ftp://h\", experiment = \"e\" }",
            "logging.mlflow.uri",
            "not an http:// or https://",
        ),
        (
            "mlflow = { experiment = \"e\" }",
            "logging.mlflow.uri",
            "missing required key",
        ),
        (
            "mlflow = { uri = \"http://h\" }",
            "logging.mlflow.experiment",
            "missing required key",
        ),
        (
            "mlflow = { uri = \"http://h\", experiment = \"e\", flush_timeout = \"3ep\" }",
            "logging.mlflow.flush_timeout",
            "\"sec\"",
        ),
        (
            "mlflow = { uri = \"http://h\", experiment = \"e\", weights = 1 }",
            "logging.mlflow.weights",
            "true or false",
        ),
        (
            "tensorboard = true",
            "logging.tensorboard",
            "valid keys in `logging`: mlflow",
        ),
    ] {
        let e = err(&with(&format!("[logging]\n{extra}\n")));
        let text = e.to_string();
        assert!(
            text.contains(":11:") && text.contains(key) && text.contains(fragment),
            "{extra}: {text}"
        );
    }
}
