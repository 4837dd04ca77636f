//! Building the C example plugins from a build script, shared by `tests/build.rs` and
//! `benches/build.rs` through `#[path]`.
//!
//! A C plugin takes the same three steps any language without a component toolchain of its own
//! takes (`wit/README.md` walks through them by hand):
//!
//! 1. `wit-bindgen`'s C generator writes `<world>.h`, `<world>.c` and `<world>_component_type.o`
//!    (the world's type, linked into the module as a custom section) from `wit/weir.wit`;
//! 2. Debian's `clang` with its `wasi-libc` (`--target=wasm32-wasi`) compiles the plugin and
//!    the bindings into a core module (WASI preview 1, the only libc Debian ships);
//! 3. `wit-component` (the library behind `wasm-tools component new`) turns the module into a
//!    component, adapting its WASI preview-1 imports with the reactor adapter that the
//!    `wasi-preview1-component-adapter-provider` crate ships for this wasmtime release.
//!
//! Steps 1 and 3 are the crates.io libraries of `wit-bindgen` and `wasm-tools` linked into the
//! build script, so nothing is installed by hand and nothing is downloaded outside the
//! registries. A missing `clang` or wasi-libc fails the build naming the Debian packages.

use std::path::{Path, PathBuf};
use std::process::Command;

use wit_bindgen_core::Files;

/// A C plugin: (file stem in OUT_DIR, world, source files under `plugins/c`, the variable that
/// will hold its path for `env!`).
pub const C_PLUGINS: &[(&str, &str, &[&str], &str)] = &[
    (
        "c_filter_rows",
        "transform",
        &["filter_rows.c", "weir_c.c"],
        "WEIR_PLUGIN_C_FILTER_ROWS",
    ),
    (
        "c_jsonl_sink",
        "sink",
        &["jsonl_sink.c", "weir_c.c"],
        "WEIR_PLUGIN_C_JSONL_SINK",
    ),
];

/// The packages that provide what step 2 needs, for the error message.
const DEBIAN_PACKAGES: &str = "clang lld wasi-libc libclang-rt-14-dev-wasm32";

/// Builds every C plugin into OUT_DIR and sets their variables.
pub fn build_c_plugins() {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .parent()
        .expect("the crate lives inside the workspace");
    let out_dir = PathBuf::from(env("OUT_DIR"));
    for watched in ["wit", "plugins/c"] {
        println!("cargo::rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo::rerun-if-env-changed=WEIR_CLANG");
    for (stem, world, sources, var) in C_PLUGINS {
        let sources: Vec<PathBuf> = sources
            .iter()
            .map(|s| root.join("plugins/c").join(s))
            .collect();
        let out = out_dir.join(format!("{stem}.wasm"));
        let work = out_dir.join(format!("{stem}.build"));
        build_c_plugin(&root.join("wit"), world, &sources, &work, &out)
            .unwrap_or_else(|e| panic!("building the C plugin {stem}: {e}"));
        println!("cargo::rustc-env={var}={}", out.display());
    }
}

/// Steps 1 to 3 for one plugin: bindings of `world` into `work`, the core module, the component
/// at `out`.
pub fn build_c_plugin(
    wit: &Path,
    world: &str,
    sources: &[PathBuf],
    work: &Path,
    out: &Path,
) -> Result<(), String> {
    std::fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;
    let generated = bindgen(wit, world, work)?;
    let core = work.join("core.wasm");
    let clang = std::env::var("WEIR_CLANG").unwrap_or_else(|_| "clang".to_owned());
    let mut command = Command::new(&clang);
    command
        .args([
            "--target=wasm32-wasi",
            "-mexec-model=reactor",
            "-O2",
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            // The generated bindings leave some parameters unused.
            "-Wno-unused-parameter",
            // Debian's wasi-libc carries debug sections, which would triple the component.
            "-Wl,--strip-debug",
        ])
        .arg("-I")
        .arg(work)
        .args(sources)
        .args(&generated)
        .arg("-o")
        .arg(&core);
    let output = command.output().map_err(|e| {
        format!("cannot run `{clang}` ({e}): install Debian's {DEBIAN_PACKAGES} (apt-get install {DEBIAN_PACKAGES})")
    })?;
    if !output.status.success() {
        return Err(format!(
            "`{clang} --target=wasm32-wasi` failed ({}); it needs Debian's {DEBIAN_PACKAGES}:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let module = std::fs::read(&core).map_err(|e| format!("{}: {e}", core.display()))?;
    let component = componentize(&module)?;
    let partial = out.with_extension("wasm.partial");
    std::fs::write(&partial, component).map_err(|e| format!("{}: {e}", partial.display()))?;
    std::fs::rename(&partial, out).map_err(|e| format!("{}: {e}", out.display()))
}

/// Step 1: `wit-bindgen c` for `world` of the package in `wit`; returns the files to compile
/// and link (the `.c` and the component-type object).
pub fn bindgen(wit: &Path, world: &str, dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve
        .push_dir(wit)
        .map_err(|e| format!("reading the WIT in {}: {e:#}", wit.display()))?;
    let world_id = resolve
        .select_world(&[package], Some(world))
        .map_err(|e| format!("world `{world}`: {e:#}"))?;
    let mut files = Files::default();
    wit_bindgen_c::Opts::default()
        .build()
        .generate(&mut resolve, world_id, &mut files)
        .map_err(|e| format!("wit-bindgen c, world `{world}`: {e:#}"))?;
    let mut link = Vec::new();
    for (name, contents) in files.iter() {
        let path = dir.join(name);
        std::fs::write(&path, contents).map_err(|e| format!("{}: {e}", path.display()))?;
        if name.ends_with(".c") || name.ends_with(".o") {
            link.push(path);
        }
    }
    Ok(link)
}

/// Step 3: `wasm-tools component new --adapt wasi_snapshot_preview1=<reactor adapter>`.
pub fn componentize(module: &[u8]) -> Result<Vec<u8>, String> {
    use wasi_preview1_component_adapter_provider::{
        WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
    };
    wit_component::ComponentEncoder::default()
        .module(module)
        .and_then(|e| {
            e.adapter(
                WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
                WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
            )
        })
        .map(|e| e.validate(true))
        .and_then(|e| e.encode())
        .map_err(|e| format!("making a component of the core module: {e:#}"))
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("cargo sets {key} for build scripts"))
}
