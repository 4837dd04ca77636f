//! `[[listener]]`, Spark's `StreamingQueryListener`: the guide's example listener (the
//! `query_log` plugin) writes one line per event with each batch's figures; a webhook receives
//! each event as JSON; a listener that fails is counted in the progress records and never fails
//! its query; `weir validate` refuses a listener that is neither or both, and a webhook the
//! operator's policy does not allow.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use weir_tests::{SCHEMA, Workspace, progress, run_ok, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn pipeline(tag: &str, listeners: &str) -> String {
    format!(
        r#"[query]
name = "{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1
on_malformed = "drop"

{listeners}

[sink]
kind = "files"
path = "out/{tag}"
format = "json"
"#
    )
}

/// A webhook receiver: answers `status` to every POST and keeps the bodies.
fn receiver(status: u16) -> Result<(String, Arc<Mutex<Vec<Value>>>)> {
    let server = TcpListener::bind("127.0.0.1:0")?;
    let addr = server.local_addr()?.to_string();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&bodies);
    std::thread::spawn(move || {
        for stream in server.incoming() {
            let Ok(stream) = stream else { continue };
            let mut reader = BufReader::new(stream);
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_ok()
                && let Ok(json) = serde_json::from_slice(&body)
            {
                kept.lock().unwrap().push(json);
            }
            let mut stream = reader.into_inner();
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    Ok((addr, bodies))
}

fn records(ws: &Workspace, tag: &str) -> Result<Vec<Value>> {
    progress(&ws.path().join("checkpoints").join(tag))
}

#[test]
fn the_query_log_plugin_writes_a_line_per_event() -> Result<()> {
    let ws = Workspace::new(3, 200)?;
    std::fs::create_dir_all(ws.path().join("logs"))?;
    let listener = r#"[[listener]]
name = "log"
plugin = "plugins/query_log.wasm"
config = { path = "/logs/queries.log" }
capabilities = { dirs = [ { host = "logs", guest = "/logs", writable = true } ] }"#;
    let file = ws.pipeline("p.toml", &pipeline("logged", listener))?;
    run_ok(EXE, &cache(), &file, &[])?;
    let text = std::fs::read_to_string(ws.path().join("logs/queries.log"))?;
    let lines: Vec<&str> = text.lines().collect();
    let records = records(&ws, "logged")?;
    ensure!(records.len() == 3, "{} batches", records.len());
    let id = records[0]["id"].as_str().context("id")?;
    let run = records[0]["runId"].as_str().context("runId")?;
    let mut want = vec![format!("started logged id={id} run={run}")];
    for r in &records {
        want.push(format!(
            "logged batch={} input={} processed={:.1}/s state=0",
            r["batchId"],
            r["numInputRows"],
            r["processedRowsPerSecond"].as_f64().context("rate")?
        ));
    }
    want.push("terminated logged error=none".to_owned());
    ensure!(
        lines == want,
        "the log:\n{text}\nwanted:\n{}",
        want.join("\n")
    );
    // Each record counts what the listener heard before it (the start, the batches before).
    let heard: Vec<u64> = records
        .iter()
        .map(|r| r["listeners"][0]["events"].as_u64().unwrap_or(u64::MAX))
        .collect();
    ensure!(heard.iter().all(|n| *n <= 3), "{heard:?}");
    Ok(())
}

#[test]
fn a_webhook_hears_every_event_as_json() -> Result<()> {
    let ws = Workspace::new(3, 200)?;
    let (addr, bodies) = receiver(200)?;
    let listener = format!("[[listener]]\nname = \"hook\"\nurl = \"http://{addr}/weir\"");
    let file = ws.pipeline("p.toml", &pipeline("hooked", &listener))?;
    run_ok(EXE, &cache(), &file, &[])?;
    let got = bodies.lock().unwrap().clone();
    let kinds: Vec<&str> = got.iter().filter_map(|b| b["event"].as_str()).collect();
    ensure!(
        kinds
            == [
                "queryStarted",
                "queryProgress",
                "queryProgress",
                "queryProgress",
                "queryTerminated"
            ],
        "{kinds:?}"
    );
    let records = records(&ws, "hooked")?;
    for (i, r) in records.iter().enumerate() {
        ensure!(got[i + 1]["progress"]["batchId"] == r["batchId"]);
        ensure!(got[i + 1]["progress"]["numInputRows"] == r["numInputRows"]);
    }
    ensure!(got[0]["name"] == "hooked" && got[0]["id"] == records[0]["id"]);
    ensure!(got[4]["exception"].is_null(), "{}", got[4]);
    Ok(())
}

#[test]
fn failing_listeners_are_counted_and_never_fail_the_query() -> Result<()> {
    let ws = Workspace::new(3, 200)?;
    let (addr, bodies) = receiver(500)?;
    // The plugin has no folder granted: every event fails. The webhook answers 500.
    let listeners = format!(
        r#"[[listener]]
name = "log"
plugin = "plugins/query_log.wasm"
config = {{ path = "/logs/queries.log" }}

[[listener]]
name = "hook"
url = "http://{addr}/"
"#
    );
    let file = ws.pipeline("p.toml", &pipeline("failing", &listeners))?;
    let run = run_ok(EXE, &cache(), &file, &[])?;
    let records = records(&ws, "failing")?;
    ensure!(records.len() == 3, "every batch ran");
    // Every event reached both, and each failure was logged, naming the listener and event.
    let kinds: Vec<String> = bodies
        .lock()
        .unwrap()
        .iter()
        .filter_map(|b| b["event"].as_str().map(str::to_owned))
        .collect();
    ensure!(
        kinds
            == [
                "queryStarted",
                "queryProgress",
                "queryProgress",
                "queryProgress",
                "queryTerminated"
            ],
        "the webhook (answering 500) heard {kinds:?}"
    );
    let log = String::from_utf8_lossy(&run.stderr);
    for name in ["log", "hook"] {
        for event in ["queryStarted", "queryProgress", "queryTerminated"] {
            ensure!(
                log.contains(&format!("listener {name} failed on {event}")),
                "{name} {event}:\n{log}"
            );
        }
    }
    let out = weir_tests::sorted_output(&ws.path().join("out/failing"))?;
    ensure!(!out.is_empty(), "the sink wrote");
    let last = &records[2]["listeners"];
    for (i, name) in ["log", "hook"].iter().enumerate() {
        // The record is written before its own event is queued: what it counts is the earlier
        // events the listener thread had taken by then, all failed.
        ensure!(last[i]["name"] == *name, "{last}");
        ensure!(last[i]["events"] == 0, "{last}");
        // The start and the first two batches had been heard (and failed) by then, at most.
        ensure!(
            last[i]["failures"].as_u64().is_some_and(|n| n <= 3),
            "{last}"
        );
    }
    Ok(())
}

#[test]
fn validate_refuses_bad_listeners() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    let both = "[[listener]]\nname = \"x\"\nplugin = \"plugins/query_log.wasm\"\nurl = \"http://example.com/\"";
    let neither = "[[listener]]\nname = \"x\"";
    let bad_url = "[[listener]]\nname = \"x\"\nurl = \"ftp://example.com/\"";
    let not_a_listener = "[[listener]]\nname = \"x\"\nplugin = \"plugins/normalize_status.wasm\"";
    for (what, listener, key) in [
        ("both", both, "listener[0]"),
        ("neither", neither, "listener[0]"),
        ("a bad url", bad_url, "listener[0].url"),
    ] {
        let file = ws.pipeline("v.toml", &pipeline("v", listener))?;
        let out = weir(EXE, &cache(), &["validate", file.to_str().context("path")?])?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && err.contains(key), "{what}: {err}");
    }
    // A component of another world fails the start, naming the listener.
    let file = ws.pipeline("w.toml", &pipeline("w", not_a_listener))?;
    let out = weir(EXE, &cache(), &["run", file.to_str().context("path")?])?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("not a Weir listener plugin"),
        "{err}"
    );
    // A policy grants webhooks only when it says so.
    let policy = ws.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!("[paths]\nroots = [\"{}\"]\n", ws.path().display()),
    )?;
    let hook = "[[listener]]\nname = \"hook\"\nurl = \"https://example.com/\"";
    let file = ws.pipeline("h.toml", &pipeline("h", hook))?;
    let args = [
        "validate",
        file.to_str().context("path")?,
        "--policy",
        policy.to_str().context("path")?,
    ];
    let out = weir(EXE, &cache(), &args)?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("listener.hook.url") && err.contains("webhooks"),
        "{err}"
    );
    std::fs::write(
        &policy,
        format!(
            "[paths]\nroots = [\"{}\"]\n\n[grants]\nwebhooks = true\n",
            ws.path().display()
        ),
    )?;
    let out = weir(EXE, &cache(), &args)?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
