//! Instruction data for language models (`dataset = "chat"`): `.jsonl` conversations rendered
//! by a chat template, tokenized, and trained on with the loss on the assistant's tokens only.
//!
//! A line is a JSON object with `messages`, a list of `{"role", "content"}` objects (roles
//! `system`, `user`, `assistant`, or any the template knows), or with `prompt` and `completion`
//! strings (and optionally `system`), read as a user message and the assistant's answer. Files
//! and folders are listed, hashed and split for evaluation as `dataset = "text"` does.
//!
//! The template is Jinja, rendered as transformers' `apply_chat_template` renders it
//! (`trim_blocks`, `lstrip_blocks`, Python's string methods, `raise_exception`; the variables
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`): the tokenizer's own
//! (`tokenizer_config.json`'s `chat_template` beside the `tokenizer.json`), a named one
//! (`chatml`, `plain`) or a `.jinja` file. The text is tokenized without adding special tokens
//! (the template writes them), as `apply_chat_template(tokenize=True)` does.
//!
//! Which tokens the assistant says: the conversation is rendered prefix by prefix. For the
//! assistant message `i`, the text up to it with the generation prompt
//! (`render(messages[..i], add_generation_prompt=true)`) ends where the assistant starts, and
//! `render(messages[..=i])` ends where its turn ends (its end-of-turn tokens included, so the
//! model learns to stop). A token is the assistant's when it overlaps such a span. A template
//! that does not render prefixes as prefixes of the whole cannot be split so, and is refused
//! unless `loss_on = "all"`.

mod sequences;
mod template;

pub use sequences::{tokenize_conversation, ChatSequences, ChatTokens};
pub use template::ChatTemplate;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::jsonl::{json_kind, jsonl_lines, line_error};
use super::own::{held_out, list_file, text_files, Document, Documents};
use super::tokenizer::TextTokenizer;
use crate::data::DataError;

/// ChatML (`<|im_start|>role\ncontent<|im_end|>\n`), the format of Qwen2 and SmolLM2.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + \
'\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}\
{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Plain text: `System`/`User:`/`Assistant:` lines, the end-of-text token after each answer.
pub const PLAIN: &str = "{% for message in messages %}{% if message['role'] == 'system' %}\
{{ message['content'] + '\\n\\n' }}{% elif message['role'] == 'user' %}\
{{ 'User: ' + message['content'] + '\\n' }}{% else %}\
{{ 'Assistant: ' + message['content'] + eos_token + '\\n' }}{% endif %}{% endfor %}\
{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}";

/// Which tokens the loss scores (`data.text.loss_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LossOn {
    /// The assistant's tokens (its answers and end-of-turn markers); the rest is context.
    Assistant,
    /// Every token.
    All,
}

impl LossOn {
    /// The names `trainer.toml` uses.
    pub const CHOICES: [(&'static str, LossOn); 2] =
        [("assistant", LossOn::Assistant), ("all", LossOn::All)];
}

/// How conversations become sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatLayout {
    /// One conversation per sequence, cut to `T + 1` tokens, padded after its end (the
    /// padding is not scored; under a causal mask it changes nothing before it).
    Padded,
    /// Conversations one after another in one stream, cut into sequences of `T` (no padding;
    /// a sequence may hold the end of one conversation and the start of the next).
    Packed,
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text.
    pub content: String,
}

/// One conversation: where it came from (`FILE:LINE`) and its messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// `FILE:LINE`.
    pub name: String,
    /// The messages in order.
    pub messages: Vec<Message>,
}

