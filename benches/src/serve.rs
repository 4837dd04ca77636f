//! `weir-bench serve`: many tenants' queries in one `weir serve` (issue 16, points 3 and 7).
//!
//! `weir-bench serve noisy [--files F] [--lines L] [--runs R] [--work DIR]`: 10 tenants; 9 run
//! the same query (orders files → the Rust `filter_rows` plugin → JSON files, one file per
//! batch), the 10th is absent (`none`), or runs a plugin that spins until its deadline every
//! batch (`spin`: the hostile plugin's `loop`), or one that grows its memory to its limit every
//! batch (`memory`: `alloc`). Per scenario: each well-behaved tenant's throughput (its rows over
//! the time from its first batch's start to its last batch's end, from its progress records),
//! and the API's latency (GET of a tenant's queries every 20 ms from another thread, p50/p99).
//! The scenarios run one after the other in each round, so the machine's noise hits them alike.
//!
//! `weir-bench serve load [--tenants T] [--per-tenant Q] [--files F] [--lines L] [--work DIR]`:
//! T × Q queries (10 × 10) of the same shape in one server: the server's peak RSS, the API's
//! latency, and each query's throughput against the same query alone in a fresh server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use sha2::Digest;

use crate::flag;

const HOSTILE: &[u8] = include_bytes!(env!("WEIR_PLUGIN_HOSTILE"));

pub fn serve(args: &[String]) -> Result<()> {
    let mode = args.first().map(String::as_str).unwrap_or_default();
    let files: usize = flag(args, "--files").map_or(Ok(20), |v| v.parse())?;
    let lines: usize = flag(args, "--lines").map_or(Ok(10_000), |v| v.parse())?;
    let work = flag(args, "--work").map_or_else(
        || std::env::temp_dir().join("weir-bench-serve"),
        PathBuf::from,
    );
    match mode {
        "noisy" => {
            let runs: usize = flag(args, "--runs").map_or(Ok(3), |v| v.parse())?;
            noisy(&work, files, lines, runs)
        }
        "load" => {
            let tenants: usize = flag(args, "--tenants").map_or(Ok(10), |v| v.parse())?;
            let per: usize = flag(args, "--per-tenant").map_or(Ok(10), |v| v.parse())?;
            load(&work, tenants, per, files, lines)
        }
        _ => bail!("weir-bench serve noisy|load [--files F] [--lines L] ..."),
    }
}

fn token(tenant: &str) -> String {
    format!("token-of-{tenant}")
}

fn sha256_hex(text: &str) -> String {
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// A `weir serve` child of this very binary.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(home: &Path, tenants: &Path, cache: &Path) -> Result<Self> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["cli", "serve", "--listen", "127.0.0.1:0"])
            .arg("--home")
            .arg(home)
            .arg("--tenants")
            .arg(tenants)
            .arg("--cache-dir")
            .arg(cache)
            .env("WEIR_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        let addr = line
            .trim()
            .strip_prefix("weir serve: listening on http://")
            .with_context(|| format!("weir serve said {line:?}"))?
            .to_owned();
        Ok(Self { child, addr })
    }

    /// The server's peak RSS so far (VmHWM), in MB.
    fn peak_rss_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }

    fn json(&self, method: &str, path: &str, tenant: &str, body: &[u8]) -> Result<(u16, Value)> {
        let (status, text) = http(&self.addr, method, path, &token(tenant), body)?;
        let json = serde_json::from_slice(&text).unwrap_or(Value::Null);
        Ok((status, json))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http(addr: &str, method: &str, path: &str, token: &str, body: &[u8]) -> Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(addr)?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no header end")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status")?;
    Ok((status, raw[end + 4..].to_vec()))
}

fn write_tenants(path: &Path, tenants: &[String]) -> Result<()> {
    let mut text = String::new();
    for t in tenants {
        text.push_str(&format!(
            "[[tenant]]\nname = \"{t}\"\ntoken_sha256 = \"{}\"\nmax_queries = 100\nmemory = \"8 GiB\"\n\n",
            sha256_hex(&token(t))
        ));
    }
    std::fs::write(path, text)?;
    Ok(())
}

