#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::{
    export_plugin, keys, Context, Error, ErrorKind, Event, Hook, Method, Plugin, Settings,
};

/// The batch key of an optional padding mask (Hugging Face's `attention_mask`: 1 = token,
/// 0 = padding). Tessera's packed token batches have none.
pub const MASK_KEY: &str = "attention_mask";
/// Metric (Composer's key): the sequence length of the batch.
pub const METRIC_SEQ_LEN: &str = "seq_length_warmup/curr_seq_len";
/// Metric (Composer's key): the batch size after the change (re-chunking makes it larger).
pub const METRIC_BATCH_SIZE: &str = "seq_length_warmup/curr_bs";

/// The warmup schedule's settings, with Composer's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Fraction of the run, in `[0, 1]`, over which the length grows to `max_seq_length`.
    pub duration: f64,
    /// The length at the start.
    pub min_seq_length: i64,
    /// The length at the end of the warmup (and the worst-case memory pass).
    pub max_seq_length: i64,
    /// The length grows in steps of this many tokens.
    pub step_size: i64,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            duration: 0.3,
            min_seq_length: 8,
            max_seq_length: 1024,
            step_size: 8,
        }
    }
}

impl Schedule {
    /// Composer's checks (`duration` in `[0, 1]`, `max_seq_length ≥ min_seq_length`) and those
    /// its arithmetic needs (`min_seq_length ≥ 1`, `step_size ≥ 1`); errors name the setting.
    pub fn validate(&self) -> Result<(), Error> {
        if !(0.0..=1.0).contains(&self.duration) {
            return Err(Error::config(format!(
                "`duration` must be between 0 and 1, got {}",
                self.duration
            )));
        }
        if self.min_seq_length < 1 {
            return Err(Error::config(format!(
                "`min_seq_length` must be at least 1, got {}",
                self.min_seq_length
            )));
        }
        if self.max_seq_length < self.min_seq_length {
            return Err(Error::config(format!(
                "`max_seq_length` = {} must be at least `min_seq_length` = {}",
                self.max_seq_length, self.min_seq_length
            )));
        }
        if self.step_size < 1 {
            return Err(Error::config(format!(
                "`step_size` must be at least 1, got {}",
                self.step_size
            )));
        }
        Ok(())
    }
}

/// Composer's `SeqLengthWarmup` schedule at `batch` (completed batches) of a run of
/// `total_batches`: `W = int(total · duration)`, `U = (max − min) // step`, `every = W // U`,
/// `L = clamp(step · (batch // every) + min, min, max)`.
///
/// Where Composer divides by zero: `U = 0` (`max − min < step`) gives `min` (nothing to grow);
/// `every = 0` (a warmup of fewer batches than steps, golden quirk 5, e.g. 100 batches with the
/// defaults) is an error that says which settings to change.
pub fn seq_len_at(batch: u64, total_batches: u64, s: &Schedule) -> Result<i64, Error> {
    s.validate()?;
    let warmup = (total_batches as f64 * s.duration) as u64;
    let updates = ((s.max_seq_length - s.min_seq_length) / s.step_size) as u64;
    if updates == 0 {
        return Ok(s.min_seq_length);
    }
    let every = warmup / updates;
    if every == 0 {
        return Err(Error::config(format!(
            "seq_length_warmup: a warmup of {warmup} batches (duration {} of {total_batches}) \
             is shorter than its {updates} length steps ((max_seq_length {} - min_seq_length {}) \
             // step_size {}); Composer divides by zero here. Raise `duration` or `step_size`, \
             narrow the lengths, or train longer",
            s.duration, s.max_seq_length, s.min_seq_length, s.step_size
        )));
    }
    let grown = (batch / every)
        .checked_mul(s.step_size as u64)
        .and_then(|g| g.checked_add(s.min_seq_length as u64))
        .unwrap_or(u64::MAX);
    Ok(grown.min(s.max_seq_length as u64) as i64)
}

/// A token batch: `input` `(B, S)` and the tensors that follow it.
#[derive(Debug)]
pub struct SeqBatch {
    /// Token ids `(B, S)` (Composer's `input_ids`).
    pub input: Tensor,
    /// Targets `(B, S)` (Composer's `labels`; Tessera's next-token ids), if any.
    pub target: Option<Tensor>,
    /// Padding mask `(B, S)` (Composer's `attention_mask`), if any.
    pub mask: Option<Tensor>,
}

