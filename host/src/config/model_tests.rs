//! Tests of `[model]`: TorchScript files, the models that refuse text or images, GPT-2's, BERT's and airbench's sizes.

use super::*;
use crate::model::ModelName;

use super::tests::*;

#[test]
fn torchscript_model_misuse_names_the_key() {
    use ErrorKind::{InvalidValue, MissingKey, UnknownKey};
    let ts = |body: &str| MINIMAL.replace("name = \"cnn\"", body);
    check(vec![
        case(
            "both",
            ts("name = \"cnn\"\ntorchscript = \"model.pt\""),
            InvalidValue,
            "model.torchscript",
            Some(7),
            "give either `name` (a zoo model) or `torchscript`",
        ),
        case(
            "neither",
            ts("num_classes = 10"),
            MissingKey,
            "model.name",
            Some(5),
            "or `torchscript = \"model.pt\"`, a model made in PyTorch",
        ),
        case(
            "missing file",
            ts("torchscript = \"model.pt\""),
            InvalidValue,
            "model.torchscript",
            Some(6),
            "the TorchScript model /base/dir/model.pt does not exist",
        ),
        case(
            "name torchscript",
            ts("name = \"torchscript\""),
            InvalidValue,
            "model.name",
            Some(6),
            "write `torchscript = \"model.pt\"` instead of `name`",
        ),
        case(
            "sha256 without a file",
            ts("name = \"cnn\"\nsha256 = \"ab\""),
            UnknownKey,
            "model.sha256",
            Some(7),
            "`sha256` pins a `torchscript` model file",
        ),
        case(
            "width",
            ts("torchscript = \"model.pt\"\nwidth = 8"),
            UnknownKey,
            "model.width",
            Some(7),
            "a TorchScript model's sizes are fixed by its file",
        ),
    ]);
}

