//! The decoding loop. Prompts run in batches, left-padded to one length: the first step feeds
//! every prompt token, each later step only the token just chosen per sequence, through the
//! layers' `forward_cached` with a [`KvCache`] holding every attention module's keys and values
//! (a row's positions and attention mask make it compute what it would alone). A sequence that
//! ends leaves the batch, and so does padding no remaining row needs. When a module on the way
//! cannot decode incrementally (a plugin's replacement of an attention module), every step
//! recomputes the whole sequence instead, one prompt at a time: correct, slower, said once.

use std::time::Instant;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::model::layers::KvCache;
use crate::model::Model;

use super::sample::Sampler;
use super::source::LanguageModel;
use super::text::{find_stop, Prompt, Streamed};
use super::{GenerateError, Settings};

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// The model chose an end-of-sequence token (kept as the last id, not in the text).
    Eos,
    /// The text reached a stop string (cut off before it).
    Stop,
    /// `max_new_tokens` were generated.
    Length,
    /// The sequence filled the model's context.
    Context,
}

/// One prompt's result.
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    /// The prompt's place in the input (from 0).
    pub index: usize,
    /// The prompt's text (`None` for ids).
    pub prompt: Option<String>,
    /// The prompt's token ids.
    pub prompt_ids: Vec<i64>,
    /// The generated token ids.
    pub ids: Vec<i64>,
    /// The generated text (`None` without a tokenizer).
    pub completion: Option<String>,
    /// Why it ended.
    pub finish: Finish,
}

/// What generation reports as it goes.
#[derive(Debug)]
pub enum Event<'a> {
    /// More text of prompt `index`'s completion (the final text's next part).
    Text {
        /// The prompt.
        index: usize,
        /// The new text.
        piece: &'a str,
    },
    /// Prompt `index`'s completion is complete.
    Done(&'a Completion),
}

/// Every prompt's completion, and how they were computed.
#[derive(Debug)]
pub struct Report {
    /// In prompt order.
    pub completions: Vec<Completion>,
    /// Whether decoding was incremental (kv cache); else why not.
    pub recomputed_because: Option<String>,
    /// Tokens generated.
    pub tokens: usize,
    /// Wall time of the decoding.
    pub seconds: f64,
}

/// A sequence being generated.
struct Row {
    index: usize,
    prompt: Option<String>,
    tokens: Vec<i64>,
    prompt_len: usize,
    sampler: Sampler,
    streamed: Streamed,
    done: Option<Completion>,
}

/// What every step needs.
struct Step<'a> {
    lm: &'a LanguageModel,
    settings: &'a Settings,
    /// Characters of text held back while they could still start a stop string.
    hold: usize,
}

