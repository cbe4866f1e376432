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

use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::own::{
    held_out, json_kind, jsonl_lines, line_error, list_file, text_files, Document, Documents,
};
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

/// A chat template ready to render.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    /// Where it came from, for messages (`chatml`, `tokenizer_config.json`, a file).
    pub origin: String,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .finish()
    }
}

/// `raise_exception(message)`, which Hugging Face templates call to refuse a conversation.
fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(
        minijinja::ErrorKind::InvalidOperation,
        message,
    ))
}

impl ChatTemplate {
    /// Compiles `source` (Jinja) with the special tokens it may name; `origin` is said in errors.
    pub fn new(source: &str, origin: &str, bos: &str, eos: &str) -> Result<ChatTemplate, String> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| format!("the chat template ({origin}) does not compile: {e:#}"))?;
        Ok(ChatTemplate {
            env,
            origin: origin.to_owned(),
            bos: bos.to_owned(),
            eos: eos.to_owned(),
        })
    }

    /// The template `choice` names for a run whose tokenizer is `tokenizer` (its
    /// `tokenizer_config.json` beside it): `"tokenizer"` (that file's `chat_template`),
    /// `"chatml"`, `"plain"`, or a path to a Jinja file. `None` chooses the tokenizer's when it has
    /// one, else `chatml`.
    pub fn choose(
        choice: Option<&str>,
        tokenizer: Option<&Path>,
        eos_token: &str,
    ) -> Result<ChatTemplate, String> {
        let config = tokenizer.map(tokenizer_config).transpose()?.flatten();
        let special = |key: &str, default: &str| {
            config
                .as_ref()
                .and_then(|(_, c)| special_token(c.get(key)))
                .unwrap_or_else(|| default.to_owned())
        };
        let (bos, eos) = (special("bos_token", ""), special("eos_token", eos_token));
        let own = config
            .as_ref()
            .and_then(|(path, c)| Some((path, template_of(c)?)));
        match choice {
            None => match own {
                Some((path, source)) => {
                    ChatTemplate::new(&source, &path.display().to_string(), &bos, &eos)
                }
                None => ChatTemplate::new(CHATML, "chatml", &bos, &eos),
            },
            Some("tokenizer") => match own {
                Some((path, source)) => {
                    ChatTemplate::new(&source, &path.display().to_string(), &bos, &eos)
                }
                None => Err(match tokenizer {
                    None => "chat_template = \"tokenizer\" needs data.text.tokenizer (its \
                             tokenizer_config.json holds the template)"
                        .to_owned(),
                    Some(t) => format!(
                        "chat_template = \"tokenizer\": no tokenizer_config.json with a \
                         `chat_template` beside {}",
                        t.display()
                    ),
                }),
            },
            Some("chatml") => ChatTemplate::new(CHATML, "chatml", &bos, &eos),
            Some("plain") => ChatTemplate::new(PLAIN, "plain", &bos, &eos),
            Some(file) => {
                let source = fs::read_to_string(file)
                    .map_err(|e| format!("chat_template = {file:?}: {e}"))?;
                ChatTemplate::new(&source, file, &bos, &eos)
            }
        }
    }

    /// The text of `messages`, with the assistant's generation prompt at the end when asked.
    pub fn render(&self, messages: &[Message], generation_prompt: bool) -> Result<String, String> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| format!("{e:#}"))?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => generation_prompt,
                bos_token => self.bos,
                eos_token => self.eos,
            })
            .map_err(|e| format!("the chat template ({}) failed: {e:#}", self.origin))
    }

    /// The text of `conversation` and the byte ranges the assistant says (see the module doc).
    pub fn render_spans(
        &self,
        conversation: &[Message],
        loss_on: LossOn,
    ) -> Result<(String, Vec<Range<usize>>), String> {
        let full = self.render(conversation, false)?;
        if loss_on == LossOn::All {
            let whole = std::iter::once(0..full.len()).collect();
            return Ok((full, whole));
        }
        let mut spans = Vec::new();
        for (i, m) in conversation.iter().enumerate() {
            if m.role != "assistant" {
                continue;
            }
            let prompt = self.render(&conversation[..i], true)?;
            let upto = self.render(&conversation[..=i], false)?;
            if !(upto.starts_with(&prompt) && full.starts_with(&upto)) {
                return Err(format!(
                    "the chat template ({}) does not render the conversation prefix by prefix \
                     (the text up to message {i} is not the start of the whole), so the \
                     assistant's tokens cannot be told apart: set data.text.loss_on = \"all\" or \
                     another chat_template",
                    self.origin
                ));
            }
            if upto.len() > prompt.len() {
                spans.push(prompt.len()..upto.len());
            }
        }
        Ok((full, spans))
    }
}

/// `tokenizer_config.json` beside `tokenizer` (its path and JSON), if there is one.
fn tokenizer_config(tokenizer: &Path) -> Result<Option<(PathBuf, Value)>, String> {
    let path = tokenizer.with_file_name("tokenizer_config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some((path, value)))
}

/// A special token as a tokenizer config writes it: a string or `{"content": ...}`.
fn special_token(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// The `chat_template` of a tokenizer config: a string, or the one named `default` in a list of
/// `{"name", "template"}`.
fn template_of(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
        _ => None,
    }
}

/// A tokenized conversation: its ids and, for each, whether the loss scores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTokens {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Per token: the assistant's (scored).
    pub scored: Vec<bool>,
}

