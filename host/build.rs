//! Links the `tessera` binary so that it runs without `LD_LIBRARY_PATH` (rpath to libtorch) and
//! with CUDA when the libtorch has it (`--no-as-needed` keeps `libtorch_cuda`, whose symbols are
//! never referenced directly, so CUDA kernels get registered). Also compiles the small C++ shims
//! for CPU/CUDA autocast, for resetting gradients to undefined, for multi-tensor optimizer steps (`csrc/optim.cpp`) and for TorchScript models
//! (their buffers and training mode, which tch's `CModule` does not reach), and the c10d shim for
//! data-parallel training (`csrc/dist.cpp`; `csrc/gloo-decls` says why it declares Gloo types),
//! libtorch's global CUDA settings (`csrc/context.cpp`), the input pipeline's pinned memory,
//! streams and events (`csrc/stream.cpp`, through c10's device-generic interface, so it needs no
//! CUDA headers), the loss scaler's multi-tensor unscale (`csrc/amp.cpp`) and the recognition of
//! out-of-memory errors (`csrc/oom.cpp`), the observer of host reads (`csrc/observe.cpp`), the
//! recomputing autograd function of activation checkpointing (`csrc/checkpoint.cpp`) and the
//! CUDA graphs of `train.cuda_graphs` (`csrc/graph.cpp`, with CUDA headers only, as NCCL).
//!
//! The c10d shim gets its NCCL backend (`-DUSE_C10D_NCCL`) when the libtorch has CUDA and the
//! NCCL and CUDA headers are found: next to a PyPI wheel's libtorch (`$LIBTORCH/../nvidia/*/
//! include`: `nccl` and `cu13` for CUDA 13 wheels; `nccl`, `cuda_runtime`, `cublas`, ... for
//! CUDA 12 ones), in `$TESSERA_CUDA_INCLUDE` (folders separated by `:`) or in
//! `$CUDA_HOME/include`. `TESSERA_C10D_NCCL` (1/0) tells the crate which it got.
use std::path::{Path, PathBuf};

/// The headers `ProcessGroupNCCL.hpp` needs, directly or through ATen's CUDA context.
const NCCL_HEADERS: &[&str] = &[
    "nccl.h",
    "cuda_runtime_api.h",
    "crt/host_config.h",
    "nv/target",
    "cublas_v2.h",
    "cublasLt.h",
    "cusparse.h",
    "cusolverDn.h",
];

/// The folders that hold every header of [`NCCL_HEADERS`], or the names of those missing.
fn nccl_includes(libtorch: &Path) -> Result<Vec<PathBuf>, Vec<&'static str>> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(libtorch.join("../nvidia")) {
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path().join("include"))
            .filter(|p| p.is_dir())
            .collect();
        found.sort();
        candidates.extend(found);
    }
    if let Some(extra) = std::env::var_os("TESSERA_CUDA_INCLUDE") {
        candidates.extend(std::env::split_paths(&extra));
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("include"));
    }
    let missing: Vec<&str> = NCCL_HEADERS
        .iter()
        .copied()
        .filter(|h| !candidates.iter().any(|d| d.join(h).is_file()))
        .collect();
    if missing.is_empty() {
        Ok(candidates
            .into_iter()
            .filter(|d| NCCL_HEADERS.iter().any(|h| d.join(h).is_file()))
            .collect())
    } else {
        Err(missing)
    }
}

