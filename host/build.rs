//! Links the `tessera` binary so that it runs without `LD_LIBRARY_PATH` (rpath to libtorch) and
//! with CUDA when the libtorch has it (`--no-as-needed` keeps `libtorch_cuda`, whose symbols are
//! never referenced directly, so CUDA kernels get registered). Also compiles the small C++ shims
//! for CPU/CUDA autocast, for resetting gradients to undefined, for multi-tensor optimizer steps (`csrc/optim.cpp`) and for TorchScript models
//! (their buffers and training mode, which tch's `CModule` does not reach), and the c10d shim for
//! data-parallel training (`csrc/dist.cpp`; `csrc/gloo-decls` says why it declares Gloo types).
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/autocast.cpp");
    println!("cargo:rerun-if-changed=csrc/dist.cpp");
    println!("cargo:rerun-if-changed=csrc/gloo-decls");
    println!("cargo:rerun-if-changed=csrc/grad.cpp");
    println!("cargo:rerun-if-changed=csrc/optim.cpp");
    println!("cargo:rerun-if-changed=csrc/rng.cpp");
    println!("cargo:rerun-if-changed=csrc/script_module.cpp");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let lib = match std::env::var("DEP_TCH_LIBTORCH_LIB") {
        Ok(lib) => PathBuf::from(lib),
        Err(_) => {
            println!("cargo:warning=torch-sys did not report its libtorch folder; no rpath set");
            return;
        }
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-env=TESSERA_LIBTORCH_HAS_CUDA=1");
    } else {
        println!("cargo:rustc-env=TESSERA_LIBTORCH_HAS_CUDA=0");
    }
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");

    let root = lib.parent().map(PathBuf::from).unwrap_or_default();
    let cxx11_abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    cc::Build::new()
        .cpp(true)
        .file("csrc/autocast.cpp")
        .file("csrc/dist.cpp")
        .file("csrc/grad.cpp")
        .file("csrc/optim.cpp")
        .file("csrc/rng.cpp")
        .file("csrc/script_module.cpp")
        .include("csrc/gloo-decls")
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}"))
        .warnings(false)
        .compile("tessera_autocast");
}
