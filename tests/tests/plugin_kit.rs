//! The plugin kit as a new user meets it: `weir plugin new` writes a project, `weir plugin
//! build` makes its component, `weir plugin test` runs it in the real host, and the project's
//! own pipeline runs it after `weir examples` wrote sample data, exactly as the printed
//! instructions say.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use weir_tests::weir;

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// `weir ARGS` run in `dir`.
fn weir_in(dir: &std::path::Path, args: &[&str]) -> Result<std::process::Output> {
    Ok(Command::new(EXE)
        .current_dir(dir)
        .args(args)
        .arg("--cache-dir")
        .arg(cache())
        .env_remove("WEIR_LOG")
        .output()?)
}

#[test]
fn a_new_plugin_builds_tests_and_runs_in_a_pipeline() -> Result<()> {
    let scratch = tempfile::tempdir()?;
    let project = scratch.path().join("keep_status");
    let out = weir(
        EXE,
        &cache(),
        &["plugin", "new", project.to_str().context("path")?],
    )?;
    let said = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        said.contains("weir plugin build") && said.contains("weir run pipeline.toml"),
        "{said}"
    );
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        "pipeline.toml",
        "weir/wit/weir.wit",
        "weir/plugin-sdk/src/lib.rs",
    ] {
        ensure!(project.join(file).is_file(), "{file} missing");
    }

    let out = weir_in(&project, &["plugin", "build"])?;
    ensure!(
        out.status.success(),
        "build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wasm = project.join("keep_status.wasm");
    ensure!(wasm.is_file(), "no component");

    let out = weir_in(
        &project,
        &[
            "plugin",
            "test",
            "keep_status.wasm",
            "--config",
            r#"{"column":"status","equals":"completed"}"#,
            "--rows",
            "100",
            "--batches",
            "1",
        ],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "test: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        text.contains("(transform)")
            && text.contains("| completed |")
            && text.contains("cost: 1 call(s)"),
        "{text}"
    );

    let out = weir_in(
        &project,
        &["plugin", "inspect", "keep_status.wasm", "--json"],
    )?;
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(
        inspected["metadata"]["name"] == "keep_status",
        "{inspected}"
    );

    let out = weir_in(&project, &["examples", "--dir", "."])?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = weir_in(&project, &["run", "pipeline.toml"])?;
    let printed = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = printed
        .lines()
        .filter(|l| l.contains("| completed |"))
        .count();
    let others = printed
        .lines()
        .filter(|l| l.contains("| pending") || l.contains("| returned"))
        .count();
    // The console sink shows the first 20 rows of each batch, as Spark's does.
    ensure!(
        rows >= 20 && others == 0,
        "{rows} completed rows, {others} others:\n{printed}"
    );

    // A name that is not one, a folder that exists, a language this weir does not make.
    let bad = weir(
        EXE,
        &cache(),
        &[
            "plugin",
            "new",
            scratch.path().join("Bad-Name").to_str().context("path")?,
        ],
    )?;
    ensure!(
        !bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("not a plugin name")
    );
    let again = weir(
        EXE,
        &cache(),
        &["plugin", "new", project.to_str().context("path")?],
    )?;
    ensure!(
        !again.status.success()
            && String::from_utf8_lossy(&again.stderr).contains("exists already")
    );
    let py = weir(
        EXE,
        &cache(),
        &[
            "plugin",
            "new",
            "--lang",
            "python",
            scratch.path().join("p").to_str().context("path")?,
        ],
    )?;
    ensure!(!py.status.success() && String::from_utf8_lossy(&py.stderr).contains("plugins/python"));
    Ok(())
}
