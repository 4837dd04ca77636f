//! The command line: validation lists every problem at once; the demo runs.

use std::path::PathBuf;

use anyhow::Result;
use weir_tests::{Workspace, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

const BAD: &str = r#"
[query]
name = "bad"
checkpoint = "checkpoints/bad"
trigger = "whenever"
colour = "blue"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "order_id BIGINT, amount DECIMAL(50,2)"
max_files_per_trigger = 0

[sink]
kind = "files"
path = "out"
format = "xlsx"
"#;

#[test]
fn validate_and_run_list_every_problem_with_its_key() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    let file = ws.pipeline("bad.toml", BAD)?;
    for command in ["validate", "run"] {
        let out = weir(EXE, &cache(), &[command, file.to_str().unwrap_or_default()])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        for key in [
            "query.trigger",
            "query.colour",
            "source.orders.schema",
            "source.orders.max_files_per_trigger",
            "sink.format",
        ] {
            assert!(
                stderr.contains(key),
                "{command}: {key} missing from:\n{stderr}"
            );
        }
        assert!(
            !ws.path().join("checkpoints/bad").exists(),
            "nothing may run"
        );
    }
    Ok(())
}

#[test]
fn set_overrides_a_key() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    let file = ws.pipeline("bad.toml", BAD)?;
    let out = weir(
        EXE,
        &cache(),
        &[
            "validate",
            file.to_str().unwrap_or_default(),
            "--set",
            "query.trigger=once",
        ],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("query.trigger"), "{stderr}");
    assert!(stderr.contains("sink.format"), "{stderr}");
    Ok(())
}

#[test]
fn the_demo_runs_end_to_end() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out = weir(
        EXE,
        &cache(),
        &[
            "demo",
            "--dir",
            dir.path().to_str().unwrap_or_default(),
            "--files",
            "3",
            "--lines",
            "300",
        ],
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("result:"), "{stdout}");
    // One progress line per batch on stderr, and records in the checkpoint.
    assert_eq!(stderr.matches("rows in").count(), 3, "{stderr}");
    let progress = weir_tests::progress(&dir.path().join("checkpoints/demo"))?;
    assert_eq!(progress.len(), 3);
    // Spark's StreamingQueryProgress field names, so its dashboards read ours.
    let mut input_rows = 0;
    for (i, p) in progress.iter().enumerate() {
        for key in [
            "id",
            "runId",
            "name",
            "timestamp",
            "batchId",
            "numInputRows",
            "inputRowsPerSecond",
            "processedRowsPerSecond",
        ] {
            assert!(!p[key].is_null(), "{key} missing in {p}");
        }
        for key in ["getBatch", "walCommit", "addBatch", "triggerExecution"] {
            assert!(
                p["durationMs"][key].is_u64(),
                "durationMs.{key} missing in {p}"
            );
        }
        assert_eq!(p["batchId"], i as u64);
        assert_eq!(p["name"], "demo");
        let source = &p["sources"][0];
        assert_eq!(source["endOffset"]["logOffset"], i as u64);
        assert_eq!(source["numInputRows"], p["numInputRows"]);
        assert!(p["sink"]["numOutputRows"].is_u64());
        assert_eq!(
            p["plugins"].as_array().map(Vec::len),
            Some(3),
            "two transforms and the sink"
        );
        input_rows += p["numInputRows"].as_u64().unwrap_or(0);
    }
    assert_eq!(input_rows, 900);
    let rows = std::fs::read_to_string(dir.path().join("out/completed_orders.jsonl"))?
        .lines()
        .count();
    assert!(rows > 0);
    Ok(())
}

/// A stateful pipeline over the sample orders: `stateful` is the
/// `[aggregate]` or `[deduplicate]` table, `watermark` the `[watermark]`
/// table or nothing.
fn stateful(tag: &str, mode: &str, watermark: &str, stateful: &str) -> String {
    format!(
        r#"
[query]
name = "{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"
output_mode = "{mode}"
state_store = "memory"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{schema}"
on_malformed = "drop"

{watermark}

{stateful}

[sink]
kind = "console"
"#,
        schema = weir_tests::SCHEMA
    )
}

const WATERMARK: &str = "[watermark]\ncolumn = \"occurred_at\"\ndelay = \"10 minutes\"";
const REVENUE: &str = "[aggregate]\nwindow = { column = \"occurred_at\", size = \"5 minutes\" }\ngroup_by = [\"status\"]\nselect = [\"sum(amount) AS revenue\"]";
const SESSIONS: &str = "[aggregate]\nwindow = { column = \"occurred_at\", gap = \"5 minutes\" }\ngroup_by = [\"customer_id\"]\nselect = [\"count(*) AS orders\"]";

