//! The plugin loader's ELF check on arbitrary bytes: it never panics, and whatever it accepts
//! has every loadable segment inside the input and defines the root-module symbol, so `dlopen`
//! is only ever given a file it can map completely.
#![no_main]

#[path = "../../../host/src/plugin/elf.rs"]
mod elf;

use libfuzzer_sys::fuzz_target;
use object::read::elf::{FileHeader, ProgramHeader};

/// abi_stable's root-module loader symbol, as a Tessera plugin exports it.
const SYMBOL: &str = "_1as_0lib_1header_0root_bmodule_bloader";

fuzz_target!(|data: &[u8]| {
    let verdict = elf::check_plugin_library(data, SYMBOL);
    // Rendering any refusal must not panic either.
    let _ = verdict.as_ref().map_err(ToString::to_string);
    if verdict.is_ok() {
        let header = object::elf::FileHeader64::<object::Endianness>::parse(data)
            .expect("accepted input has an ELF header");
        let endian = header.endian().expect("accepted input has a byte order");
        for segment in header
            .program_headers(endian, data)
            .expect("accepted input has program headers")
        {
            if segment.p_type(endian) == object::elf::PT_LOAD {
                let end = segment.p_offset(endian) + segment.p_filesz(endian);
                assert!(end <= data.len() as u64, "accepted a segment past the end");
            }
        }
    }
});
