//! Fuzzes the `trainer.toml` loader: any text must give a `Config` or a `ConfigError`, never a
//! panic. The input is also tried with its first line as a `--set key=value` override applied to
//! the rest of the text.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let base = Path::new("/fuzz/base");
    if let Err(e) = tessera::config::from_str(&text, base, "trainer.toml") {
        // Rendering the error (line/column, key, message) must not panic either.
        let _ = e.to_string();
    }
    if let Some((first, rest)) = text.split_once('\n') {
        let overrides = [first.to_string()];
        let result =
            tessera::config::from_str_with_overrides(rest, base, "trainer.toml", &overrides);
        if let Err(e) = result {
            let _ = e.to_string();
        }
    }
});
