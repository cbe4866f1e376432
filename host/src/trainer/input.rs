//! Loader batches to the device: the pixels cross as the loader made them (`u8`, or `f32` after a
//! method's transform), token ids as `i64`, and the device scales and normalizes the pixels.
//!
//! On CUDA the host buffers are pinned and the copies `non_blocking`, and training copies the
//! next batch while the current step runs ([`TrainInput`]): on a side stream, with an event the
//! compute stream waits on, as PyTorch's `DataLoader(pin_memory=True)` with a CUDA-stream
//! prefetcher does. On the CPU the same steps run in order, without streams, and give the same
//! batches.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};

use tch::{Device, Kind, TchError, Tensor};

use tessera_plugin_api::keys;

use crate::data::{DataError, HostBatch, HostInput, Normalize, Pixels, TokenTargets};
use crate::engine::Batch;

use super::error::Result;
use super::Trainer;

extern "C" {
    fn tessera_stream_last_error() -> *const c_char;
    fn tessera_stream_from_pool(device: i32, out: *mut i64) -> i32;
    fn tessera_stream_current(device: i32, out: *mut i64) -> i32;
    fn tessera_stream_exchange(device: i32, id: i64, previous: *mut i64) -> i32;
    fn tessera_event_new() -> *mut c_void;
    fn tessera_event_free(event: *mut c_void);
    fn tessera_event_record(event: *mut c_void, device: i32, id: i64) -> i32;
    fn tessera_event_block(event: *mut c_void, device: i32, id: i64) -> i32;
    fn tessera_record_stream(tensor: *const c_void, device: i32, id: i64) -> i32;
    fn tessera_pinned_copy(
        data: *const c_void,
        nbytes: i64,
        dtype: i32,
        sizes: *const i64,
        ndim: i32,
    ) -> *mut c_void;
}

/// The shim's last error on this thread, as a libtorch error saying what was being done.
fn shim_error(doing: &str) -> TchError {
    // SAFETY: the shim returns a NUL-terminated thread-local string that lives until the next
    // failing call on this thread; it is copied at once.
    let message = unsafe { CStr::from_ptr(tessera_stream_last_error()) }.to_string_lossy();
    TchError::Torch(format!("{doing}: {message}"))
}

fn check(status: i32, doing: &str) -> Result<(), TchError> {
    if status == 0 {
        Ok(())
    } else {
        Err(shim_error(doing))
    }
}

/// A host tensor of `shape` holding `data`, in pinned memory when `device` is CUDA (so that a
/// `non_blocking` copy is asynchronous).
fn host_tensor<T: tch::kind::Element>(
    data: &[T],
    shape: &[i64],
    device: Device,
) -> Result<Tensor, TchError> {
    if !device.is_cuda() {
        return Tensor::f_from_slice(data)?.f_view(shape);
    }
    // c10's `ScalarType` numbers of the kinds batches hold.
    let dtype = match T::KIND {
        Kind::Uint8 => 0,
        Kind::Int64 => 4,
        Kind::Float => 6,
        other => {
            return Err(TchError::Kind(format!(
                "a batch of {other:?} cannot be pinned (u8, i64 and f32 can)"
            )))
        }
    };
    let nbytes = std::mem::size_of_val(data) as i64;
    // SAFETY: `data` holds `nbytes` bytes and `shape` `shape.len()` sizes, both alive for the
    // call; the result is a new `at::Tensor*` that the returned `Tensor` owns.
    let raw = unsafe {
        tessera_pinned_copy(
            data.as_ptr().cast(),
            nbytes,
            dtype,
            shape.as_ptr(),
            shape.len() as i32,
        )
    };
    if raw.is_null() {
        return Err(shim_error("allocating pinned host memory for a batch"));
    }
    // SAFETY: `raw` is a new, owned `at::Tensor*`.
    Ok(unsafe { Tensor::from_ptr(raw.cast()) })
}

/// `data` as a tensor of `shape` on `device`: pinned and copied `non_blocking` on the current
/// stream when `device` is CUDA.
fn to_device_tensor<T: tch::kind::Element>(
    data: &[T],
    shape: &[i64],
    device: Device,
) -> Result<Tensor, TchError> {
    host_tensor(data, shape, device)?.f_to_device_(device, T::KIND, true, false)
}

