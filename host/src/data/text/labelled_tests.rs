//! Unit tests of `labelled`: label parsing and its errors (file and line), class resolution,
//! the sample layout, the shared tokenizer cache and the special tokens of both kinds of
//! tokenizer.
use std::fs;
use std::path::{Path, PathBuf};

use super::*;
use crate::data::idx::tests::TempDir;
use crate::data::text::own::read_documents;
use crate::data::text::special::{CLS_TOKEN, MASK_TOKEN, PAD_TOKEN, SEP_TOKEN};

fn write(dir: &TempDir, name: &str, body: &str) -> PathBuf {
    let path = dir.0.join(name);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, body).unwrap();
    path
}

fn error_of(dir: &TempDir, body: &str) -> String {
    let path = write(dir, "bad.jsonl", body);
    read_labelled(&path, "text", "label", None)
        .unwrap_err()
        .to_string()
}

#[test]
fn labels_are_class_indices_or_names() {
    let object = serde_json::Map::new();
    let parse = |v: serde_json::Value| parse_label(Some(v), "label", &object);
    assert_eq!(parse(serde_json::json!(3)), Ok(RawLabel::Index(3)));
    assert_eq!(parse(serde_json::json!(0)), Ok(RawLabel::Index(0)));
    assert_eq!(
        parse(serde_json::json!("sotu")),
        Ok(RawLabel::Name("sotu".into()))
    );
    for (value, why) in [
        (serde_json::json!(-1), "is negative"),
        (serde_json::json!(1.5), "is not an integer"),
        (serde_json::json!(1.0), "is not an integer"),
        (serde_json::json!(true), "is a boolean"),
        (serde_json::json!(null), "is null"),
        (serde_json::json!([1]), "is an array"),
        (serde_json::json!(""), "empty string"),
        (serde_json::json!(5_000_000_000u64), "too large"),
    ] {
        let err = parse(value.clone()).unwrap_err();
        assert!(err.contains(why), "{value}: {err}");
    }
    let err = parse_label(None, "label", &object).unwrap_err();
    assert!(
        err.contains("has no field \"label\" (data.text.label_field)"),
        "{err}"
    );
}

#[test]
fn a_bad_line_is_an_error_naming_the_file_and_the_line() {
    let dir = TempDir::new("labelled-errors");
    let good = "{\"text\": \"a\", \"label\": 0}\n";
    for (line2, why) in [
        ("not json", "line 2: is not valid JSON"),
        (
            "{\"text\": \"b\"}",
            "line 2: has no field \"label\" (data.text.label_field); its fields: text",
        ),
        (
            "{\"label\": 1}",
            "line 2: has no field \"text\" (data.text.text_field)",
        ),
        (
            "{\"text\": \"b\", \"label\": 1.5}",
            "line 2: label \"label\" = 1.5 is not an integer",
        ),
        (
            "{\"text\": \"b\", \"label\": -2}",
            "line 2: label \"label\" = -2 is negative",
        ),
        (
            "{\"text\": \"b\", \"label\": false}",
            "line 2: label \"label\" is a boolean",
        ),
        (
            "{\"text\": \"b\", \"label\": \"x\"}",
            "line 2: the label is a string, but bad.jsonl:1 has an integer",
        ),
        ("[1, 2]", "line 2: is not a JSON object"),
    ] {
        let err = error_of(&dir, &format!("{good}{line2}\n"));
        assert!(
            err.contains("bad.jsonl") && err.contains(why),
            "{line2}: {err}"
        );
    }
    // Blank lines count in the numbering.
    let err = error_of(&dir, &format!("{good}\n\n{{\"text\": 3, \"label\": 0}}\n"));
    assert!(err.contains("line 4: field \"text\" is a number"), "{err}");
    // A .txt file in the folder has no label.
    let folder = dir.0.join("folder");
    write(&dir, "folder/a.jsonl", good);
    write(&dir, "folder/b.txt", "no label");
    let err = read_labelled(&folder, "text", "label", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("b.txt") && err.contains("has no label"),
        "{err}"
    );
    let err = error_of(&dir, "\n\n");
    assert!(err.contains("holds no labelled lines"), "{err}");
}

