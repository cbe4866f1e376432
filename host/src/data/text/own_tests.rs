//! Unit tests of `own`: the document readers, the content hash, the held-out split and the token
//! cache of the user's own text.
use std::fs;
use std::path::Path;

use super::*;
use crate::data::idx::tests::TempDir;
use crate::data::text::cache::{token_cache_dir, TOKEN_MANIFEST};

/// Writes `files` (relative path, contents) under `root`.
fn write_files(root: &Path, files: &[(&str, &str)]) {
    for (name, body) in files {
        let path = root.join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, body).unwrap();
    }
}

/// `n` documents of repeated words (so a BPE has merges to learn), each a little different.
fn essays(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let mut text = String::new();
            for j in 0..30 {
                text.push_str(&format!(
                    "Essay {i}, paragraph {j}: the river runs to the sea and the sea runs \
                     to the sky. "
                ));
            }
            (format!("essay-{i:02}.txt"), text)
        })
        .collect()
}

fn folder_of_essays(dir: &TempDir, n: usize) -> std::path::PathBuf {
    let root = dir.0.join("essays");
    for (name, text) in essays(n) {
        write_files(&root, &[(&name, &text)]);
    }
    root
}

fn config(path: &Path, cache: &Path) -> OwnTextConfig {
    OwnTextConfig {
        path: path.to_path_buf(),
        eval_path: None,
        eval_fraction: 0.2,
        text_field: "text".to_owned(),
        vocab_size: 300,
        tokenizer: None,
        cache_dir: cache.to_path_buf(),
    }
}

fn names(docs: &Documents) -> Vec<&str> {
    docs.docs.iter().map(|d| d.name.as_str()).collect()
}

#[test]
fn a_folder_is_read_file_by_file_in_path_order_skipping_hidden_and_other_files() {
    let dir = TempDir::new("own-folder");
    write_files(
        &dir.0,
        &[
            ("b.txt", "bee"),
            ("a.txt", "ay"),
            ("sub/c.txt", "sea"),
            ("sub/d.jsonl", "{\"text\": \"dee\"}\n\n{\"text\": \"e\"}\n"),
            ("notes.md", "not text"),
            (".hidden.txt", "hidden"),
            (".git/e.txt", "hidden folder"),
        ],
    );
    // A link to a folder (here a cycle) is skipped; a link to a file is read.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&dir.0, dir.0.join("sub/loop")).unwrap();
        std::os::unix::fs::symlink(dir.0.join("a.txt"), dir.0.join("sub/link.txt")).unwrap();
    }
    let docs = read_documents(&dir.0, "text").unwrap();
    #[cfg(unix)]
    assert!(docs
        .docs
        .iter()
        .any(|d| d.name == "sub/link.txt" && d.text == "ay"));
    #[cfg(unix)]
    fs::remove_file(dir.0.join("sub/link.txt")).unwrap();
    let docs = read_documents(&dir.0, "text").unwrap();
    assert_eq!(
        names(&docs),
        [
            "a.txt",
            "b.txt",
            "sub/c.txt",
            "sub/d.jsonl:1",
            "sub/d.jsonl:3"
        ]
    );
    let texts: Vec<&str> = docs.docs.iter().map(|d| d.text.as_str()).collect();
    assert_eq!(texts, ["ay", "bee", "sea", "dee", "e"]);
    // One file is a source too.
    let one = read_documents(&dir.0.join("sub/d.jsonl"), "text").unwrap();
    assert_eq!(names(&one), ["d.jsonl:1", "d.jsonl:3"]);
    // Empty, wrong kind, not UTF-8: named.
    let empty = TempDir::new("own-empty");
    let msg = read_documents(&empty.0, "text").unwrap_err().to_string();
    assert!(
        msg.contains(&empty.0.display().to_string()) && msg.contains("no .txt"),
        "{msg}"
    );
    let msg = read_documents(&dir.0.join("notes.md"), "text")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("notes.md") && msg.contains("neither"), "{msg}");
    fs::write(dir.0.join("b.txt"), b"ok \xff bad").unwrap();
    let msg = read_documents(&dir.0, "text").unwrap_err().to_string();
    assert!(
        msg.contains("b.txt") && msg.contains("not UTF-8") && msg.contains("offset 3"),
        "{msg}"
    );
    let missing = read_documents(&dir.0.join("nope"), "text").unwrap_err();
    assert!(missing.to_string().contains("nope"), "{missing}");
}

