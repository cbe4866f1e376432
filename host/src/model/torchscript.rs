//! A model made in PyTorch: a TorchScript file (`torch.jit.script(model).save(path)`), named by
//! `[model] torchscript`. It is one [`Layer`] of kind `torchscript`: its parameters and buffers
//! join the [`ParamStore`] under their PyTorch `state_dict` names (so the optimizer, checkpoints
//! and export see them as a zoo model's), but surgery cannot see inside it.
//!
//! libtorch's JIT graph optimizations (profiling, fusion, symbolic differentiation) are switched
//! off (process-wide) when such a model is loaded: the graph then runs op by op, as eager PyTorch
//! does, at every call. Optimized, it would be re-planned after its first few calls — at another
//! step in a resumed process — and, on CUDA, fused into other kernels, so a resumed run could
//! drift from the straight one.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};

use tch::{Device, Kind, TchError, Tensor};

use super::layers::Layer;
use super::params::{ParamStore, Role};
use super::InputShape;

extern "C" {
    fn tessera_script_last_error() -> *const c_char;
    fn tessera_script_load(path: *const c_char, device: i32) -> *mut c_void;
    fn tessera_script_free(module: *mut c_void);
    fn tessera_script_named_tensors(
        module: *mut c_void,
        data: *mut c_void,
        visit: extern "C" fn(*mut c_void, *const c_char, *mut c_void, i32),
    ) -> i32;
    fn tessera_script_forward(module: *mut c_void, input: *mut c_void, train: i32) -> *mut c_void;
}

/// The last shim error on this thread.
fn last_error() -> String {
    // SAFETY: the shim returns a NUL-terminated thread-local string that lives until the next
    // failing call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(tessera_script_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A loaded TorchScript module (an owned `torch::jit::Module*`).
#[derive(Debug)]
struct ScriptModule(*mut c_void);

// SAFETY: the module is used by one thread at a time (a `Layer` is `Send`, not `Sync`), and
// libtorch's module may move between threads.
unsafe impl Send for ScriptModule {}

impl Drop for ScriptModule {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `tessera_script_load` and is freed once.
        unsafe { tessera_script_free(self.0) }
    }
}

/// One named tensor as the shim lists it.
struct Named {
    name: String,
    tensor: Tensor,
    role: Role,
}

extern "C" fn collect(data: *mut c_void, name: *const c_char, tensor: *mut c_void, param: i32) {
    // SAFETY: `data` is the `Vec<Named>` passed to `tessera_script_named_tensors` below, `name`
    // a NUL-terminated string valid for this call, and `tensor` a new `at::Tensor*` that is ours.
    let (out, name, tensor) = unsafe {
        (
            &mut *(data as *mut Vec<Named>),
            CStr::from_ptr(name).to_string_lossy().into_owned(),
            Tensor::from_ptr(tensor.cast()),
        )
    };
    let role = if param != 0 {
        Role::Parameter
    } else {
        Role::Buffer
    };
    out.push(Named { name, tensor, role });
}

/// A TorchScript model as one layer of the module tree.
#[derive(Debug)]
pub struct TorchscriptModel {
    module: ScriptModule,
    file: PathBuf,
    tensors: Vec<(String, Tensor)>,
}