/// Compiles `csrc/jpeg.c` against the system's libjpeg-turbo (Debian's `libjpeg62-turbo-dev`,
/// `scripts/ensure-libjpeg.sh` installs it) and links it, statically when `libjpeg.a` is there,
/// setting `cfg(tessera_libjpeg)`; without the headers JPEGs are decoded by the `image` crate
/// (a warning says so).
fn libjpeg() {
    println!("cargo:rerun-if-changed=csrc/jpeg.c");
    println!("cargo:rerun-if-env-changed=TESSERA_JPEG_DIR");
    println!("cargo:rustc-check-cfg=cfg(tessera_libjpeg)");
    // TESSERA_JPEG_DIR: a prefix with include/ and lib/ (a libjpeg-turbo built elsewhere).
    let prefix = std::env::var_os("TESSERA_JPEG_DIR").map(PathBuf::from);
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let mut includes: Vec<PathBuf> = prefix.iter().map(|p| p.join("include")).collect();
    includes.extend(["/usr/include", "/usr/local/include"].map(PathBuf::from));
    if !includes.iter().any(|d| d.join("jpeglib.h").is_file()) {
        println!(
            "cargo:warning=libjpeg-turbo's jpeglib.h was not found (in {}); JPEGs are decoded by \
             the slower `image` crate, without region decoding (install libjpeg62-turbo-dev or \
             run scripts/ensure-libjpeg.sh, or set TESSERA_JPEG_DIR)",
            includes
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return;
    }
    let mut build = cc::Build::new();
    build.file("csrc/jpeg.c").opt_level(2);
    if let Some(p) = &prefix {
        build.include(p.join("include"));
    }
    build.compile("tessera_jpeg");
    let mut dirs: Vec<PathBuf> = prefix.iter().map(|p| p.join("lib")).collect();
    dirs.extend(
        [
            format!("/usr/lib/{arch}-linux-gnu"),
            "/usr/lib64".to_owned(),
            "/usr/lib".to_owned(),
            "/usr/local/lib".to_owned(),
        ]
        .map(PathBuf::from),
    );
    match dirs.iter().find(|d| d.join("libjpeg.a").is_file()) {
        Some(d) => {
            println!("cargo:rustc-link-search=native={}", d.display());
            println!("cargo:rustc-link-lib=static=jpeg");
        }
        None => {
            for d in dirs.iter().filter(|d| d.is_dir()) {
                println!("cargo:rustc-link-search=native={}", d.display());
            }
            println!("cargo:rustc-link-lib=jpeg");
        }
    }
    println!("cargo:rustc-cfg=tessera_libjpeg");
}

fn main() {
    libjpeg();
    println!("cargo:rerun-if-changed=csrc/amp.cpp");
    println!("cargo:rerun-if-changed=csrc/autocast.cpp");
    println!("cargo:rerun-if-changed=csrc/checkpoint.cpp");
    println!("cargo:rerun-if-changed=csrc/context.cpp");
    println!("cargo:rerun-if-changed=csrc/dist.cpp");
    println!("cargo:rerun-if-changed=csrc/dist_group.h");
    println!("cargo:rerun-if-changed=csrc/full_shard.cpp");
    println!("cargo:rerun-if-changed=csrc/dist_watch.cpp");
    println!("cargo:rerun-if-changed=csrc/gloo-decls");
    println!("cargo:rerun-if-changed=csrc/grad.cpp");
    println!("cargo:rerun-if-changed=csrc/graph.cpp");
    println!("cargo:rerun-if-changed=csrc/guarded.h");
    println!("cargo:rerun-if-changed=csrc/observe.cpp");
    println!("cargo:rerun-if-changed=csrc/oom.cpp");
    println!("cargo:rerun-if-changed=csrc/optim.cpp");
    println!("cargo:rerun-if-changed=csrc/rng.cpp");
    println!("cargo:rerun-if-changed=csrc/script_module.cpp");
    println!("cargo:rerun-if-changed=csrc/shims.cpp");
    println!("cargo:rerun-if-changed=csrc/stream.cpp");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=TESSERA_CUDA_INCLUDE");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let lib = match std::env::var("DEP_TCH_LIBTORCH_LIB") {
        Ok(lib) => PathBuf::from(lib),
        Err(_) => {
            println!("cargo:warning=torch-sys did not report its libtorch folder; no rpath set");
            return;
        }
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    let has_cuda = lib.join("libtorch_cuda.so").exists();
    if has_cuda {
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-env=TESSERA_LIBTORCH_HAS_CUDA=1");
    } else {
        println!("cargo:rustc-env=TESSERA_LIBTORCH_HAS_CUDA=0");
    }
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");

    let root = lib.parent().map(PathBuf::from).unwrap_or_default();
    let cxx11_abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    let base = || {
        let mut b = cc::Build::new();
        b.cpp(true)
            .include(root.join("include"))
            .include(root.join("include/torch/csrc/api/include"))
            .flag("-std=c++17")
            .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}"))
            .warnings(false);
        b
    };
    // amp.cpp, autocast.cpp, checkpoint.cpp, context.cpp, grad.cpp, observe.cpp, oom.cpp,
    // optim.cpp, rng.cpp, script_module.cpp and stream.cpp as one translation unit: ATen's
    // headers are parsed once (csrc/shims.cpp says more).
    base().file("csrc/shims.cpp").compile("tessera_autocast");

    // The c10d shim, with NCCL when it can be built; CUDA graphs (`train.cuda_graphs`) need the
    // same CUDA headers.
    let mut dist = base();
    dist.file("csrc/dist.cpp")
        .file("csrc/full_shard.cpp")
        .file("csrc/dist_watch.cpp")
        .include("csrc/gloo-decls");
    let mut graph = base();
    graph.file("csrc/graph.cpp");
    let nccl = if has_cuda {
        match nccl_includes(&root) {
            Ok(dirs) => {
                for d in dirs {
                    println!("cargo:rerun-if-changed={}", d.display());
                    dist.include(&d);
                    graph.include(d);
                }
                dist.define("USE_C10D_NCCL", None);
                graph.define("TESSERA_CUDA_GRAPHS", None);
                true
            }
            Err(missing) => {
                println!(
                    "cargo:warning=no NCCL backend for data-parallel CUDA runs: {} not found next \
                     to libtorch ({}/../nvidia/*/include), in TESSERA_CUDA_INCLUDE or CUDA_HOME \
                     (scripts/ensure-libtorch.sh installs them from PyPI)",
                    missing.join(", "),
                    root.display()
                );
                false
            }
        }
    } else {
        false
    };
    println!("cargo:rustc-env=TESSERA_C10D_NCCL={}", u8::from(nccl));
    dist.compile("tessera_dist");
    graph.compile("tessera_graph");
    if nccl {
        // c10's CUDA streams, for the CUDA graphs of csrc/graph.cpp (a library, not a link
        // argument, so that every binary linking this crate gets it).
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
}
