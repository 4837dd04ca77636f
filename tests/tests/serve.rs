//! `weir serve` through its HTTP API, as a tenant's client sees it: bearer tokens, a tenant's
//! plugins and queries invisible to another, paths that leave the tenant's folder refused,
//! quotas named, a new plugin build taken between batches (and a bad one refused with the old
//! one kept), stop, start and delete, Prometheus metrics read with a real text-format parser,
//! and a server killed with SIGKILL whose restart resumes every query to exactly the rows of an
//! uninterrupted run. `weir run --metrics` serves the same figures for one query.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use weir_tests::serve::{
    ACME, FILTER, OPERATOR, SQL, Server, ZETA, batches, http, pipeline, plugin, problem_keys, sha,
    tenants_file, write_orders,
};
use weir_tests::sorted_output;

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn start(home: &std::path::Path, tenants: &std::path::Path) -> Result<Server> {
    Server::start(EXE, &cache(), home, tenants)
}

#[test]
fn the_api_keeps_tenants_apart_and_runs_their_queries() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    let tenants = tenants_file(dir.path(), "max_queries = 2\nmemory = \"300 MiB\"")?;
    write_orders(&home.join("acme/data/orders"), 3)?;
    let server = start(&home, &tenants)?;

    // Tokens.
    let none = server.call("GET", "/v1/queries", None, b"")?;
    ensure!(none.status == 401, "no token: {}", none.status);
    ensure!(
        none.headers
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer")
    );
    let wrong = server.call("GET", "/v1/queries", Some("acme-token-2"), b"")?;
    ensure!(wrong.status == 401, "a wrong token: {}", wrong.status);
    let op = server.call("GET", "/v1/queries", Some(OPERATOR), b"")?;
    ensure!(
        op.status == 403,
        "the operator acts for no tenant: {}",
        op.status
    );

    // Plugins: stored with their digest; not a component, or too large, refused.
    let filter = plugin("filter_rows");
    let (status, up) = server.json("PUT", "/v1/plugins/filter_rows", ACME, filter)?;
    ensure!(
        status == 200 && up["sha256"] == sha(filter),
        "upload: {status} {up}"
    );
    let (status, bad) = server.json("PUT", "/v1/plugins/junk", ACME, b"not a component")?;
    ensure!(status == 400, "junk upload: {status} {bad}");
    ensure!(
        bad["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not a WebAssembly component")
    );
    let big = vec![0u8; 5 << 20];
    let too_big = server.call("PUT", "/v1/plugins/big", Some(ACME), &big)?;
    ensure!(
        too_big.status == 413,
        "an upload over --max-upload: {}",
        too_big.status
    );
    let (_, zeta_plugins) = server.json("GET", "/v1/plugins", ZETA, b"")?;
    ensure!(
        zeta_plugins == serde_json::json!([]),
        "zeta sees {zeta_plugins}"
    );

    // A query: created, running, its batches visible to its tenant only.
    let orders = pipeline("orders", FILTER, "");
    let (status, created) = server.json("PUT", "/v1/queries/orders", ACME, orders.as_bytes())?;
    ensure!(status == 201, "create: {status} {created}");
    let q = server.wait_for("orders", ACME, |q| batches(q) >= 3)?;
    ensure!(q["status"] == "running", "{q}");
    let built: Vec<&Value> = q["batches"]
        .as_array()
        .context("batches")?
        .iter()
        .flat_map(|b| b["plugins"].as_array().into_iter().flatten())
        .map(|p| &p["sha256"])
        .collect();
    ensure!(
        !built.is_empty() && built.iter().all(|s| **s == sha(filter)),
        "{q}"
    );
    let hidden = server.call("GET", "/v1/queries/orders", Some(ZETA), b"")?;
    ensure!(
        hidden.status == 404,
        "zeta reading acme's query: {}",
        hidden.status
    );
    let hidden = server.call("POST", "/v1/queries/orders/stop", Some(ZETA), b"")?;
    ensure!(
        hidden.status == 404,
        "zeta stopping acme's query: {}",
        hidden.status
    );
    let (_, progress) = server.json("GET", "/v1/queries/orders/progress?after=0", ACME, b"")?;
    let ids: Vec<u64> = progress
        .as_array()
        .context("progress")?
        .iter()
        .filter_map(|p| p["batchId"].as_u64())
        .collect();
    ensure!(ids.len() >= 2 && ids[0] == 1, "progress after 0: {ids:?}");

    // Every problem of the pipeline, with its key; paths that leave the tenant's folder.
    let broken =
        pipeline("broken", FILTER, "bogus = 1").replace("json\"\nschema", "yaml\"\nschema");
    let (status, reply) = server.json("PUT", "/v1/queries/broken", ACME, broken.as_bytes())?;
    ensure!(status == 400, "a broken pipeline: {status} {reply}");
    ensure!(problem_keys(&reply).len() >= 2, "every problem: {reply}");
    std::os::unix::fs::symlink(dir.path(), home.join("acme/outside"))?;
    let escapes = [
        ("checkpoint", pipeline("esc", SQL, "").replace("\"checkpoints/esc\"", "\"../zeta/cp\"")),
        ("sink", pipeline("esc", SQL, "").replace("\"out/esc\"", "\"outside/out\"")),
        (
            "table",
            pipeline("esc", SQL, "").replace(
                "[sink]",
                "[[table]]\nname = \"customers\"\nkind = \"files\"\npath = \"/etc\"\nformat = \"json\"\nschema = \"customer_id BIGINT\"\n\n[join]\nleft = \"orders\"\nright = \"customers\"\ntype = \"left\"\non = [\"customer_id\"]\n\n[sink]",
            ),
        ),
    ];
    for (what, text) in escapes {
        let (status, reply) = server.json("PUT", "/v1/queries/esc", ACME, text.as_bytes())?;
        ensure!(status == 400, "{what} outside the folder: {status} {reply}");
        let keys = problem_keys(&reply);
        let want = match what {
            "checkpoint" => "query.checkpoint",
            "sink" => "sink.path",
            _ => "table.customers.path",
        };
        ensure!(keys.iter().any(|k| k == want), "{what}: {reply}");
    }
    let (status, reply) = server.json(
        "POST",
        "/v1/queries/esc/validate",
        ACME,
        pipeline("esc", SQL, "").as_bytes(),
    )?;
    ensure!(
        status == 200 && reply["ok"] == true,
        "validate: {status} {reply}"
    );

    // Quotas: the plugins' memory (256 MiB each by default, 300 MiB allowed), the count.
    let (status, reply) = server.json(
        "PUT",
        "/v1/queries/second",
        ACME,
        pipeline("second", FILTER, "").as_bytes(),
    )?;
    ensure!(
        status == 403 && reply["quota"] == "memory",
        "memory quota: {status} {reply}"
    );
    let (status, reply) = server.json(
        "PUT",
        "/v1/queries/second",
        ACME,
        pipeline("second", SQL, "").as_bytes(),
    )?;
    ensure!(status == 201, "a second query: {status} {reply}");
    // The tenant's ceilings on a plugin's limits (max_timeout defaults to 30 s).
    let slow = FILTER.replace(
        "value = \"completed\" }",
        "value = \"completed\" }\nlimits = { timeout = \"10m\" }",
    );
    let (status, reply) = server.json(
        "PUT",
        "/v1/queries/slow",
        ACME,
        pipeline("slow", &slow, "").as_bytes(),
    )?;
    ensure!(
        status == 400,
        "a timeout over the ceiling: {status} {reply}"
    );
    ensure!(
        problem_keys(&reply)
            .iter()
            .any(|k| k == "transform[0].limits.timeout"),
        "{reply}"
    );
    // More decoding threads than the tenant's max_threads (default 1) are refused.
    let (status, reply) = server.json(
        "PUT",
        "/v1/queries/wide",
        ACME,
        pipeline("wide", SQL, "")
            .replacen("[query]\n", "[query]\nthreads = 2\n", 1)
            .as_bytes(),
    )?;
    ensure!(status == 400, "threads over the ceiling: {status} {reply}");
    ensure!(
        problem_keys(&reply).iter().any(|k| k == "query.threads"),
        "{reply}"
    );
    ensure!(
        reply.to_string().contains("tenant acme"),
        "names the tenant: {reply}"
    );
    let (status, reply) = server.json(
        "PUT",
        "/v1/queries/third",
        ACME,
        pipeline("third", SQL, "").as_bytes(),
    )?;
    ensure!(
        status == 403 && reply["quota"] == "max_queries",
        "query quota: {status} {reply}"
    );

    // A build the query refuses (a sink, not a transform): the old one keeps running and stays.
    let (status, reply) =
        server.json("PUT", "/v1/plugins/filter_rows", ACME, plugin("jsonl_sink"))?;
    ensure!(status == 422, "a refused build: {status} {reply}");
    let on_disk = std::fs::read(home.join("acme/plugins/filter_rows.wasm"))?;
    ensure!(on_disk == filter, "the refused build was not put back");
    // A new build (the same code with a custom section): taken between batches.
    let mut rebuilt = filter.to_vec();
    rebuilt.extend_from_slice(&[0, 6, 5, b'b', b'u', b'i', b'l', b'd']);
    let (status, reply) = server.json("PUT", "/v1/plugins/filter_rows", ACME, &rebuilt)?;
    ensure!(status == 200, "a new build: {status} {reply}");
    ensure!(reply["queries"][0]["outcome"] == "replaced", "{reply}");
    write_orders(&home.join("acme/data/orders2"), 1)?;
    std::fs::rename(
        home.join("acme/data/orders2/orders-00000.json"),
        home.join("acme/data/orders/orders-99999.json"),
    )?;
    let q = server.wait_for("orders", ACME, |q| batches(q) >= 4)?;
    let last = q["batches"].as_array().context("batches")?.last().cloned();
    ensure!(
        last.as_ref()
            .is_some_and(|b| b["plugins"][0]["sha256"] == sha(&rebuilt)),
        "the last batch ran the new build: {q}"
    );

    // Metrics, per tenant, read with a Prometheus parser.
    let text = server.call("GET", "/metrics", Some(ACME), b"")?;
    ensure!(text.status == 200, "metrics: {}", text.status);
    let scrape = prometheus_parse::Scrape::parse(text.body.lines().map(|l| Ok(l.to_owned())))?;
    let sample = |metric: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && s.labels.get("query") == Some("orders"))
    };
    let batches_run = match sample("weir_batches_total").map(|s| &s.value) {
        Some(prometheus_parse::Value::Counter(v)) => *v,
        other => bail!("weir_batches_total: {other:?}\n{}", text.body),
    };
    ensure!(batches_run >= 4.0, "batches: {batches_run}");
    for metric in [
        "weir_input_rows_total",
        "weir_input_rows_per_second",
        "weir_processed_rows_per_second",
        "weir_add_batch_seconds",
        "weir_malformed_rows_total",
        "weir_plugin_calls_total",
        "weir_plugin_memory_peak_bytes",
    ] {
        ensure!(sample(metric).is_some(), "no {metric}:\n{}", text.body);
    }
    ensure!(
        matches!(
            sample("weir_batch_duration_seconds").map(|s| &s.value),
            Some(prometheus_parse::Value::Histogram(_))
        ),
        "the batch duration is a histogram"
    );
    ensure!(
        scrape
            .samples
            .iter()
            .all(|s| s.labels.get("tenant") == Some("acme"))
    );
    let zeta = server.call("GET", "/metrics", Some(ZETA), b"")?;
    ensure!(!zeta.body.contains("acme"), "zeta sees acme's metrics");
    let all = server.call("GET", "/metrics", Some(OPERATOR), b"")?;
    ensure!(
        all.body.contains(r#"tenant="acme""#),
        "the operator sees every tenant"
    );

    // Stop, start, delete.
    let (status, reply) = server.json("POST", "/v1/queries/orders/stop", ACME, b"")?;
    ensure!(
        status == 200 && reply["status"] == "stopped",
        "stop: {status} {reply}"
    );
    let (status, reply) = server.json("POST", "/v1/queries/orders/start", ACME, b"")?;
    ensure!(
        status == 200 && reply["status"] == "running",
        "start: {status} {reply}"
    );
    let checkpoint = home.join("acme/checkpoints/orders");
    ensure!(checkpoint.join("commits").is_dir());
    let (status, reply) = server.json("DELETE", "/v1/queries/orders", ACME, b"")?;
    ensure!(status == 200, "delete: {status} {reply}");
    ensure!(!checkpoint.exists(), "the checkpoint is gone");
    let gone = server.call("GET", "/v1/queries/orders", Some(ACME), b"")?;
    ensure!(gone.status == 404, "a deleted query: {}", gone.status);
    Ok(())
}