impl TorchscriptModel {
    /// Loads `file` onto `device`, registers its parameters and buffers in `store` (by their
    /// `state_dict` names) and checks that it maps a batch of `input` to `(N, num_classes)`.
    /// Every error names the file.
    pub fn load(
        file: &Path,
        store: &mut ParamStore,
        input: InputShape,
        num_classes: i64,
    ) -> Result<TorchscriptModel, TchError> {
        let shown = file.display();
        if !file.is_file() {
            return Err(TchError::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("TorchScript model {shown}: no such file"),
            )));
        }
        let path = CString::new(file.as_os_str().as_encoded_bytes())
            .map_err(|_| TchError::FileFormat(format!("{shown}: the path holds a NUL byte")))?;
        let device = match store.device() {
            Device::Cuda(i) => i as i32,
            _ => -1,
        };
        tch::jit::f_set_graph_executor_optimize(false)?;
        // SAFETY: `path` is a NUL-terminated string; the result is owned by `ScriptModule`.
        let raw = unsafe { tessera_script_load(path.as_ptr(), device) };
        if raw.is_null() {
            return Err(TchError::FileFormat(format!(
                "{shown} is not a TorchScript model (save one with \
                 `torch.jit.script(model).save(path)`): {}",
                summary(&last_error())
            )));
        }
        let module = ScriptModule(raw);
        let mut named: Vec<Named> = Vec::new();
        // SAFETY: `module.0` is live; `collect` gets `named` back as its `data`.
        let rc = unsafe {
            tessera_script_named_tensors(module.0, (&mut named as *mut Vec<Named>).cast(), collect)
        };
        if rc != 0 {
            return Err(TchError::Torch(format!(
                "{shown}: listing its parameters and buffers: {}",
                last_error()
            )));
        }
        for n in &named {
            store.adopt(n.name.clone(), &n.tensor, n.role);
        }
        let model = TorchscriptModel {
            module,
            file: file.to_owned(),
            tensors: named.into_iter().map(|n| (n.name, n.tensor)).collect(),
        };
        model.check_output(input, num_classes, store.device())?;
        Ok(model)
    }

    /// The file the model was loaded from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Runs the model once, in evaluation mode and without gradients, on a zero batch of two
    /// `input` samples: its output must be `(2, num_classes)`.
    fn check_output(
        &self,
        input: InputShape,
        num_classes: i64,
        device: Device,
    ) -> Result<(), TchError> {
        let shown = self.file.display();
        let dims = [2, input.channels, input.height, input.width];
        let xs = Tensor::f_zeros(dims, (Kind::Float, device))?;
        let ys = tch::no_grad(|| self.run(&xs, false)).map_err(|e| {
            TchError::Shape(format!(
                "{shown} does not run on a batch of {} x {} x {} images (channels x height x \
                 width, as the data gives them): {}",
                input.channels, input.height, input.width, e
            ))
        })?;
        if ys.size() != [2, num_classes] {
            return Err(TchError::Shape(format!(
                "{shown} maps a batch of 2 images to an output of shape {:?}; a classifier of \
                 {num_classes} classes must give (N, {num_classes}) = [2, {num_classes}] (check \
                 its last layer and `[model] num_classes`)",
                ys.size()
            )));
        }
        Ok(())
    }

    /// Runs `forward`; a failure comes back as libtorch's message, summed up.
    fn run(&self, xs: &Tensor, train: bool) -> Result<Tensor, String> {
        let mut input = xs.shallow_clone();
        // SAFETY: the module is live; `input` is a live `at::Tensor*` the shim only reads; the
        // result is a new `at::Tensor*` that becomes ours.
        let out = unsafe {
            tessera_script_forward(self.module.0, input.as_mut_ptr().cast(), i32::from(train))
        };
        if out.is_null() {
            return Err(summary(&last_error()).to_owned());
        }
        // SAFETY: see above.
        Ok(unsafe { Tensor::from_ptr(out.cast()) })
    }
}

/// The gist of a libtorch message: the Python-style `...Error: what` line that ends a TorchScript
/// interpreter traceback, else the first line (C++ frames follow it).
fn summary(message: &str) -> &str {
    let lines = || message.lines().map(str::trim).filter(|l| !l.is_empty());
    lines()
        .rev()
        .find_map(|l| {
            let (head, rest) = l.split_once("Error: ")?;
            head.chars().all(char::is_alphanumeric).then_some(rest)
        })
        .or_else(|| lines().next())
        .unwrap_or("")
}

impl Layer for TorchscriptModel {
    fn kind(&self) -> &str {
        "torchscript"
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        self.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect()
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        self.run(xs, train)
            .map_err(|e| TchError::Torch(format!("{}: forward failed: {e}", self.file.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::summary;

    #[test]
    fn summary_keeps_the_error_line_of_a_torchscript_traceback() {
        let traceback = "The following operation failed in the TorchScript interpreter.\n\
            Traceback of TorchScript (most recent call last):\n  File \"x.py\", line 3\n\
            RuntimeError: expected input[2, 1, 28, 28] to have 3 channels, but got 1\n";
        assert_eq!(
            summary(traceback),
            "expected input[2, 1, 28, 28] to have 3 channels, but got 1"
        );
        assert_eq!(
            summary("\nnot a ZIP archive\n  frame #0"),
            "not a ZIP archive"
        );
        assert_eq!(summary(""), "");
    }
}