/// Renders and tokenizes `conversation`: a token is scored when its bytes overlap one of the
/// assistant's spans.
pub fn tokenize_conversation(
    template: &ChatTemplate,
    tokenizer: &TextTokenizer,
    conversation: &Conversation,
    loss_on: LossOn,
) -> Result<ChatTokens, String> {
    let (text, spans) = template
        .render_spans(&conversation.messages, loss_on)
        .map_err(|e| format!("{}: {e}", conversation.name))?;
    let (ids, offsets) = tokenizer
        .encode_with_offsets(&text)
        .map_err(|e| format!("{}: {e}", conversation.name))?;
    let scored = offsets
        .iter()
        .map(|&(start, end)| {
            spans
                .iter()
                .any(|s| start < s.end && end.max(start + 1) > s.start)
        })
        .collect();
    Ok(ChatTokens { ids, scored })
}

/// Training and evaluation sequences of a chat source.
#[derive(Debug, Clone)]
pub struct ChatSequences {
    /// Padded: one conversation per row. Packed: one row, the whole stream.
    rows: Vec<ChatTokens>,
    /// The sequences kept: `(row, first token)` of each; those without a scored target are
    /// left out.
    windows: Vec<(usize, usize)>,
    /// Sequences left out for having no scored target.
    dropped: usize,
    layout: ChatLayout,
    seq_len: usize,
    pad_id: u32,
    ignore: i64,
}

impl ChatSequences {
    /// Sequences of `seq_len` tokens over `conversations` laid out by `layout`; unscored
    /// targets (and padding) are `ignore`. A sequence without any scored target (a
    /// conversation cut before its answer, a packed window of prompts only) is left out: its
    /// loss would be a mean over nothing. An error when nothing is left to train on.
    pub fn new(
        conversations: Vec<ChatTokens>,
        layout: ChatLayout,
        seq_len: usize,
        pad_id: u32,
        ignore: i64,
    ) -> Result<ChatSequences, DataError> {
        if seq_len == 0 {
            return Err(DataError::Invalid(
                "the sequence length must be at least 1".to_owned(),
            ));
        }
        let (rows, starts): (Vec<ChatTokens>, Vec<(usize, usize)>) = match layout {
            ChatLayout::Padded => {
                let starts = (0..conversations.len()).map(|r| (r, 0)).collect();
                (conversations, starts)
            }
            ChatLayout::Packed => {
                let mut stream = ChatTokens {
                    ids: Vec::new(),
                    scored: Vec::new(),
                };
                for c in conversations {
                    stream.ids.extend(c.ids);
                    stream.scored.extend(c.scored);
                }
                let n = stream.ids.len().saturating_sub(1) / seq_len;
                (vec![stream], (0..n).map(|i| (0, i * seq_len)).collect())
            }
        };
        let scores = |&(row, start): &(usize, usize)| {
            let r: &ChatTokens = &rows[row];
            let end = (start + seq_len + 1).min(r.ids.len());
            r.scored
                .get(start + 1..end)
                .is_some_and(|s| s.contains(&true))
        };
        let total = starts.len();
        let windows: Vec<(usize, usize)> = starts.into_iter().filter(|w| scores(w)).collect();
        if windows.is_empty() {
            return Err(DataError::Invalid(format!(
                "the conversations make no sequence of {seq_len} tokens with a scored target \
                 ({total} without one{})",
                if layout == ChatLayout::Packed {
                    "; packed, the stream needs seq_len + 1 tokens"
                } else {
                    ": raise data.text.seq_len so that the answers fit"
                }
            )));
        }
        Ok(ChatSequences {
            dropped: total - windows.len(),
            layout,
            rows,
            windows,
            seq_len,
            pad_id,
            ignore,
        })
    }

    /// The number of sequences.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Whether there are none (never: [`ChatSequences::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Tokens per sequence.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Padded: the sequences kept whose conversation is longer than `seq_len + 1` tokens (cut).
    pub fn truncated(&self) -> usize {
        match self.layout {
            ChatLayout::Padded => self
                .windows
                .iter()
                .filter(|&&(row, _)| self.rows[row].ids.len() > self.seq_len + 1)
                .count(),
            ChatLayout::Packed => 0,
        }
    }

    /// The sequences left out for having no scored target.
    pub fn dropped(&self) -> usize {
        self.dropped
    }

    /// The scored targets of all sequences.
    pub fn scored_targets(&self) -> usize {
        (0..self.len())
            .map(|i| {
                let (_, scored) = self.window(i);
                scored.iter().skip(1).filter(|&&s| s).count()
            })
            .sum()
    }

    /// The tokens of sequence `i`: up to `T + 1` ids and their scored flags.
    fn window(&self, i: usize) -> (&[u32], &[bool]) {
        let (row, start) = self.windows[i];
        let row = &self.rows[row];
        let end = (start + self.seq_len + 1).min(row.ids.len());
        (&row.ids[start..end], &row.scored[start..end])
    }

    /// Appends sequence `index` (`T` input ids, `T` targets: the next token where it is scored,
    /// else `ignore`; padding after a short conversation).
    pub fn write(&self, index: usize, input: &mut Vec<i64>, target: &mut Vec<i64>) {
        let (ids, scored) = self.window(index);
        let t = self.seq_len;
        for j in 0..t {
            input.push(i64::from(ids.get(j).copied().unwrap_or(self.pad_id)));
            target.push(match (ids.get(j + 1), scored.get(j + 1)) {
                (Some(&id), Some(true)) => i64::from(id),
                _ => self.ignore,
            });
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
#[path = "chat_tests.rs"]
mod tests;
