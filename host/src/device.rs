//! Where to train (`train.device`): the CPU, a CUDA device, or CUDA when available; in a
//! data-parallel run, one CUDA device per rank (`cuda:LOCAL_RANK`). Also libtorch's
//! process-wide CUDA settings (`train.deterministic`, `train.matmul_precision`) through the
//! `host/csrc/context.cpp` shim, which tch does not reach.

use std::ffi::CStr;
use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};
use tessera_plugin_api::LIBTORCH_VERSION;

extern "C" {
    fn tessera_context_last_error() -> *const std::ffi::c_char;
    fn tessera_cuda_device_count() -> i32;
    fn tessera_cuda_set_device(index: i32) -> i32;
    fn tessera_set_determinism(deterministic: i32, benchmark: i32) -> i32;
    fn tessera_determinism() -> i32;
    fn tessera_set_matmul_precision(precision: *const std::ffi::c_char) -> i32;
    fn tessera_matmul_precision() -> i32;
}

/// Where to train. Written `"auto"`, `"cpu"`, `"cuda"` or `"cuda:N"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// CUDA when available, else the CPU (default): `cuda:0` in a single process,
    /// `cuda:LOCAL_RANK` in a data-parallel run.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA (`"cuda"`): `cuda:0` in a single process, `cuda:LOCAL_RANK` in a data-parallel run.
    CudaLocalRank,
    /// The CUDA device with this index (`"cuda:N"`), whatever the rank.
    Cuda(usize),
}

/// Where this process stands on its machine in a data-parallel run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalRank {
    /// Rank on this machine (`LOCAL_RANK`).
    pub rank: usize,
    /// Ranks on this machine (`LOCAL_WORLD_SIZE`).
    pub world: usize,
}

/// The device asked for is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// A CUDA index beyond the devices libtorch can use.
    #[error("device = \"cuda:{index}\" but {usable} CUDA device(s) are usable (libtorch {LIBTORCH_VERSION}, built {built} CUDA)")]
    Unusable {
        /// The CUDA index asked for.
        index: usize,
        /// How many CUDA devices libtorch can use.
        usable: usize,
        /// `"with"` or `"without"`: whether this libtorch was built with CUDA.
        built: &'static str,
    },
    /// More ranks on this machine than CUDA devices to give each its own.
    #[error("train.device = \"{device}\" gives each rank its own GPU (cuda:LOCAL_RANK), but this machine runs {local_world} ranks (LOCAL_WORLD_SIZE) and has {usable} CUDA device(s); start at most {usable} ranks per machine (tessera launch --nproc {usable}), or name a device for every rank (\"cuda:N\", shared)")]
    TooManyRanks {
        /// The configured device (`auto` or `cuda`).
        device: Device,
        /// Ranks on this machine.
        local_world: usize,
        /// CUDA devices on this machine.
        usable: usize,
    },
    /// libtorch refused one of the run's process-wide settings.
    #[error(transparent)]
    Setting(#[from] ContextError),
}

/// Whether this binary's libtorch was built with CUDA (`"with"` / `"without"`).
fn built() -> &'static str {
    if env!("TESSERA_LIBTORCH_HAS_CUDA") == "1" {
        "with"
    } else {
        "without"
    }
}

/// CUDA devices this process can use (0 without a GPU, a driver or a CUDA libtorch).
pub fn cuda_device_count() -> usize {
    // SAFETY: plain C call; the shim catches libtorch's exceptions (-1).
    usize::try_from(unsafe { tessera_cuda_device_count() }).unwrap_or(0)
}

impl Device {
    /// The libtorch device of a single process; fails when CUDA is asked for but unusable.
    pub fn resolve(self) -> Result<tch::Device, DeviceError> {
        self.resolve_for(None)
    }

    /// The libtorch device of this process, given its place on the machine in a data-parallel
    /// run (`None` for a single process); CUDA's current device becomes the one chosen, as
    /// `torch.cuda.set_device` (this thread's CUDA work and context go there, not to device 0).
    pub fn resolve_for(self, local: Option<LocalRank>) -> Result<tch::Device, DeviceError> {
        let device = self.resolve_with(local, cuda_device_count(), built())?;
        if let tch::Device::Cuda(i) = device {
            set_current_cuda_device(i)?;
        }
        Ok(device)
    }