#[test]
fn a_killed_server_resumes_its_queries_to_the_same_rows() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    let tenants = tenants_file(dir.path(), "")?;
    write_orders(&home.join("acme/data/orders"), 6)?;
    write_orders(&home.join("zeta/data/orders"), 6)?;

    let server = start(&home, &tenants)?;
    let (status, _) = server.json(
        "PUT",
        "/v1/plugins/filter_rows",
        ACME,
        plugin("filter_rows"),
    )?;
    ensure!(status == 200);
    for (token, transform) in [(ACME, FILTER), (ZETA, SQL)] {
        let text = pipeline("orders", transform, "");
        let (status, reply) = server.json("PUT", "/v1/queries/orders", token, text.as_bytes())?;
        ensure!(status == 201, "create: {status} {reply}");
    }
    server.wait_for("orders", ACME, |q| batches(q) >= 2)?;
    server.kill()?;

    let server = start(&home, &tenants)?;
    for token in [ACME, ZETA] {
        server.wait_for("orders", token, |q| batches(q) >= 6)?;
    }
    // The same rows as one uninterrupted `weir run` of the same pipeline.
    let reference = dir.path().join("reference");
    write_orders(&reference.join("data/orders"), 6)?;
    let text = pipeline("orders", SQL, "").replace("\"50 milliseconds\"", "\"available-now\"");
    std::fs::write(reference.join("p.toml"), text)?;
    let out = weir_tests::run_ok(EXE, &cache(), &reference.join("p.toml"), &[])?;
    ensure!(out.status.success());
    let want = sorted_output(&reference.join("out/orders"))?;
    ensure!(!want.is_empty());
    for tenant in ["acme", "zeta"] {
        let got = sorted_output(&home.join(tenant).join("out/orders"))?;
        ensure!(
            got == want,
            "{tenant}: {} rows after the restart, {} uninterrupted",
            got.len(),
            want.len()
        );
    }
    Ok(())
}