#[test]
fn jsonl_errors_name_the_file_and_the_line() {
    let path = Path::new("data/corpus.jsonl");
    let parse = |body: &str, field: &str| parse_jsonl(path, "corpus.jsonl", body.as_bytes(), field);
    let docs = parse(
        "{\"text\": \"one\", \"id\": 1}\r\n\n  \n{\"body\": \"x\", \"text\": \"two\"}",
        "text",
    )
    .unwrap();
    assert_eq!(
        docs,
        [
            Document {
                name: "corpus.jsonl:1".into(),
                text: "one".into()
            },
            Document {
                name: "corpus.jsonl:4".into(),
                text: "two".into()
            }
        ]
    );
    assert_eq!(parse("{\"body\": \"x\"}", "body").unwrap()[0].text, "x");
    let cases = [
        (
            "{\"text\": \"a\"}\n{\"text\": \"b\"\n",
            "line 2: is not valid JSON",
        ),
        (
            "{\"text\": \"a\"}\n\n[\"text\"]\n",
            "line 3: is not a JSON object",
        ),
        (
            "{\"body\": \"a\", \"id\": 2}\n",
            "line 1: has no field \"text\" (data.text.text_field); its fields: body, id",
        ),
        (
            "{\"text\": 5}\n",
            "line 1: field \"text\" is a number, not a string",
        ),
        ("{\"text\": null}\n", "line 1: field \"text\" is null"),
    ];
    for (body, want) in cases {
        let msg = parse(body, "text").unwrap_err().to_string();
        assert!(
            msg.contains("data/corpus.jsonl") && msg.contains(want),
            "{msg}"
        );
    }
    let msg = parse_jsonl(path, "corpus.jsonl", b"{\"text\": \"a\"}\n\"\xff\"", "text")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("line 2: is not UTF-8"), "{msg}");
}

#[test]
fn the_content_hash_changes_with_any_file_and_not_with_the_folder_s_place() {
    let dir = TempDir::new("own-hash");
    let root = folder_of_essays(&dir, 4);
    let base = read_documents(&root, "text").unwrap().sha256;
    assert_eq!(read_documents(&root, "text").unwrap().sha256, base);
    // One byte of one file.
    let file = root.join("essay-02.txt");
    let original = fs::read(&file).unwrap();
    let mut edited = original.clone();
    edited[10] ^= 1;
    fs::write(&file, &edited).unwrap();
    let changed = read_documents(&root, "text").unwrap().sha256;
    assert_ne!(changed, base);
    fs::write(&file, &original).unwrap();
    assert_eq!(read_documents(&root, "text").unwrap().sha256, base);
    // A renamed file (same bytes), an added file.
    fs::rename(&file, root.join("essay-99.txt")).unwrap();
    assert_ne!(read_documents(&root, "text").unwrap().sha256, base);
    fs::rename(root.join("essay-99.txt"), &file).unwrap();
    fs::write(root.join("extra.txt"), "more").unwrap();
    assert_ne!(read_documents(&root, "text").unwrap().sha256, base);
    fs::remove_file(root.join("extra.txt")).unwrap();
    // The same files elsewhere: the same hash.
    let moved = dir.0.join("moved");
    fs::rename(&root, &moved).unwrap();
    assert_eq!(read_documents(&moved, "text").unwrap().sha256, base);
}

#[test]
fn the_held_out_documents_are_a_fixed_sample_of_the_requested_share() {
    let docs: Vec<Document> = (0..100)
        .map(|i| Document {
            name: format!("doc-{i}.txt"),
            text: String::new(),
        })
        .collect();
    let held = held_out(&docs, 0.05).unwrap();
    assert_eq!(held.len(), 5);
    assert!(held.windows(2).all(|w| w[0] < w[1]), "{held:?}");
    assert_eq!(held_out(&docs, 0.05).unwrap(), held);
    // Not simply the first or last documents.
    assert_ne!(held, [0, 1, 2, 3, 4]);
    assert_ne!(held, [95, 96, 97, 98, 99]);
    // A document's rank is its name's: the same documents in another order are held out.
    let mut reversed = docs.clone();
    reversed.reverse();
    let mut again: Vec<usize> = held_out(&reversed, 0.05)
        .unwrap()
        .into_iter()
        .map(|i| 99 - i)
        .collect();
    again.sort_unstable();
    assert_eq!(again, held);
    // At least one, and at least one left to train on.
    assert_eq!(held_out(&docs[..3], 0.01).unwrap().len(), 1);
    assert_eq!(held_out(&docs[..3], 0.99).unwrap().len(), 2);
    let msg = held_out(&docs[..1], 0.5).unwrap_err().to_string();
    assert!(
        msg.contains("at least 2 documents") && msg.contains("eval_path"),
        "{msg}"
    );
}

