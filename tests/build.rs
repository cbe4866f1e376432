// The test executables link libtorch (through tessera-plugin-api and the host): give them an
// rpath so they run without LD_LIBRARY_PATH.
fn main() {
    if let Ok(lib) = std::env::var("DEP_TESSERA_PLUGIN_API_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
