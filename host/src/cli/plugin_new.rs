//! `weir plugin new --lang rust NAME` and `weir plugin build`: a plugin project to start from,
//! and its component.
//!
//! Why the SDK is copied into the project: the project must build with no checkout of Weir at
//! hand, against exactly the WIT this `weir` loads. So the binary carries the SDK's sources and
//! the WIT (`include_str!`) and writes them under `weir/` in the new project.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use super::{complain, say};

macro_rules! sdk_files {
    ($($file:literal),* $(,)?) => {
        &[$(($file, include_str!(concat!("../../../plugin-sdk/src/", $file)))),*]
    };
}

/// The SDK's sources, by file name.
const SDK_SOURCES: &[(&str, &str)] = sdk_files!(
    "batch.rs",
    "bitmap.rs",
    "column.rs",
    "delta_merge.rs",
    "error.rs",
    "function.rs",
    "guest.rs",
    "host.rs",
    "lib.rs",
    "listener.rs",
    "output.rs",
    "schema.rs",
    "state.rs",
    "testing.rs",
    "text.rs",
);
const WIT: &str = include_str!("../../../wit/weir.wit");
/// Weir's own toolchain file: the Rust release and the `wasm32-wasip2` target it builds with.
const TOOLCHAIN: &str = include_str!("../../../rust-toolchain.toml");
const SDK_CARGO: &str = include_str!("template/sdk-Cargo.toml.txt");
const CARGO: &str = include_str!("template/Cargo.toml.txt");
const LIB: &str = include_str!("template/lib.rs.txt");
const PIPELINE: &str = include_str!("template/pipeline.toml.txt");
const README: &str = include_str!("template/README.md.txt");

/// `NAME` in `CamelCase`, the transform's type.
fn type_name(name: &str) -> String {
    name.split(['_', '-'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn valid(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 64
}

/// Writes a new Rust plugin project `dir` (its last component is the plugin's name).
pub(super) fn new(lang: &str, dir: &Path) -> ExitCode {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if lang != "rust" {
        complain(&format!(
            "plugin new: --lang {lang}: this weir makes Rust projects; Python and JavaScript plugins start from plugins/python and plugins/js (plugin-sdk/README.md)"
        ));
        return ExitCode::from(2);
    }
    if !valid(&name) {
        complain(&format!(
            "plugin new: {name:?} is not a plugin name: lower-case letters, digits and '_', starting with a letter"
        ));
        return ExitCode::from(2);
    }
    if dir.exists() {
        complain(&format!("plugin new: {} exists already", dir.display()));
        return ExitCode::from(2);
    }
    let fill = |t: &str| {
        t.replace("{{name}}", &name)
            .replace("{{type}}", &type_name(&name))
    };
    let mut files: Vec<(PathBuf, String)> = vec![
        (dir.join("Cargo.toml"), fill(CARGO)),
        (dir.join("rust-toolchain.toml"), TOOLCHAIN.into()),
        (dir.join("src/lib.rs"), fill(LIB)),
        (dir.join("pipeline.toml"), fill(PIPELINE)),
        (dir.join("README.md"), fill(README)),
        (
            dir.join(".gitignore"),
            "/target\n/checkpoints\n/data\n/plugins\n*.wasm\n".into(),
        ),
        (dir.join("weir/plugin-sdk/Cargo.toml"), SDK_CARGO.into()),
        (dir.join("weir/wit/weir.wit"), WIT.into()),
    ];
    for (file, text) in SDK_SOURCES {
        files.push((
            dir.join("weir/plugin-sdk/src").join(file),
            (*text).to_owned(),
        ));
    }
    for (path, text) in files {
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text));
        if let Err(e) = written {
            complain(&format!("plugin new: {}: {e}", path.display()));
            return ExitCode::from(1);
        }
    }
    say(&format!(
        "{dir}: a Rust transform plugin ({name}: keeps the rows whose column equals a value)\n\
         next:\n  cd {dir}\n  cargo test                 # its tests, natively\n  \
         weir plugin build          # -> {name}.wasm (needs the wasm32-wasip2 target: rustup target add wasm32-wasip2)\n  \
         weir plugin test {name}.wasm --config '{{\"column\":\"status\",\"equals\":\"completed\"}}'\n  \
         weir examples --dir . && weir run pipeline.toml",
        dir = dir.display()
    ));
    ExitCode::SUCCESS
}

/// Builds the plugin project `dir` into `dir/<name>.wasm`.
pub(super) fn build(dir: &Path) -> ExitCode {
    match try_build(dir) {
        Ok(out) => {
            let size = std::fs::metadata(&out).map_or(0, |m| m.len());
            say(&format!(
                "{}: {size} bytes\nnext: weir plugin test {} --config '{{...}}'",
                out.display(),
                out.display()
            ));
            ExitCode::SUCCESS
        }
        Err(e) => {
            complain(&format!("plugin build: {}: {e}", dir.display()));
            ExitCode::from(1)
        }
    }
}

fn try_build(dir: &Path) -> Result<PathBuf, String> {
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| format!("no plugin project here ({}: {e})", manifest.display()))?;
    let table: toml::Table = text.parse().map_err(|e| format!("Cargo.toml: {e}"))?;
    let name = table
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(toml::Value::as_str)
        .ok_or("Cargo.toml has no package.name")?
        .to_owned();
    let target_dir = dir.join("target");
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(dir)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "cargo build failed ({status}); is the wasm32-wasip2 target installed? (rustup target add wasm32-wasip2)"
        ));
    }
    let built = target_dir
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")));
    let out = dir.join(format!("{name}.wasm"));
    std::fs::copy(&built, &out).map_err(|e| format!("{}: {e}", built.display()))?;
    Ok(out)
}