#[test]
fn validate_refuses_the_stateful_combinations_run_refuses() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    let cases = [
        (
            stateful("a", "append", "", REVENUE),
            "query.output_mode: \"append\" needs a [watermark]",
        ),
        (
            stateful("b", "update", WATERMARK, SESSIONS),
            "aggregate.window.gap: session windows do not support output_mode = \"update\"",
        ),
        (
            stateful(
                "c",
                "complete",
                WATERMARK,
                "[deduplicate]\nkeys = [\"order_id\"]",
            ),
            "query.output_mode: \"complete\" needs an [aggregate]",
        ),
        (
            stateful(
                "d",
                "append",
                "",
                "[deduplicate]\nkeys = [\"order_id\"]\nwithin_watermark = true",
            ),
            "deduplicate.within_watermark: dropDuplicatesWithinWatermark needs a [watermark]",
        ),
        (
            stateful("e", "complete", "", ""),
            "query.output_mode: \"complete\" is only for queries with an [aggregate]",
        ),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let file = ws.pipeline(&format!("case{i}.toml"), text)?;
        for command in ["validate", "run"] {
            let out = weir(EXE, &cache(), &[command, file.to_str().unwrap_or_default()])?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command} case {i}: {stderr}");
            assert!(
                stderr.contains(expected),
                "{command} case {i}: {expected} missing from:\n{stderr}"
            );
        }
    }
    assert!(
        !ws.path().join("checkpoints").exists(),
        "no checkpoint was opened"
    );

    // Together with the other problems of the file, each with its key.
    let text = stateful("f", "update", WATERMARK, SESSIONS).replace("available-now", "whenever");
    let file = ws.pipeline("both.toml", &text)?;
    let out = weir(
        EXE,
        &cache(),
        &["validate", file.to_str().unwrap_or_default()],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("2 problem(s)"), "{stderr}");
    assert!(stderr.contains("query.trigger"), "{stderr}");
    assert!(stderr.contains("aggregate.window.gap"), "{stderr}");
    Ok(())
}

#[test]
fn validate_and_run_warn_when_state_can_only_grow() -> Result<()> {
    let ws = Workspace::new(2, 10)?;
    let cases = [
        (
            stateful("complete", "complete", WATERMARK, REVENUE),
            Some("\"complete\" keeps every group"),
        ),
        (
            stateful("nowm", "update", "", REVENUE),
            Some("the aggregation has no [watermark]"),
        ),
        (
            stateful(
                "by_order",
                "append",
                WATERMARK,
                "[deduplicate]\nkeys = [\"order_id\"]",
            ),
            Some("the deduplication keys do not include the watermarked event-time column"),
        ),
        (stateful("bounded", "append", WATERMARK, REVENUE), None),
        (
            stateful(
                "keyed",
                "append",
                WATERMARK,
                "[deduplicate]\nkeys = [\"order_id\", \"occurred_at\"]",
            ),
            None,
        ),
        (
            stateful(
                "within",
                "append",
                WATERMARK,
                "[deduplicate]\nkeys = [\"order_id\"]\nwithin_watermark = true",
            ),
            None,
        ),
    ];
    for (text, warning) in cases {
        let file = ws.pipeline("w.toml", &text)?;
        let path = file.to_str().unwrap_or_default();
        let out = weir(EXE, &cache(), &["validate", path])?;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{stderr}");
        match warning {
            Some(w) => {
                assert!(
                    stderr.contains("warning: ") && stderr.contains(w),
                    "{w} missing from:\n{stderr}"
                );
                assert!(stdout.contains("1 warning(s)"), "{stdout}");
            }
            None => {
                assert!(!stderr.contains("warning"), "{stderr}");
                assert!(stdout.contains("0 warning(s)"), "{stdout}");
            }
        }
        // `weir run` logs the same warning before it runs the query.
        let out = weir(EXE, &cache(), &["run", path])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        match warning {
            Some(w) => assert!(stderr.contains(w), "run: {w} missing from:\n{stderr}"),
            None => assert!(!stderr.contains("grows without bound"), "{stderr}"),
        }
    }
    Ok(())
}