#[test]
fn fields_are_configurable_and_the_hash_is_dataset_texts() {
    let dir = TempDir::new("labelled-fields");
    let path = write(
        &dir,
        "reviews.jsonl",
        "{\"body\": \"good\", \"stars\": \"pos\", \"id\": 1}\n{\"body\": \"bad\", \"stars\": \"neg\"}\n",
    );
    let read = read_labelled(&path, "body", "stars", None).unwrap();
    let names: Vec<&str> = read
        .documents
        .docs
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, ["reviews.jsonl:1", "reviews.jsonl:2"]);
    assert_eq!(
        read.labels,
        [RawLabel::Name("pos".into()), RawLabel::Name("neg".into())]
    );
    // The same texts as dataset = "text" reads, under the same content hash: both share the
    // tokenizer cache folder.
    assert_eq!(read.documents, read_documents(&path, "body").unwrap());
}

#[test]
fn string_labels_become_sorted_class_indices_over_both_splits() {
    let dir = TempDir::new("labelled-classes");
    let train = write(
        &dir,
        "train.jsonl",
        "{\"text\": \"a\", \"label\": \"sotu\"}\n{\"text\": \"b\", \"label\": \"shakespeare\"}\n",
    );
    let eval = write(
        &dir,
        "eval.jsonl",
        "{\"text\": \"c\", \"label\": \"other\"}\n",
    );
    let (train, eval) = (
        read_labelled(&train, "text", "label", None).unwrap(),
        read_labelled(&eval, "text", "label", None).unwrap(),
    );
    let (classes, labels) = resolve_labels(&[&train, &eval]).unwrap();
    assert_eq!(classes.count, 3);
    assert_eq!(
        classes.names.as_deref().unwrap(),
        ["other", "shakespeare", "sotu"]
    );
    assert_eq!(labels, [vec![2, 1], vec![0]]);

    let ints = write(
        &dir,
        "ints.jsonl",
        "{\"text\": \"a\", \"label\": 4}\n{\"text\": \"b\", \"label\": 1}\n",
    );
    let ints = read_labelled(&ints, "text", "label", None).unwrap();
    let (classes, labels) = resolve_labels(&[&ints]).unwrap();
    assert_eq!((classes.count, classes.names), (5, None));
    assert_eq!(labels, [vec![4, 1]]);
    // A split of names and a split of indices do not mix.
    let err = resolve_labels(&[&ints, &eval]).unwrap_err().to_string();
    assert!(
        err.contains("eval.jsonl:1") && err.contains("ints.jsonl:1") && err.contains("string"),
        "{err}"
    );
}

fn bpe_specials() -> SpecialTokens {
    SpecialTokens::new(300, Some(0), |_| None)
}

#[test]
fn a_sample_is_cls_tokens_sep_then_padding_with_its_attention_mask() {
    let s = bpe_specials(); // pad 300, cls 301, sep 302
    let (mut input, mut mask) = (Vec::new(), Vec::new());
    write_sample(&[5, 6, 7], 7, &s, &mut input, &mut mask);
    assert_eq!(input, [301, 5, 6, 7, 302, 300, 300]);
    assert_eq!(mask, [1, 1, 1, 1, 1, 0, 0]);
    // Too long: truncated to seq_len - 2 tokens, [SEP] kept last, no padding.
    let (mut input, mut mask) = (Vec::new(), Vec::new());
    write_sample(&[5, 6, 7, 8, 9], 4, &s, &mut input, &mut mask);
    assert_eq!(input, [301, 5, 6, 302]);
    assert_eq!(mask, [1, 1, 1, 1]);
    // An empty text is [CLS] [SEP].
    let (mut input, mut mask) = (Vec::new(), Vec::new());
    write_sample(&[], 4, &s, &mut input, &mut mask);
    assert_eq!((input, mask), (vec![301, 302, 300, 300], vec![1, 1, 0, 0]));

    let set = LabelledSequences::new(vec![vec![5, 6, 7, 8], vec![9]], vec![1, 0], 4, s).unwrap();
    assert_eq!((set.len(), set.seq_len(), set.truncated()), (2, 4, 1));
    let (mut input, mut mask, mut types) = (Vec::new(), Vec::new(), Vec::new());
    assert_eq!(set.write(1, &mut input, &mut mask, &mut types), 0);
    assert_eq!(input, [301, 9, 302, 300]);
    assert!(types.is_empty(), "single texts have no token types");
    assert!(!set.paired());
    assert!(LabelledSequences::new(vec![vec![1]], vec![0], 2, s).is_err());
    assert!(LabelledSequences::new(vec![vec![1]], vec![], 4, s).is_err());
}

