// The test executables link libtorch (through tessera-plugin-api and the host): give them an
// rpath so they run without LD_LIBRARY_PATH.
//
// A test binary links several plugin crates as libraries (tests/methods/main.rs: blurpool,
// factorize, muon, ...) to compute expected values with their functions. Each plugin defines the
// same unmangled symbol, its abi_stable root module (`#[export_root_module]`), which tessera
// looks up in the plugin's .so; the tests never look it up in themselves, so the copies are
// allowed to coexist (the linker keeps the first). Rust mangles every other symbol, so nothing
// else can collide.
fn main() {
    if let Ok(lib) = std::env::var("DEP_TESSERA_PLUGIN_API_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
    println!("cargo:rustc-link-arg-tests=-Wl,--allow-multiple-definition");
}
