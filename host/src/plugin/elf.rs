//! Reads a would-be plugin file as ELF before anything maps or runs it.
//!
//! `dlopen` maps a file's segments and runs its initialisers: a truncated file whose segments
//! reach past its end dies of SIGBUS when a page beyond the end is touched, and any real shared
//! library (say libtorch's own `libc10.so`) runs its constructors, which may abort the process.
//! So a file is opened as a library only when, read as plain bytes, it is a 64-bit ELF shared
//! object for this machine's architecture and byte order, every loadable segment lies inside the
//! file, and its dynamic symbol table exports (defines) the plugin's root-module symbol.
//!
//! This module depends on `object` and the standard library only, so the fuzz target in
//! `fuzz/plugin-elf` compiles it on its own (without libtorch).

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader, Sym};
use object::Endianness;

/// Why a file is not a plugin library this process may open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    /// Not an ELF file at all.
    #[error("not an ELF file (it starts with {0})")]
    NotElf(String),
    /// An ELF file of the wrong class, byte order, architecture or type.
    #[error("{0}")]
    Foreign(String),
    /// A header, table or segment reaches past the end of the file.
    #[error("truncated or damaged: {0}")]
    Damaged(String),
    /// A well-formed shared library that does not export the symbol.
    #[error("it does not export `{0}`")]
    NoRootModule(String),
}

/// Offsets in `e_ident`: the file's class (32/64-bit) and byte order.
const EI_CLASS: usize = 4;
const EI_DATA: usize = 5;

/// `e_machine` of the architecture this code was compiled for.
const HOST_MACHINE: u16 = if cfg!(target_arch = "x86_64") {
    elf::EM_X86_64
} else if cfg!(target_arch = "aarch64") {
    elf::EM_AARCH64
} else if cfg!(target_arch = "riscv64") {
    elf::EM_RISCV
} else if cfg!(target_arch = "powerpc64") {
    elf::EM_PPC64
} else if cfg!(target_arch = "s390x") {
    elf::EM_S390
} else {
    elf::EM_NONE
};

fn machine_name(machine: u16) -> String {
    match machine {
        elf::EM_X86_64 => "x86-64".to_owned(),
        elf::EM_AARCH64 => "AArch64".to_owned(),
        elf::EM_386 => "x86 (32-bit)".to_owned(),
        elf::EM_ARM => "ARM (32-bit)".to_owned(),
        elf::EM_RISCV => "RISC-V".to_owned(),
        elf::EM_PPC64 => "PowerPC 64".to_owned(),
        elf::EM_S390 => "s390x".to_owned(),
        other => format!("e_machine {other}"),
    }
}

