//! `weir plugin new --lang rust|python|js NAME` and `weir plugin build`: a plugin project to
//! start from, and its component.
//!
//! Why the SDK is copied into the project: the project must build with no checkout of Weir at
//! hand, against exactly the WIT this `weir` loads. So the binary carries the SDK's sources and
//! the WIT (`include_str!`) and writes them under `weir/` in the new project. A Python or
//! JavaScript project also gets the pinned tool versions (`requirements.txt` with hashes,
//! `package-lock.json`) this `weir`'s own plugins are built with, and a `build.sh` that
//! installs them once; `plugin.toml` says which language and world it is.

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

const PY_SDK: &str = include_str!("../../../plugin-sdk/python/weir_plugin.py");
const PY_REQUIREMENTS: &str = include_str!("../../../plugins/python/requirements.txt");
const PY_MANIFEST: &str = include_str!("template/python/plugin.toml.txt");
const PY_SOURCE: &str = include_str!("template/python/plugin.py.txt");
const PY_BUILD: &str = include_str!("template/python/build.sh.txt");
const PY_TEST: &str = include_str!("template/python/test.sh.txt");
const PY_README: &str = include_str!("template/python/README.md.txt");

const JS_SDK: &str = include_str!("../../../plugin-sdk/js/weir-plugin.js");
const JS_STATE: &str = include_str!("../../../plugin-sdk/js/weir-state.js");
const JS_MERGE: &str = include_str!("../../../plugin-sdk/js/weir-merge.js");
const JS_PACKAGE: &str = include_str!("../../../plugins/js/package.json");
const JS_LOCK: &str = include_str!("../../../plugins/js/package-lock.json");
const JS_MANIFEST: &str = include_str!("template/js/plugin.toml.txt");
const JS_SOURCE: &str = include_str!("template/js/plugin.js.txt");
const JS_BUILD: &str = include_str!("template/js/build.sh.txt");
const JS_BUILD_MJS: &str = include_str!("template/js/build.mjs.txt");
const JS_TEST: &str = include_str!("template/js/test.sh.txt");
const JS_README: &str = include_str!("template/js/README.md.txt");

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

/// A file of a new project: its path in the project, its text, whether it is a script.
type ProjectFile = (PathBuf, String, bool);

/// The files of a new project in `lang` for plugin `name`, and the commands that come next.
fn project(lang: &str, name: &str) -> Option<(Vec<ProjectFile>, String)> {
    let fill = |t: &str| {
        t.replace("{{name}}", name)
            .replace("{{type}}", &type_name(name))
    };
    let file = |path: &str, text: String| (PathBuf::from(path), text, false);
    let script = |path: &str, text: String| (PathBuf::from(path), text, true);
    let try_it = format!(
        "  weir plugin test {name}.wasm --config '{{\"column\":\"status\",\"equals\":\"completed\"}}'\n  \
         weir examples --dir . && weir run pipeline.toml"
    );
    let gitignore =
        |extra: &str| format!("/checkpoints\n/data\n/plugins\n/examples\n/out\n*.wasm\n{extra}");
    match lang {
        "rust" => {
            let mut files = vec![
                file("Cargo.toml", fill(CARGO)),
                file("rust-toolchain.toml", TOOLCHAIN.into()),
                file("src/lib.rs", fill(LIB)),
                file("pipeline.toml", fill(PIPELINE)),
                file("README.md", fill(README)),
                file(".gitignore", gitignore("/target\n")),
                file("weir/plugin-sdk/Cargo.toml", SDK_CARGO.into()),
                file("weir/wit/weir.wit", WIT.into()),
            ];
            for (name, text) in SDK_SOURCES {
                files.push(file(
                    &format!("weir/plugin-sdk/src/{name}"),
                    (*text).to_owned(),
                ));
            }
            let next = format!(
                "cargo test                 # its tests, natively\n  \
                 weir plugin build          # -> {name}.wasm (needs the wasm32-wasip2 target: rustup target add wasm32-wasip2)\n{try_it}"
            );
            Some((files, next))
        }
        "python" => {
            let files = vec![
                file("plugin.toml", fill(PY_MANIFEST)),
                file(&format!("{name}.py"), fill(PY_SOURCE)),
                script("build.sh", fill(PY_BUILD)),
                script("test.sh", fill(PY_TEST)),
                file("requirements.txt", PY_REQUIREMENTS.into()),
                file("pipeline.toml", fill(PIPELINE)),
                file("README.md", fill(PY_README)),
                file(".gitignore", gitignore("__pycache__/\n")),
                file("weir/weir_plugin.py", PY_SDK.into()),
                file("weir/wit/weir.wit", WIT.into()),
            ];
            let next = format!(
                "weir plugin build          # -> {name}.wasm (installs componentize-py with pip the first time)\n  \
                 ./test.sh                  # builds it and runs it on sample orders in the real host\n{try_it}"
            );
            Some((files, next))
        }
        "js" | "javascript" => {
            let files = vec![
                file("plugin.toml", fill(JS_MANIFEST)),
                file(&format!("{name}.js"), fill(JS_SOURCE)),
                script("build.sh", fill(JS_BUILD)),
                file("build.mjs", fill(JS_BUILD_MJS)),
                script("test.sh", fill(JS_TEST)),
                file("package.json", JS_PACKAGE.into()),
                file("package-lock.json", JS_LOCK.into()),
                file("pipeline.toml", fill(PIPELINE)),
                file("README.md", fill(JS_README)),
                file(".gitignore", gitignore("node_modules/\n")),
                file("weir/weir-plugin.js", JS_SDK.into()),
                file("weir/weir-state.js", JS_STATE.into()),
                file("weir/weir-merge.js", JS_MERGE.into()),
                file("weir/wit/weir.wit", WIT.into()),
            ];
            let next = format!(
                "weir plugin build          # -> {name}.wasm (installs componentize-js with npm the first time)\n  \
                 ./test.sh                  # builds it and runs it on sample orders in the real host\n{try_it}"
            );
            Some((files, next))
        }
        _ => None,
    }
}