/// The conversations of `path` (a `.jsonl` file or a folder of them) and the source's content
/// hash (as [`Documents`], each conversation a document named `FILE:LINE` holding its line).
pub fn read_conversations(path: &Path) -> Result<(Vec<Conversation>, Documents), DataError> {
    let meta = fs::metadata(path).map_err(|e| DataError::io(path, e))?;
    let mut listing = String::from("tessera chat source v1\n");
    let (mut conversations, mut docs) = (Vec::new(), Vec::new());
    for (name, file) in text_files(path, meta.is_dir())? {
        if !name.ends_with(".jsonl") {
            return Err(DataError::format(
                &file,
                "chat data is read from .jsonl lines (`messages`, or `prompt` and `completion`)",
            ));
        }
        let bytes = fs::read(&file).map_err(|e| DataError::io(&file, e))?;
        list_file(&mut listing, &name, &bytes);
        jsonl_lines(&file, &bytes, |number, line| {
            let messages = parse_line(line).map_err(|why| line_error(&file, number, why))?;
            let at = format!("{name}:{number}");
            docs.push(Document {
                name: at.clone(),
                text: line.to_owned(),
            });
            conversations.push(Conversation { name: at, messages });
            Ok(())
        })?;
    }
    if conversations.is_empty() {
        return Err(DataError::format(path, "holds no conversations"));
    }
    let docs = Documents::collect(
        docs.into_iter().map(Ok),
        crate::files::sha256_hex(listing.as_bytes()),
        path.display().to_string(),
    )?;
    Ok((conversations, docs))
}

/// The messages of one line, or why it has none.
fn parse_line(line: &str) -> Result<Vec<Message>, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("is not valid JSON: {e}"))?;
    let Value::Object(object) = value else {
        return Err(format!(
            "is {}, not a JSON object with `messages` or `prompt` and `completion`",
            json_kind(&value)
        ));
    };
    let string = |key: &str, v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        other => Err(format!("`{key}` is {}, not a string", json_kind(other))),
    };
    if let Some(messages) = object.get("messages") {
        let Value::Array(list) = messages else {
            return Err(format!(
                "`messages` is {}, not a list of {{\"role\", \"content\"}} objects",
                json_kind(messages)
            ));
        };
        if list.is_empty() {
            return Err("`messages` is empty".to_owned());
        }
        return list
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let field = |key: &str| match m.get(key) {
                    Some(v) => string(&format!("messages[{i}].{key}"), v),
                    None => Err(format!("messages[{i}] has no `{key}`")),
                };
                Ok(Message {
                    role: field("role")?,
                    content: field("content")?,
                })
            })
            .collect();
    }
    match (object.get("prompt"), object.get("completion")) {
        (Some(p), Some(c)) => {
            let mut messages = Vec::with_capacity(3);
            if let Some(s) = object.get("system") {
                messages.push(Message {
                    role: "system".to_owned(),
                    content: string("system", s)?,
                });
            }
            messages.push(Message {
                role: "user".to_owned(),
                content: string("prompt", p)?,
            });
            messages.push(Message {
                role: "assistant".to_owned(),
                content: string("completion", c)?,
            });
            Ok(messages)
        }
        _ => {
            let keys: Vec<&str> = object.keys().map(String::as_str).collect();
            Err(format!(
                "has neither `messages` nor `prompt` and `completion` (its fields: {})",
                if keys.is_empty() {
                    "none".to_owned()
                } else {
                    keys.join(", ")
                }
            ))
        }
    }
}

/// `dataset = "chat"` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatConfig {
    /// The conversations' source, split, tokenizer (or BPE size) and cache, as for
    /// `dataset = "text"`.
    pub text: super::OwnTextConfig,
    /// `data.text.chat_template`: `None` for the tokenizer's, else `chatml`.
    pub template: Option<String>,
    /// `data.text.loss_on`.
    pub loss_on: LossOn,
    /// `data.text.packing`.
    pub layout: ChatLayout,
    /// Tokens per training sequence.
    pub seq_len: usize,
    /// Tokens per evaluation sequence.
    pub eval_seq_len: usize,
    /// The target of unscored positions (the loss's `ignore_index`).
    pub ignore: i64,
}

