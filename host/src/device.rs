//! Where to train (`train.device`): the CPU, a CUDA device, or CUDA when available.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};
use tessera_plugin_api::LIBTORCH_VERSION;

/// Where to train. Written `"auto"`, `"cpu"`, `"cuda"` (= `"cuda:0"`) or `"cuda:N"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// CUDA device 0 when available, else the CPU (default).
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// The CUDA device with this index.
    Cuda(usize),
}

/// A CUDA device was asked for but is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device = \"cuda:{index}\" but {usable} CUDA device(s) are usable (libtorch {LIBTORCH_VERSION}, built {built} CUDA)")]
pub struct DeviceError {
    /// The CUDA index asked for.
    pub index: usize,
    /// How many CUDA devices libtorch can use.
    pub usable: i64,
    /// `"with"` or `"without"`: whether this libtorch was built with CUDA.
    pub built: &'static str,
}

impl Device {
    /// The libtorch device; fails when CUDA is asked for but unusable.
    pub fn resolve(self) -> Result<tch::Device, DeviceError> {
        Ok(match self {
            Device::Auto => tch::Device::cuda_if_available(),
            Device::Cpu => tch::Device::Cpu,
            Device::Cuda(i) => {
                let n = tch::Cuda::device_count();
                if !tch::Cuda::is_available() || i as i64 >= n {
                    return Err(DeviceError {
                        index: i,
                        usable: if tch::Cuda::is_available() { n } else { 0 },
                        built: if env!("TESSERA_LIBTORCH_HAS_CUDA") == "1" {
                            "with"
                        } else {
                            "without"
                        },
                    });
                }
                tch::Device::Cuda(i)
            }
        })
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
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
            "cuda" => Ok(Device::Cuda(0)),
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