/// Generates a completion of each of `prompts` from `lm` as `settings` say, reporting text and
/// finished completions to `on_event` as they come.
pub fn generate(
    lm: &LanguageModel,
    prompts: &[Prompt],
    settings: &Settings,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<Report, GenerateError> {
    settings.validate()?;
    let _no_grad = tch::no_grad_guard();
    let mut rows = prompts
        .iter()
        .enumerate()
        .map(|(index, prompt)| row(lm, settings, index, prompt))
        .collect::<Result<Vec<Row>, GenerateError>>()?;
    let step = Step {
        lm,
        settings,
        hold: settings
            .stop
            .iter()
            .map(|s| s.chars().count().saturating_sub(1))
            .max()
            .unwrap_or(0),
    };
    let started = Instant::now();
    let mut recomputed_because =
        (!settings.kv_cache).then(|| "the kv cache is off (--no-kv-cache)".to_owned());
    for batch in rows.chunks_mut(settings.batch_size) {
        if recomputed_because.is_none() {
            if let Some(kind) = run_cached(lm.model(), batch, &step, on_event)? {
                let why = format!("the model's `{kind}` module cannot decode incrementally");
                tracing::warn!(
                    "{why}: every new token recomputes the whole sequence, one prompt at a \
                     time (the same tokens, slower)"
                );
                recomputed_because = Some(why);
            }
        }
        if recomputed_because.is_some() {
            for row in batch.iter_mut() {
                run_whole(lm.model(), row, &step, on_event)?;
            }
        }
    }
    let completions: Vec<Completion> = rows.into_iter().filter_map(|r| r.done).collect();
    Ok(Report {
        tokens: completions.iter().map(|c| c.ids.len()).sum(),
        completions,
        recomputed_because,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Prompt `index` encoded and checked against the model's vocabulary and context.
fn row(
    lm: &LanguageModel,
    settings: &Settings,
    index: usize,
    prompt: &Prompt,
) -> Result<Row, GenerateError> {
    let number = index + 1;
    let (text, tokens) = match prompt {
        Prompt::Ids(ids) => (None, ids.clone()),
        Prompt::Text(text) => {
            let Some(codec) = &lm.codec else {
                return Err(GenerateError::Invalid(format!(
                    "{} has no tokenizer (a run on synthetic-text trains without one; a folder \
                     needs a tokenizer.json): give the prompts as token ids with --prompt-ids",
                    lm.description
                )));
            };
            (Some(text.clone()), codec.encode(text)?)
        }
    };
    if tokens.is_empty() {
        return Err(GenerateError::Invalid(format!(
            "prompt {number} encodes to no tokens: give some text"
        )));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t < 0 || t >= lm.vocab_size) {
        return Err(GenerateError::Invalid(format!(
            "prompt {number}: token id {bad} is not in the model's vocabulary of {}",
            lm.vocab_size
        )));
    }
    if let Some(context) = lm.context.filter(|&c| tokens.len() as i64 >= c) {
        return Err(GenerateError::Invalid(format!(
            "prompt {number} has {} tokens; the model's context is {context}, which leaves no \
             room to generate (at most {} prompt tokens)",
            tokens.len(),
            context - 1
        )));
    }
    Ok(Row {
        index,
        prompt: text,
        prompt_len: tokens.len(),
        tokens,
        sampler: Sampler::new(settings.sampling, settings.seed, index),
        streamed: Streamed::default(),
        done: None,
    })
}

/// Decodes `rows` as one batch with a kv cache. `Some(kind)`: a module of that kind cannot
/// decode incrementally (found at the first step, before any row changed).
fn run_cached(
    model: &Model,
    rows: &mut [Row],
    step: &Step<'_>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<Option<String>, GenerateError> {
    let device = model.params.device();
    let width = rows.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
    let (mut ids, mut real) = (Vec::new(), Vec::new());
    for r in rows.iter() {
        let pad = width - r.tokens.len();
        ids.extend(std::iter::repeat_n(0, pad).chain(r.tokens.iter().copied()));
        real.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1, r.tokens.len())));
    }
    let shape = [rows.len() as i64, width as i64];
    let mut input = Tensor::from_slice(&ids)
        .f_view(shape)?
        .f_to_device(device)?;
    let mut real = Tensor::from_slice(&real)
        .f_view(shape)?
        .f_to_device(device)?;
    let mut active: Vec<usize> = (0..rows.len()).collect();
    let mut cache = KvCache::new();
    loop {
        let new = input.size().last().copied().unwrap_or(0);
        cache.begin_step(&real, new)?;
        let logits = match model.root.forward_cached(&input, &mut cache) {
            Ok(logits) => logits,
            Err(e) => {
                return match cache.unsupported_kind() {
                    Some(kind) if cache.past() == 0 => Ok(Some(kind.to_owned())),
                    _ => Err(e.into()),
                }
            }
        };
        cache.end_step(new);
        for (&r, logits) in active.iter().zip(last_logits(&logits)?) {
            advance(&mut rows[r], &logits, step, on_event)?;
        }
        let going: Vec<usize> = (0..active.len())
            .filter(|&p| rows[active[p]].done.is_none())
            .collect();
        if going.is_empty() {
            return Ok(None);
        }
        if going.len() < active.len() {
            // Ended rows leave, and so does the padding every remaining row has before its
            // tokens (all but the newest are cached).
            let past = cache.past();
            let padding = |p: &usize| past - (rows[active[*p]].tokens.len() as i64 - 1);
            let drop = going.iter().map(padding).min().unwrap_or(0);
            let kept: Vec<i64> = going.iter().map(|&p| p as i64).collect();
            let kept = Tensor::from_slice(&kept).f_to_device(device)?;
            cache.keep(&kept, drop)?;
            real = real
                .f_index_select(0, &kept)?
                .f_narrow(1, drop, past - drop)?;
            active = going.iter().map(|&p| active[p]).collect();
        }
        let next: Vec<i64> = active
            .iter()
            .map(|&r| rows[r].tokens.last().copied().unwrap_or(0))
            .collect();
        let n = next.len() as i64;
        input = Tensor::from_slice(&next)
            .f_view([n, 1])?
            .f_to_device(device)?;
        let ones = Tensor::f_ones([n, 1], (Kind::Int64, device))?;
        real = Tensor::f_cat(&[&real, &ones], 1)?;
    }
}

/// Decodes `row` alone, each step a forward over its whole sequence.
fn run_whole(
    model: &Model,
    row: &mut Row,
    step: &Step<'_>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<(), GenerateError> {
    let device = model.params.device();
    while row.done.is_none() {
        let input = Tensor::from_slice(&row.tokens)
            .f_view([1, -1])?
            .f_to_device(device)?;
        let logits = model.root.forward(&input, false)?;
        let last = last_logits(&logits)?;
        advance(row, &last[0], step, on_event)?;
    }
    Ok(())
}

/// Each row's logits at its last position, as floats on the CPU.
fn last_logits(logits: &Tensor) -> Result<Vec<Vec<f32>>, GenerateError> {
    let last = logits
        .f_select(1, -1)?
        .f_to_kind(Kind::Float)?
        .f_to_device(Device::Cpu)?;
    let vocab = last.size().last().copied().unwrap_or(1).max(1) as usize;
    let flat = Vec::<f32>::try_from(last.f_flatten(0, -1)?)?;
    Ok(flat.chunks(vocab).map(<[f32]>::to_vec).collect())
}

/// Chooses `row`'s next token from `logits` and checks whether the sequence ends.
fn advance(
    row: &mut Row,
    logits: &[f32],
    step: &Step<'_>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<(), GenerateError> {
    let token = row.sampler.next(logits) as i64;
    row.tokens.push(token);
    let generated = &row.tokens[row.prompt_len..];
    let mut finish = step.lm.eos.contains(&token).then_some(Finish::Eos);
    let text_ids = match finish {
        Some(_) => &generated[..generated.len() - 1],
        None => generated,
    };
    let mut text = match &step.lm.codec {
        Some(codec) => Some(codec.decode(text_ids)?),
        None => None,
    };
    if let Some(t) = text.as_mut().filter(|_| finish.is_none()) {
        if let Some(at) = find_stop(t, &step.settings.stop) {
            t.truncate(at);
            finish = Some(Finish::Stop);
        }
    }
    if finish.is_none() && generated.len() >= step.settings.max_new_tokens {
        finish = Some(Finish::Length);
    }
    if finish.is_none()
        && step
            .lm
            .context
            .is_some_and(|c| row.tokens.len() as i64 >= c)
    {
        finish = Some(Finish::Context);
    }
    if let Some(t) = &text {
        let piece = row.streamed.next(t, step.hold, finish.is_some());
        if !piece.is_empty() {
            on_event(Event::Text {
                index: row.index,
                piece: &piece,
            });
        }
    }
    if let Some(finish) = finish {
        let completion = Completion {
            index: row.index,
            prompt: row.prompt.clone(),
            prompt_ids: row.tokens[..row.prompt_len].to_vec(),
            ids: row.tokens[row.prompt_len..].to_vec(),
            completion: text,
            finish,
        };
        on_event(Event::Done(&completion));
        row.done = Some(completion);
    }
    Ok(())
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
