// Lets this crate's own tests find libtorch without LD_LIBRARY_PATH. The plugin itself needs no
// rpath: the host has already loaded libtorch when it opens the plugin.
fn main() {
    if let Ok(lib) = std::env::var("DEP_TESSERA_PLUGIN_API_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