#[test]
fn a_pair_is_cls_a_sep_b_sep_with_token_types_one_on_the_second() {
    let s = bpe_specials(); // pad 300, cls 301, sep 302
    let (mut input, mut mask, mut types) = (Vec::new(), Vec::new(), Vec::new());
    write_pair_sample((&[5, 6], &[7]), 8, &s, &mut input, &mut mask, &mut types);
    assert_eq!(input, [301, 5, 6, 302, 7, 302, 300, 300]);
    assert_eq!(mask, [1, 1, 1, 1, 1, 1, 0, 0]);
    assert_eq!(types, [0, 0, 0, 0, 1, 1, 0, 0]);

    let set = LabelledSequences::new(vec![vec![5, 6, 7, 8], vec![9]], vec![1, 0], 6, s)
        .unwrap()
        .with_pairs(vec![vec![10, 11], vec![12]])
        .unwrap();
    assert!(set.paired());
    assert_eq!(set.truncated(), 1, "4 + 2 tokens do not fit in 6 - 3");
    let (mut input, mut mask, mut types) = (Vec::new(), Vec::new(), Vec::new());
    assert_eq!(set.write(0, &mut input, &mut mask, &mut types), 1);
    // Room for 3: the shorter (2) is more than half of it, so both are cut to half, 2 + 1 (the
    // longer, first, text gets the odd token).
    assert_eq!(input, [301, 5, 6, 302, 10, 302]);
    assert_eq!(types, [0, 0, 0, 0, 1, 1]);
    assert_eq!(mask, [1; 6]);
    // A pair needs 5 tokens and one second text per sample.
    let short = LabelledSequences::new(vec![vec![1]], vec![0], 4, s).unwrap();
    assert!(short.with_pairs(vec![vec![2]]).is_err());
    let set = LabelledSequences::new(vec![vec![1]], vec![0], 5, s).unwrap();
    assert!(set.with_pairs(vec![]).is_err());
}

#[test]
fn pairs_are_cut_longest_first_as_the_fast_tokenizers_cut_them() {
    // Fits: nothing cut.
    assert_eq!(pair_lengths(3, 4, 7), (3, 4));
    // The shorter fits in half the room: the longer is cut to the rest, either order.
    assert_eq!(pair_lengths(2, 10, 7), (2, 5));
    assert_eq!(pair_lengths(10, 2, 7), (5, 2));
    // Both longer than half: half each, the odd token to the longer (the second on a tie).
    assert_eq!(pair_lengths(5, 5, 7), (3, 4));
    assert_eq!(pair_lengths(9, 6, 7), (4, 3));
    assert_eq!(pair_lengths(6, 9, 7), (3, 4));
    assert_eq!(pair_lengths(8, 8, 6), (3, 3));
    // No room: nothing kept.
    assert_eq!(pair_lengths(2, 3, 0), (0, 0));
    // Every cut fills the room exactly.
    for a in 0..12 {
        for b in 0..12 {
            for room in 0..15 {
                let (x, y) = pair_lengths(a, b, room);
                assert!(x <= a && y <= b);
                assert_eq!(x + y, (a + b).min(room), "{a} {b} {room}");
            }
        }
    }
}