#[test]
fn checkpoint_inspect_reads_the_logs_through_the_checkpoint() -> Result<()> {
    let ws = Workspace::new(3, 50)?;
    let file = ws.pipeline(
        "inspect.toml",
        &weir_tests::orders_pipeline("inspect", "drop", &weir_tests::files_sink("inspect")),
    )?;
    weir_tests::run_ok(EXE, &cache(), &file, &[])?;
    let checkpoint = ws.path().join("checkpoints/inspect");
    let dir = checkpoint.to_str().unwrap_or_default();
    let out = weir(EXE, &cache(), &["checkpoint", "inspect", dir])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    // Three files, one a batch: batches 0..=2 planned and committed.
    assert!(
        stdout.contains("offsets: 3 entries (0..=2); latest 2: {"),
        "{stdout}"
    );
    assert!(
        stdout.contains("commits: 3 entries (0..=2); latest 2: {"),
        "{stdout}"
    );
    let id = weir_host::checkpoint::CheckpointReader::open(&checkpoint)?
        .metadata()
        .map(|m| m.id.clone())
        .unwrap_or_default();
    assert!(!id.is_empty() && stdout.contains(&id), "{stdout}");
    assert!(stdout.contains("last progress: {"), "{stdout}");
    assert!(stdout.contains("\"batchId\":2"), "{stdout}");

    // A damaged entry is named, and nothing else is printed.
    std::fs::write(checkpoint.join("commits/2"), "v1\n{\"nextBatchWat")?;
    let out = weir(EXE, &cache(), &["checkpoint", "inspect", dir])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("commits/2"), "{stderr}");
    Ok(())
}

/// A sink section for the policy tests: the jsonl sink with a folder, a variable and an address.
fn granted_sink(dir: &str) -> String {
    format!(
        r#"[sink]
kind = "plugin"
name = "jsonl_sink"
plugin = "plugins/jsonl_sink.wasm"
config = {{ path = "/out/orders.jsonl" }}
capabilities = {{ dirs = [ {{ host = "{dir}", guest = "/out", writable = true }} ], env = ["HOME"], http = ["127.0.0.1:8080"] }}
"#
    )
}

#[test]
fn the_operators_policy_confines_paths_grants_and_limits_in_validate_and_run() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    std::fs::create_dir_all(ws.path().join("out/policy"))?;
    let policy = ws.pipeline(
        "tight-policy.toml",
        r#"
[paths]
roots = ["data"]
[grants]
env = ["WEIR_REGION"]
private_networks = false
[limits]
memory = "32 MiB"
timeout = "10s"
fuel = 1000000
"#,
    )?;
    let text = weir_tests::orders_pipeline("policy", "drop", &granted_sink("out/policy"));
    let file = ws.pipeline("policy.toml", &text)?;
    let root = std::fs::canonicalize(ws.path())?;
    let data = root.join("data");
    for command in ["validate", "run"] {
        let out = weir(
            EXE,
            &cache(),
            &[
                command,
                file.to_str().unwrap_or_default(),
                "--policy",
                policy.to_str().unwrap_or_default(),
            ],
        )?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        let by = format!("the operator's policy ({})", policy.display());
        for expected in [
            format!(
                "query.checkpoint: {} is outside the folders {by} allows: {}",
                root.join("checkpoints/policy").display(),
                data.display()
            ),
            format!(
                "transform[0].plugin: {} is outside",
                root.join("plugins/normalize_status.wasm").display()
            ),
            format!(
                "transform[1].limits.memory: 256 MiB is over the ceiling of 32 MiB that {by} sets"
            ),
            format!("transform[0].limits.timeout: 30s is over the ceiling of 10s that {by} sets"),
            format!(
                "sink.limits.fuel: {by} meters every plugin: set limits.fuel to at most 1000000"
            ),
            format!(
                "sink.capabilities.dirs[0].host: {} is outside",
                root.join("out/policy").display()
            ),
            format!(
                "sink.capabilities.env[0]: \"HOME\" may not be granted: {by} allows only WEIR_REGION"
            ),
            format!(
                "sink.capabilities.http[0]: 127.0.0.1 is a loopback address, and {by} lets plugins reach public addresses only"
            ),
        ] {
            assert!(
                stderr.contains(&expected),
                "{command}: {expected:?} missing from:\n{stderr}"
            );
        }
        // The source folder is under the root: not reported.
        assert!(
            !stderr.contains("source.orders.path"),
            "{command}:\n{stderr}"
        );
        assert!(
            !root.join("checkpoints/policy").exists(),
            "{command}: nothing may run"
        );
    }

    // A policy that allows the workspace (and the variable): the same query runs.
    let fits = ws.pipeline(
        "fits-policy.toml",
        "[paths]\nroots = [\".\"]\n[grants]\nenv = [\"HOME\"]\nprivate_networks = true\n",
    )?;
    for command in ["validate", "run"] {
        let out = weir(
            EXE,
            &cache(),
            &[
                command,
                file.to_str().unwrap_or_default(),
                "--policy",
                fits.to_str().unwrap_or_default(),
            ],
        )?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{command}: {stderr}");
    }
    let written = weir_tests::lines(&root.join("out/policy/orders.jsonl"))?;
    assert!(!written.is_empty(), "the run wrote its rows");
    Ok(())
}

