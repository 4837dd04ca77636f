//! Building the Python and JavaScript example plugins from a build script, shared by
//! `tests/build.rs` and `benches/build.rs` through `#[path]`.
//!
//! The work is done by the scripts a plugin author runs by hand (`plugins/python/build.sh`,
//! `plugins/js/build.sh`): they install componentize-py (pip) and componentize-js (npm) when
//! missing and cache each component by a hash of its inputs, so an unchanged tree costs a file
//! copy. Running them here means `cargo test` needs no manual step, and a missing python3,
//! pip, node or npm fails the build with the script's reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A script and the components it writes: (file stem in OUT_DIR, environment variable that
/// will hold its path for `env!`).
const SCRIPTS: &[(&str, &[(&str, &str)])] = &[
    (
        "plugins/python/build.sh",
        &[
            ("python_filter_rows", "WEIR_PLUGIN_PYTHON_FILTER_ROWS"),
            ("python_jsonl_sink", "WEIR_PLUGIN_PYTHON_JSONL_SINK"),
            ("python_count_char", "WEIR_PLUGIN_PYTHON_COUNT_CHAR"),
            ("python_running_total", "WEIR_PLUGIN_PYTHON_RUNNING_TOTAL"),
            ("python_merge_sink", "WEIR_PLUGIN_PYTHON_MERGE_SINK"),
        ],
    ),
    (
        "plugins/js/build.sh",
        &[
            ("js_filter_rows", "WEIR_PLUGIN_JS_FILTER_ROWS"),
            ("js_jsonl_sink", "WEIR_PLUGIN_JS_JSONL_SINK"),
            ("js_running_total", "WEIR_PLUGIN_JS_RUNNING_TOTAL"),
            ("js_merge_sink", "WEIR_PLUGIN_JS_MERGE_SINK"),
        ],
    ),
];

/// Builds every Python and JavaScript plugin into OUT_DIR and sets their variables.
pub fn build_polyglot_plugins() {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .parent()
        .expect("the crate lives inside the workspace");
    let out_dir = PathBuf::from(env("OUT_DIR"));
    for watched in [
        "wit",
        "plugins/python",
        "plugins/js",
        "plugin-sdk/python",
        "plugin-sdk/js",
    ] {
        println!("cargo::rerun-if-changed={}", root.join(watched).display());
    }
    // Both languages at once: a cold build spends most of its time in each tool.
    let children: Vec<_> = SCRIPTS
        .iter()
        .map(|(script, _)| (script, spawn(root, script, &out_dir)))
        .collect();
    for (script, child) in children {
        let output = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for {script}: {e}"));
        assert!(
            output.status.success(),
            "{script} failed ({}): {}\nThe Python and JavaScript plugins are built by \
             plugins/python/build.sh (needs python3 with venv and pip) and plugins/js/build.sh \
             (needs node and npm); both reach their package registry the first time.",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    for (_, outputs) in SCRIPTS {
        for (stem, var) in *outputs {
            let path = out_dir.join(format!("{stem}.wasm"));
            assert!(path.is_file(), "{} was not written", path.display());
            println!("cargo::rustc-env={var}={}", path.display());
        }
    }
}

fn spawn(root: &Path, script: &str, out_dir: &Path) -> std::process::Child {
    Command::new("bash")
        .arg(root.join(script))
        .arg(out_dir)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run bash {script}: {e} (is bash installed?)"))
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("cargo sets {key} for build scripts"))
}
