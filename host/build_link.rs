//! How Weir's executables are linked, shared by `host/build.rs` and `benches/build.rs` through
//! `#[path]` (the packages with executables).

use std::path::Path;
use std::process::{Command, Stdio};

/// Everything the package's executables are linked with: packed relocations and, in release
/// builds, the hot functions grouped (`hot_functions` is the list `benches/hot_functions.sh`
/// writes).
pub fn link_executables(hot_functions: &Path) {
    pack_relocations();
    group_hot_functions(hot_functions);
}

/// Places the functions of `list` (one symbol a line) together at the start of the code, with
/// lld's `--symbol-ordering-file`, in release builds; names the list has but the executable
/// lacks are skipped.
///
/// Why: the executables hold over 100 MB of code and a query runs a few MB of it. The kernel
/// maps code in blocks (the disk's read-ahead, whole large folios), so code a query ran
/// scattered over the whole `.text` made 51 MB of the attribution join's resident set;
/// grouped, 23 MB (`BENCHMARKS.md` §8.3). Only where the linker takes the option: rust-lld,
/// the default for x86_64-unknown-linux-gnu, does, GNU ld and gold do not, so an empty program
/// is linked with it first, with the build's own flags (which may choose another linker).
fn group_hot_functions(list: &Path) {
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    if !release || std::env::var("HOST") != std::env::var("TARGET") || !list.is_file() {
        return;
    }
    println!("cargo::rerun-if-changed={}", list.display());
    let args = [
        format!("-Wl,--symbol-ordering-file={}", list.display()),
        "-Wl,--no-warn-symbol-ordering".to_owned(),
    ];
    if !links_with(&args) {
        return;
    }
    for arg in args {
        println!("cargo::rustc-link-arg-bins={arg}");
    }
}

/// Whether rustc, given the build's `RUSTFLAGS`, links an empty program with the linker
/// arguments `args`: the linker it picks is the one that links the executables.
fn links_with(args: &[String]) -> bool {
    let Ok(out_dir) = std::env::var("OUT_DIR") else {
        return false;
    };
    let dir = Path::new(&out_dir).join("link-probe");
    let source = dir.join("probe.rs");
    if std::fs::create_dir_all(&dir).is_err() || std::fs::write(&source, "fn main() {}\n").is_err()
    {
        return false;
    }
    let mut rustc = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned()));
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    rustc.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    rustc.arg(&source).arg("-o").arg(dir.join("probe"));
    for arg in args {
        rustc.arg("-C").arg(format!("link-arg={arg}"));
    }
    rustc
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Links the package's executables with packed relative relocations (`DT_RELR`) where the C
/// library running the build loads them (glibc 2.36 or later).
///
/// Why: a position-independent executable is relocated as it starts, and with one 24-byte
/// record per pointer Weir's table of them was 6 MB, read in whole by every process (6 MB of
/// its resident set, `BENCHMARKS.md` §8.2); packed, it is about 100 KB. An executable built against a
/// C library already needs that library or a later one, so the requirement adds nothing where
/// the build ran.
fn pack_relocations() {
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