    /// [`Device::resolve_for`]'s choice on a machine with `usable` CUDA devices (for tests).
    pub fn resolve_with(
        self,
        local: Option<LocalRank>,
        usable: usize,
        built: &'static str,
    ) -> Result<tch::Device, DeviceError> {
        let cuda = |index: usize| {
            if index < usable {
                Ok(tch::Device::Cuda(index))
            } else {
                Err(DeviceError::Unusable {
                    index,
                    usable,
                    built,
                })
            }
        };
        let per_rank = |device: Device| match local {
            None => cuda(0),
            Some(l) if l.world > usable => Err(DeviceError::TooManyRanks {
                device,
                local_world: l.world,
                usable,
            }),
            Some(l) => cuda(l.rank),
        };
        match self {
            Device::Cpu => Ok(tch::Device::Cpu),
            Device::Auto if usable == 0 => Ok(tch::Device::Cpu),
            Device::Auto | Device::CudaLocalRank => per_rank(self),
            Device::Cuda(i) => cuda(i),
        }
    }
}

/// Makes CUDA device `index` this thread's current device.
fn set_current_cuda_device(index: usize) -> Result<(), DeviceError> {
    // SAFETY: plain C call; the shim catches libtorch's exceptions.
    if unsafe { tessera_cuda_set_device(index as i32) } != 0 {
        return Err(DeviceError::Unusable {
            index,
            usable: cuda_device_count(),
            built: built(),
        });
    }
    Ok(())
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::CudaLocalRank => f.write_str("cuda"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// The device string is not one of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device {0:?}; expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"")]
pub struct UnknownDevice(pub String);

impl FromStr for Device {
    type Err = UnknownDevice;

    fn from_str(s: &str) -> Result<Self, UnknownDevice> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::CudaLocalRank),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Ok(Device::Cuda(i)),
                _ => Err(UnknownDevice(s.to_string())),
            },
        }
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// `train.matmul_precision`: how float32 matrix products may be computed, as
/// `torch.set_float32_matmul_precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatmulPrecision {
    /// Full float32 (PyTorch's default).
    Highest,
    /// TensorFloat-32 on GPUs that have it (NVIDIA Ampere and later), as PyTorch already does
    /// for convolutions; unchanged on CPUs without TF32 (default).
    #[default]
    High,
    /// bfloat16 products where the hardware has them (GPUs, and CPUs with AVX512-BF16/AMX).
    Medium,
}

impl MatmulPrecision {
    /// Accepted spellings, for the config reader.
    pub const CHOICES: [(&'static str, MatmulPrecision); 3] = [
        ("highest", MatmulPrecision::Highest),
        ("high", MatmulPrecision::High),
        ("medium", MatmulPrecision::Medium),
    ];

    /// The name torch uses.
    pub fn as_str(self) -> &'static str {
        match self {
            MatmulPrecision::Highest => "highest",
            MatmulPrecision::High => "high",
            MatmulPrecision::Medium => "medium",
        }
    }
}

/// libtorch refused a setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {message}")]
pub struct ContextError {
    /// The setting.
    pub what: String,
    /// libtorch's message.
    pub message: String,
}

fn context_error(what: &str) -> ContextError {
    // SAFETY: the shim returns a NUL-terminated thread-local string, copied at once.
    let message = unsafe { CStr::from_ptr(tessera_context_last_error()) }
        .to_string_lossy()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    ContextError {
        what: what.to_owned(),
        message,
    }
}

/// The value of `CUBLAS_WORKSPACE_CONFIG` that deterministic cuBLAS needs (PyTorch accepts
/// `:4096:8` and `:16:8`).
pub const CUBLAS_DETERMINISTIC: &str = ":4096:8";

/// What `CUBLAS_WORKSPACE_CONFIG` must become for `train.deterministic = true`, given its
/// current value: `Ok(Some(value))` to set, `Ok(None)` when it already allows determinism, and
/// an error when the user set another value.
pub fn cublas_workspace_for_determinism(
    current: Option<&str>,
) -> Result<Option<&'static str>, String> {
    match current {
        None => Ok(Some(CUBLAS_DETERMINISTIC)),
        Some(":4096:8") | Some(":16:8") => Ok(None),
        Some(other) => Err(format!(
            "deterministic cuBLAS needs CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8), and the \
             environment sets it to {other:?}; unset it (Tessera then sets :4096:8) or set one \
             of those"
        )),
    }
}