/// The pixels as the model sees them: `u8` scaled to [0, 1] (÷255), then `(x - mean) * (1 /
/// std)` per channel (`per_channel`: the two `[1, C, 1, 1]` tensors on the device), in `f32`,
/// in place on the device — on the CPU the same bits as the loader's host formula
/// ([`HostBatch::input_f32`]).
fn scale_and_normalize(
    pixels: Tensor,
    bytes: bool,
    per_channel: Option<&(Tensor, Tensor)>,
) -> Result<Tensor, TchError> {
    let mut x = if bytes {
        pixels.f_to_kind(Kind::Float)?.f_div_scalar_(255.0)?
    } else {
        pixels
    };
    if let Some((mean, inv_std)) = per_channel {
        x = x.f_sub_(mean)?.f_mul_(inv_std)?;
    }
    Ok(x)
}

/// A token id outside `[0, rows)`, found on the host before the batch is uploaded.
fn check_token_ids(ids: &[i64], rows: i64, what: &str) -> Result<(), TchError> {
    match ids.iter().position(|&id| id < 0 || id >= rows) {
        None => Ok(()),
        Some(at) => Err(TchError::Shape(format!(
            "{what}: token id {} (at position {at} of the batch) is outside the model's \
             vocabulary [0, {rows}) (its token embedding's rows): the data holds ids the model \
             cannot embed (a larger model.vocab_size, or data tokenized for another vocabulary)",
            ids[at]
        ))),
    }
}

/// A normalization for a channel count, with its `[1, C, 1, 1]` mean and 1/std on the device.
type PerChannel = (Normalize, i64, (Tensor, Tensor));

/// Moves loader batches to one device: the pixels cross as the loader made them and are scaled
/// and normalized there, with the normalization's per-channel mean and 1/std uploaded once;
/// token ids are checked on the host against the model's token embedding first, so the model
/// never checks them on the device (a read on the host every forward).
pub struct Uploader {
    device: Device,
    /// The rows of the model's token embedding ([`crate::model::Model::token_rows`]).
    token_rows: Option<i64>,
    /// The normalizations seen, with their `[1, C, 1, 1]` mean and 1/std on the device.
    per_channel: RefCell<Vec<PerChannel>>,
}

impl Uploader {
    /// An uploader to `device` for a model whose token embedding has `token_rows` rows.
    pub fn new(device: Device, token_rows: Option<i64>) -> Uploader {
        Uploader {
            device,
            token_rows,
            per_channel: RefCell::new(Vec::new()),
        }
    }

    /// The rows of the model's token embedding, which bound the token ids.
    pub fn token_rows(&self) -> Option<i64> {
        self.token_rows
    }

    /// `normalize`'s mean and 1/std for `channels` channels on the device, uploaded at the
    /// first batch that uses them.
    fn per_channel(
        &self,
        normalize: &Normalize,
        channels: i64,
    ) -> Result<(Tensor, Tensor), TchError> {
        let mut cache = self.per_channel.borrow_mut();
        if let Some((_, _, (mean, inv_std))) = cache
            .iter()
            .find(|(n, c, _)| n == normalize && *c == channels)
        {
            return Ok((mean.shallow_clone(), inv_std.shallow_clone()));
        }
        let (mean, inv_std) = normalize.per_channel(channels as usize);
        let shape = [1, channels, 1, 1];
        let made = (
            to_device_tensor(&mean, &shape, self.device)?,
            to_device_tensor(&inv_std, &shape, self.device)?,
        );
        let out = (made.0.shallow_clone(), made.1.shallow_clone());
        cache.push((normalize.clone(), channels, made));
        Ok(out)
    }

