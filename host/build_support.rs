//! Compiling Weir plugins to `wasm32-wasip2` components from a build script,
//! shared by `host/build.rs` (the example plugins) and `tests/build.rs` (the
//! misbehaving plugin of the sandbox tests) through `#[path]`.
//!
//! Each plugin gets its own cargo invocation: the SDK's `transform`/`sink`
//! features must not unify across plugins, since a component may export only
//! the world it implements. The guests use their own target directory next
//! to the outer one, so the outer cargo's lock is never contended.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment passed through to the nested cargo; everything else the outer
/// cargo set for the build script (flags, wrappers, target) is left out.
const KEEP_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "CARGO_MAKEFLAGS",
    "TMPDIR",
    "http_proxy",
    "https_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CARGO_NET_OFFLINE",
    "CARGO_HTTP_CAINFO",
];

/// A plugin crate to build: (package, library file stem, environment variable
/// that will name the built `.wasm` for `env!`).
pub type Plugin = (&'static str, &'static str, &'static str);

/// Builds `plugins` and sets their environment variables for the crate.
pub fn build_plugins(plugins: &[Plugin]) {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .parent()
        .expect("the crate lives inside the workspace")
        .to_path_buf();
    let out_dir = PathBuf::from(env("OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out.
    let target_dir = out_dir
        .ancestors()
        .nth(4)
        .expect("OUT_DIR is at least four levels deep")
        .join("weir-plugins");
    for watched in ["wit", "plugin-sdk", "plugins", "Cargo.lock", "Cargo.toml"] {
        println!("cargo::rerun-if-changed={}", root.join(watched).display());
    }
    let cargo = env("CARGO");
    for (package, stem, var) in plugins {
        let mut cmd = Command::new(&cargo);
        cmd.env_clear();
        for key in KEEP_ENV {
            if let Some(v) = std::env::var_os(key) {
                cmd.env(key, v);
            }
        }
        if let Some(rustc) = std::env::var_os("RUSTC") {
            cmd.env("RUSTC", rustc);
        }
        cmd.current_dir(&root).args([
            "build",
            "--quiet",
            "--locked",
            "--profile",
            "plugin",
            "--target",
            "wasm32-wasip2",
            "--package",
            package,
            "--target-dir",
        ]);
        cmd.arg(&target_dir);
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
        assert!(
            status.success(),
            "building plugin {package} for wasm32-wasip2 failed ({status}); \
             is the wasm32-wasip2 target installed? (`rustup target add wasm32-wasip2`; \
             rust-toolchain.toml asks rustup for it when it installs the toolchain)"
        );
        let built = target_dir
            .join("wasm32-wasip2/plugin")
            .join(format!("{stem}.wasm"));
        let dest = out_dir.join(format!("{stem}.wasm"));
        copy(&built, &dest);
        println!("cargo::rustc-env={var}={}", dest.display());
    }
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("cargo sets {key} for build scripts"))
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
}