#[test]
fn a_second_load_reads_the_cache_and_a_changed_file_makes_another() {
    let dir = TempDir::new("own-cache");
    let root = folder_of_essays(&dir, 10);
    let cache = dir.0.join("cache");
    let cfg = config(&root, &cache);
    let first = load_own_text(&cfg).unwrap();
    // 10 documents, 0.2 held out: 2 evaluation documents, each ending with the EOS id.
    let eos = first.eos_id;
    assert_eq!(first.val.iter().filter(|&&t| t == eos).count(), 2);
    assert_eq!(first.train.iter().filter(|&&t| t == eos).count(), 8);
    // The streams decode back to the documents.
    let tokenizer = first.tokenizer().unwrap();
    let all: Vec<String> = essays(10).into_iter().map(|(_, t)| t).collect();
    let decoded = tokenizer.decode(&first.val).unwrap();
    for doc in decoded.split(EOS_TOKEN).filter(|d| !d.is_empty()) {
        assert!(all.iter().any(|t| t == doc), "{doc:.40}");
    }

    let key_dirs = |cache: &Path| {
        let mut dirs: Vec<String> = fs::read_dir(cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("text-"))
            .collect();
        dirs.sort();
        dirs
    };
    let dirs = key_dirs(&cache);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let folder = cache.join(&dirs[0]);
    let tokens = token_cache_dir(&folder, &first.tokenizer_sha256);
    let manifest = tokens.join(TOKEN_MANIFEST);
    let stamp = fs::metadata(&manifest).unwrap().modified().unwrap();
    let bpe = fs::metadata(&first.tokenizer_path)
        .unwrap()
        .modified()
        .unwrap();
    let source = fs::read_to_string(folder.join(SOURCE_FILE)).unwrap();
    assert!(source.contains(&root.display().to_string()), "{source}");

    // The second load reads the cache: nothing rewritten, the same streams.
    let second = load_own_text(&cfg).unwrap();
    assert_eq!((&second.train, &second.val), (&first.train, &first.val));
    assert_eq!(fs::metadata(&manifest).unwrap().modified().unwrap(), stamp);
    assert_eq!(
        fs::metadata(&second.tokenizer_path)
            .unwrap()
            .modified()
            .unwrap(),
        bpe
    );

    // A changed file is another source: another cache folder, other streams.
    let file = root.join("essay-03.txt");
    fs::write(&file, "A new essay about the sea.").unwrap();
    let third = load_own_text(&cfg).unwrap();
    assert_eq!(key_dirs(&cache).len(), 2);
    assert_ne!((&third.train, &third.val), (&first.train, &first.val));
    // So is another held-out share or another evaluation source.
    let other = load_own_text(&OwnTextConfig {
        eval_fraction: 0.3,
        ..cfg.clone()
    })
    .unwrap();
    assert_eq!(other.val.iter().filter(|&&t| t == other.eos_id).count(), 3);
    assert_eq!(key_dirs(&cache).len(), 3);
}

#[test]
fn a_damaged_token_cache_is_refused_by_name_until_its_folder_is_deleted() {
    let dir = TempDir::new("own-damaged");
    let root = folder_of_essays(&dir, 6);
    let cache = dir.0.join("cache");
    let cfg = config(&root, &cache);
    let good = load_own_text(&cfg).unwrap();
    let tokens = fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("text-"))
        })
        .map(|p| token_cache_dir(&p, &good.tokenizer_sha256))
        .unwrap();
    let train = tokens.join("train.u16");
    let bytes = fs::read(&train).unwrap();

    let refused = |want: &[&str]| {
        let msg = load_own_text(&cfg).unwrap_err().to_string();
        for w in want {
            assert!(msg.contains(w), "{w:?} not in: {msg}");
        }
        assert!(
            msg.contains(&tokens.display().to_string()) && msg.contains("delete that folder"),
            "{msg}"
        );
    };
    // Other bytes, same length.
    let mut flipped = bytes.clone();
    flipped[4] ^= 0x10;
    fs::write(&train, &flipped).unwrap();
    refused(&["train.u16 is damaged"]);
    // Truncated (a wrong length).
    fs::write(&train, &bytes[..bytes.len() - 3]).unwrap();
    refused(&["train.u16 has", "truncated or corrupt"]);
    // A bad header: the manifest lost its lines.
    fs::write(&train, &bytes).unwrap();
    assert!(load_own_text(&cfg).is_ok());
    let manifest = tokens.join(TOKEN_MANIFEST);
    fs::write(&manifest, "garbage\n").unwrap();
    refused(&["MANIFEST has no `corpus` line"]);
    fs::remove_file(&manifest).unwrap();
    refused(&["MANIFEST"]);
    // Deleting the folder, as the message says, encodes again: the same streams.
    fs::remove_dir_all(&tokens).unwrap();
    let again = load_own_text(&cfg).unwrap();
    assert_eq!((again.train, again.val), (good.train, good.val));
}