/// The process-wide settings of a run: deterministic algorithms (and cuDNN's deterministic
/// mode) when `deterministic`, cuDNN's benchmark mode otherwise when `device` is CUDA, and the
/// float32 matmul precision. Under `deterministic` on CUDA, sets `CUBLAS_WORKSPACE_CONFIG` when
/// unset (call this before any CUDA work: cuBLAS reads it when it makes its first handle).
pub fn apply_settings(
    deterministic: bool,
    precision: MatmulPrecision,
    device: tch::Device,
) -> Result<(), ContextError> {
    if deterministic && device.is_cuda() {
        let current = std::env::var("CUBLAS_WORKSPACE_CONFIG").ok();
        match cublas_workspace_for_determinism(current.as_deref()) {
            Ok(Some(value)) => std::env::set_var("CUBLAS_WORKSPACE_CONFIG", value),
            Ok(None) => {}
            Err(message) => {
                return Err(ContextError {
                    what: "train.deterministic = true".into(),
                    message,
                })
            }
        }
    }
    let benchmark = !deterministic && device.is_cuda();
    // SAFETY: plain C call; the shim catches libtorch's exceptions.
    if unsafe { tessera_set_determinism(i32::from(deterministic), i32::from(benchmark)) } != 0 {
        return Err(context_error("train.deterministic"));
    }
    let name = std::ffi::CString::new(precision.as_str()).unwrap_or_default();
    // SAFETY: `name` is a NUL-terminated string alive for the call.
    if unsafe { tessera_set_matmul_precision(name.as_ptr()) } != 0 {
        return Err(context_error("train.matmul_precision"));
    }
    Ok(())
}

/// libtorch's current settings, read back from its global context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `torch.are_deterministic_algorithms_enabled()`.
    pub deterministic_algorithms: bool,
    /// `torch.is_deterministic_algorithms_warn_only_enabled()`.
    pub warn_only: bool,
    /// `torch.backends.cudnn.deterministic`.
    pub cudnn_deterministic: bool,
    /// `torch.backends.cudnn.benchmark`.
    pub cudnn_benchmark: bool,
    /// `torch.get_float32_matmul_precision()`.
    pub matmul_precision: MatmulPrecision,
}