#[test]
fn weir_run_serves_its_metrics() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_orders(&dir.path().join("data/orders"), 2)?;
    std::fs::write(dir.path().join("p.toml"), pipeline("solo", SQL, ""))?;
    let mut child = Command::new(EXE)
        .arg("run")
        .arg(dir.path().join("p.toml"))
        .args(["--metrics", "127.0.0.1:0", "--cache-dir"])
        .arg(cache())
        .env_remove("WEIR_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let result = (|| -> Result<()> {
        let url = line
            .trim()
            .strip_prefix("weir run: metrics on http://")
            .with_context(|| format!("weir run said {line:?}"))?;
        let addr = url.strip_suffix("/metrics").context("a /metrics URL")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let reply = http(addr, "GET", "/metrics", None, b"")?;
            let scrape =
                prometheus_parse::Scrape::parse(reply.body.lines().map(|l| Ok(l.to_owned())))?;
            let done = scrape.samples.iter().any(|s| {
                s.metric == "weir_batches_total"
                    && s.labels.get("query") == Some("solo")
                    && matches!(s.value, prometheus_parse::Value::Counter(v) if v >= 2.0)
            });
            if done {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "no batches in:\n{}", reply.body);
            std::thread::sleep(Duration::from_millis(50));
        }
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

#[test]
fn a_failing_query_backs_off_and_starts_again_by_itself() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    let tenants = tenants_file(dir.path(), "")?;
    write_orders(&home.join("acme/data/orders"), 2)?;
    let server = start(&home, &tenants)?;
    let (status, _) = server.json("PUT", "/v1/plugins/hostile", ACME, weir_tests::HOSTILE_WASM)?;
    ensure!(status == 200);
    let failing = r#"[[transform]]
