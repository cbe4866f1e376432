//! `dataset = "chat"`: instruction data for a language model. Chat templates render and
//! tokenize as transformers' `apply_chat_template` does (a tokenizer made here with two templates
//! in the forms models ship them: `scripts/chat_reference.py`); a llama trains on conversations
//! with the loss on the assistant's tokens, padded or packed; microbatches of unequal scored
//! token counts train as the whole batch; bad lines are errors naming the file and the line.

use serde_json::Value;
use tessera::data::text::chat::{ChatTemplate, Message};
use tessera::data::TextTokenizer;
use tessera_tests::{
    python_with_env, read_jsonl, run_dir, train, train_losses, transformers_imports, TempDir,
    TrainerToml,
};

#[test]
fn templates_render_and_tokenize_as_transformers_apply_chat_template() {
    if !transformers_imports() {
        return;
    }
    let dir = TempDir::new("chat-parity");
    let out = dir.path().join("reference");
    let out_s = out.display().to_string();
    let run = python_with_env(&["scripts/chat_reference.py", &out_s], &[])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("cases.json")).expect("cases.json"))
            .expect("cases.json parses");
    assert!(cases.len() >= 4);
    for case in &cases {
        let name = case["template"].as_str().expect("template");
        let tokenizer_path = out.join(name).join("tokenizer.json");
        let template = ChatTemplate::choose(None, Some(&tokenizer_path), "<|endoftext|>")
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            template.origin.ends_with("tokenizer_config.json"),
            "{}",
            template.origin
        );
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| Message {
                role: m["role"].as_str().expect("role").to_owned(),
                content: m["content"].as_str().expect("content").to_owned(),
            })
            .collect();
        let text = template.render(&messages, false).expect("renders");
        assert_eq!(text, case["text"].as_str().expect("text"), "{name}");
        let prompt = template
            .render(&messages[..messages.len() - 1], true)
            .expect("renders");
        assert_eq!(prompt, case["prompt"].as_str().expect("prompt"), "{name}");
        let tokenizer = TextTokenizer::load(&tokenizer_path).expect("the tokenizer loads");
        let (ids, _) = tokenizer.encode_with_offsets(&text).expect("encodes");
        let want: Vec<u32> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("an id") as u32)
            .collect();
        assert_eq!(ids, want, "{name}: {text:?}");
    }
}

/// `n` small instruction lines: arithmetic questions and answers of varied lengths, some as
/// `prompt`/`completion`, some as multi-turn `messages`.
fn conversations(n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        let (a, b) = (i % 7 + 1, (i * 3) % 11 + 2);
        let line = if i % 3 == 0 {
            serde_json::json!({"messages": [
                {"role": "system", "content": "You add numbers."},
                {"role": "user", "content": format!("What is {a} plus {b}?")},
                {"role": "assistant", "content": format!("{a} plus {b} is {}.", a + b)},
                {"role": "user", "content": "And times two?"},
                {"role": "assistant", "content": format!("Twice that is {}.", 2 * (a + b))},
            ]})
        } else {
            serde_json::json!({
                "prompt": format!("Add {a} and {b}."),
                "completion": format!("{a} + {b} = {}", a + b) + &" Done.".repeat(i % 4),
            })
        };
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

fn chat_run(run: &str, text: &str) -> TrainerToml {
    let mut toml = TrainerToml::gpt(run);
    toml.model = "name = \"llama\"\nnum_hidden_layers = 2\nhidden_size = 32\n\
                  intermediate_size = 64\nnum_attention_heads = 4\nnum_key_value_heads = 2\n\
                  max_position_embeddings = 128"
        .to_owned();
    toml.data = format!(
        "dataset = \"chat\"\ndata_dir = \"train.jsonl\"\nbatch_size = 8\neval_batch_size = 8\n\
         workers = 0\n\n[data.text]\nseq_len = 64\nvocab_size = 300\neval_fraction = 0.1\n\
         cache_dir = \"tok-cache\"\n{text}"
    );
    toml.max_duration = "4ba".to_owned();
    toml
}

fn losses(dir: &TempDir, run: &str) -> Vec<f64> {
    train_losses(&read_jsonl(&run_dir(dir, run).join("metrics.jsonl")))
}

#[test]
fn a_llama_trains_on_conversations_padded_or_packed() {
    let dir = TempDir::new("chat-train");
    dir.write("train.jsonl", &conversations(60));
    for (run, text) in [
        ("assistant", ""),
        ("all", "loss_on = \"all\""),
        ("packed", "packing = true"),
        ("plain", "chat_template = \"plain\""),
    ] {
        dir.write("trainer.toml", &chat_run(run, text).render());
        let out = train(&dir, &[], &[]);
        out.assert_success();
        let log = format!("{}{}", out.stdout, out.stderr);
        assert!(
            log.contains("chat: 54 training and 6 evaluation conversations"),
            "{log}"
        );
        match run {
            "packed" => assert!(log.contains("(packed)"), "{log}"),
            "all" => assert!(log.contains("(every token)"), "{log}"),
            "plain" => assert!(log.contains("template plain"), "{log}"),
            _ => assert!(
                log.contains("template chatml")
                    && log.contains("one conversation each, padded")
                    && log.contains("(the assistant's tokens)"),
                "{log}"
            ),
        }
        let l = losses(&dir, run);
        assert_eq!(l.len(), 4, "{run}: {l:?}");
        assert!(l.iter().all(|x| x.is_finite()), "{run}: {l:?}");
    }
    // Scoring every token is another loss than scoring the answers.
    assert_ne!(losses(&dir, "assistant"), losses(&dir, "all"));
    // The evaluation reports a language model's loss over the scored tokens.
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir(&dir, "assistant").join("run.json")).expect("run.json"),
    )
    .expect("run.json parses");
    assert!(
        record["final_perplexity"]
            .as_f64()
            .is_some_and(f64::is_finite),
        "{record:#}"
    );
}