/// A chat source loaded: both splits' sequences and the tokenizer's facts.
#[derive(Debug)]
pub struct ChatData {
    /// Training sequences.
    pub train: ChatSequences,
    /// Evaluation sequences.
    pub eval: ChatSequences,
    /// The vocabulary size.
    pub vocab_size: usize,
    /// The tokenizer file.
    pub tokenizer_path: PathBuf,
    /// Its sha256.
    pub tokenizer_sha256: String,
    /// The template's origin.
    pub template: String,
    /// Conversations in each split.
    pub conversations: (usize, usize),
}

/// Reads, splits, renders and tokenizes the conversations of `cfg`. Without a tokenizer a
/// byte-level BPE is trained on the rendered training conversations and cached in the source's
/// cache folder (as for `dataset = "text"`).
pub fn load_chat(cfg: &ChatConfig) -> Result<ChatData, DataError> {
    let (all, docs) = read_conversations(&cfg.text.path)?;
    let (train, eval, eval_split) = match &cfg.text.eval_path {
        Some(path) => {
            let (eval, eval_docs) = read_conversations(path)?;
            let key = eval_docs;
            (all, eval, Some(key))
        }
        None => {
            let held = held_out(&docs.docs, cfg.text.eval_fraction)?;
            let (mut train, mut eval) = (Vec::new(), Vec::new());
            for (i, c) in all.into_iter().enumerate() {
                if held.binary_search(&i).is_ok() {
                    eval.push(c);
                } else {
                    train.push(c);
                }
            }
            (train, eval, None)
        }
    };
    let origin = |e: String| DataError::format(&cfg.text.path, e);
    let default_eos = super::EOS_TOKEN;
    let template = ChatTemplate::choose(
        cfg.template.as_deref(),
        cfg.text.tokenizer.as_deref(),
        default_eos,
    )
    .map_err(origin)?;
    let tokenizer = match &cfg.text.tokenizer {
        Some(path) => TextTokenizer::load(path)?,
        None => {
            let split = match &eval_split {
                Some(d) => super::own::EvalSplit::Given(d),
                None => super::own::EvalSplit::Fraction(cfg.text.eval_fraction),
            };
            let (_, dir) = super::own::cache_folder(&docs, split, &cfg.text)?;
            let mut texts = Vec::with_capacity(train.len());
            for c in &train {
                texts.push(
                    template
                        .render(&c.messages, false)
                        .map_err(|e| origin(format!("{}: {e}", c.name)))?,
                );
            }
            let pieces: Vec<(&str, bool)> = texts.iter().map(|t| (t.as_str(), true)).collect();
            super::tokenizer::cached_bpe(&dir, &pieces, cfg.text.vocab_size)?
        }
    };
    let encode = |list: &[Conversation]| -> Result<Vec<ChatTokens>, DataError> {
        list.iter()
            .map(|c| tokenize_conversation(&template, &tokenizer, c, cfg.loss_on).map_err(origin))
            .collect()
    };
    let (train_tokens, eval_tokens) = (encode(&train)?, encode(&eval)?);
    let none_scored = train_tokens
        .iter()
        .zip(&train)
        .find(|(t, _)| !t.scored.iter().any(|&s| s));
    if let Some((_, c)) = none_scored {
        return Err(origin(format!(
            "{}: the conversation has no assistant message, nothing to train on (loss_on = \
             \"assistant\")",
            c.name
        )));
    }
    let pad = tokenizer.eos_id();
    let sequences =
        |tokens, seq_len| ChatSequences::new(tokens, cfg.layout, seq_len, pad, cfg.ignore);
    let conversations = (train.len(), eval.len());
    Ok(ChatData {
        train: sequences(train_tokens, cfg.seq_len)?,
        eval: sequences(eval_tokens, cfg.eval_seq_len)?,
        vocab_size: tokenizer.vocab_size(),
        tokenizer_path: tokenizer.path().to_owned(),
        tokenizer_sha256: tokenizer.sha256().to_owned(),
        template: template.origin.clone(),
        conversations,
    })
}

#[cfg(test)]
mod tests;