fn check_like(what: &str, t: &Option<Tensor>, shape: &[i64]) -> Result<(), Error> {
    match t {
        Some(t) if t.size() != shape => Err(format!(
            "seq_length_warmup: `{what}` has shape {:?}, the input {shape:?}",
            t.size()
        )
        .into()),
        _ => Ok(()),
    }
}

fn map(
    t: Option<Tensor>,
    f: impl Fn(&Tensor) -> Result<Tensor, Error>,
) -> Result<Option<Tensor>, Error> {
    t.as_ref().map(f).transpose()
}

/// Composer's `set_batch_sequence_length(batch, L, truncate, preserve_end_of_sequence)`.
///
/// - `L ≥ S`: the batch unchanged.
/// - `truncate`: every tensor becomes `[:, :L]`. With `preserve_eos`, in every tensor (input,
///   target and mask, as Composer does for every batch tensor) the value at the row's last
///   position (`mask.sum() − 1`; without a mask, every row is full, as a packed batch is) is
///   written at `min(that, L − 1)`, so each (input, target) pair stays a pair of the stream.
/// - otherwise (re-chunk): every tensor is flattened, cut to `(numel // L) · L` tokens (the
///   remainder dropped) and viewed as rows of `L`, so the batch has more, shorter rows and
///   each element keeps its partner in the other tensors (a next-token target stays aligned).
pub fn set_batch_sequence_length(
    batch: SeqBatch,
    len: i64,
    truncate: bool,
    preserve_eos: bool,
) -> Result<SeqBatch, Error> {
    let shape = batch.input.size();
    if shape.len() != 2 {
        return Err(format!(
            "seq_length_warmup: the input must be token ids (B, S), got shape {shape:?}"
        )
        .into());
    }
    check_like("target", &batch.target, &shape)?;
    check_like(MASK_KEY, &batch.mask, &shape)?;
    if len < 1 {
        return Err(format!("seq_length_warmup: sequence length {len} is not positive").into());
    }
    let (b, s) = (shape[0], shape[1]);
    if len >= s {
        return Ok(batch);
    }
    if truncate {
        let cut =
            |t: &Tensor| -> Result<Tensor, Error> { Ok(t.f_narrow(1, 0, len)?.f_contiguous()?) };
        if !preserve_eos {
            return Ok(SeqBatch {
                input: cut(&batch.input)?,
                target: map(batch.target, cut)?,
                mask: map(batch.mask, cut)?,
            });
        }
        let device = batch.input.device();
        let last = match &batch.mask {
            Some(m) => m
                .f_sum_dim_intlist(1, false, Kind::Int64)?
                .f_sub_scalar(1)?,
            None => Tensor::f_full([b], s - 1, (Kind::Int64, device))?,
        };
        // Python indexing: -1 (an empty row) is the row's last position.
        let read = last.f_remainder(s)?.f_unsqueeze(1)?;
        let write = last
            .f_clamp_max(len - 1)?
            .f_remainder(len)?
            .f_unsqueeze(1)?;
        // Composer does this for every tensor of the batch: the value at the row's last
        // position is written at min(that, L − 1) of the cut tensor.
        let keep_end = |t: &Tensor| -> Result<Tensor, Error> {
            let end = t.f_gather(1, &read, false)?;
            Ok(cut(t)?.f_scatter(1, &write, &end)?)
        };
        return Ok(SeqBatch {
            input: keep_end(&batch.input)?,
            target: map(batch.target, keep_end)?,
            mask: map(batch.mask, keep_end)?,
        });
    }
    let keep = (b * s / len) * len;
    let chunk = |t: &Tensor| -> Result<Tensor, Error> {
        Ok(t.f_reshape([-1])?
            .f_narrow(0, 0, keep)?
            .f_view([-1, len])?
            .f_contiguous()?)
    };
    Ok(SeqBatch {
        input: chunk(&batch.input)?,
        target: map(batch.target, chunk)?,
        mask: map(batch.mask, chunk)?,
    })
}

/// The SeqLengthWarmup method: shorter sequences early in training, at `after_dataloader`.
#[derive(Debug)]
pub struct SeqLengthWarmup {
    schedule: Schedule,
    truncate: bool,
    preserve_end_of_sequence: bool,
    activated: bool,
}