/// Checks that `data` (a whole file's bytes) is a shared library for this machine, with every
/// loadable segment inside the file, that defines the dynamic symbol `symbol`.
pub fn check_plugin_library(data: &[u8], symbol: &str) -> Result<(), ElfError> {
    if data.len() < 4 || &data[..4] != elf::ELFMAG.as_slice() {
        let shown: String = data
            .iter()
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ");
        return Err(ElfError::NotElf(if shown.is_empty() {
            "nothing: it is empty".to_owned()
        } else {
            format!("bytes {shown}")
        }));
    }
    if data.len() < 16 {
        return Err(ElfError::Damaged(format!(
            "{} bytes, shorter than an ELF identification",
            data.len()
        )));
    }
    if data[EI_CLASS] != elf::ELFCLASS64 {
        return Err(ElfError::Foreign(
            "a 32-bit ELF file; this tessera is a 64-bit program".to_owned(),
        ));
    }
    let little = data[EI_DATA] == elf::ELFDATA2LSB;
    if little != cfg!(target_endian = "little") {
        return Err(ElfError::Foreign(
            "an ELF file of the other byte order than this machine's".to_owned(),
        ));
    }
    let header = elf::FileHeader64::<Endianness>::parse(data)
        .map_err(|e| ElfError::Damaged(format!("ELF header: {e}")))?;
    let endian = header
        .endian()
        .map_err(|e| ElfError::Damaged(format!("ELF header: {e}")))?;
    let machine = header.e_machine(endian);
    if machine != HOST_MACHINE {
        return Err(ElfError::Foreign(format!(
            "built for {}, but this machine is {}",
            machine_name(machine),
            machine_name(HOST_MACHINE)
        )));
    }
    if header.e_type(endian) != elf::ET_DYN {
        return Err(ElfError::Foreign(format!(
            "an ELF file of type {} (a shared library has type {})",
            header.e_type(endian),
            elf::ET_DYN
        )));
    }
    let segments = header
        .program_headers(endian, data)
        .map_err(|e| ElfError::Damaged(format!("program headers: {e}")))?;
    let file_len = data.len() as u64;
    let mut loadable = 0;
    for segment in segments {
        if segment.p_type(endian) != elf::PT_LOAD {
            continue;
        }
        loadable += 1;
        let offset = segment.p_offset(endian);
        let size = segment.p_filesz(endian);
        if offset.checked_add(size).is_none_or(|end| end > file_len) {
            return Err(ElfError::Damaged(format!(
                "a loadable segment spans bytes {offset}..{} but the file has {file_len}",
                offset.saturating_add(size)
            )));
        }
    }
    if loadable == 0 {
        return Err(ElfError::Damaged("no loadable segment".to_owned()));
    }
    let sections = header
        .sections(endian, data)
        .map_err(|e| ElfError::Damaged(format!("section headers: {e}")))?;
    let symbols = sections
        .symbols(endian, data, elf::SHT_DYNSYM)
        .map_err(|e| ElfError::Damaged(format!("dynamic symbol table: {e}")))?;
    let strings = symbols.strings();
    let exported = symbols.iter().any(|sym| {
        sym.st_shndx(endian) != elf::SHN_UNDEF
            && matches!(sym.st_bind(), elf::STB_GLOBAL | elf::STB_WEAK)
            && sym
                .name(endian, strings)
                .is_ok_and(|n| n == symbol.as_bytes())
    });
    if exported {
        Ok(())
    } else {
        Err(ElfError::NoRootModule(symbol.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYMBOL: &str = abi_stable::library::ROOT_MODULE_LOADER_NAME;

    /// This test binary itself: an ELF executable for this machine (not a shared library).
    fn own_executable() -> Vec<u8> {
        std::fs::read(std::env::current_exe().expect("current exe")).expect("read own exe")
    }

    #[test]
    fn garbage_and_short_files_are_refused() {
        assert!(matches!(
            check_plugin_library(b"", SYMBOL),
            Err(ElfError::NotElf(_))
        ));
        assert!(matches!(
            check_plugin_library(b"hello, world", SYMBOL),
            Err(ElfError::NotElf(_))
        ));
        assert!(matches!(
            check_plugin_library(b"\x7fELF\x02\x01", SYMBOL),
            Err(ElfError::Damaged(_))
        ));
    }

    #[test]
    fn an_executable_is_not_a_shared_library() {
        let exe = own_executable();
        // Rust test binaries are position-independent executables, which are also ET_DYN: those
        // pass the type check and then lack the root-module symbol.
        let err = check_plugin_library(&exe, SYMBOL).expect_err("an executable");
        assert!(
            matches!(err, ElfError::Foreign(_) | ElfError::NoRootModule(_)),
            "{err}"
        );
    }

    #[test]
    fn other_architectures_and_classes_are_named() {
        let mut exe = own_executable();
        exe[EI_CLASS] = elf::ELFCLASS32;
        let err = check_plugin_library(&exe, SYMBOL).expect_err("32-bit");
        assert!(err.to_string().contains("32-bit"), "{err}");

        let mut exe = own_executable();
        // e_machine is at offset 18, in the file's byte order.
        let other = if HOST_MACHINE == elf::EM_AARCH64 {
            elf::EM_X86_64
        } else {
            elf::EM_AARCH64
        };
        let bytes = if cfg!(target_endian = "little") {
            other.to_le_bytes()
        } else {
            other.to_be_bytes()
        };
        exe[18..20].copy_from_slice(&bytes);
        let err = check_plugin_library(&exe, SYMBOL).expect_err("foreign machine");
        assert!(
            err.to_string()
                .contains(&format!("built for {}", machine_name(other))),
            "{err}"
        );
    }

    /// The fuzz target's seeds and the regression inputs: the tiny library exporting the
    /// symbol passes (so the fuzz target's copy of the symbol name is abi_stable's), everything
    /// else is refused, nothing panics.
    #[test]
    fn fuzz_regressions_and_seed_corpus() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let seeds = format!("{root}/fuzz/plugin-elf/corpus/plugin_elf");
        let tiny = std::fs::read(format!("{seeds}/tiny-plugin.so")).expect("the seed plugin");
        assert_eq!(check_plugin_library(&tiny, SYMBOL), Ok(()));
        let other = std::fs::read(format!("{seeds}/no-symbol.so")).expect("the seed library");
        assert_eq!(
            check_plugin_library(&other, SYMBOL),
            Err(ElfError::NoRootModule(SYMBOL.to_owned()))
        );
        let regressions = format!("{root}/tests/fuzz_regressions/plugin_elf");
        let mut replayed = 0;
        for entry in std::fs::read_dir(&regressions).expect("the regressions folder") {
            let path = entry.expect("an entry").path();
            let bytes = std::fs::read(&path).expect("a regression input");
            assert!(
                check_plugin_library(&bytes, SYMBOL).is_err(),
                "{} was accepted",
                path.display()
            );
            replayed += 1;
        }
        assert!(replayed > 0, "no regression inputs in {regressions}");
    }

    #[test]
    fn every_prefix_of_a_file_is_refused_without_panicking() {
        let exe = own_executable();
        for len in (0..exe.len()).step_by(exe.len() / 64 + 1) {
            assert!(check_plugin_library(&exe[..len], SYMBOL).is_err(), "{len}");
        }
    }
}
