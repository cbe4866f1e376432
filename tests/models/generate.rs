//! `tessera generate` (docs/generate.md): greedy generation equals transformers'
//! `model.generate(do_sample=False)` token for token on tiny random llama (grouped-query) and
//! gpt2 folders made by `scripts/generate_reference.py`, whether the prompts run as one
//! left-padded batch, one at a time, or recomputing whole sequences without the kv cache; a run's
//! checkpoint generates with its tokenizer (batched = alone = recomputed, seeded draws repeat,
//! stop strings cut, the streamed text is the completion, its `--format hf` export generates the
//! same); plugin surgery generates as trained (a wrapped head through the kv cache, a replaced
//! attention by recomputing, said once); mistakes are errors naming the file, prompt or option.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera_tests::*;

/// `tessera generate SOURCE ARGS...` run in `dir`.
fn generate(dir: &TempDir, source: &Path, args: &[&str]) -> Output {
    let source = source.to_str().expect("a UTF-8 temp path");
    let mut all = vec!["generate", source];
    all.extend_from_slice(args);
    tessera(&all, dir.path(), &[])
}

/// The JSON lines of a successful `--json` run.
fn lines(out: &Output) -> Vec<Value> {
    out.assert_success();
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}\n{}", out.dump())))
        .collect()
}

/// Each line's `key` as ids.
fn ids(lines: &[Value], key: &str) -> Vec<Vec<i64>> {
    lines
        .iter()
        .map(|l| {
            l[key]
                .as_array()
                .unwrap_or_else(|| panic!("no `{key}` in {l}"))
                .iter()
                .map(|v| v.as_i64().expect("an id"))
                .collect()
        })
        .collect()
}

/// The reference folder of `variant`; `None` (with a notice) without transformers.
fn reference(dir: &TempDir, variant: &str) -> Option<PathBuf> {
    if !transformers_imports() {
        return None;
    }
    let out = dir.join(variant);
    let run = python_with_env(
        &[
            "scripts/generate_reference.py",
            variant,
            out.to_str().expect("a UTF-8 temp path"),
        ],
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    Some(out)
}

#[test]
fn greedy_generation_equals_transformers_batched_alone_and_recomputed() {
    let dir = TempDir::new("generate-parity");
    for variant in ["llama", "gpt2"] {
        let Some(out) = reference(&dir, variant) else {
            return;
        };
        let expected = read_json(&out.join("expected.json"));
        let want_prompts: Vec<Vec<i64>> = expected["prompt_ids"]
            .as_array()
            .expect("prompt_ids")
            .iter()
            .map(|p| serde_json::from_value(p.clone()).expect("ids"))
            .collect();
        let want: Vec<Vec<i64>> =
            serde_json::from_value(expected["generated"].clone()).expect("the generated ids");
        let prompts = out.join("prompts.jsonl");
        let prompts = prompts.to_str().expect("a UTF-8 temp path");
        for (how, extra, says) in [
            ("one batch", &[][..], "kv cache"),
            ("one at a time", &["--batch-size", "1"][..], "kv cache"),
            ("recomputed", &["--no-kv-cache"][..], "recomputed"),
        ] {
            let mut args = vec!["--prompts", prompts, "--json", "--max-new-tokens", "24"];
            args.extend_from_slice(extra);
            let run = generate(&dir, &out.join("model"), &args);
            let got = lines(&run);
            assert_eq!(ids(&got, "prompt_ids"), want_prompts, "{variant} {how}");
            assert_eq!(ids(&got, "ids"), want, "{variant} {how}: {}", run.dump());
            assert!(run.stderr.contains(says), "{variant} {how}: {}", run.dump());
        }
        println!(
            "{variant}: {} prompts as transformers generates them",
            want.len()
        );
    }
}

/// A tiny llama (or gpt2: `model`) trained 20 batches on the user's own text with a BPE of 300,
/// with `algorithms` (`[[algorithms]]` bodies); the path of its last checkpoint.
fn trained(dir: &TempDir, run: &str, model: &str, algorithms: &[&str]) -> PathBuf {
    let texts = dir.join("texts");
    std::fs::create_dir_all(&texts).expect("texts folder");
    for (i, doc) in word_documents(20).iter().enumerate() {
        std::fs::write(texts.join(format!("doc-{i:02}.txt")), doc).expect("a text file");
    }
    let mut toml = TrainerToml::gpt(run);
    toml.model = model.to_owned();
    toml.optimizer = "name = \"adamw\"\nlr = 0.01".to_owned();
    toml.max_duration = "20ba".to_owned();
    toml.data = format!(
        "dataset = \"text\"\ndata_dir = '{}'\nbatch_size = 8\neval_batch_size = 16\n\
         workers = 0\n\n[data.text]\nseq_len = 32\nvocab_size = 300\ncache_dir = '{}'\n",
        texts.display(),
        dir.join("cache").display()
    );
    for a in algorithms {
        toml.algorithms.push((*a).to_owned());
    }
    toml.write_to(dir);
    train(dir, &[], &[]).assert_success();
    run_dir(dir, run).join("checkpoints").join("latest.ckpt")
}

const TINY_LLAMA: &str = "name = \"llama\"\nnum_hidden_layers = 2\nhidden_size = 32\n\
                          intermediate_size = 64\nnum_attention_heads = 4\n\
                          num_key_value_heads = 2\nmax_position_embeddings = 64";

const PROMPTS: [&str; 3] = ["the river", "a boat sails under grey sky while", "dawn"];

/// `--prompt` for each of `prompts`, then `extra`.
fn prompt_args<'a>(prompts: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = Vec::new();
    for p in prompts {
        args.extend(["--prompt", p]);
    }
    args.extend_from_slice(extra);
    args
}