impl SeqLengthWarmup {
    /// The schedule's settings.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// `truncate` (else re-chunk).
    pub fn truncate(&self) -> bool {
        self.truncate
    }

    /// `preserve_end_of_sequence`.
    pub fn preserve_end_of_sequence(&self) -> bool {
        self.preserve_end_of_sequence
    }

    fn set_length(&self, batch: SeqBatch, len: i64) -> Result<SeqBatch, Error> {
        set_batch_sequence_length(batch, len, self.truncate, self.preserve_end_of_sequence)
    }

    /// Composer's `_activate_model`: one forward and backward pass at `max_seq_length` on the
    /// (already cut) batch, so the allocator reaches its worst case on the first batch, then
    /// every gradient zeroed.
    fn memory_pass(&self, ctx: &mut Context<'_>, batch: &SeqBatch) -> Result<(), Error> {
        let target = batch
            .target
            .as_ref()
            .ok_or("seq_length_warmup: the batch has no `target` for the memory pass")?;
        let output = ctx.forward(&batch.input, true)?;
        let loss = ctx.loss(&output, target, false)?;
        loss.f_backward()?;
        for p in ctx.parameters()? {
            if !p.trainable {
                continue;
            }
            if let Some(mut t) = ctx.parameter(p.name.as_str())? {
                t.zero_grad();
            }
        }
        Ok(())
    }
}

impl Method for SeqLengthWarmup {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let time = ctx.time();
        if !time.training {
            return Ok(());
        }
        if time.max_batches == 0 {
            return Err(Error::new(
                ErrorKind::CONFIG,
                "seq_length_warmup needs the run's length in batches: set `max_duration` in \
                 epochs or batches (`ep`, `ba`), as Composer requires",
            ));
        }
        let input = ctx
            .tensor(keys::INPUT)
            .ok_or("seq_length_warmup: the batch has no `input`")?;
        let mut batch = SeqBatch {
            input,
            target: ctx.tensor(keys::TARGET),
            mask: ctx.tensor(MASK_KEY),
        };
        let len = seq_len_at(time.batch, time.max_batches, &self.schedule)?;
        if !self.activated {
            // Only at the run's first batch: a resumed run then draws the same random numbers
            // (dropout) as the run it continues.
            if time.batch == 0 {
                batch = self.set_length(batch, self.schedule.max_seq_length)?;
                self.memory_pass(ctx, &batch)?;
            }
            self.activated = true;
        }
        let batch = self.set_length(batch, len)?;
        ctx.log_metric(METRIC_SEQ_LEN, len as f64);
        ctx.log_metric(METRIC_BATCH_SIZE, batch.input.size()[0] as f64);
        let mut entries = vec![(keys::INPUT, batch.input)];
        if let Some(t) = batch.target {
            entries.push((keys::TARGET, t));
        }
        if let Some(m) = batch.mask {
            entries.push((MASK_KEY, m));
        }
        ctx.set_batch(entries)
    }
}

fn length(settings: &Settings, key: &str, default: i64) -> Result<i64, Error> {
    let v = settings.u64_or(key, default as u64)?;
    i64::try_from(v).map_err(|_| Error::config(format!("`{key}` is too large: {v}")))
}

impl Plugin for SeqLengthWarmup {
    const NAME: &'static str = "seq_length_warmup";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "trains language models on short sequences first, growing them to full length";
    const DEFAULT_SETTINGS: &'static str = "duration = 0.3\nmin_seq_length = 8\n\
        max_seq_length = 1024\nstep_size = 8\ntruncate = true\npreserve_end_of_sequence = false";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::AFTER_DATALOADER)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let d = Schedule::default();
        let schedule = Schedule {
            duration: settings.f64_or("duration", d.duration)?,
            min_seq_length: length(settings, "min_seq_length", d.min_seq_length)?,
            max_seq_length: length(settings, "max_seq_length", d.max_seq_length)?,
            step_size: length(settings, "step_size", d.step_size)?,
        };
        schedule.validate()?;
        Ok(SeqLengthWarmup {
            schedule,
            truncate: settings.bool("truncate")?,
            preserve_end_of_sequence: settings.bool("preserve_end_of_sequence")?,
            activated: false,
        })
    }
}

export_plugin!(SeqLengthWarmup);
