//! Fuzzes the checkpoint reader on in-memory bytes: any file is either a verified checkpoint or
//! an error that names it, never a panic or a huge allocation.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tessera::checkpoint::Checkpoint;

const NAME: &str = "fuzz-input.ckpt";

fuzz_target!(|data: &[u8]| {
    match Checkpoint::from_bytes(data, Path::new(NAME)) {
        Ok(c) => {
            // A checkpoint that verifies serializes again to one that verifies.
            let again = c.to_bytes().expect("re-serializing a verified checkpoint");
            Checkpoint::from_bytes(&again, Path::new(NAME)).expect("reading it back");
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(NAME), "error does not name the input: {msg}");
        }
    }
});