fn pipeline(name: &str, transform: &str) -> String {
    format!(
        r#"[query]
name = "{name}"
checkpoint = "checkpoints/{name}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{schema}"
max_files_per_trigger = 1
on_malformed = "drop"

{transform}

[sink]
kind = "files"
path = "out/{name}"
format = "json"
"#,
        schema = weir_host::examples::ORDERS_SCHEMA
    )
}

const FILTER: &str = r#"[[transform]]
name = "keep_completed"
plugin = "filter_rows"
config = { column = "status", op = "eq", value = "completed" }
limits = { memory = "32 MiB" }"#;

/// What the 10th tenant runs.
fn hostile(scenario: &str) -> Option<&'static str> {
    match scenario {
        "spin" => Some(
            r#"[[transform]]
name = "spin"
plugin = "hostile"
config = { mode = "loop" }
limits = { timeout = "2s" }"#,
        ),
        "memory" => Some(
            r#"[[transform]]
name = "grow"
plugin = "hostile"
config = { mode = "alloc" }
limits = { memory = "256 MiB" }"#,
        ),
        _ => None,
    }
}

/// Sets up `home/<tenant>` with the orders and the plugins.
fn tenant_home(home: &Path, tenant: &str, orders: &Path) -> Result<()> {
    let dir = home.join(tenant).join("data/orders");
    std::fs::create_dir_all(&dir)?;
    for entry in std::fs::read_dir(orders)? {
        let entry = entry?;
        std::fs::hard_link(entry.path(), dir.join(entry.file_name()))
            .or_else(|_| std::fs::copy(entry.path(), dir.join(entry.file_name())).map(|_| ()))?;
    }
    Ok(())
}

/// A query's rows, throughput, and first batch's start and last batch's end (ms).
fn throughput(server: &Server, tenant: &str, query: &str) -> Result<(u64, f64, i64, i64)> {
    let (status, records) = server.json(
        "GET",
        &format!("/v1/queries/{query}/progress?limit=1000"),
        tenant,
        b"",
    )?;
    ensure!(status == 200, "progress of {tenant}/{query}: {status}");
    let all = records.as_array().context("progress records")?;
    let mut by_batch = std::collections::BTreeMap::new();
    for r in all {
        if let Some(b) = r["batchId"].as_u64() {
            by_batch.insert(b, r.clone());
        }
    }
    let rows: u64 = by_batch
        .values()
        .map(|r| r["numInputRows"].as_u64().unwrap_or(0))
        .sum();
    let ts = |r: &Value| -> Result<i64> {
        let t = r["timestamp"].as_str().context("timestamp")?;
        parse_rfc3339_ms(t)
    };
    let first = by_batch.values().next().context("no batches")?;
    let last = by_batch.values().last().context("no batches")?;
    let start = ts(first)?;
    let end = ts(last)? + last["batchDuration"].as_i64().unwrap_or(0);
    let secs = ((end - start).max(1)) as f64 / 1000.0;
    Ok((rows, rows as f64 / secs, start, end))
}

/// `2024-03-01T00:03:07.123Z` → ms since the epoch.
fn parse_rfc3339_ms(t: &str) -> Result<i64> {
    let num = |s: &str| s.parse::<i64>().with_context(|| format!("{t}: {s}"));
    let (date, time) = t.split_once('T').context("T")?;
    let mut d = date.split('-');
    let (y, m, dd) = (
        num(d.next().context("y")?)?,
        num(d.next().context("m")?)?,
        num(d.next().context("d")?)?,
    );
    let time = time.trim_end_matches('Z');
    let mut p = time.split(':');
    let (hh, mm) = (num(p.next().context("h")?)?, num(p.next().context("m")?)?);
    let sec = p.next().context("s")?;
    let (s, ms) = sec.split_once('.').unwrap_or((sec, "0"));
    // Days from civil (Howard Hinnant).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + dd - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(((days * 24 + hh) * 60 + mm) * 60_000 + num(s)? * 1000 + num(ms)?)
}

