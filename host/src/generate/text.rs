//! Text in and out of generation: the prompts (`--prompt`, `--prompts FILE.jsonl`,
//! `--prompt-ids`), the tokenizer that encodes them and decodes what is generated, the stop
//! strings that end a sequence, and the text streamed as it grows.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use super::GenerateError;

/// A prompt as given: text (encoded with the tokenizer) or token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Token ids, for a model trained without a tokenizer (`synthetic-text`).
    Ids(Vec<i64>),
}

/// The prompts of a JSON Lines file, one `{"prompt": "..."}` a line (blank lines skipped); a
/// line that is not such an object is an error naming the file and the line.
pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>, GenerateError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        GenerateError::Invalid(format!("cannot read the prompts {}: {e}", path.display()))
    })?;
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), i + 1);
        let value: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| GenerateError::Invalid(format!("{}: not JSON: {e}", at())))?;
        match value.get("prompt").and_then(|p| p.as_str()) {
            Some(p) => prompts.push(Prompt::Text(p.to_owned())),
            None => {
                return Err(GenerateError::Invalid(format!(
                    "{}: expected an object with a string \"prompt\", got {}",
                    at(),
                    truncated(line, 80)
                )))
            }
        }
    }
    if prompts.is_empty() {
        return Err(GenerateError::Invalid(format!(
            "{} holds no prompts (one {{\"prompt\": \"...\"}} a line)",
            path.display()
        )));
    }
    Ok(prompts)
}

/// `text`'s first `max` characters, with `...` when cut.
fn truncated(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_owned(),
    }
}

/// Token ids written `1 2 3` or `1,2,3`.
pub fn parse_ids(text: &str) -> Result<Vec<i64>, GenerateError> {
    let ids: Result<Vec<i64>, _> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::parse::<i64>)
        .collect();
    match ids {
        Ok(ids) if !ids.is_empty() && ids.iter().all(|&i| i >= 0) => Ok(ids),
        _ => Err(GenerateError::Invalid(format!(
            "--prompt-ids {text:?}: expected token ids (whole numbers >= 0) separated by spaces \
             or commas"
        ))),
    }
}

/// A Hugging Face `tokenizer.json` for generation: prompts encoded as `tokenizer(prompt)` does
/// in transformers (special tokens added, such as Llama's BOS), completions decoded without
/// special tokens.
pub struct TextCodec {
    inner: Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for TextCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TextCodec({})", self.path.display())
    }
}

impl TextCodec {
    /// Loads `path`.
    pub fn load(path: &Path) -> Result<TextCodec, GenerateError> {
        let inner = Tokenizer::from_file(path).map_err(|e| {
            GenerateError::Invalid(format!(
                "{} is not a loadable tokenizer.json: {e}",
                path.display()
            ))
        })?;
        Ok(TextCodec {
            inner,
            path: path.to_owned(),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id of `token`, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The ids of `text`, special tokens added as the tokenizer's post-processor says.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, GenerateError> {
        let encoding = self.inner.encode(text, true).map_err(|e| {
            GenerateError::Invalid(format!(
                "{}: cannot encode {text:?}: {e}",
                self.path.display()
            ))
        })?;
        Ok(encoding.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    /// The text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[i64]) -> Result<String, GenerateError> {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        self.inner.decode(&ids, true).map_err(|e| {
            GenerateError::Invalid(format!("{}: cannot decode ids: {e}", self.path.display()))
        })
    }
}

/// Where the first of `stops` begins in `text`, if one occurs.
pub fn find_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

/// The part of a growing text not yet streamed. It holds back what could still become a stop
/// string (the last `longest stop − 1` characters) and an incomplete UTF-8 character (decoded as
/// U+FFFD), so that what is streamed is exactly the final text's beginning.
#[derive(Debug, Default)]
pub struct Streamed {
    sent: String,
}

impl Streamed {
    /// The new part of `text` safe to show now, given the stop strings' longest length in
    /// characters; `done`: `text` is final (everything left is shown).
    pub fn next(&mut self, text: &str, hold_chars: usize, done: bool) -> String {
        let mut end = text.len();
        if !done {
            let text = text.trim_end_matches('\u{FFFD}');
            end = text.len();
            if hold_chars > 0 {
                end = text
                    .char_indices()
                    .rev()
                    .nth(hold_chars - 1)
                    .map_or(0, |(i, _)| i);
            }
        }
        // A decoder may rewrite earlier text as tokens arrive; only a continuation streams.
        if end <= self.sent.len() || !text.starts_with(self.sent.as_str()) {
            return String::new();
        }
        let piece = text[self.sent.len()..end].to_owned();
        self.sent.push_str(&piece);
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_holds_back_possible_stops_and_partial_characters() {
        let mut s = Streamed::default();
        assert_eq!(s.next("Hello", 2, false), "Hel");
        assert_eq!(s.next("Hello wor", 2, false), "lo w");
        assert_eq!(s.next("Hello wor\u{FFFD}", 2, false), "");
        assert_eq!(s.next("Hello world", 2, true), "orld");
        let mut s = Streamed::default();
        assert_eq!(s.next("ab", 0, false), "ab");
        assert_eq!(s.next("abc", 0, false), "c");
    }

    #[test]
    fn stops_and_ids_and_prompt_files() {
        let stops = vec!["\n\n".to_owned(), "END".to_owned()];
        assert_eq!(find_stop("a END b\n\n", &stops), Some(2));
        assert_eq!(find_stop("nothing", &stops), None);
        assert_eq!(parse_ids("1, 2 3").unwrap(), [1, 2, 3]);
        assert!(parse_ids("1 x").is_err());
        assert!(parse_ids("").is_err());
        let dir = std::env::temp_dir().join(format!("tessera-prompts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.jsonl");
        std::fs::write(&file, "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\"}\n").unwrap();
        assert_eq!(
            read_prompts(&file).unwrap(),
            [Prompt::Text("a".into()), Prompt::Text("b".into())]
        );
        std::fs::write(&file, "{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n").unwrap();
        let e = read_prompts(&file).unwrap_err().to_string();
        assert!(e.contains("p.jsonl:2"), "{e}");
        std::fs::write(&file, "{\"prompt\": \"a\"}\nnot json\n").unwrap();
        let e = read_prompts(&file).unwrap_err().to_string();
        assert!(e.contains("p.jsonl:2") && e.contains("not JSON"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