/// The HF Trainer's bug, checked absent: padded conversations score different numbers of
/// tokens per sequence; 4 microbatches of 2 weigh by their shares of the batch's scored tokens
/// and train as one pass of 8.
#[test]
fn microbatches_of_unequal_answer_lengths_train_as_the_whole_batch() {
    use tessera_tests::dist::max_difference;
    let dir = TempDir::new("chat-microbatch");
    dir.write("train.jsonl", &conversations(60));
    dir.write("trainer.toml", &chat_run("whole", "").render());
    for (run, microbatch) in [("whole", 8), ("split", 2)] {
        train(
            &dir,
            &[
                &format!("run_name={run}"),
                &format!("train.microbatch_size={microbatch}"),
                "checkpoint.interval=4ba",
            ],
            &[],
        )
        .assert_success();
    }
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir(&dir, "split").join("run.json")).expect("run.json"),
    )
    .expect("run.json parses");
    assert_eq!(record["microbatch_size"], 2, "{record:#}");
    let (whole, split) = (losses(&dir, "whole"), losses(&dir, "split"));
    assert_eq!(whole.len(), 4);
    for (a, b) in whole.iter().zip(&split) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{whole:?} vs {split:?}");
    }
    let ckpt = |run: &str| run_dir(&dir, run).join("checkpoints").join("ep0-ba4.ckpt");
    let (diff, name) = max_difference(&ckpt("whole"), &ckpt("split"), &["model/"]);
    println!("4 microbatches vs the whole batch: {diff:e} at `{name}`");
    assert!(diff <= 1e-4, "{diff:e} at `{name}`");
}

/// The same over ranks: 2 ranks of 4 padded conversations (unequal answer lengths on each)
/// weigh by their shares of the global batch's scored tokens, and train what one process of 8
/// trains (not the mean of the ranks' means).
#[test]
fn two_ranks_train_as_one_process_over_the_global_batch_tokens() {
    use tessera_tests::dist::{assert_all_succeeded, max_difference, train_ranks};
    let dir = TempDir::new("chat-ranks");
    dir.write("train.jsonl", &conversations(60));
    dir.write("trainer.toml", &chat_run("ranks", "").render());
    assert_all_succeeded(&train_ranks(
        &dir,
        2,
        &[
            "data.batch_size=4",
            "train.threads=1",
            "checkpoint.interval=4ba",
        ],
    ));
    train(
        &dir,
        &[
            "run_name=one",
            "data.batch_size=8",
            "train.threads=1",
            "checkpoint.interval=4ba",
        ],
        &[],
    )
    .assert_success();
    let (ranks, one) = (losses(&dir, "ranks"), losses(&dir, "one"));
    assert_eq!(ranks.len(), 4);
    for (a, b) in ranks.iter().zip(&one) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{ranks:?} vs {one:?}");
    }
    let ckpt = |run: &str| run_dir(&dir, run).join("checkpoints").join("ep0-ba4.ckpt");
    let (diff, name) = max_difference(&ckpt("ranks"), &ckpt("one"), &["model/"]);
    println!("2 ranks vs one process: {diff:e} at `{name}`");
    assert!(diff <= 1e-4, "{diff:e} at `{name}`");
}