    /// Moves a loader batch to the device on the current stream, as the state's batch: images
    /// become a `[B, C, H, W]` float input (scaled and normalized there) and `[B]` class
    /// indices, token sequences a `[B, T]` int64 input (its ids checked first) and `[B, T]`
    /// target ids (or `[B]` class indices: labelled text), with a `[B, T]` int64
    /// `attention_mask` entry when they are padded and a `[B, T]` int64 `token_type_ids` entry
    /// when they are sentence pairs. On CUDA the host buffers are pinned and
    /// the copies do not block the host.
    pub fn batch(&self, batch: &HostBatch) -> Result<Batch, TchError> {
        let device = self.device;
        let (mut attention_mask, mut token_type_ids) = (None, None);
        let (input, target) = match &batch.input {
            HostInput::Pixels {
                data,
                shape,
                normalize,
            } => {
                let shape = shape.map(|v| v as i64);
                let pixels = match data {
                    Pixels::Bytes(bytes) => to_device_tensor(bytes, &shape, device)?,
                    Pixels::Floats(values) => to_device_tensor(values, &shape, device)?,
                };
                let bytes = matches!(data, Pixels::Bytes(_));
                let per_channel = match normalize.as_deref() {
                    Some(n) => Some(self.per_channel(n, shape[1])?),
                    None => None,
                };
                let input = scale_and_normalize(pixels, bytes, per_channel.as_ref())?;
                (input, to_device_tensor(&batch.target, &[shape[0]], device)?)
            }
            HostInput::Tokens {
                ids,
                shape,
                targets,
                attention_mask: mask,
                token_type_ids: types,
            } => {
                if let Some(rows) = self.token_rows {
                    check_token_ids(ids, rows, "the batch's input ids")?;
                }
                let shape = shape.map(|v| v as i64);
                let target_shape = match targets {
                    TokenTargets::PerToken => &shape[..],
                    TokenTargets::PerSequence => &shape[..1],
                };
                if let Some(mask) = mask {
                    attention_mask = Some(to_device_tensor(mask, &shape, device)?);
                }
                if let Some(types) = types {
                    token_type_ids = Some(to_device_tensor(types, &shape, device)?);
                }
                (
                    to_device_tensor(ids, &shape, device)?,
                    to_device_tensor(&batch.target, target_shape, device)?,
                )
            }
        };
        let mut out = Batch::new(input, target);
        if let Some(mask) = attention_mask {
            out.set(keys::ATTENTION_MASK, mask);
        }
        if let Some(types) = token_type_ids {
            out.set(keys::TOKEN_TYPE_IDS, types);
        }
        Ok(out)
    }
}

/// Moves a loader batch to `device` (an [`Uploader`] for one batch, without a token bound).
pub fn to_device(batch: &HostBatch, device: Device) -> Result<Batch, TchError> {
    Uploader::new(device, None).batch(batch)
}

impl Trainer {
    /// Moves a loader batch to the device as the state's batch (see [`Uploader::batch`]).
    pub(super) fn device_batch(&self, b: HostBatch) -> Result<Batch> {
        Ok(self.uploader.batch(&b)?)
    }
}

/// A CUDA event (`c10::Event`), freed on drop.
struct Event(*mut c_void);

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `tessera_event_new` and is freed once.
        unsafe { tessera_event_free(self.0) }
    }
}

/// The side stream that copies the next batch, and the event that marks the copy done.
struct SideStream {
    device: i32,
    stream: i64,
    copied: Event,
}

impl SideStream {
    fn new(device: i32) -> Result<SideStream, TchError> {
        let mut stream = 0;
        // SAFETY: `stream` is a valid out-pointer for the call.
        check(
            unsafe { tessera_stream_from_pool(device, &mut stream) },
            "taking a CUDA stream for the input copies",
        )?;
        // SAFETY: no arguments; a null result is checked.
        let event = unsafe { tessera_event_new() };
        if event.is_null() {
            return Err(shim_error("creating a CUDA event for the input copies"));
        }
        Ok(SideStream {
            device,
            stream,
            copied: Event(event),
        })
    }

    /// The current stream of the device on this thread: the compute stream.
    fn current(&self) -> Result<i64, TchError> {
        let mut stream = 0;
        // SAFETY: `stream` is a valid out-pointer for the call.
        check(
            unsafe { tessera_stream_current(self.device, &mut stream) },
            "reading the current CUDA stream",
        )?;
        Ok(stream)
    }