/// GETs a tenant's query list every 20 ms until stopped; the latencies in ms.
fn probe_api(addr: String, tenants: Vec<String>, stop: Arc<AtomicBool>) -> Arc<Mutex<Vec<f64>>> {
    let out = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&out);
    std::thread::spawn(move || {
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let tenant = &tenants[i % tenants.len()];
            i += 1;
            let started = Instant::now();
            if http(&addr, "GET", "/v1/queries", &token(tenant), b"").is_ok() {
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                kept.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(ms);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    out
}

fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

fn median(values: &[f64]) -> f64 {
    percentile(values, 50.0)
}

fn upload(server: &Server, tenant: &str, name: &str, bytes: &[u8]) -> Result<()> {
    let (status, reply) = server.json("PUT", &format!("/v1/plugins/{name}"), tenant, bytes)?;
    ensure!(status == 200, "upload {tenant}/{name}: {status} {reply}");
    Ok(())
}

fn create(server: &Server, tenant: &str, name: &str, text: &str) -> Result<()> {
    let (status, reply) = server.json(
        "PUT",
        &format!("/v1/queries/{name}"),
        tenant,
        text.as_bytes(),
    )?;
    ensure!(status == 201, "create {tenant}/{name}: {status} {reply}");
    Ok(())
}

fn wait_stopped(server: &Server, tenant: &str, name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let (_, q) = server.json("GET", &format!("/v1/queries/{name}"), tenant, b"")?;
        match q["status"].as_str() {
            Some("stopped") => return Ok(()),
            Some("failed") => bail!("{tenant}/{name} failed: {}", q["error"]),
            _ => {}
        }
        ensure!(Instant::now() < deadline, "{tenant}/{name} never finished");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Outcome {
    /// Each well-behaved query's rows per second.
    throughputs: Vec<f64>,
    /// All well-behaved queries' rows over the time from the first one's first batch to the
    /// last one's last.
    aggregate: f64,
    api_ms: Vec<f64>,
    peak_rss_mb: f64,
    rows: u64,
}

/// One server: `good` tenants × `per` queries of the filter, and (maybe) one hostile tenant.
fn round(
    work: &Path,
    orders: &Path,
    good: &[String],
    per: usize,
    scenario: &str,
) -> Result<Outcome> {
    let dir = work.join(format!("round-{scenario}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    let home = dir.join("home");
    let mut tenants = good.to_vec();
    let bad = "hostile".to_owned();
    if hostile(scenario).is_some() {
        tenants.push(bad.clone());
    }
    for t in &tenants {
        tenant_home(&home, t, orders)?;
    }
    write_tenants(&dir.join("tenants.toml"), &tenants)?;
    let server = Server::start(&home, &dir.join("tenants.toml"), &work.join("cache"))?;
    let filter = weir_host::examples::FILTER_ROWS_WASM;
    for t in good {
        upload(&server, t, "filter_rows", filter)?;
    }
    if let Some(transform) = hostile(scenario) {
        upload(&server, &bad, "hostile", HOSTILE)?;
        // Its own trigger keeps it coming back: a processing-time query whose every batch
        // misbehaves, started again by the host after each failure.
        let text =
            pipeline("noise", transform).replace("\"available-now\"", "\"100 milliseconds\"");
        create(&server, &bad, "noise", &text)?;
        // Measured in its steady state: once it has failed on its limit (and backs off).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, q) = server.json("GET", "/v1/queries/noise", &bad, b"")?;
            if q["failures_in_a_row"].as_u64() >= Some(1) {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "the hostile query never failed: {q}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let api = probe_api(server.addr.clone(), tenants.clone(), Arc::clone(&stop));
    for t in good {
        for q in 0..per {
            create(
                &server,
                t,
                &format!("q{q}"),
                &pipeline(&format!("q{q}"), FILTER),
            )?;
        }
    }
    for t in good {
        for q in 0..per {
            wait_stopped(&server, t, &format!("q{q}"))?;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut throughputs = Vec::new();
    let mut rows = 0;
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    for t in good {
        for q in 0..per {
            let (r, tp, start, end) = throughput(&server, t, &format!("q{q}"))?;
            rows += r;
            throughputs.push(tp);
            first = first.min(start);
            last = last.max(end);
        }
    }
    let aggregate = rows as f64 / ((last - first).max(1) as f64 / 1000.0);
    std::thread::sleep(Duration::from_millis(50));
    let api_ms = api
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    Ok(Outcome {
        throughputs,
        aggregate,
        api_ms,
        peak_rss_mb: server.peak_rss_mb(),
        rows,
    })
}

fn orders(work: &Path, files: usize, lines: usize) -> Result<PathBuf> {
    let dir = work.join(format!("orders-{files}x{lines}"));
    if !dir.exists() {
        weir_host::examples::write_orders(
            &dir,
            weir_host::examples::OrdersSpec {
                files,
                lines_per_file: lines,
                seed: 42,
                malformed_every: 100,
            },
        )?;
    }
    Ok(dir)
}

fn noisy(work: &Path, files: usize, lines: usize, runs: usize) -> Result<()> {
    std::fs::create_dir_all(work)?;
    let orders = orders(work, files, lines)?;
    let good: Vec<String> = (0..9).map(|i| format!("t{i}")).collect();
    let scenarios = ["none", "spin", "memory"];
    let mut tp: Vec<Vec<f64>> = vec![Vec::new(); scenarios.len()];
    let mut api: Vec<Vec<f64>> = vec![Vec::new(); scenarios.len()];
    for run in 0..runs {
        for (i, s) in scenarios.iter().enumerate() {
            let o = round(work, &orders, &good, 1, s)?;
            let m = median(&o.throughputs);
            println!(
                "run {} {s:>6}: {} rows, {:.0} rows/s in all, median per-tenant {:.0} rows/s (min {:.0}), API p50 {:.1} ms p99 {:.1} ms ({} calls), RSS {:.0} MB",
                run + 1,
                o.rows,
                o.aggregate,
                m,
                o.throughputs.iter().copied().fold(f64::INFINITY, f64::min),
                percentile(&o.api_ms, 50.0),
                percentile(&o.api_ms, 99.0),
                o.api_ms.len(),
                o.peak_rss_mb
            );
            tp[i].push(o.aggregate);
            api[i].extend(o.api_ms);
        }
    }
    println!(
        "\n| scenario | the 9 tenants' rows/s in all (median of runs) | vs none | API p50 ms | API p99 ms |"
    );
    println!("|---|---|---|---|---|");
    let base = median(&tp[0]);
    for (i, s) in scenarios.iter().enumerate() {
        let m = median(&tp[i]);
        println!(
            "| {s} | {m:.0} | {:+.1} % | {:.1} | {:.1} |",
            (m / base - 1.0) * 100.0,
            percentile(&api[i], 50.0),
            percentile(&api[i], 99.0)
        );
    }
    Ok(())
}

fn load(work: &Path, tenants: usize, per: usize, files: usize, lines: usize) -> Result<()> {
    std::fs::create_dir_all(work)?;
    let orders = orders(work, files, lines)?;
    let alone = round(work, &orders, &["solo".to_owned()], 1, "alone")?;
    let alone_tp = alone.throughputs[0];
    println!(
        "alone: {} rows, {:.0} rows/s, RSS {:.0} MB",
        alone.rows, alone_tp, alone.peak_rss_mb
    );
    let names: Vec<String> = (0..tenants).map(|i| format!("t{i}")).collect();
    let started = Instant::now();
    let all = round(work, &orders, &names, per, "load")?;
    let wall = started.elapsed().as_secs_f64();
    let m = median(&all.throughputs);
    let sum: f64 = all.rows as f64 / wall;
    println!(
        "\n| queries | rows | wall s | server peak RSS MB | per-query rows/s (median, min, max) | vs alone | all queries' rows/s | API p50 / p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {wall:.1} | {:.0} | {m:.0}, {:.0}, {:.0} | {:.3} | {sum:.0} ({:.2}× alone) | {:.1} / {:.1} |",
        tenants * per,
        all.rows,
        all.peak_rss_mb,
        all.throughputs
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min),
        all.throughputs.iter().copied().fold(0.0, f64::max),
        m / alone_tp,
        sum / alone_tp,
        percentile(&all.api_ms, 50.0),
        percentile(&all.api_ms, 99.0)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_timestamps() {
        assert_eq!(
            super::parse_rfc3339_ms("2024-03-01T00:03:07.123Z").unwrap(),
            1_709_251_387_123
        );
    }
}