#[test]
fn bad_conversations_are_errors_naming_the_file_and_line() {
    let dir = TempDir::new("chat-errors");
    let good = conversations(10);
    for (bad, want) in [
        (
            "{\"prompt\": \"a\"}",
            "line 11: has neither `messages` nor `prompt` and `completion`",
        ),
        (
            "{\"messages\": [{\"role\": \"user\", \"content\": 7}]}",
            "line 11: `messages[0].content` is a number",
        ),
        (
            "{\"messages\": [{\"role\": \"user\", \"content\": \"only a question\"}]}",
            "train.jsonl:11: the conversation has no assistant message",
        ),
    ] {
        dir.write("train.jsonl", &format!("{good}{bad}\n"));
        dir.write(
            "trainer.toml",
            &chat_run("bad", "eval_path = \"train.jsonl\"")
                .render()
                .replace("eval_fraction = 0.1\n", ""),
        );
        let out = train(&dir, &[], &[]);
        assert!(!out.status.success(), "{bad}: {}", out.dump());
        assert!(
            out.stderr.contains("train.jsonl") && out.stderr.contains(want),
            "{bad}: {}",
            out.stderr
        );
    }
}

/// examples/sft/run.sh in a copy (its data, runs and exports stay out of the checkout), cut to
/// two batches: dialogues made from the Shakespeare corpus, a SmolLM-sized llama fine-tuned
/// with LoRA, the adapters exported for PEFT, the merged model for transformers, a sample
/// generated from it.
#[test]
fn the_sft_example_runs_at_two_batches() {
    use tessera_tests::{repo_root, run_with_timeout, target_dir, tessera_bin};
    let dir = TempDir::new("sft-example");
    let copy = dir.path().join("examples").join("sft");
    std::fs::create_dir_all(&copy).expect("mkdir");
    let source = repo_root().join("examples").join("sft");
    for name in ["run.sh", "sft.toml", "make_dialogues.py", "README.md"] {
        std::fs::copy(source.join(name), copy.join(name)).expect("copy");
    }
    // The plugins of this build, wherever the copy is.
    let toml = std::fs::read_to_string(copy.join("sft.toml")).expect("sft.toml");
    let dirs = format!("dirs = [{:?}]", target_dir().display().to_string());
    assert!(toml.contains("dirs = [\"../../target/release\"]"));
    std::fs::write(
        copy.join("sft.toml"),
        toml.replace("dirs = [\"../../target/release\"]", &dirs),
    )
    .expect("write");
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(copy.join("run.sh"))
        .env("STEPS", "2")
        .env("TESSERA", tessera_bin())
        .env_remove("LD_LIBRARY_PATH")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = run_with_timeout(
        cmd,
        "examples/sft/run.sh",
        std::time::Duration::from_secs(900),
    );
    assert!(out.status.success(), "run.sh failed:\n{}", out.dump());
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("runs/sft-smollm-lora/run.json"))
            .expect("run.json"),
    )
    .expect("run.json parses");
    assert_eq!(record["batches"], 2, "{record:#}");
    let log = format!("{}{}", out.stdout, out.stderr);
    assert!(
        log.contains("lora: rank-8 adapters on 120 linear layers"),
        "{log}"
    );
    assert!(log.contains("generated 8 tokens for 1 prompt(s)"), "{log}");
    for file in [
        "out/adapter/adapter_config.json",
        "out/adapter/adapter_model.safetensors",
        "out/merged/config.json",
        "out/merged/model.safetensors",
        "out/merged/tokenizer.json",
    ] {
        assert!(copy.join(file).is_file(), "{file} missing:\n{log}");
    }
    // The merged folder's tokenizer is the BPE the run trained (export copies it).
    let trained: Vec<_> = std::fs::read_dir(copy.join("data").join("tok-cache"))
        .expect("the token cache")
        .flatten()
        .map(|e| e.path().join("tokenizer-bpe-4096.json"))
        .filter(|p| p.is_file())
        .collect();
    assert_eq!(trained.len(), 1, "{trained:?}");
    assert_eq!(
        std::fs::read(&trained[0]).unwrap(),
        std::fs::read(copy.join("out/merged/tokenizer.json")).unwrap()
    );
}
