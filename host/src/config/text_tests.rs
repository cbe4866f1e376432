//! Tests of `[data]` for text: transforms refused, the recorded config, own, chat and labelled text, masked-LM.

use super::*;
use crate::data::{Dataset, Transforms};

use super::tests::*;

#[test]
fn text_runs_accept_an_empty_transforms_table_and_refuse_transforms() {
    let text = |transforms: &str| {
        format!(
            "[data]\ndataset = \"synthetic-text\"\n{transforms}\n[model]\nname = \"gpt2\"\n\n\
             [train]\nmax_duration = \"3ba\"\n"
        )
    };
    // What a text run's recorded config holds (run.json, checkpoints): read back by
    // `tessera eval` and `tessera export`.
    let cfg = ok(&text("[data.transforms]\n"));
    assert_eq!(cfg.data.transforms, Transforms::default());
    let e = err(&text(
        "[data.transforms]\nnormalize = { mean = [0.5], std = [0.5] }\n",
    ));
    assert!(e.to_string().contains("are image transforms"), "{e}");
}

#[test]
fn text_configs_round_trip_through_the_recorded_config() {
    // A corpus run's recorded config must read back (`tessera eval`/`export`/`predict` of its
    // checkpoints): `tokens`/`eval_tokens` are synthetic-text only and a corpus refuses them, so
    // they are recorded only when set.
    let corpus = MINIMAL
        .replace(
            "\"fashion-mnist\"",
            "\"shakespeare\"\n[data.text]\nseq_len = 64\nvocab_size = 512",
        )
        .replace("\"cnn\"", "\"gpt2\"");
    let c = ok(&corpus);
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    let text = &recorded["data"]["text"];
    assert!(
        text.get("tokens").is_none() && text.get("eval_tokens").is_none(),
        "{text}"
    );
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    // synthetic-text keeps them, set or defaulted.
    let synthetic = corpus.replace("\"shakespeare\"", "\"synthetic-text\"");
    let c = ok(&synthetic);
    let t = c.data.text.as_ref().expect("a text config");
    assert_eq!((t.tokens(), t.eval_tokens()), (262_144, 32_768));
    let sized = synthetic.replace(
        "vocab_size = 512",
        "vocab_size = 512\ntokens = 1000\neval_tokens = 300",
    );
    let c = ok(&sized);
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["data"]["text"]["tokens"], 1000);
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    let t = again.data.text.as_ref().expect("a text config");
    assert_eq!((t.tokens(), t.eval_tokens()), (1000, 300));
}

#[test]
fn own_text_keys_are_read_checked_and_round_trip() {
    let own = MINIMAL
        .replace(
            "\"fashion-mnist\"",
            "\"text\"\ndata_dir = \"my-text\"\n[data.text]\nseq_len = 64\nvocab_size = 512\n\
             eval_fraction = 0.1\ntext_field = \"body\"\ncache_dir = \"tok-cache\"",
        )
        .replace("\"cnn\"", "\"gpt2\"");
    let c = ok(&own);
    assert_eq!(c.data.dataset, Dataset::Text);
    assert!(c
        .data
        .data_dir
        .as_ref()
        .is_some_and(|p| p.ends_with("my-text")));
    let t = c.data.text.as_ref().expect("a text config");
    assert_eq!((t.eval_fraction(), t.text_field()), (0.1, "body"));
    assert!(t
        .cache_dir
        .as_ref()
        .is_some_and(|p| p.ends_with("tok-cache")));
    assert_eq!(t.eval_path, None);
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    // Defaults: 5 % held out, the "text" field.
    let plain = own.replace("eval_fraction = 0.1\ntext_field = \"body\"\n", "");
    let t = ok(&plain).data.text.expect("a text config");
    assert_eq!((t.eval_fraction(), t.text_field()), (0.05, "text"));
    // An evaluation source instead.
    let given = plain.replace(
        "vocab_size = 512",
        "vocab_size = 512\neval_path = \"val.jsonl\"",
    );
    let t = ok(&given).data.text.expect("a text config");
    assert!(t.eval_path.is_some_and(|p| p.ends_with("val.jsonl")));
    // Refused by name.
    refused(
        &own.replace("data_dir = \"my-text\"\n", ""),
        "data.data_dir",
        &["missing", ".txt", ".jsonl"],
    );
    refused(
        &own.replace(
            "eval_fraction = 0.1",
            "eval_fraction = 0.1\neval_path = \"v\"",
        ),
        "data.text.eval_fraction",
        &["either eval_path", "not both"],
    );
    refused(
        &own.replace("eval_fraction = 0.1", "eval_fraction = 1.0"),
        "data.text.eval_fraction",
        &["1"],
    );
    refused(
        &own.replace("\"text\"\ndata_dir", "\"shakespeare\"\ndata_dir"),
        "data.text.eval_fraction",
        &["only applies to dataset = \"text\"", "shakespeare"],
    );
}

