//! The C allocator's thresholds, set once when a Weir process starts.
//!
//! Why: each micro-batch allocates a few large blocks (an input file read whole, the decoder's
//! column buffers, Parquet pages) and frees them once its output is written. glibc serves blocks
//! above an adaptive threshold (128 KB at first) with fresh `mmap`s and gives the top of the
//! heap back to the kernel once 128 KB of it are free, so every batch faulted in, zeroed and
//! unmapped memory it had just returned: 40,000 page faults and about a tenth of the CPU of a
//! JSON → Parquet query over 100 files (`BENCHMARKS.md` §13). Fixed thresholds keep such blocks
//! in the heap for the next batch: blocks below 32 MB come from the heap, and up to 64 MB of
//! free heap top stay mapped. Peak RSS does not grow, because the next batch reuses that
//! memory before it would allocate more.
//!
//! The number of heaps is capped at one per core, unless the operator set `MALLOC_ARENA_MAX` or
//! a `GLIBC_TUNABLES` arena limit. glibc allows eight per core, and each thread that allocates
//! (decoders, RocksDB's flushes and compactions) may get a heap of its own that keeps its free
//! memory; at one per core the attribution join peaked 2-3 MB lower, its CPU unchanged
//! (`BENCHMARKS.md` §8.3).

/// Blocks at least this large get their own mapping (glibc's largest allowed value on 64-bit).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;
/// Free memory at the top of the heap kept mapped.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 64 << 20;

/// Sets the thresholds and the heap cap; call it first thing in `main`, before any thread
/// starts. A no-op where the C library is not glibc. Returns whether every setting was taken.
pub fn tune() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let arenas = libc::c_int::try_from(cores).unwrap_or(libc::c_int::MAX);
        let operator_set = std::env::var_os("MALLOC_ARENA_MAX").is_some()
            || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("arena_max"));
        // SAFETY: `mallopt` only changes the allocator's parameters; called before other
        // threads exist, it races with no allocation.
        let taken = unsafe {
            [
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                if operator_set {
                    1
                } else {
                    libc::mallopt(libc::M_ARENA_MAX, arenas)
                },
            ]
        };
        taken.iter().all(|&t| t == 1)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_every_setting() {
        assert!(super::tune());
    }
}