#[test]
fn pair_fields_are_read_beside_the_text_and_named_when_missing() {
    let dir = TempDir::new("labelled-pairs");
    let path = write(
        &dir,
        "pairs.jsonl",
        "{\"text\": \"a b\", \"text_pair\": \"c\", \"label\": 1}\n\
         {\"text\": \"d\", \"text_pair\": \"e f\", \"label\": 0}\n",
    );
    let read = read_labelled(&path, "text", "label", Some("text_pair")).unwrap();
    assert_eq!(read.pairs, ["c", "e f"]);
    assert!(read_labelled(&path, "text", "label", None)
        .unwrap()
        .pairs
        .is_empty());
    let bad = write(
        &dir,
        "bad.jsonl",
        "{\"text\": \"a\", \"text_pair\": \"c\", \"label\": 1}\n{\"text\": \"d\", \"label\": 0}\n",
    );
    let err = read_labelled(&bad, "text", "label", Some("text_pair"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bad.jsonl: line 2")
            && err.contains("no field \"text_pair\"")
            && err.contains("its fields: label, text"),
        "{err}"
    );
    let typed = write(
        &dir,
        "typed.jsonl",
        "{\"text\": \"a\", \"text_pair\": 3, \"label\": 1}\n",
    );
    let err = read_labelled(&typed, "text", "label", Some("text_pair"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("typed.jsonl: line 1") && err.contains("a number"),
        "{err}"
    );
}

/// Lines of two "sources" whose words differ, labelled by source name.
fn two_sources(n: usize) -> String {
    let mut body = String::new();
    for i in 0..n {
        let (text, label) = if i % 2 == 0 {
            (
                format!("thou art the sun {i} and thee shalt rise"),
                "shakespeare",
            )
        } else {
            (format!("the economy of the union {i} is strong"), "sotu")
        };
        body.push_str(&serde_json::json!({"text": text, "label": label}).to_string());
        body.push('\n');
    }
    body
}

fn labelled_config(path: &Path, cache: &Path) -> LabelledTextConfig {
    LabelledTextConfig {
        text: OwnTextConfig {
            path: path.to_path_buf(),
            eval_path: None,
            eval_fraction: 0.25,
            text_field: "text".into(),
            vocab_size: 300,
            tokenizer: None,
            cache_dir: cache.to_path_buf(),
        },
        label_field: "label".into(),
        pair_field: None,
        seq_len: 64,
        eval_seq_len: 64,
    }
}

#[test]
fn a_trained_bpe_reserves_the_special_tokens_and_is_cached_as_for_text() {
    let dir = TempDir::new("labelled-bpe");
    let path = write(&dir, "data.jsonl", &two_sources(40));
    let cfg = labelled_config(&path, &dir.0.join("cache"));
    let loaded = load_labelled_text(&cfg).unwrap();
    assert_eq!((loaded.train.len(), loaded.eval.len()), (30, 10));
    assert_eq!(
        loaded.classes.names.as_deref().unwrap(),
        ["shakespeare", "sotu"]
    );
    // The held-out lines are dataset = "text"'s.
    let docs = read_documents(&path, "text").unwrap();
    let held = held_out(&docs.docs, 0.25).unwrap();
    let eval_labels: Vec<i64> = held
        .iter()
        .map(|&i| if i % 2 == 0 { 0 } else { 1 })
        .collect();
    assert_eq!(loaded.eval.labels(), eval_labels);
    // The BPE has none of the four: they follow its vocabulary.
    let s = loaded.specials;
    let tokenizer = TextTokenizer::load(&loaded.tokenizer_path).unwrap();
    let v = tokenizer.vocab_size() as u32;
    assert_eq!((s.pad, s.cls, s.sep, s.mask), (v, v + 1, v + 2, v + 3));
    assert_eq!(s.vocab_size, v as usize + 4);
    assert_eq!(s.eos, Some(tokenizer.eos_id()));
    // The tokenizer sits in the folder dataset = "text" uses for the same source and split.
    let own = cfg.text.clone();
    let (_, folder) = cache_folder(&docs, EvalSplit::Fraction(0.25), &own).unwrap();
    assert_eq!(loaded.tokenizer_path.parent().unwrap(), folder);
    // Samples decode back to their text between [CLS] and [SEP].
    let (mut input, mut mask) = (Vec::new(), Vec::new());
    let first = (0..40).find(|i| !held.contains(i)).unwrap();
    let class = loaded
        .train
        .write(0, &mut input, &mut mask, &mut Vec::new());
    assert_eq!(class, (first % 2) as i64);
    assert_eq!(input[0], i64::from(s.cls));
    let real = mask.iter().filter(|&&m| m == 1).count();
    assert_eq!(input[real - 1], i64::from(s.sep));
    assert!(input[real..].iter().all(|&t| t == i64::from(s.pad)));
    let ids: Vec<u32> = input[1..real - 1].iter().map(|&t| t as u32).collect();
    let line = two_sources(40).lines().nth(first).unwrap().to_owned();
    let text: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        tokenizer.decode(&ids).unwrap(),
        text["text"].as_str().unwrap()
    );
    // A second load trains nothing new: the same file.
    let again = load_labelled_text(&cfg).unwrap();
    assert_eq!(again.tokenizer_sha256, loaded.tokenizer_sha256);
}

/// A word-level `tokenizer.json` with BERT's special tokens (ids 0..4) and a few words.
fn bert_like_tokenizer(dir: &TempDir) -> PathBuf {
    let vocab = serde_json::json!({
        "[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4,
        "thou": 5, "art": 6, "the": 7, "economy": 8, "union": 9
    });
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, PAD_TOKEN), special(1, "[UNK]"), special(2, CLS_TOKEN),
            special(3, SEP_TOKEN), special(4, MASK_TOKEN)],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    write(dir, "bert/tokenizer.json", &json.to_string())
}