#[test]
fn chat_keys_are_read_checked_and_round_trip() {
    let chat = MINIMAL
        .replace(
            "\"fashion-mnist\"",
            "\"chat\"\ndata_dir = \"train.jsonl\"\n[data.text]\nseq_len = 64\n\
             chat_template = \"plain\"\nloss_on = \"all\"\npacking = true\neval_fraction = 0.2",
        )
        .replace("\"cnn\"", "\"gpt2\"");
    let c = ok(&chat);
    assert_eq!(c.data.dataset, Dataset::Chat);
    assert!(c.data.dataset.is_text() && !c.data.dataset.is_labelled_text());
    let t = c.data.text.as_ref().expect("a text config");
    assert_eq!(t.chat_template.as_deref(), Some("plain"));
    assert_eq!(t.loss_on, Some(crate::data::LossOn::All));
    assert_eq!((t.packing, t.eval_fraction()), (Some(true), 0.2));
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["data"]["dataset"], "chat");
    assert_eq!(recorded["data"]["text"]["loss_on"], "all");
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    refused(
        &chat.replace("data_dir = \"train.jsonl\"\n", ""),
        "data.data_dir",
        &["missing", "conversations", "prompt"],
    );
    refused(
        &chat.replace("loss_on = \"all\"", "loss_on = \"assistent\""),
        "data.text.loss_on",
        &["did you mean \"assistant\"?"],
    );
    refused(
        &chat.replace("packing = true", "text_field = \"body\""),
        "data.text.text_field",
        &["has no text_field"],
    );
    refused(
        &chat.replace("\"chat\"", "\"text\""),
        "data.text.chat_template",
        &["only applies to dataset = \"chat\"", "\"text\""],
    );
    refused(
        &chat.replace("[train]", "[train]\nignore_index = 0"),
        "train.ignore_index",
        &["dataset = \"chat\" marks the positions", "-100"],
    );
}

#[test]
fn labelled_text_keys_are_read_checked_and_round_trip() {
    let labelled = MINIMAL
        .replace(
            "\"fashion-mnist\"",
            "\"labelled-text\"\ndata_dir = \"train.jsonl\"\n[data.text]\nseq_len = 64\n\
             eval_path = \"eval.jsonl\"\nlabel_field = \"source\"\ntext_field = \"body\"",
        )
        .replace("\"cnn\"", "\"gpt2\"");
    let c = ok(&labelled);
    assert_eq!(c.data.dataset, Dataset::LabelledText);
    assert!(c.data.dataset.is_text() && c.data.dataset.is_labelled_text());
    let t = c.data.text.as_ref().expect("a text config");
    assert_eq!(
        (t.label_field(), t.text_field(), t.seq_len),
        ("source", "body", 64)
    );
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["data"]["dataset"], "labelled-text");
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    // Default field.
    let plain = labelled.replace("label_field = \"source\"\n", "");
    assert_eq!(ok(&plain).data.text.unwrap().label_field(), "label");
    refused(
        &labelled.replace("data_dir = \"train.jsonl\"\n", ""),
        "data.data_dir",
        &["missing", "labelled text", "\"label\""],
    );
    // label_field is labelled text's only.
    let own = labelled.replace("\"labelled-text\"", "\"text\"");
    refused(
        &own,
        "data.text.label_field",
        &["only applies to dataset = \"labelled-text\"", "\"text\""],
    );
    // Sentence pairs: a bert with two token types reads them; other models and datasets refuse.
    let pairs = labelled
        .replace(
            "text_field = \"body\"",
            "text_field = \"body\"\npair_field = \"text_pair\"",
        )
        .replace("\"gpt2\"", "\"bert\"");
    let c = ok(&pairs);
    assert_eq!(
        c.data.text.as_ref().unwrap().pair_field.as_deref(),
        Some("text_pair")
    );
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    refused(
        &pairs.replace("\"bert\"", "\"gpt2\""),
        "model.name",
        &["pair_field = \"text_pair\"", "only bert", "\"gpt2\""],
    );
    refused(
        &pairs.replace("name = \"bert\"", "name = \"bert\"\ntype_vocab_size = 1"),
        "model.type_vocab_size",
        &["token types 0 and 1", "1 token type"],
    );
    refused(
        &pairs
            .replace("\"labelled-text\"", "\"text\"")
            .replace("label_field = \"source\"\n", ""),
        "data.text.pair_field",
        &["only applies to dataset = \"labelled-text\""],
    );
    // Classification metrics, not a language model's.
    let f1 = labelled.replace("[train]", "[train]\nmetrics = [\"accuracy\", \"f1\"]");
    assert!(ok(&f1).train.metrics.is_some());
    refused(
        &labelled.replace("[train]", "[train]\nmetrics = [\"perplexity\"]"),
        "train.metrics",
        &[
            "perplexity exists only for language models",
            "labelled text",
        ],
    );
}