#[test]
fn an_evaluation_source_and_documents_from_any_reader_tokenize_alike() {
    let dir = TempDir::new("own-eval");
    let root = folder_of_essays(&dir, 5);
    let eval_file = dir.0.join("eval.jsonl");
    let lines: Vec<String> = essays(7)[5..]
        .iter()
        .map(|(_, t)| serde_json::json!({ "text": t, "id": 1 }).to_string())
        .collect();
    fs::write(&eval_file, lines.join("\n")).unwrap();
    let cache = dir.0.join("cache");
    let cfg = OwnTextConfig {
        eval_path: Some(eval_file.clone()),
        ..config(&root, &cache)
    };
    let loaded = load_own_text(&cfg).unwrap();
    let tokenizer = loaded.tokenizer().unwrap();
    // All 5 files train; the 2 lines evaluate.
    assert_eq!(
        loaded.train.iter().filter(|&&t| t == loaded.eos_id).count(),
        5
    );
    let mut want = Vec::new();
    for (_, text) in &essays(7)[5..] {
        want.extend(tokenizer.encode(text).unwrap());
        want.push(loaded.eos_id);
    }
    assert_eq!(loaded.val, want);

    // The seam: the same documents from an iterator, with the same hashes, hit the same cache.
    let train = read_documents(&root, "text").unwrap();
    let eval = read_documents(&eval_file, "text").unwrap();
    let from_reader = Documents::collect(
        train.docs.iter().cloned().map(Ok),
        train.sha256.clone(),
        "an iterator".to_owned(),
    )
    .unwrap();
    let again = tokenize_documents(&from_reader, EvalSplit::Given(&eval), &cfg).unwrap();
    assert_eq!((again.train, again.val), (loaded.train, loaded.val));
    // A reader's error stops the collection.
    let failed = Documents::collect(
        [Err(DataError::Invalid("shard 3 is corrupt".into()))],
        String::new(),
        String::new(),
    );
    assert!(failed.is_err());
}

/// Packs `train` and `val` documents as text shards of `format` under `dir/name`, a few
/// documents per shard.
fn pack_text(
    dir: &Path,
    name: &str,
    format: crate::data::ShardFormat,
    compression: Option<&str>,
    train: Vec<String>,
    val: Vec<String>,
) -> std::path::PathBuf {
    use crate::data::shards::pack::{pack, PackOptions, PackSource, PixelEncoding};
    let dst = dir.join(name);
    let options = PackOptions {
        format,
        compression: compression.map(str::to_owned),
        shard_size: 8_000,
        pixels: PixelEncoding::Png,
    };
    let summary = pack(&PackSource::Text(train, val), &dst, &options).unwrap();
    assert!(summary.shards[0] > 1, "{summary:?}");
    dst
}