/// Reads [`Settings`] back from libtorch.
pub fn settings() -> Result<Settings, ContextError> {
    // SAFETY: plain C calls; the shim catches libtorch's exceptions.
    let (bits, precision) = unsafe { (tessera_determinism(), tessera_matmul_precision()) };
    if bits < 0 {
        return Err(context_error("reading the determinism settings"));
    }
    let matmul_precision = match precision {
        0 => MatmulPrecision::Highest,
        1 => MatmulPrecision::High,
        2 => MatmulPrecision::Medium,
        _ => return Err(context_error("reading the float32 matmul precision")),
    };
    Ok(Settings {
        deterministic_algorithms: bits & 1 != 0,
        warn_only: bits & 2 != 0,
        cudnn_deterministic: bits & 4 != 0,
        cudnn_benchmark: bits & 8 != 0,
        matmul_precision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(rank: usize, world: usize) -> Option<LocalRank> {
        Some(LocalRank { rank, world })
    }

    #[test]
    fn a_single_process_takes_cuda_0_or_the_cpu() {
        assert_eq!(
            Device::Auto.resolve_with(None, 0, "with"),
            Ok(tch::Device::Cpu)
        );
        assert_eq!(
            Device::Auto.resolve_with(None, 4, "with"),
            Ok(tch::Device::Cuda(0))
        );
        assert_eq!(
            Device::CudaLocalRank.resolve_with(None, 2, "with"),
            Ok(tch::Device::Cuda(0))
        );
        assert_eq!(
            Device::Cuda(3).resolve_with(None, 4, "with"),
            Ok(tch::Device::Cuda(3))
        );
        assert_eq!(
            Device::Cpu.resolve_with(None, 4, "with"),
            Ok(tch::Device::Cpu)
        );
        let e = Device::CudaLocalRank
            .resolve_with(None, 0, "without")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "device = \"cuda:0\" but 0 CUDA device(s) are usable (libtorch \
                 {LIBTORCH_VERSION}, built without CUDA)"
            )
        );
    }

    #[test]
    fn each_rank_takes_the_gpu_of_its_local_rank() {
        for device in [Device::Auto, Device::CudaLocalRank] {
            for rank in 0..4 {
                assert_eq!(
                    device.resolve_with(local(rank, 4), 4, "with"),
                    Ok(tch::Device::Cuda(rank)),
                    "{device} rank {rank}"
                );
            }
            // Fewer ranks than GPUs: the first ones.
            assert_eq!(
                device.resolve_with(local(1, 2), 8, "with"),
                Ok(tch::Device::Cuda(1))
            );
        }
        // Without GPUs, auto trains every rank on the CPU.
        assert_eq!(
            Device::Auto.resolve_with(local(3, 4), 0, "with"),
            Ok(tch::Device::Cpu)
        );
        // An explicit device is every rank's.
        assert_eq!(
            Device::Cuda(1).resolve_with(local(3, 4), 2, "with"),
            Ok(tch::Device::Cuda(1))
        );
        assert_eq!(
            Device::Cpu.resolve_with(local(3, 4), 8, "with"),
            Ok(tch::Device::Cpu)
        );
    }

    #[test]
    fn more_local_ranks_than_gpus_names_both_counts() {
        for device in [Device::Auto, Device::CudaLocalRank] {
            let e = device.resolve_with(local(0, 8), 4, "with").unwrap_err();
            assert_eq!(
                e,
                DeviceError::TooManyRanks {
                    device,
                    local_world: 8,
                    usable: 4
                }
            );
            let text = e.to_string();
            assert!(
                text.contains("runs 8 ranks") && text.contains("has 4 CUDA device(s)"),
                "{text}"
            );
            assert!(
                text.contains(&format!("train.device = \"{device}\"")),
                "{text}"
            );
        }
        // `cuda` with no GPU at all says there is none.
        assert!(matches!(
            Device::CudaLocalRank.resolve_with(local(0, 2), 0, "with"),
            Err(DeviceError::TooManyRanks { usable: 0, .. })
        ));
        assert!(matches!(
            Device::Cuda(2).resolve_with(local(0, 2), 2, "with"),
            Err(DeviceError::Unusable {
                index: 2,
                usable: 2,
                ..
            })
        ));
    }

    #[test]
    fn this_machine_has_no_usable_gpu_and_resolves_auto_to_the_cpu() {
        // The build and test machine has no GPU; a machine with one runs scripts/gpu-check.sh.
        if cuda_device_count() == 0 {
            assert_eq!(Device::Auto.resolve_for(local(1, 2)), Ok(tch::Device::Cpu));
            assert!(Device::CudaLocalRank.resolve_for(None).is_err());
        } else {
            assert_eq!(Device::Auto.resolve_for(None), Ok(tch::Device::Cuda(0)));
        }
    }

    #[test]
    fn cublas_workspace_is_set_when_unset_and_refused_when_wrong() {
        assert_eq!(cublas_workspace_for_determinism(None), Ok(Some(":4096:8")));
        assert_eq!(cublas_workspace_for_determinism(Some(":16:8")), Ok(None));
        assert_eq!(cublas_workspace_for_determinism(Some(":4096:8")), Ok(None));
        let e = cublas_workspace_for_determinism(Some(":0:0")).unwrap_err();
        assert!(
            e.contains("CUBLAS_WORKSPACE_CONFIG") && e.contains("\":0:0\""),
            "{e}"
        );
    }

    /// The one test that changes libtorch's global settings (tests share the process): it
    /// sets each combination, reads it back from libtorch's context, and restores the defaults.
    #[test]
    fn settings_reach_libtorch() {
        // Setting the flags for a CUDA device does no CUDA work (this machine may have none).
        apply_settings(true, MatmulPrecision::Medium, tch::Device::Cuda(0)).unwrap();
        assert_eq!(
            settings().unwrap(),
            Settings {
                deterministic_algorithms: true,
                warn_only: false,
                cudnn_deterministic: true,
                cudnn_benchmark: false,
                matmul_precision: MatmulPrecision::Medium,
            }
        );
        let workspace = std::env::var("CUBLAS_WORKSPACE_CONFIG").unwrap_or_default();
        assert!(
            workspace == ":4096:8" || workspace == ":16:8",
            "{workspace:?}"
        );
        apply_settings(false, MatmulPrecision::Highest, tch::Device::Cuda(0)).unwrap();
        assert_eq!(
            settings().unwrap(),
            Settings {
                deterministic_algorithms: false,
                warn_only: false,
                cudnn_deterministic: false,
                cudnn_benchmark: true,
                matmul_precision: MatmulPrecision::Highest,
            }
        );
        apply_settings(false, MatmulPrecision::High, tch::Device::Cpu).unwrap();
        let s = settings().unwrap();
        assert!(!s.cudnn_benchmark && !s.deterministic_algorithms);
        assert_eq!(s.matmul_precision, MatmulPrecision::High);
        // On the CPU, determinism needs no cuBLAS setting, and cuDNN's benchmark stays off.
        apply_settings(true, MatmulPrecision::High, tch::Device::Cpu).unwrap();
        let s = settings().unwrap();
        assert!(s.deterministic_algorithms && s.cudnn_deterministic && !s.cudnn_benchmark);
        apply_settings(false, MatmulPrecision::Highest, tch::Device::Cpu).unwrap();
    }
}