/// Writes a new plugin project `dir` in `lang` (its last component is the plugin's name).
pub(super) fn new(lang: &str, dir: &Path) -> ExitCode {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !valid(&name) {
        complain(&format!(
            "plugin new: {name:?} is not a plugin name: lower-case letters, digits and '_', starting with a letter"
        ));
        return ExitCode::from(2);
    }
    let Some((files, next)) = project(lang, &name) else {
        complain(&format!(
            "plugin new: --lang {lang}: expected rust, python or js (C and other languages: wit/README.md)"
        ));
        return ExitCode::from(2);
    };
    if dir.exists() {
        complain(&format!("plugin new: {} exists already", dir.display()));
        return ExitCode::from(2);
    }
    for (path, text, executable) in files {
        let path = dir.join(path);
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text))
            .and_then(|()| {
                if executable {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                } else {
                    Ok(())
                }
            });
        if let Err(e) = written {
            complain(&format!("plugin new: {}: {e}", path.display()));
            return ExitCode::from(1);
        }
    }
    let language = match lang {
        "rust" => "Rust",
        "python" => "Python",
        _ => "JavaScript",
    };
    say(&format!(
        "{dir}: a {language} transform plugin ({name}: keeps the rows whose column equals a value)\n\
         next:\n  cd {dir}\n  {next}",
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
    if dir.join("Cargo.toml").is_file() {
        return build_rust(dir);
    }
    let manifest = dir.join("plugin.toml");
    let text = std::fs::read_to_string(&manifest).map_err(|e| {
        format!(
            "no plugin project here: neither Cargo.toml nor plugin.toml ({}: {e})",
            manifest.display()
        )
    })?;
    let table: toml::Table = text.parse().map_err(|e| format!("plugin.toml: {e}"))?;
    let name = table
        .get("name")
        .and_then(toml::Value::as_str)
        .ok_or("plugin.toml has no `name`")?
        .to_owned();
    if !valid(&name) {
        return Err(format!("plugin.toml: name {name:?} is not a plugin name"));
    }
    let script = dir.join("build.sh");
    if !script.is_file() {
        return Err(format!("{} is missing", script.display()));
    }
    let status = Command::new("bash")
        .arg("build.sh")
        .current_dir(dir)
        .status()
        .map_err(|e| format!("cannot run bash build.sh: {e}"))?;
    if !status.success() {
        return Err(format!(
            "build.sh failed ({status}); its messages above say why"
        ));
    }
    let out = dir.join(format!("{name}.wasm"));
    if !out.is_file() {
        return Err(format!("build.sh did not write {}", out.display()));
    }
    Ok(out)
}

fn build_rust(dir: &Path) -> Result<PathBuf, String> {
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
