//! The checkpoint refuses a second user and reports damage clearly.

use std::path::PathBuf;

use anyhow::Result;
use weir_host::query::{Query, QueryOptions};
use weir_tests::{SCHEMA, Workspace, run_ok, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn pipeline() -> String {
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
format = "parquet"
"#
    )
}

#[test]
fn a_second_process_on_the_same_checkpoint_is_refused() -> Result<()> {
    let ws = Workspace::new(1, 50)?;
    let file = ws.pipeline("plain.toml", &pipeline())?;
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
    let file = ws.pipeline("plain.toml", &pipeline())?;
    run_ok(EXE, &cache(), &file, &[])?;
    let checkpoint = ws.path().join("checkpoints/plain");
    for (victim, bytes) in [
        ("offsets/2", &b"v1\n{\"batchWatermarkMs\":0,\"batchTim"[..]),
        ("sources/0/1", &b"garbage"[..]),
        ("metadata", &b""[..]),
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
