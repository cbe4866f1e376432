//! The allocator settings of `tessera::memory`: after `tune_for_training`, a block of a
//! training step's size comes from the heap (not fresh `mmap`ed pages) and freeing it does not
//! hand the memory back to the kernel. One test function: the settings are process-wide.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn tuned_malloc_keeps_step_sized_blocks_in_the_heap() {
    use tessera::memory::{tune_for_training, AllocatorTuning, MMAP_THRESHOLD};

    // A user's own malloc tunables win.
    std::env::set_var("GLIBC_TUNABLES", "glibc.malloc.arena_max=2");
    assert_eq!(tune_for_training(), AllocatorTuning::UserTunables);
    std::env::remove_var("GLIBC_TUNABLES");
    assert_eq!(tune_for_training(), AllocatorTuning::Applied);

    let step_sized = 16 << 20;
    // SAFETY: plain malloc/free of blocks this test owns; mallinfo2 only reads statistics.
    unsafe {
        let before = libc::mallinfo2();
        let block = std::hint::black_box(libc::malloc(step_sized) as *mut u8);
        assert!(!block.is_null());
        std::ptr::write_bytes(block, 1, step_sized);
        let during = libc::mallinfo2();
        assert_eq!(during.hblkhd, before.hblkhd, "a 16 MiB block was mmap'ed");
        libc::free(block as *mut libc::c_void);
        let after = libc::mallinfo2();
        assert_eq!(after.arena, during.arena, "the heap was trimmed after free");
        assert!(
            after.fordblks >= during.fordblks + step_sized,
            "the freed block is not kept for reuse"
        );

        // The measurement itself can see an mmap'ed block: one above the threshold.
        let large = 2 * MMAP_THRESHOLD;
        let block = std::hint::black_box(libc::malloc(large));
        assert!(!block.is_null());
        assert!(libc::mallinfo2().hblkhd >= after.hblkhd + large);
        libc::free(block);
    }
}
