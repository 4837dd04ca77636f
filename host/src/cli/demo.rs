//! `weir demo`: the main job on embedded defaults. It writes sample orders,
//! the example plugins and a pipeline file into a folder, runs the pipeline
//! (a Wasm transform chain and a Wasm foreachBatch sink) and shows the result.

use std::path::PathBuf;
use std::process::ExitCode;

use super::{complain, say};
use crate::examples::{self, OrdersSpec};

pub(super) fn run(
    dir: Option<PathBuf>,
    files: usize,
    lines: usize,
    cache_dir: Option<PathBuf>,
) -> ExitCode {
    match prepare(dir, files, lines) {
        Ok((dir, pipeline)) => {
            say(&format!("demo folder: {}", dir.display()));
            say(&format!("pipeline:    {}\n", pipeline.display()));
            let options = super::RunOptions {
                cache_dir,
                failpoint: None,
                watch_plugins: false,
                policy: None,
                metrics: None,
            };
            let code = super::run(&pipeline, &[], options);
            if code == ExitCode::SUCCESS {
                show_result(&dir);
            }
            code
        }
        Err(e) => {
            complain(&format!("demo: {e}"));
            ExitCode::from(1)
        }
    }
}

fn prepare(
    dir: Option<PathBuf>,
    files: usize,
    lines: usize,
) -> std::io::Result<(PathBuf, PathBuf)> {
    let dir = match dir {
        Some(d) => d,
        None => tempfile_dir()?,
    };
    std::fs::create_dir_all(&dir)?;
    let written = examples::write_orders(
        &dir.join("data/orders"),
        OrdersSpec {
            files,
            lines_per_file: lines,
            ..OrdersSpec::default()
        },
    )?;
    say(&format!(
        "generated {} order lines in {files} files ({} malformed on purpose)",
        written.lines, written.malformed
    ));
    examples::write_plugins(&dir.join("plugins"))?;
    std::fs::create_dir_all(dir.join("out"))?;
    let pipeline = dir.join("pipeline.toml");
    std::fs::write(
        &pipeline,
        PIPELINE.replace("{schema}", examples::ORDERS_SCHEMA),
    )?;
    Ok((dir, pipeline))
}

fn tempfile_dir() -> std::io::Result<PathBuf> {
    let base = std::env::temp_dir().join(format!("weir-demo-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    Ok(base)
}

fn show_result(dir: &std::path::Path) {
    let out = dir.join("out/completed_orders.jsonl");
    match std::fs::read_to_string(&out) {
        Ok(text) => {
            let rows = text.lines().count();
            say(&format!(
                "\nresult: {rows} completed orders in {}",
                out.display()
            ));
            for line in text.lines().take(3) {
                say(&format!("  {line}"));
            }
            if rows > 3 {
                say("  ...");
            }
            say(&format!(
                "progress records: {}",
                dir.join("checkpoints/demo/progress.jsonl").display()
            ));
        }
        Err(e) => complain(&format!("cannot read the result {}: {e}", out.display())),
    }
}

const PIPELINE: &str = r#"# Written by `weir demo`.
[query]
name = "demo"
checkpoint = "checkpoints/demo"
trigger = "available-now"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{schema}"
max_files_per_trigger = 1
on_malformed = "dead-letter"
dead_letter_path = "dead-letter/orders"

[[transform]]
name = "normalize_status"
plugin = "plugins/normalize_status.wasm"
config = { column = "status", lowercase = true, trim = true, map = { canceled = "cancelled" } }

[[transform]]
name = "keep_completed"
plugin = "plugins/filter_rows.wasm"
config = { column = "status", op = "eq", value = "completed" }

[sink]
kind = "plugin"
name = "jsonl_sink"
plugin = "plugins/jsonl_sink.wasm"
config = { path = "/out/completed_orders.jsonl" }
capabilities = { dirs = [ { host = "out", guest = "/out", writable = true } ] }
"#;