#[test]
fn a_tokenizer_with_the_special_tokens_keeps_their_ids() {
    let dir = TempDir::new("labelled-bert");
    let path = write(
        &dir,
        "data.jsonl",
        "{\"text\": \"thou art\", \"label\": 1}\n{\"text\": \"the economy\", \"label\": 0}\n",
    );
    let eval = write(
        &dir,
        "eval.jsonl",
        "{\"text\": \"the union thou\", \"label\": 0}\n",
    );
    let mut cfg = labelled_config(&path, &dir.0.join("cache"));
    cfg.text.tokenizer = Some(bert_like_tokenizer(&dir));
    cfg.text.eval_path = Some(eval);
    cfg.seq_len = 6;
    cfg.eval_seq_len = 4;
    let loaded = load_labelled_text(&cfg).unwrap();
    let s = loaded.specials;
    assert_eq!((s.pad, s.cls, s.sep, s.mask), (0, 2, 3, 4));
    assert_eq!(s.vocab_size, 10);
    // [SEP] is the end-of-document token of a BERT tokenizer.
    assert_eq!(s.eos, Some(3));
    assert_eq!((loaded.classes.count, loaded.classes.names), (2, None));
    let (mut input, mut mask) = (Vec::new(), Vec::new());
    assert_eq!(
        loaded
            .train
            .write(0, &mut input, &mut mask, &mut Vec::new()),
        1
    );
    assert_eq!(input, [2, 5, 6, 3, 0, 0]);
    assert_eq!(mask, [1, 1, 1, 1, 0, 0]);
    let (mut input, mut mask) = (Vec::new(), Vec::new());
    loaded.eval.write(0, &mut input, &mut mask, &mut Vec::new());
    assert_eq!(input, [2, 7, 9, 3], "truncated to eval_seq_len");
    // Nothing was trained: no cache folder.
    assert!(!dir.0.join("cache").exists());
}

/// The set shipped for the example (`scripts/make_labelled_text.py`) reads, balanced, with the
/// two sources as classes.
#[test]
fn the_example_set_loads() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/finetune/labelled-text");
    let dir = TempDir::new("labelled-example");
    let mut cfg = labelled_config(&data.join("train.jsonl"), &dir.0);
    cfg.text.eval_path = Some(data.join("eval.jsonl"));
    cfg.text.vocab_size = 512;
    (cfg.seq_len, cfg.eval_seq_len) = (128, 128);
    let loaded = load_labelled_text(&cfg).unwrap();
    assert_eq!((loaded.train.len(), loaded.eval.len()), (240, 80));
    assert_eq!(
        loaded.classes.names.as_deref().unwrap(),
        ["shakespeare", "sotu"]
    );
    for (set, per_class) in [(&loaded.train, 120), (&loaded.eval, 40)] {
        assert_eq!(set.labels().iter().filter(|&&c| c == 0).count(), per_class);
        assert_eq!(set.truncated(), 0, "128 tokens hold every sentence");
    }
    assert_eq!(loaded.specials.vocab_size, 512 + 4);
}
