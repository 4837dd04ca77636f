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

/// `weir ARGS` run in `dir`, which must succeed: its standard output.
fn weir_ok(dir: &std::path::Path, args: &[&str]) -> Result<String> {
    let out = weir_in(dir, args)?;
    ensure!(
        out.status.success(),
        "weir {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn a_new_rust_plugin_builds_tests_and_runs_in_a_pipeline() -> Result<()> {
    let scratch = tempfile::tempdir()?;
    let project = new_build_test_and_run(scratch.path(), "rust", "keep_status")?;
    let inspected: serde_json::Value = serde_json::from_str(&weir_ok(
        &project,
        &["plugin", "inspect", "keep_status.wasm", "--json"],
    )?)?;
    ensure!(
        inspected["metadata"]["name"] == "keep_status",
        "{inspected}"
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
    let cobol = weir(
        EXE,
        &cache(),
        &[
            "plugin",
            "new",
            "--lang",
            "cobol",
            scratch.path().join("p").to_str().context("path")?,
        ],
    )?;
    ensure!(
        !cobol.status.success()
            && String::from_utf8_lossy(&cobol.stderr).contains("expected rust, python or js")
    );
    Ok(())
}

#[test]
fn a_new_python_plugin_builds_tests_and_runs_in_a_pipeline() -> Result<()> {
    let scratch = tempfile::tempdir()?;
    new_build_test_and_run(scratch.path(), "python", "keep_py")?;
    Ok(())
}

#[test]
fn a_new_js_plugin_builds_tests_and_runs_in_a_pipeline() -> Result<()> {
    let scratch = tempfile::tempdir()?;
    new_build_test_and_run(scratch.path(), "js", "keep_js")?;
    Ok(())
}

/// Follows the instructions `weir plugin new --lang LANG` prints, in a new project `name` under
/// `scratch`: build, the project's own test (Python and JavaScript), `weir plugin test`,
/// `weir examples --dir .` and `weir run pipeline.toml`, checking what each says.
fn new_build_test_and_run(scratch: &std::path::Path, lang: &str, name: &str) -> Result<PathBuf> {
    let project = scratch.join(name);
    let out = weir(
        EXE,
        &cache(),
        &[
            "plugin",
            "new",
            "--lang",
            lang,
            project.to_str().context("path")?,
        ],
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
    let files: &[&str] = match lang {
        "rust" => &["Cargo.toml", "src/lib.rs", "weir/plugin-sdk/src/lib.rs"],
        "python" => &[
            "plugin.toml",
            "build.sh",
            "test.sh",
            "requirements.txt",
            "weir/weir_plugin.py",
        ],
        _ => &[
            "plugin.toml",
            "build.sh",
            "test.sh",
            "package-lock.json",
            "weir/weir-plugin.js",
        ],
    };
    for file in files
        .iter()
        .chain(&["pipeline.toml", "README.md", "weir/wit/weir.wit"])
    {
        ensure!(project.join(file).is_file(), "{file} missing");
    }

    weir_ok(&project, &["plugin", "build"])?;
    let wasm = format!("{name}.wasm");
    ensure!(project.join(&wasm).is_file(), "no component");

    if lang != "rust" {
        // The project's own test: it builds and runs the plugin with the weir it is given.
        let out = Command::new("bash")
            .arg("test.sh")
            .current_dir(&project)
            .env("WEIR", EXE)
            .env("WEIR_CACHE_DIR", cache())
            .env_remove("WEIR_LOG")
            .output()?;
        ensure!(
            out.status.success(),
            "test.sh: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let text = weir_ok(
        &project,
        &[
            "plugin",
            "test",
            &wasm,
            "--config",
            r#"{"column":"status","equals":"completed"}"#,
            "--rows",
            "100",
            "--batches",
            "1",
        ],
    )?;
    ensure!(
        text.contains("(transform)")
            && text.contains("| completed |")
            && text.contains("cost: 1 call(s)"),
        "{text}"
    );

    weir_ok(&project, &["examples", "--dir", "."])?;
    let printed = weir_ok(&project, &["run", "pipeline.toml"])?;
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
        "{lang}: {rows} completed rows, {others} others:\n{printed}"
    );
    Ok(project)
}

#[test]
fn weir_plugin_test_runs_stateful_transforms_and_listeners() -> Result<()> {
    let scratch = tempfile::tempdir()?;
    weir_host::examples::write_plugins(&scratch.path().join("plugins"))?;

    // Batch n sees what batch n-1 put: the keys grow, and the totals run on.
    let text = weir_ok(
        scratch.path(),
        &[
            "plugin",
            "test",
            "plugins/running_total.wasm",
            "--config",
            r#"{"key":"customer_id","value":"amount"}"#,
            "--rows",
            "200",
        ],
    )?;
    ensure!(text.contains("(stateful-transform)"), "{text}");
    let keys: Vec<u64> = text
        .lines()
        .filter_map(|l| l.split_once("state: ")?.1.split(' ').next()?.parse().ok())
        .collect();
    // Customers seldom repeat in 200 orders: the keys of every batch are added to those the
    // earlier batches committed (a store reset per batch would hold one batch's keys each time).
    ensure!(
        keys.len() == 3 && keys[1] > keys[0] + keys[0] / 2 && keys[2] > keys[1] + keys[0] / 2,
        "{text}"
    );
    ensure!(text.contains("running_total"), "{text}");

    // A listener hears started, a progress record per batch, idle and terminated.
    let text = weir_ok(
        scratch.path(),
        &[
            "plugin",
            "test",
            "plugins/query_log.wasm",
            "--config",
            r#"{"path":"/out/events.log"}"#,
            "--dir",
            "events=/out",
            "--batches",
            "2",
        ],
    )?;
    ensure!(
        text.contains("(listener)") && text.matches("queryProgress: delivered").count() == 2,
        "{text}"
    );
    let log = std::fs::read_to_string(scratch.path().join("events/events.log"))?;
    ensure!(
        log.lines().count() == 5
            && log.contains("batch=1 input=1000")
            && log.starts_with("started"),
        "{log}"
    );
    Ok(())
}