#[test]
fn a_writable_grant_may_not_overlap_the_checkpoint_or_the_plugin_cache() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    let cache = cache();
    std::fs::create_dir_all(&cache)?;
    let cache_real = std::fs::canonicalize(&cache)?;
    let root = std::fs::canonicalize(ws.path())?;
    std::fs::create_dir_all(root.join("checkpoints"))?;
    for (tag, dir, what, folder) in [
        (
            "over_checkpoint",
            "checkpoints".to_owned(),
            "the query's checkpoint",
            root.join("checkpoints/over_checkpoint"),
        ),
        (
            "over_cache",
            cache_real.display().to_string(),
            "the compiled-plugin cache",
            cache_real.clone(),
        ),
    ] {
        let text = weir_tests::orders_pipeline(tag, "drop", &granted_sink(&dir));
        let file = ws.pipeline(&format!("{tag}.toml"), &text)?;
        for command in ["validate", "run"] {
            let out = weir(EXE, &cache, &[command, file.to_str().unwrap_or_default()])?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
            let expected = format!(
                "overlaps {what} ({}): a plugin could rewrite it",
                folder.display()
            );
            assert!(
                stderr.contains(&expected),
                "{command}: {expected:?} missing from:\n{stderr}"
            );
            assert!(
                stderr.contains("sink.capabilities.dirs[0].host"),
                "{stderr}"
            );
        }
    }
    Ok(())
}

/// A folder of Parquet files as a stream (`format = "parquet"`): the orders written as Parquet
/// by one query are read back by another, with and without `schema`, into the same JSON rows
/// as the JSON orders make directly.
#[test]
fn a_folder_of_parquet_files_is_a_source() -> Result<()> {
    let ws = Workspace::new(3, 40)?;
    let cache = cache();
    let expected = weir_tests::files_reference(&ws, EXE, &cache)?;
    let query = |tag: &str, source: &str, sink: &str| {
        format!(
            "[query]\nname = \"{tag}\"\ncheckpoint = \"checkpoints/{tag}\"\ntrigger = \"available-now\"\n\n\
             [[source]]\nname = \"orders\"\nkind = \"files\"\n{source}\n\n{sink}"
        )
    };
    let to_parquet = ws.pipeline(
        "to_parquet.toml",
        &query(
            "to_parquet",
            &format!(
                "path = \"data/orders\"\nformat = \"json\"\nschema = \"{}\"\non_malformed = \"drop\"\nmax_files_per_trigger = 1",
                weir_tests::SCHEMA
            ),
            "[sink]\nkind = \"files\"\npath = \"out/parquet\"\nformat = \"parquet\"\n",
        ),
    )?;
    weir_tests::run_ok(EXE, &cache, &to_parquet, &[])?;
    for (tag, schema) in [
        ("inferred", String::new()),
        ("declared", format!("\nschema = \"{}\"", weir_tests::SCHEMA)),
    ] {
        let from_parquet = ws.pipeline(
            &format!("{tag}.toml"),
            &query(
                tag,
                &format!("path = \"out/parquet\"\nformat = \"parquet\"\nmax_files_per_trigger = 1{schema}"),
                &weir_tests::files_sink(tag),
            ),
        )?;
        let validated = weir(
            EXE,
            &cache,
            &["validate", from_parquet.to_str().unwrap_or_default()],
        )?;
        assert!(
            validated.status.success(),
            "{tag}: {}",
            String::from_utf8_lossy(&validated.stderr)
        );
        weir_tests::run_ok(EXE, &cache, &from_parquet, &[])?;
        let got = weir_tests::sorted_output(&ws.path().join("out").join(tag))?;
        assert_eq!(got, expected, "{tag}");
    }
    // Without `schema` and without a file to take it from: refused when the query starts.
    let empty = ws.pipeline(
        "empty.toml",
        &query(
            "empty",
            "path = \"out/nothing\"\nformat = \"parquet\"",
            &weir_tests::files_sink("empty"),
        ),
    )?;
    let out = weir(EXE, &cache, &["run", empty.to_str().unwrap_or_default()])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("without `schema` takes its schema from the first file"),
        "{stderr}"
    );
    Ok(())
}
