//! Conversations as training sequences: tokenized with their loss masks (`ChatTokens`), packed
//! or padded into sequences (`ChatSequences`).

use super::template::ChatTemplate;

use super::{ChatLayout, Conversation, LossOn};
use crate::data::text::tokenizer::TextTokenizer;
use crate::data::DataError;

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