#[test]
fn torchscript_model_is_absolute_hashed_pinned_and_recorded() {
    let dir = std::env::temp_dir().join(format!("tessera-config-ts-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("models")).unwrap_or_else(|e| panic!("{e}"));
    // The config only hashes the file; loading it as TorchScript happens when the model is built.
    let file = dir.join("models/net.pt");
    std::fs::write(&file, b"abc").unwrap_or_else(|e| panic!("{e}"));
    let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    let text = MINIMAL.replace("name = \"cnn\"", "torchscript = \"models/net.pt\"");
    let c = from_str(&text, &dir, "trainer.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.model.name, ModelName::Torchscript);
    let ts = c.model.torchscript.clone().expect("a torchscript file");
    assert_eq!(
        (ts.path.as_path(), ts.sha256.as_str()),
        (file.as_path(), abc)
    );
    assert!(ts.path.is_absolute());
    assert_eq!((c.model.hidden.len(), c.model.width), (0, None));
    // Recorded as `torchscript` + `sha256` (no `name`), and read back the same.
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        recorded["model"],
        serde_json::json!({"torchscript": file, "sha256": abc, "num_classes": 10})
    );
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.model, c.model);
    // A pinned sha256 refuses a changed file, naming the key and both hashes.
    let pinned = text.replace(
        ".pt\"",
        &format!(".pt\"\nsha256 = \"{}\"", abc.to_uppercase()),
    );
    assert!(from_str(&pinned, &dir, "trainer.toml").is_ok());
    std::fs::write(&file, b"abd").unwrap_or_else(|e| panic!("{e}"));
    let e = match from_str(&pinned, &dir, "trainer.toml") {
        Ok(_) => panic!("a changed file must be refused"),
        Err(e) => e,
    };
    assert_eq!(
        (e.key.as_str(), e.location.line()),
        ("model.sha256", Some(7))
    );
    assert!(e.to_string().contains("the model file changed"), "{e}");
    assert!(recorded::from_recorded(&recorded, "again", &[]).is_err());
    // A folder is not a model file.
    let folder = MINIMAL.replace("name = \"cnn\"", "torchscript = \"models\"");
    let e = match from_str(&folder, &dir, "trainer.toml") {
        Ok(_) => panic!("a folder must be refused"),
        Err(e) => e,
    };
    assert!(e.to_string().contains("does not exist as a file"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn image_models_refuse_text_and_gpt2_refuses_images() {
    let text = MINIMAL.replace("\"fashion-mnist\"", "\"synthetic-text\"");
    refused(
        &text,
        "model.name",
        &["\"cnn\" takes images", "synthetic-text", "gpt2"],
    );
    let gpt2 = MINIMAL.replace("\"cnn\"", "\"gpt2\"");
    refused(
        &gpt2,
        "model.name",
        &["language model", "fashion-mnist", "text dataset"],
    );
    let transforms = format!("{text}\n[data.transforms]\nhorizontal_flip = {{ p = 0.5 }}\n")
        .replace("\"cnn\"", "\"gpt2\"");
    refused(
        &transforms,
        "data.transforms.horizontal_flip",
        &["image transforms", "text"],
    );
    let eval_tokens = text.replace("\"cnn\"", "\"gpt2\"").replace(
        "\"synthetic-text\"",
        "\"shakespeare\"\n[data.text]\neval_tokens = 9",
    );
    refused(&eval_tokens, "data.text.eval_tokens", &["synthetic-text"]);
}

#[test]
fn gpt2_sizes_default_validate_and_round_trip() {
    use crate::model::Gpt2Config;
    let gpt2 = MINIMAL.replace("\"cnn\"", "\"gpt2\"").replace(
        "\"fashion-mnist\"",
        "\"synthetic-text\"\n[data.text]\nvocab_size = 256",
    );
    let c = ok(&gpt2);
    assert_eq!(c.model.gpt2, Some(Gpt2Config::default()));
    let g = Gpt2Config::default();
    assert_eq!(
        (g.n_layer, g.n_head, g.n_embd, g.n_positions, g.vocab_size),
        (12, 12, 768, 1024, None)
    );
    assert!(g.tie_embeddings && g.layer_norm_epsilon == 1e-5);
    let sized = gpt2.replace(
        "name = \"gpt2\"",
        "name = \"gpt2\"\nn_layer = 2\nn_head = 4\nn_embd = 64\nn_positions = 128\n\
         vocab_size = 300\ntie_embeddings = false\nlayer_norm_epsilon = 1e-6\ndropout = 0.1",
    );
    let c = ok(&sized);
    let want = Gpt2Config {
        n_layer: 2,
        n_head: 4,
        n_embd: 64,
        n_positions: 128,
        vocab_size: Some(300),
        tie_embeddings: false,
        layer_norm_epsilon: 1e-6,
    };
    assert_eq!(c.model.gpt2.as_ref(), Some(&want));
    assert_eq!(c.model.dropout, 0.1);
    // Recorded with every size, and read back the same.
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["model"]["n_embd"], 64);
    assert_eq!(recorded["model"]["tie_embeddings"], false);
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.model, c.model);
    // Errors name the key and its line.
    for (from, to, key, fragment) in [
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nn_embd = 100",
            "model.n_embd",
            "multiple of `n_head`",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nn_head = 5",
            "model.n_head",
            "multiple of `n_head`",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nvocab_size = 3",
            "model.vocab_size",
            "must be >= 256",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nn_layer = 0",
            "model.n_layer",
            "",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nhidden = [4]",
            "model.hidden",
            "does not apply to model \"gpt2\"",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\nlayer_norm_epsilon = 0",
            "model.layer_norm_epsilon",
            "",
        ),
        (
            "name = \"gpt2\"",
            "name = \"gpt2\"\ntie_embeddings = 1",
            "model.tie_embeddings",
            "",
        ),
    ] {
        let e = err(&gpt2.replace(from, to));
        assert_eq!(e.key, key, "{e}");
        // The line after `name` (line 8, below [data.text]).
        assert_eq!(e.location.line(), Some(9), "{e}");
        assert!(e.message.contains(fragment), "{e}");
    }
    let e = err(&MINIMAL.replace("name = \"cnn\"", "name = \"cnn\"\nn_head = 2"));
    assert_eq!(e.key, "model.n_head");
    assert!(
        e.message
            .contains("only applies to models \"gpt2\" and \"bert\""),
        "{e}"
    );
}

#[test]
fn bert_sizes_default_validate_and_round_trip() {
    use crate::model::{BertConfig, BertHead};
    let bert = MINIMAL.replace("\"cnn\"", "\"bert\"").replace(
        "\"fashion-mnist\"",
        "\"synthetic-text\"\n[data.text]\nvocab_size = 256",
    );
    let c = ok(&bert);
    assert_eq!(c.model.bert, Some(BertConfig::default()));
    assert!(c.model.gpt2.is_none());
    let b = BertConfig::default();
    assert_eq!(
        (b.n_layer, b.n_head, b.n_embd, b.n_inner, b.n_positions),
        (12, 12, 768, 3072, 512)
    );
    assert_eq!((b.type_vocab_size, b.layer_norm_epsilon), (2, 1e-12));
    assert_eq!(b.head, BertHead::MaskedLm);
    let sized = bert.replace(
        "name = \"bert\"",
        "name = \"bert\"\nn_layer = 2\nn_head = 4\nn_embd = 64\nn_inner = 96\n\
         n_positions = 128\nvocab_size = 300\ntype_vocab_size = 1\nlayer_norm_epsilon = 1e-6\n\
         dropout = 0.1\nhead = \"masked_lm\"",
    );
    let c = ok(&sized);
    let want = BertConfig {
        n_layer: 2,
        n_head: 4,
        n_embd: 64,
        n_inner: 96,
        n_positions: 128,
        vocab_size: Some(300),
        type_vocab_size: 1,
        layer_norm_epsilon: 1e-6,
        head: BertHead::MaskedLm,
    };
    assert_eq!(c.model.bert.as_ref(), Some(&want));
    assert_eq!(c.model.dropout, 0.1);
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["model"]["n_inner"], 96);
    assert_eq!(recorded["model"]["head"], "masked_lm");
    let again = recorded::from_recorded(&recorded, "again", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.model, c.model);
    // Errors name the key and its line (the line after `name`).
    for (to, key, fragment) in [
        ("n_embd = 100", "model.n_embd", "multiple of `n_head`"),
        ("n_inner = 0", "model.n_inner", ""),
        ("head = \"pretraining\"", "model.head", "masked_lm"),
        (
            "head = \"classification\"",
            "model.head",
            "needs class labels",
        ),
        (
            "tie_embeddings = false",
            "model.tie_embeddings",
            "word embedding",
        ),
        ("vocab_size = 3", "model.vocab_size", "must be >= 256"),
        (
            "width = 4",
            "model.width",
            "does not apply to model \"bert\"",
        ),
    ] {
        let e = err(&bert.replace("name = \"bert\"", &format!("name = \"bert\"\n{to}")));
        assert_eq!(e.key, key, "{to}: {e}");
        assert_eq!(e.location.line(), Some(9), "{e}");
        assert!(e.message.contains(fragment), "{to}: {e}");
    }
    // BERT's own keys on another model, and BERT on images.
    let e = err(&MINIMAL.replace("name = \"cnn\"", "name = \"cnn\"\nn_inner = 2"));
    assert_eq!(e.key, "model.n_inner");
    assert!(e.message.contains("only applies to model \"bert\""), "{e}");
    let e = err(&MINIMAL.replace("name = \"cnn\"", "name = \"bert\""));
    assert_eq!(e.key, "model.name");
    assert!(e.message.contains("language model"), "{e}");
}

