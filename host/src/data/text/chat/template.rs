//! A chat template (`ChatTemplate`): the Jinja template of a tokenizer's config or a built-in
//! one, rendering a conversation and marking the spans the loss is on.

use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{LossOn, Message};
use super::{CHATML, PLAIN};

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
