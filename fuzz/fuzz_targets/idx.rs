//! Fuzzes the IDX readers (raw and gzip) on in-memory bytes: every input gives images, labels or
//! an error that names the input, never a panic or a huge allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera::data::idx::{parse_images, parse_labels};

const NAME: &str = "fuzz-input.idx";

fuzz_target!(|data: &[u8]| {
    match parse_images(data, NAME) {
        Ok(images) => assert_eq!(
            images.pixels.len(),
            images.count * images.height * images.width,
            "pixel count differs from the dimensions"
        ),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(NAME), "error does not name the input: {msg}");
        }
    }
    match parse_labels(data, NAME) {
        Ok(labels) => assert!(!labels.is_empty(), "labels accepted with a zero dimension"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(NAME), "error does not name the input: {msg}");
        }
    }
});