#[test]
fn airbench_widths_default_validate_and_record() {
    let airbench =
        |extra: &str| MINIMAL.replace("name = \"cnn\"", &format!("name = \"airbench\"{extra}"));
    let c = ok(&airbench(""));
    assert_eq!(c.model.name, ModelName::Airbench);
    assert_eq!(
        (c.model.widths.clone(), c.model.width),
        (vec![64, 256, 256], None)
    );
    let c = ok(&airbench("\nwidths = [8, 16, 32]"));
    assert_eq!(c.model.widths, [8, 16, 32]);
    let recorded = serde_json::to_value(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recorded["model"]["widths"], serde_json::json!([8, 16, 32]));
    // A resumed run reads the recorded config back.
    let again = from_recorded(&recorded, "run.json", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.model, c.model);
    for (extra, fragment) in [
        ("\nwidths = [8, 16]", "three widths"),
        ("\nwidths = [8, 0, 16]", "model.widths.1"),
        ("\nwidth = 8", "give its three conv-group widths"),
        ("\nnorm = \"group\"", "\"batch\""),
        ("\nhidden = [4]", "only applies to model \"mlp\""),
    ] {
        let e = err(&airbench(extra)).to_string();
        assert!(e.contains(fragment), "{extra}: {e}");
    }
    let e =
        err(&MINIMAL.replace("name = \"cnn\"", "name = \"cnn\"\nwidths = [8, 8, 8]")).to_string();
    assert!(e.contains("only applies to model \"airbench\""), "{e}");
    assert!(
        !serde_json::to_value(ok(MINIMAL)).unwrap_or_default()["model"]
            .as_object()
            .is_some_and(|m| m.contains_key("widths"))
    );
}
