//! Safetensors files as tensors, for every floor that reads or writes them: checkpoints, the
//! export, `init_weights`. A bottom-floor module (it knows nothing of the host).

use std::borrow::Cow;

use safetensors::tensor::{Dtype, SafeTensors, View};
use tch::{Device, Kind, Tensor};

/// A tensor as little-endian bytes on the CPU, ready for safetensors (also used by
/// `tessera export`).
pub struct Blob {
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    pub(crate) bytes: Vec<u8>,
}

impl View for &Blob {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn dtype_of(kind: Kind) -> Result<Dtype, String> {
    Ok(match kind {
        Kind::Bool => Dtype::BOOL,
        Kind::Uint8 => Dtype::U8,
        Kind::Int8 => Dtype::I8,
        Kind::Int16 => Dtype::I16,
        Kind::Int => Dtype::I32,
        Kind::Int64 => Dtype::I64,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Half => Dtype::F16,
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        other => return Err(format!("tensors of kind {other:?} cannot be saved")),
    })
}

/// The libtorch kind of a safetensors dtype, `None` for one libtorch lacks.
pub fn kind_of(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::BOOL => Kind::Bool,
        Dtype::U8 => Kind::Uint8,
        Dtype::I8 => Kind::Int8,
        Dtype::I16 => Kind::Int16,
        Dtype::I32 => Kind::Int,
        Dtype::I64 => Kind::Int64,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F16 => Kind::Half,
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        _ => return None,
    })
}

/// Copies `t` (any device, any layout) into a [`Blob`]; fails for kinds safetensors lacks.
pub fn blob_of(name: &str, t: &Tensor) -> Result<Blob, String> {
    let err = |e: tch::TchError| format!("saving `{name}`: {e}");
    let dtype = dtype_of(t.kind())?;
    let cpu = t
        .f_detach()
        .and_then(|t| t.f_to_device(Device::Cpu))
        .and_then(|t| t.f_contiguous())
        .map_err(err)?;
    let numel = cpu.numel();
    let mut bytes = vec![0u8; numel * cpu.kind().elt_size_in_bytes()];
    cpu.f_copy_data_u8(&mut bytes, numel).map_err(err)?;
    Ok(Blob {
        dtype,
        shape: cpu.size().iter().map(|&d| d as usize).collect(),
        bytes,
    })
}

/// The tensor of safetensors view `v` named `name` (copied out of the file's bytes); `Err`
/// names it when its dtype has no libtorch kind or libtorch refuses it.
pub fn tensor_of(name: &str, v: &safetensors::tensor::TensorView<'_>) -> Result<Tensor, String> {
    let (kind, shape) = kind_and_shape(v).map_err(|e| format!("`{name}` has {e}"))?;
    Tensor::f_from_data_size(v.data(), &shape, kind).map_err(|e| format!("`{name}`: {e}"))
}

/// The libtorch kind and shape of a safetensors view, or why it has none.
fn kind_and_shape(v: &safetensors::tensor::TensorView<'_>) -> Result<(Kind, Vec<i64>), String> {
    let kind = kind_of(v.dtype())
        .ok_or_else(|| format!("dtype {:?}, which Tessera cannot hold", v.dtype()))?;
    Ok((kind, v.shape().iter().map(|&d| d as i64).collect()))
}

/// A tensor over a safetensors view's bytes, without copying them: valid only while the bytes
/// live, so it is copied from at once and dropped.
pub fn borrowed(v: &safetensors::tensor::TensorView<'_>) -> Result<Tensor, tch::TchError> {
    let (kind, shape) = kind_and_shape(v).map_err(tch::TchError::Kind)?;
    let data = v.data();
    let expected = shape.iter().product::<i64>() as usize * kind.elt_size_in_bytes();
    if data.len() != expected {
        return Err(tch::TchError::Shape(format!(
            "{} bytes for shape {shape:?} of {kind:?}",
            data.len()
        )));
    }
    if data.is_empty() {
        return Tensor::f_zeros(&shape, (kind, Device::Cpu));
    }
    // SAFETY: `data` holds exactly the tensor's bytes (checked above) and outlives the returned
    // tensor, which the caller copies from and drops while the file's bytes are borrowed (the
    // `SafeTensors` view borrows them). libtorch does not keep the pointer past the copy: the
    // tensor does not own the memory and is never resized. Unaligned element pointers are fine
    // for the CPU copy kernels (x86-64 and aarch64 allow unaligned loads).
    unsafe { Tensor::f_from_blob(data.as_ptr(), &shape, &[], kind, Device::Cpu) }
}

/// Every tensor of a plain safetensors file (no Tessera metadata needed: an export, a
/// `save_pretrained` or `safetensors.torch.save_file` file), sorted by name.
pub fn read_plain_tensors(bytes: &[u8]) -> Result<Vec<(String, Tensor)>, String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let mut views = st.tensors();
    views.sort_by(|a, b| a.0.cmp(&b.0));
    views
        .into_iter()
        .map(|(name, v)| tensor_of(&name, &v).map(|t| (name, t)))
        .collect()
}
