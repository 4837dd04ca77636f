//! How Weir's executables are linked, shared by `host/build.rs` and `benches/build.rs` through
//! `#[path]` (the packages with executables).

use std::process::Command;

/// Links the package's executables with packed relative relocations (`DT_RELR`) where the C
/// library running the build loads them (glibc 2.36 or later).
///
/// Why: a position-independent executable is relocated as it starts, and with one 24-byte
/// record per pointer Weir's table of them was 6 MB, read in whole by every process (6 MB of
/// its resident set, `BENCHMARKS.md` §8.2); packed, it is about 100 KB. An executable built against a
/// C library already needs that library or a later one, so the requirement adds nothing where
/// the build ran.
pub fn pack_relocations() {
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if !linux_gnu || std::env::var("HOST") != std::env::var("TARGET") {
        return;
    }
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return;
    };
    // "glibc 2.36"
    let text = String::from_utf8_lossy(&out.stdout);
    let mut version = text
        .trim()
        .trim_start_matches("glibc ")
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (version.next().unwrap_or(0), version.next().unwrap_or(0));
    if (major, minor) >= (2, 36) {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
