//! `tessera generate`: text from a trained language model (docs/generate.md).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use tessera::generate::{
    self, parse_ids, read_prompts, Completion, Event, LanguageModel, Prompt, Sampling, Settings,
};

use crate::Exit;

#[derive(clap::Args)]
pub struct Args {
    /// A run's checkpoint (`.ckpt`, rebuilt with its methods as `tessera eval` does), a
    /// trainer.toml, or a Hugging Face save_pretrained folder (config.json, model.safetensors
    /// or its shards, tokenizer.json) of a llama-family or gpt2 model.
    source: PathBuf,
    /// A prompt (repeatable).
    #[arg(long)]
    prompt: Vec<String>,
    /// A JSON Lines file of prompts, one `{"prompt": "..."}` a line.
    #[arg(long, value_name = "FILE.jsonl")]
    prompts: Option<PathBuf>,
    /// A prompt as token ids, `"1 2 3"` (repeatable): for a model trained without a tokenizer.
    #[arg(long, value_name = "IDS")]
    prompt_ids: Vec<String>,
    /// Tokens to generate per prompt at most.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0: greedy (the most likely token each time); above 0: draw from the softmax of the
    /// logits divided by it.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Draw only among the K most likely tokens.
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// Draw only among the most likely tokens whose probabilities add up to P.
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    top_p: f64,
    /// The seed of the draws: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// End a sequence when its text contains STRING, cut off there (repeatable).
    #[arg(long, value_name = "STRING")]
    stop: Vec<String>,
    /// Write one JSON line per prompt (prompt, ids, completion, finish) instead of the text.
    #[arg(long)]
    json: bool,
    /// Prompts decoded together at most.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Recompute whole sequences every step instead of decoding with a kv cache (for
    /// comparisons; the same tokens, slower).
    #[arg(long)]
    no_kv_cache: bool,
    /// Where to run: auto, cpu, cuda, cuda:N (default: a run's own train.device; auto).
    #[arg(long)]
    device: Option<String>,
    /// Override a setting of a run's config (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    let mut prompts: Vec<Prompt> = args.prompt.iter().cloned().map(Prompt::Text).collect();
    if let Some(file) = &args.prompts {
        prompts.extend(read_prompts(file)?);
    }
    for ids in &args.prompt_ids {
        prompts.push(Prompt::Ids(parse_ids(ids)?));
    }
    if prompts.is_empty() {
        anyhow::bail!("no prompt given: --prompt TEXT, --prompts FILE.jsonl or --prompt-ids IDS");
    }
    let settings = Settings {
        max_new_tokens: args.max_new_tokens,
        sampling: Sampling {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
        },
        seed: args.seed,
        stop: args.stop.clone(),
        batch_size: args.batch_size,
        kv_cache: !args.no_kv_cache,
    };
    settings.validate()?;
    let lm = LanguageModel::load(&args.source, args.device.as_deref(), &args.overrides)?;
    let stream = prompts.len() == 1 && !args.json && lm.codec.is_some();
    let mut out = Output::new(args.json, stream);
    if stream {
        // The prompt, then its completion as it comes.
        let prompt = match &prompts[0] {
            Prompt::Text(text) => text.clone(),
            Prompt::Ids(ids) => format!("{ids:?}"),
        };
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(prompt.as_bytes());
        let _ = stdout.flush();
    }
    let report = generate::generate(&lm, &prompts, &settings, &mut |event| out.on(event))?;
    let rate = report.tokens as f64 / report.seconds.max(1e-9);
    eprintln!(
        "generated {} tokens for {} prompt(s) in {:.2} s ({rate:.1} tokens/s, {})",
        report.tokens,
        report.completions.len(),
        report.seconds,
        match &report.recomputed_because {
            None => "kv cache".to_owned(),
            Some(why) => format!("whole sequences recomputed: {why}"),
        }
    );
    Ok(Exit::SUCCESS)
}

/// What goes to stdout: one prompt's text streamed as it comes; several prompts' each printed
/// whole, in prompt order, as soon as it and those before it are done; or JSON Lines.
struct Output {
    json: bool,
    stream: bool,
    /// Completions done but waiting for an earlier prompt's.
    waiting: BTreeMap<usize, Completion>,
    next: usize,
}

impl Output {
    fn new(json: bool, stream: bool) -> Output {
        Output {
            json,
            stream,
            waiting: BTreeMap::new(),
            next: 0,
        }
    }

    /// Writes what `event` brings; a closed stdout (a pipe into `head`) is not an error.
    fn on(&mut self, event: Event<'_>) {
        let mut stdout = std::io::stdout().lock();
        match event {
            Event::Text { piece, .. } if self.stream => {
                let _ = stdout.write_all(piece.as_bytes());
                let _ = stdout.flush();
            }
            Event::Text { .. } => {}
            Event::Done(c) => {
                self.waiting.insert(c.index, c.clone());
                while let Some(c) = self.waiting.remove(&self.next) {
                    let text = self.render(&c);
                    let _ = stdout.write_all(text.as_bytes());
                    let _ = stdout.flush();
                    self.next += 1;
                }
            }
        }
    }

    /// A finished completion as printed (the streamed text only needs its line end).
    fn render(&self, c: &Completion) -> String {
        if self.json {
            return format!("{}\n", serde_json::json!(c));
        }
        let ids = |ids: &[i64]| ids.iter().map(i64::to_string).collect::<Vec<_>>().join(" ");
        let body = match (&c.prompt, &c.completion) {
            (_, Some(_)) if self.stream => String::new(),
            (Some(prompt), Some(completion)) => format!("{prompt}{completion}"),
            (None, Some(completion)) => format!("[{}]{completion}", ids(&c.prompt_ids)),
            (_, None) => format!("[{}] -> [{}]", ids(&c.prompt_ids), ids(&c.ids)),
        };
        let separator = if self.stream || c.index == 0 {
            ""
        } else {
            "---\n"
        };
        format!("{separator}{body}\n")
    }
}