#[test]
fn a_trained_llama_checkpoint_generates_with_its_tokenizer() {
    let dir = TempDir::new("generate-llama-run");
    let ckpt = trained(&dir, "tiny-llama", TINY_LLAMA, &[]);
    let json = |extra: &[&str]| {
        let mut args = prompt_args(&PROMPTS, &["--json", "--max-new-tokens", "16"]);
        args.extend_from_slice(extra);
        lines(&generate(&dir, &ckpt, &args))
    };
    // Greedy: one batch = one at a time = recomputed.
    let batched = json(&[]);
    assert_eq!(batched.len(), 3);
    for extra in [&["--batch-size", "1"][..], &["--no-kv-cache"][..]] {
        assert_eq!(ids(&json(extra), "ids"), ids(&batched, "ids"), "{extra:?}");
    }
    for (line, prompt) in batched.iter().zip(PROMPTS) {
        assert_eq!(line["prompt"], prompt);
        assert!(line["completion"].is_string(), "{line}");
        assert!(["length", "eos"].contains(&line["finish"].as_str().unwrap_or("")));
    }
    // Seeded draws repeat; another seed draws otherwise; a prompt draws the same alone.
    let drawn = |seed: &str, extra: &[&str]| {
        let mut args = vec!["--temperature", "1.0", "--top-p", "0.95", "--seed", seed];
        args.extend_from_slice(extra);
        ids(&json(&args), "ids")
    };
    let a = drawn("5", &[]);
    assert_eq!(a, drawn("5", &[]));
    assert_eq!(a, drawn("5", &["--batch-size", "1"]));
    assert_ne!(a, drawn("6", &[]));
    // A stop string cuts the text before it; the streamed text is the same completion.
    let full = batched[0]["completion"].as_str().expect("text").to_owned();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 4, "{full:?}");
    let stop: String = chars[2..4].iter().collect();
    let cut = &full[..full.find(&stop).expect("the stop occurs")];
    let stopped = lines(&generate(
        &dir,
        &ckpt,
        &[
            "--prompt",
            PROMPTS[0],
            "--json",
            "--max-new-tokens",
            "16",
            "--stop",
            &stop,
        ],
    ));
    assert_eq!(stopped[0]["completion"], cut, "stop {stop:?} in {full:?}");
    assert_eq!(stopped[0]["finish"], "stop");
    let streamed = generate(
        &dir,
        &ckpt,
        &[
            "--prompt",
            PROMPTS[0],
            "--max-new-tokens",
            "16",
            "--stop",
            &stop,
        ],
    );
    streamed.assert_success();
    assert_eq!(streamed.stdout, format!("{}{cut}\n", PROMPTS[0]));
    // The run exported as a Hugging Face folder generates the same tokens (its tokenizer was
    // trained into the data cache, which `--format hf` does not copy: the prompts go as ids).
    let hf = dir.join("hf");
    tessera(
        &[
            "export",
            ckpt.to_str().expect("UTF-8"),
            "--to",
            hf.to_str().expect("UTF-8"),
            "--format",
            "hf",
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    let prompt_ids: Vec<String> = ids(&batched, "prompt_ids")
        .iter()
        .map(|p| format!("{p:?}").trim_matches(['[', ']']).to_owned())
        .collect();
    let mut args = vec!["--json", "--max-new-tokens", "16"];
    for p in &prompt_ids {
        args.extend(["--prompt-ids", p.as_str()]);
    }
    assert_eq!(
        ids(&lines(&generate(&dir, &hf, &args)), "ids"),
        ids(&batched, "ids")
    );
    // A prompt longer than the context (64 tokens) is refused before anything runs.
    let long = "the river runs to the sea ".repeat(30);
    generate(&dir, &ckpt, &["--prompt", "dawn", "--prompt", &long])
        .assert_failure(&["prompt 2 has", "the model's context is 64"]);
    // Generation stops at the context.
    let long = lines(&generate(
        &dir,
        &ckpt,
        &["--prompt", PROMPTS[1], "--json", "--max-new-tokens", "100"],
    ));
    let total = ids(&long, "prompt_ids")[0].len() + ids(&long, "ids")[0].len();
    assert!(
        long[0]["finish"] == "context" && total == 64 || long[0]["finish"] == "eos",
        "{}",
        long[0]
    );
}

#[test]
fn plugin_surgery_generates_as_trained() {
    let dir = TempDir::new("generate-plugins");
    let runs = [
        // A wrapped head (position-wise): incremental decoding goes through the wrapper.
        ("softcap", "plugin = \"logit_softcap\"", "kv cache"),
        // A replaced attention: whole sequences are recomputed, said once.
        (
            "rotary",
            "plugin = \"rotary\"",
            "cannot decode incrementally",
        ),
    ];
    for (run, algorithm, says) in runs {
        let ckpt = trained(&dir, run, TINY_GPT, &[algorithm]);
        let args = prompt_args(&PROMPTS, &["--json", "--max-new-tokens", "12"]);
        let cached = generate(&dir, &ckpt, &args);
        assert!(cached.stderr.contains(says), "{run}: {}", cached.dump());
        assert_eq!(
            cached.stderr.matches("cannot decode incrementally").count(),
            usize::from(run == "rotary") * 2,
            "said once (and in the summary): {}",
            cached.dump()
        );
        let mut args = args.clone();
        args.push("--no-kv-cache");
        let recomputed = generate(&dir, &ckpt, &args);
        assert_eq!(
            ids(&lines(&cached), "ids"),
            ids(&lines(&recomputed), "ids"),
            "{run}"
        );
    }
}

#[test]
fn mistakes_are_errors_naming_what_is_wrong() {
    let dir = TempDir::new("generate-errors");
    let missing = dir.join("nowhere.ckpt");
    generate(&dir, &missing, &["--prompt", "a"]).assert_failure(&["nowhere.ckpt", "no such file"]);
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).expect("a folder");
    generate(&dir, &empty, &["--prompt", "a"]).assert_failure(&["without a config.json"]);
    let bert = dir.join("bert");
    std::fs::create_dir_all(&bert).expect("a folder");
    std::fs::write(bert.join("config.json"), r#"{"model_type": "bert"}"#).expect("config");
    generate(&dir, &bert, &["--prompt", "a"]).assert_failure(&["\"bert\"", "gpt2"]);
    // A run on synthetic text: no tokenizer, ids only.
    TrainerToml::gpt("synthetic").write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let ckpt = run_dir(&dir, "synthetic").join("checkpoints/latest.ckpt");
    generate(&dir, &ckpt, &["--prompt", "a"]).assert_failure(&["no tokenizer", "--prompt-ids"]);
    let by_ids = lines(&generate(
        &dir,
        &ckpt,
        &["--prompt-ids", "1 2 3", "--json", "--max-new-tokens", "5"],
    ));
    assert_eq!(ids(&by_ids, "ids")[0].len(), 5);
    generate(&dir, &ckpt, &["--prompt-ids", "1 99"]).assert_failure(&["token id 99"]);
    generate(&dir, &ckpt, &["--prompt-ids", "1 x"]).assert_failure(&["--prompt-ids"]);
    generate(&dir, &ckpt, &[]).assert_failure(&["no prompt given"]);
    generate(&dir, &ckpt, &["--prompt-ids", "1", "--top-p", "2"]).assert_failure(&["--top-p"]);
    let file = dir.write("prompts.jsonl", "{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n");
    let file = file.to_str().expect("UTF-8");
    generate(&dir, &ckpt, &["--prompts", file]).assert_failure(&["prompts.jsonl:2", "\"prompt\""]);
    // Not a language model.
    let mut toml = TrainerToml::new("classifier");
    toml.data = synthetic_rgb_data(64);
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_success();
    let ckpt = run_dir(&dir, "classifier").join("checkpoints/latest.ckpt");
    generate(&dir, &ckpt, &["--prompt-ids", "1"])
        .assert_failure(&["is not a causal language model"]);
}