#[test]
fn mds_and_webdataset_text_shards_read_as_the_documents_packed() {
    use crate::data::ShardFormat;
    let dir = TempDir::new("own-shards");
    let texts: Vec<String> = essays(9).into_iter().map(|(_, t)| t).collect();
    let (train, val) = (texts[..7].to_vec(), texts[7..].to_vec());
    let mut hashes = Vec::new();
    for (name, format, compression) in [
        ("mds", ShardFormat::Mds, None),
        ("mds-zstd", ShardFormat::Mds, Some("zstd:3")),
        ("wds", ShardFormat::Wds, None),
    ] {
        let root = pack_text(
            &dir.0,
            name,
            format,
            compression,
            train.clone(),
            val.clone(),
        );
        let docs = read_documents(&root.join("train"), "text").unwrap();
        let got: Vec<&str> = docs.docs.iter().map(|d| d.text.as_str()).collect();
        assert_eq!(
            got,
            train.iter().map(String::as_str).collect::<Vec<_>>(),
            "{name}"
        );
        // Names say the shard and the sample, and are distinct (they rank the held-out split).
        let mut unique = names(&docs);
        unique.dedup();
        assert_eq!(unique.len(), train.len(), "{name}: {:?}", names(&docs));
        assert!(docs.docs[0].name.starts_with("shard"), "{:?}", docs.docs[0]);
        let eval = read_documents(&root.join("val"), "text").unwrap();
        assert_eq!(eval.docs.len(), 2, "{name}");
        // The same bytes hash alike wherever they lie; any changed byte hashes otherwise.
        let moved = dir.0.join(format!("{name}-moved"));
        fs::rename(&root, &moved).unwrap();
        let again = read_documents(&moved.join("train"), "text").unwrap();
        assert_eq!(again.sha256, docs.sha256, "{name}");
        hashes.push(docs.sha256.clone());
        if format == ShardFormat::Wds {
            // A tar file on its own is a source too.
            let first = wds_first_shard(&moved.join("train"));
            let one = read_documents(&first, "text").unwrap();
            assert_eq!(one.docs[0].text, train[0]);
        }
    }
    hashes.sort();
    hashes.dedup();
    assert_eq!(hashes.len(), 3, "three encodings of the text hash apart");

    // Training on shards and on the same documents as .txt files gives the same token streams
    // (another cache folder: the source hash differs).
    let folder = dir.0.join("folder");
    for (i, t) in texts.iter().enumerate() {
        write_files(&folder, &[(&format!("d{i}.txt"), t)]);
    }
    let root = dir.0.join("mds-moved");
    let cache = dir.0.join("cache");
    let from_shards = load_own_text(&OwnTextConfig {
        eval_path: Some(root.join("val")),
        ..config(&root.join("train"), &cache)
    })
    .unwrap();
    let train_only = dir.0.join("train-only");
    let eval_only = dir.0.join("eval-only");
    for (i, t) in texts.iter().enumerate() {
        let to = if i < 7 { &train_only } else { &eval_only };
        write_files(to, &[(&format!("d{i}.txt"), t)]);
    }
    let from_files = load_own_text(&OwnTextConfig {
        eval_path: Some(eval_only),
        ..config(&train_only, &cache)
    })
    .unwrap();
    assert_eq!(
        (&from_shards.train, &from_shards.val),
        (&from_files.train, &from_files.val)
    );
    assert_eq!(fs::read_dir(&cache).unwrap().count(), 2);

    // A changed byte in a shard changes the hash.
    let shard = root.join("train").join("shard.00000.mds");
    let mut bytes = fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    fs::write(&shard, &bytes).unwrap();
    let changed = read_documents(&root.join("train"), "text").unwrap();
    assert!(!hashes.contains(&changed.sha256));
}

fn wds_first_shard(dir: &Path) -> std::path::PathBuf {
    let mut tars: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "tar"))
        .collect();
    tars.sort();
    tars.remove(0)
}

#[test]
fn shard_text_errors_name_the_column_or_sample() {
    use crate::data::shards::{mds, wds};
    let dir = TempDir::new("own-shard-errors");
    // An MDS folder without the configured column lists the columns it has.
    let body = dir.0.join("body");
    fs::create_dir_all(&body).unwrap();
    let mut w = mds::Writer::new(
        &body,
        vec![
            ("body".to_owned(), mds::Encoding::Str),
            ("id".to_owned(), mds::Encoding::Int),
        ],
        None,
        1 << 20,
    )
    .unwrap();
    w.write(&[b"hello".to_vec(), 7i64.to_le_bytes().to_vec()])
        .unwrap();
    w.finish().unwrap();
    let err = read_documents(&body, "text").unwrap_err().to_string();
    assert!(err.contains("index.json"), "{err}");
    assert!(err.contains("no column \"text\""), "{err}");
    assert!(err.contains("body (str), id (int)"), "{err}");
    // With text_field naming it, the column reads.
    let docs = read_documents(&body, "body").unwrap();
    assert_eq!(docs.docs[0].text, "hello");
    // A column that is not `str` is refused with its encoding.
    let err = read_documents(&body, "id").unwrap_err().to_string();
    assert!(err.contains("column \"id\" has encoding `int`"), "{err}");

    // A WebDataset sample without a .txt member names its key and fields.
    let tars = dir.0.join("tars");
    fs::create_dir_all(&tars).unwrap();
    let mut w = wds::Writer::new(&tars, "shard", 1 << 20);
    w.write("a", &[("txt", b"first")]).unwrap();
    w.write("b", &[("json", b"{}"), ("cls", b"1")]).unwrap();
    w.finish().unwrap();
    let err = read_documents(&tars, "text").unwrap_err().to_string();
    assert!(err.contains("sample `b`"), "{err}");
    assert!(err.contains("has no .txt member"), "{err}");
    assert!(err.contains("json, cls"), "{err}");
}
