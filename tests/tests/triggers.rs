//! Triggers, and stopping on a signal after the current batch.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use weir_tests::{SCHEMA, Workspace, commit_ids, offset_ids, run_ok};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn pipeline(tag: &str, trigger: &str) -> String {
    format!(
        r#"
[query]
name = "{tag}"
checkpoint = "checkpoints/{tag}"
{trigger}

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
path = "out/{tag}"
format = "json"
"#
    )
}

fn spawn(file: &Path) -> Result<Child> {
    Ok(Command::new(EXE)
        .arg("run")
        .arg(file)
        .arg("--cache-dir")
        .arg(cache())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?)
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    while !done()? {
        if start.elapsed() > timeout {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn signal(child: &Child, sig: i32) -> Result<()> {
    let pid = i32::try_from(child.id())?;
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    if unsafe { libc::kill(pid, sig) } != 0 {
        bail!("kill failed: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn progress_timestamps(checkpoint: &Path) -> Result<Vec<String>> {
    weir_tests::progress(checkpoint)?
        .iter()
        .map(|v| {
            v["timestamp"]
                .as_str()
                .map(str::to_owned)
                .context("timestamp")
        })
        .collect()
}

#[test]
fn sigterm_and_sigint_finish_the_batch_and_exit_cleanly() -> Result<()> {
    for (tag, sig) in [("term", libc::SIGTERM), ("int", libc::SIGINT)] {
        let ws = Workspace::new(2, 200)?;
        // No trigger: continuous, waiting for new files after the two there.
        let file = ws.pipeline("q.toml", &pipeline(tag, ""))?;
        let mut child = spawn(&file)?;
        let checkpoint = ws.path().join("checkpoints").join(tag);
        wait_for("two commits", Duration::from_secs(60), || {
            Ok(commit_ids(&checkpoint)?.len() == 2)
        })?;
        signal(&child, sig)?;
        let status = child.wait()?;
        assert_eq!(status.code(), Some(0), "{tag}: a signal is a clean stop");
        assert_eq!(offset_ids(&checkpoint)?, commit_ids(&checkpoint)?);
        // The lock is released: the query starts again at once.
        run_ok(
            EXE,
            &cache(),
            &file,
            &["--set", "query.trigger=available-now"],
        )?;
    }
    Ok(())
}

#[test]
fn processing_time_trigger_spaces_batches_by_its_interval() -> Result<()> {
    let ws = Workspace::new(3, 100)?;
    let file = ws.pipeline("q.toml", &pipeline("pt", r#"trigger = "700ms""#))?;
    let mut child = spawn(&file)?;
    let checkpoint = ws.path().join("checkpoints/pt");
    let result = wait_for("three commits", Duration::from_secs(60), || {
        Ok(commit_ids(&checkpoint)?.len() == 3)
    });
    signal(&child, libc::SIGINT)?;
    let status = child.wait()?;
    result?;
    assert_eq!(status.code(), Some(0));
    let ts = progress_timestamps(&checkpoint)?;
    assert_eq!(ts.len(), 3);
    // Timestamps are RFC 3339 with milliseconds; compare their seconds-of-day.
    let ms = |t: &str| -> Result<i64> {
        let clock = &t[11..23];
        let h: i64 = clock[0..2].parse()?;
        let m: i64 = clock[3..5].parse()?;
        let s: i64 = clock[6..8].parse()?;
        let f: i64 = clock[9..12].parse()?;
        Ok(((h * 60 + m) * 60 + s) * 1000 + f)
    };
    for pair in ts.windows(2) {
        let gap = (ms(&pair[1])? - ms(&pair[0])?).rem_euclid(86_400_000);
        assert!(
            gap >= 650,
            "batches {pair:?} are {gap} ms apart, the interval is 700 ms"
        );
    }
    Ok(())
}

#[test]
fn once_takes_everything_in_one_batch_and_available_now_respects_the_limit() -> Result<()> {
    let ws = Workspace::new(4, 50)?;
    let once = ws.pipeline("once.toml", &pipeline("once", r#"trigger = "once""#))?;
    run_ok(EXE, &cache(), &once, &[])?;
    assert_eq!(commit_ids(&ws.path().join("checkpoints/once"))?, vec![0]);
    let now = ws.pipeline("now.toml", &pipeline("now", r#"trigger = "available-now""#))?;
    run_ok(EXE, &cache(), &now, &[])?;
    assert_eq!(
        commit_ids(&ws.path().join("checkpoints/now"))?,
        vec![0, 1, 2, 3]
    );
    // Both read every row: the same rows, cut differently.
    let count = |tag: &str| -> Result<usize> {
        let mut n = 0;
        for e in std::fs::read_dir(ws.path().join("out").join(tag))? {
            n += std::fs::read_to_string(e?.path())?.lines().count();
        }
        Ok(n)
    };
    assert_eq!(count("once")?, count("now")?);
    assert_eq!(count("once")? as u64, ws.orders.lines - ws.orders.malformed);
    Ok(())
}