    /// Makes `stream` current on this thread; returns the stream it replaces.
    fn exchange(&self, stream: i64) -> Result<i64, TchError> {
        let mut previous = 0;
        // SAFETY: `previous` is a valid out-pointer for the call.
        check(
            unsafe { tessera_stream_exchange(self.device, stream, &mut previous) },
            "switching CUDA streams",
        )?;
        Ok(previous)
    }

    /// Moves `batch` to the device on the side stream and records `copied` after it.
    fn copy(&self, batch: &HostBatch, uploader: &Uploader) -> Result<Batch, TchError> {
        let compute = self.exchange(self.stream)?;
        let copied = uploader.batch(batch).and_then(|b| {
            // SAFETY: the event is alive; the stream id came from the pool.
            check(
                unsafe { tessera_event_record(self.copied.0, self.device, self.stream) },
                "recording the input copy's CUDA event",
            )?;
            Ok(b)
        });
        self.exchange(compute)?;
        copied
    }

    /// Makes the current (compute) stream wait for the copy of `batch`, and tells the caching
    /// allocator that the compute stream uses its tensors (allocated on the side stream).
    fn hand_over(&self, batch: &Batch) -> Result<(), TchError> {
        let compute = self.current()?;
        // SAFETY: the event is alive; the stream id is the current stream's.
        check(
            unsafe { tessera_event_block(self.copied.0, self.device, compute) },
            "making the compute stream wait for the input copy",
        )?;
        for tensor in batch.keys().iter().filter_map(|k| batch.get(k)) {
            // SAFETY: `tensor` is a live `at::Tensor*` for the call.
            check(
                unsafe { tessera_record_stream(tensor.as_ptr().cast(), self.device, compute) },
                "recording the batch's use on the compute stream",
            )?;
        }
        Ok(())
    }
}

/// The batches of one training epoch on their way to the device, one ahead: when a batch is
/// taken, the next is already being copied (on CUDA, on a side stream, while the current step
/// runs; on the CPU, right away, the same work in the same order as without prefetching).
///
/// The loader's position is not what a checkpoint records (the clock is): a batch fetched
/// ahead but not trained when the run stops is made again by the resumed run, so none is lost
/// or skipped. A loader error is reported when its batch is due, after the batches before it.
/// The host's part of fetching batch n + 1 happens within step n's timed interval (from its
/// request for data to its end), so training time still counts every batch's preparation.
pub(super) struct TrainInput<I> {
    batches: I,
    /// The epoch's own uploader: its per-channel tensors live on the side stream.
    uploader: Uploader,
    side: Option<SideStream>,
    next: Option<Result<Batch>>,
}

impl<I: Iterator<Item = std::result::Result<HostBatch, DataError>>> TrainInput<I> {
    /// Serves `batches` on `device`, their token ids checked against `token_rows`.
    pub(super) fn new(
        batches: I,
        device: Device,
        token_rows: Option<i64>,
    ) -> Result<TrainInput<I>> {
        let side = match device {
            Device::Cuda(index) => Some(SideStream::new(index as i32)?),
            _ => None,
        };
        Ok(TrainInput {
            batches,
            uploader: Uploader::new(device, token_rows),
            side,
            next: None,
        })
    }

    /// Takes a batch from the loader and starts its copy; `None` at the end of the epoch.
    fn fetch(&mut self) -> Option<Result<Batch>> {
        let host = match self.batches.next()? {
            Ok(host) => host,
            Err(e) => return Some(Err(e.into())),
        };
        let copied = match &self.side {
            Some(side) => side.copy(&host, &self.uploader),
            None => self.uploader.batch(&host),
        };
        Some(copied.map_err(Into::into))
    }

    /// The next batch, ready for the compute stream; the copy of the one after it is started.
    /// `None` at the end of the epoch.
    pub(super) fn next_batch(&mut self) -> Option<Result<Batch>> {
        let batch = match self.next.take().or_else(|| self.fetch())? {
            Ok(batch) => batch,
            Err(e) => return Some(Err(e)),
        };
        if let Some(side) = &self.side {
            if let Err(e) = side.hand_over(&batch) {
                return Some(Err(e.into()));
            }
        }
        self.next = self.fetch();
        Some(Ok(batch))
    }
}

#[cfg(test)]
#[path = "input_tests.rs"]
mod tests;
