//! The checkpoint refuses a second user and reports damage clearly, and a
//! well-formed but hostile entry (a file outside the source folder, a size
//! above the file's, a batch id near `u64::MAX`) is refused before anything
//! outside the query's folders is read.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use weir_host::query::{Query, QueryOptions};
use weir_tests::{SCHEMA, Workspace, run_ok, sorted_output, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// The test pipeline: orders, one file per batch, into `out/plain` in `sink_format`.
fn pipeline(sink_format: &str) -> String {
    format!(
        r#"
[query]
name = "plain"
checkpoint = "checkpoints/plain"
trigger = "available-now"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1
on_malformed = "drop"

[sink]
kind = "files"
path = "out/plain"
format = "{sink_format}"
"#
    )
}

#[test]
fn a_second_process_on_the_same_checkpoint_is_refused() -> Result<()> {
    let ws = Workspace::new(1, 50)?;
    let file = ws.pipeline("plain.toml", &pipeline("parquet"))?;
    let spec = weir_host::spec::load(&file, &[])?;
    // This test process holds the checkpoint...
    let _holder = Query::start(
        spec,
        QueryOptions {
            cache_dir: Some(cache()),
            ..QueryOptions::default()
        },
    )?;
    // ...so the `weir` process must refuse it, naming the holder.
    let out = weir(EXE, &cache(), &["run", file.to_str().unwrap_or_default()])?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in use by pid"), "{stderr}");
    assert!(stderr.contains(&std::process::id().to_string()), "{stderr}");
    Ok(())
}

#[test]
fn damaged_log_files_are_named_not_panicked_on() -> Result<()> {
    let ws = Workspace::new(3, 50)?;
    let file = ws.pipeline("plain.toml", &pipeline("parquet"))?;
    run_ok(EXE, &cache(), &file, &[])?;
    let checkpoint = ws.path().join("checkpoints/plain");
    for (victim, bytes) in [
        ("offsets/2", &b"v1\n{\"batchWatermarkMs\":0,\"batchTim"[..]),
        ("offsets/1", &b"garbage"[..]),
        ("metadata", &b""[..]),
        // The query's secret, cut short: refused naming it, never replaced by a new one.
        ("secret", &b"0123456789abcdef"[..]),
    ] {
        let path = checkpoint.join(victim);
        let original = std::fs::read(&path)?;
        std::fs::write(&path, bytes)?;
        let out = weir(EXE, &cache(), &["run", file.to_str().unwrap_or_default()])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{victim}: {stderr}");
        assert!(
            stderr.contains(&path.display().to_string()),
            "{victim}: the error must name the file: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{victim}: {stderr}");
        std::fs::write(&path, original)?;
    }
    // Restored, the checkpoint works again.
    run_ok(EXE, &cache(), &file, &[])?;
    Ok(())
}

/// Valid order rows that are not in the workspace's data (order ids 9876543210..).
const OUTSIDE_ROWS: &str = concat!(
    r#"{"order_id":9876543210,"customer_id":1,"status":"completed","amount":1.00,"occurred_at":"2024-03-01T00:00:00.000Z","session_id":"s-outside"}"#,
    "\n",
    r#"{"order_id":9876543211,"customer_id":2,"status":"completed","amount":2.00,"occurred_at":"2024-03-01T00:00:01.000Z","session_id":"s-outside"}"#,
    "\n",
);

/// A finished two-batch run of `pipeline("json")`: the workspace, pipeline file, checkpoint
/// and the sink's sorted output.
fn two_batches() -> Result<(Workspace, PathBuf, PathBuf, Vec<String>)> {
    let ws = Workspace::new(2, 50)?;
    let file = ws.pipeline("plain.toml", &pipeline("json"))?;
    run_ok(EXE, &cache(), &file, &[])?;
    let checkpoint = ws.path().join("checkpoints/plain");
    let output = sorted_output(&ws.path().join("out/plain"))?;
    assert_eq!(
        output.len() as u64,
        ws.orders.lines - ws.orders.malformed,
        "the reference run"
    );
    Ok((ws, file, checkpoint, output))
}

/// Rewrites the first file that the offsets entry `entry` records for the first source with `edit`.
fn edit_entry(entry: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> Result<()> {
    let text = std::fs::read_to_string(entry)?;
    let json = text.strip_prefix("v1\n").context("entry version line")?;
    let mut value: serde_json::Value = serde_json::from_str(json.trim_end())?;
    edit(&mut value["sources"][0]["files"][0]);
    std::fs::write(entry, format!("v1\n{value}\n"))?;
    Ok(())
}

/// Runs the query, which must fail with the checkpoint's `Corrupt` error naming `file` (and
/// saying `reason`), without a panic and without changing the sink's output.
fn refused(
    ws: &Workspace,
    pipeline: &Path,
    file: &Path,
    reason: &str,
    output: &[String],
) -> Result<()> {
    let out = weir(
        EXE,
        &cache(),
        &["run", pipeline.to_str().unwrap_or_default()],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}: {stderr}", file.display());
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains(&format!("{}: ", file.display())),
        "the error must name {}: {stderr}",
        file.display()
    );
    assert!(stderr.contains(reason), "{reason}: {stderr}");
    assert!(
        stderr.contains("the checkpoint is damaged; restore it or start a new checkpoint"),
        "{stderr}"
    );
    let now = sorted_output(&ws.path().join("out/plain"))?;
    assert!(
        !now.iter().any(|l| l.contains("s-outside")),
        "outside rows in the sink"
    );
    assert_eq!(now, output, "the sink's output changed");
    Ok(())
}

#[test]
fn an_offsets_entry_naming_a_file_outside_the_folder_is_refused_and_nothing_is_read() -> Result<()>
{
    let (ws, file, checkpoint, output) = two_batches()?;
    let outside = ws.path().join("outside/rows.json");
    std::fs::create_dir_all(ws.path().join("outside"))?;
    std::fs::write(&outside, OUTSIDE_ROWS)?;
    let entry = checkpoint.join("offsets/1");
    let commit = checkpoint.join("commits/1");
    let (original_entry, original_commit) = (std::fs::read(&entry)?, std::fs::read(&commit)?);
    let absolute = outside.to_str().context("utf-8 path")?.to_owned();
    for (name, reason) in [
        (absolute.as_str(), "has a path separator"),
        ("../../outside/rows.json", "has a path separator"),
        ("..", "is `..` or `.`"),
    ] {
        // The attack: batch 1 "read" the outside file, and is replayed.
        edit_entry(&entry, |f| {
            f["name"] = name.into();
            f["size"] = OUTSIDE_ROWS.len().into();
        })?;
        std::fs::remove_file(&commit)?;
        refused(
            &ws,
            &file,
            &entry,
            &format!("file name {name:?} {reason}"),
            &output,
        )?;
        std::fs::write(&entry, &original_entry)?;
        std::fs::write(&commit, &original_commit)?;
    }
    // Restored, the checkpoint works again; and the outside rows are valid input: copied
    // into the source folder, they are read.
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(sorted_output(&ws.path().join("out/plain"))?, output);
    std::fs::copy(&outside, ws.path().join("data/orders/orders-99999.json"))?;
    run_ok(EXE, &cache(), &file, &[])?;
    let after = sorted_output(&ws.path().join("out/plain"))?;
    assert_eq!(after.iter().filter(|l| l.contains("s-outside")).count(), 2);
    Ok(())
}

#[test]
fn a_recorded_size_above_the_file_is_refused() -> Result<()> {
    let (ws, file, checkpoint, output) = two_batches()?;
    let entry = checkpoint.join("offsets/1");
    let commit = checkpoint.join("commits/1");
    let data = ws.path().join("data/orders/orders-00001.json");
    let len = std::fs::metadata(&data)?.len();
    let (original_entry, original_commit) = (std::fs::read(&entry)?, std::fs::read(&commit)?);
    for size in [len + 1, u64::MAX] {
        edit_entry(&entry, |f| f["size"] = size.into())?;
        std::fs::remove_file(&commit)?;
        refused(
            &ws,
            &file,
            &entry,
            &format!(
                "batch 1 records {size} bytes of {}, which holds {len} bytes",
                data.display()
            ),
            &output,
        )?;
        std::fs::write(&entry, &original_entry)?;
        std::fs::write(&commit, &original_commit)?;
    }
    // Restored, batch 1 is replayed to the same output.
    std::fs::remove_file(&commit)?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(sorted_output(&ws.path().join("out/plain"))?, output);
    Ok(())
}

#[test]
fn batch_ids_near_u64_max_are_refused_not_overflowed() -> Result<()> {
    let (ws, file, checkpoint, output) = two_batches()?;
    // A log entry named beyond any batch id.
    for (name, copy_of) in [
        ("offsets/18446744073709551615", "offsets/1"),
        ("commits/9223372036854775808", "commits/1"),
    ] {
        let victim = checkpoint.join(name);
        std::fs::copy(checkpoint.join(copy_of), &victim)?;
        refused(
            &ws,
            &file,
            &victim,
            "is above the largest batch id 9223372036854775807",
            &output,
        )?;
        std::fs::remove_file(&victim)?;
    }
    // The largest batch id, planned and committed: the next batch's id is refused when new
    // input arrives, before anything is written for it.
    let last = "9223372036854775807";
    std::fs::copy(
        checkpoint.join("offsets/1"),
        checkpoint.join("offsets").join(last),
    )?;
    std::fs::copy(
        checkpoint.join("commits/1"),
        checkpoint.join("commits").join(last),
    )?;
    // The source log holds every file taken by then (batches 2.. took none).
    let mut files = Vec::new();
    for n in 0..2 {
        let text = std::fs::read_to_string(checkpoint.join(format!("offsets/{n}")))?;
        let entry: serde_json::Value = serde_json::from_str(
            text.strip_prefix("v1\n")
                .context("version line")?
                .trim_end(),
        )?;
        files.extend(
            entry["sources"][0]["files"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
    }
    std::fs::create_dir_all(checkpoint.join("sources/0"))?;
    std::fs::write(
        checkpoint.join("sources/0").join(last),
        format!("v1\n{}\n", serde_json::json!({ "files": files })),
    )?;
    std::fs::write(
        ws.path().join("data/orders/orders-99999.json"),
        OUTSIDE_ROWS,
    )?;
    refused(
        &ws,
        &file,
        &checkpoint.join("offsets/9223372036854775808"),
        "batch id 9223372036854775808 would be above the largest batch id",
        &output,
    )?;
    assert!(!checkpoint.join("offsets/9223372036854775808").exists());
    Ok(())
}