#[test]
fn mlm_keys_are_read_checked_and_round_trip() {
    let corpus = MINIMAL
        .replace(
            "\"fashion-mnist\"",
            "\"shakespeare\"\n[data.text]\nseq_len = 64\n[data.mlm]\nprobability = 0.2",
        )
        .replace("\"cnn\"", "\"gpt2\"");
    let c = ok(&corpus);
    let mlm = c.data.mlm.expect("[data.mlm]");
    assert_eq!(
        (mlm.probability, mlm.mask_fraction, mlm.random_fraction),
        (0.2, 0.8, 0.1)
    );
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.data, c.data);
    assert_eq!(
        ok(&corpus.replace("[data.mlm]\nprobability = 0.2", ""))
            .data
            .mlm,
        None
    );
    // Every default: an empty table.
    let defaults = ok(&corpus.replace("probability = 0.2", ""))
        .data
        .mlm
        .unwrap();
    assert_eq!(defaults, crate::data::MlmConfig::default());
    // Errors name the key and its line.
    let line = |text: &str, key: &str| {
        let e = parse(text).unwrap_err();
        assert_eq!(e.key, key, "{e}");
        let at = text
            .lines()
            .position(|l| l.starts_with(key.rsplit('.').next().unwrap()));
        assert_eq!(e.location.line(), at.map(|i| i + 1), "{e}");
        e.to_string()
    };
    for bad in ["0", "0.0", "1.5", "-0.1"] {
        line(
            &corpus.replace("probability = 0.2", &format!("probability = {bad}")),
            "data.mlm.probability",
        );
    }
    assert!(
        ok(&corpus.replace("probability = 0.2", "probability = 1.0"))
            .data
            .mlm
            .is_some()
    );
    let e = line(
        &corpus.replace(
            "probability = 0.2",
            "mask_fraction = 0.9\nrandom_fraction = 0.2",
        ),
        "data.mlm.random_fraction",
    );
    assert!(e.contains("more than 1"), "{e}");
    let e = line(
        &corpus.replace("probability = 0.2", "mask_fraction = 0.95"),
        "data.mlm.mask_fraction",
    );
    assert!(e.contains("0.95 + random_fraction 0.1"), "{e}");
    line(
        &corpus.replace("probability = 0.2", "mask_fraction = 1.2"),
        "data.mlm.mask_fraction",
    );
    // Not for images or labelled text.
    refused(
        &with("[data.mlm]\nprobability = 0.2\n"),
        "data.mlm",
        &["masked-LM", "fashion-mnist"],
    );
    let labelled = corpus.replace(
        "\"shakespeare\"",
        "\"labelled-text\"\ndata_dir = \"train.jsonl\"",
    );
    refused(&labelled, "data.mlm", &["labelled-text", "classification"]);
    // The targets' ignore index is fixed.
    refused(
        &corpus.replace("[train]", "[train]\nignore_index = 0"),
        "train.ignore_index",
        &["-100", "[data.mlm]"],
    );
    assert!(
        ok(&corpus.replace("[train]", "[train]\nignore_index = -100"))
            .data
            .mlm
            .is_some()
    );
}