name = "refuse"
plugin = "hostile"
config = { mode = "error" }"#;
    let text = pipeline("bad", failing, "");
    let (status, reply) = server.json("PUT", "/v1/queries/bad", ACME, text.as_bytes())?;
    ensure!(status == 201, "create: {status} {reply}");
    let q = server.wait_for_status("bad", ACME, |q| q["failures_in_a_row"].as_u64() >= Some(1))?;
    ensure!(
        q["error"]
            .as_str()
            .unwrap_or_default()
            .contains("refusing this batch"),
        "{q}"
    );
    // Starting it again at once is refused while it backs off...
    let (status, reply) = server.json("POST", "/v1/queries/bad/start", ACME, b"")?;
    ensure!(
        status == 429 && reply["retry_after_seconds"].as_u64() >= Some(1),
        "{status} {reply}"
    );
    // ...and the host starts it again by itself, later and later.
    let q = server.wait_for_status("bad", ACME, |q| q["failures_in_a_row"].as_u64() >= Some(2))?;
    ensure!(q["status"] == "failed" || q["status"] == "running", "{q}");
    // A stopped query stays stopped.
    let (status, reply) = server.json("POST", "/v1/queries/bad/stop", ACME, b"")?;
    ensure!(
        status == 200 && reply["status"] != "running",
        "{status} {reply}"
    );
    std::thread::sleep(Duration::from_secs(3));
    let (_, q) = server.json("GET", "/v1/queries/bad", ACME, b"")?;
    ensure!(
        q["failures_in_a_row"].as_u64() <= Some(3) && q["status"] != "running",
        "{q}"
    );
    Ok(())
}
