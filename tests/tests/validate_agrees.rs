//! `weir validate` and `weir run` agree on every pipeline file: the shipped examples are
//! accepted by both, and each refused file is refused by both, before anything runs, with the
//! same list of problems. A setting that only `weir run` refused (found when the sink or an
//! operator started) would show here as a file that `validate` accepts and `run` refuses.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use weir_tests::{SCHEMA, Workspace, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// The shipped examples, from the repository (not the working directory).
fn examples() -> Result<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|f| f.extension().is_some_and(|e| e == "toml"));
    files.sort();
    Ok(files)
}

/// What a command made of a file.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Refused before running (exit code 2), with the problems as printed.
    Refused(String),
    /// Accepted: `code` is the exit code (`None`: still running at the deadline, and killed).
    Accepted { code: Option<i32>, stderr: String },
}

fn validate(file: &Path, overrides: &[&str]) -> Result<Verdict> {
    let path = file.to_str().context("utf-8 path")?;
    let args: Vec<&str> = ["validate", path]
        .into_iter()
        .chain(overrides.iter().copied())
        .collect();
    let out = weir(EXE, &cache(), &args)?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    Ok(match out.status.code() {
        Some(2) => Verdict::Refused(stderr),
        code => Verdict::Accepted { code, stderr },
    })
}

/// `weir run`, stopped after `patience` if it has not ended by then: validation takes
/// milliseconds, so a run still going has been accepted.
fn run(file: &Path, overrides: &[&str], scratch: &Path, patience: Duration) -> Result<Verdict> {
    let log = scratch.join(format!(
        "{}.run.stderr",
        file.file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("pipeline")
    ));
    let mut child = Command::new(EXE)
        .arg("run")
        .arg(file)
        .args(overrides)
        .arg("--cache-dir")
        .arg(cache())
        .env_remove("WEIR_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("running {EXE}"))?;
    let deadline = Instant::now() + patience;
    let code = loop {
        if let Some(status) = child.try_wait()? {
            break status.code();
        }
        if Instant::now() >= deadline {
            child.kill()?;
            child.wait()?;
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&log)?;
    Ok(match code {
        Some(2) => Verdict::Refused(stderr),
        code => Verdict::Accepted { code, stderr },
    })
}

#[test]
fn every_example_is_accepted_by_validate_and_by_run() -> Result<()> {
    let examples = examples()?;
    assert!(examples.len() >= 5, "{examples:?}");
    for example in examples {
        let ws = Workspace::new(1, 20)?;
        let name = example
            .file_name()
            .and_then(|n| n.to_str())
            .context("name")?;
        let file = ws.pipeline(name, &std::fs::read_to_string(&example)?)?;
        // The folder a plugin sink is granted must exist (both commands refuse a missing one).
        std::fs::create_dir_all(ws.path().join("out"))?;
        // The static side of the join example.
        std::fs::create_dir_all(ws.path().join("data/customers"))?;
        std::fs::write(
            ws.path().join("data/customers/customers.json"),
            "{\"customer_id\": 1, \"name\": \"ada\", \"country\": \"uk\", \"tier\": \"gold\"}\n",
        )?;
        // The other stream of the stream-stream join example.
        std::fs::create_dir_all(ws.path().join("data/clicks"))?;
        std::fs::write(
            ws.path().join("data/clicks/clicks.json"),
            "{\"click_id\": 1, \"session_id\": \"s-1\", \"clicked_at\": \"2024-03-01T00:00:00Z\", \"url\": \"/\"}\n",
        )?;
        let kafka = name.starts_with("kafka");
        // Batches until the data is read, then stop; no broker listens on port 1.
        let mut overrides = vec!["--set", "query.trigger=available-now"];
        if kafka {
            overrides.extend([
                "--set",
                "source.orders.bootstrap_servers=127.0.0.1:1",
                "--set",
                "sink.bootstrap_servers=127.0.0.1:1",
            ]);
        }
        let checked = validate(&file, &overrides)?;
        assert!(
            matches!(&checked, Verdict::Accepted { code: Some(0), .. }),
            "validate {name}: {checked:?}"
        );
        let patience = Duration::from_secs(if kafka { 5 } else { 120 });
        let ran = run(&file, &overrides, ws.path(), patience)?;
        match &ran {
            Verdict::Accepted { code, stderr } => {
                // A Kafka query without a broker fails on its first batch or waits for it;
                // every other example runs to its end.
                if !kafka {
                    assert_eq!(*code, Some(0), "run {name}:\n{stderr}");
                }
                assert!(!stderr.contains("problem(s)"), "run {name}:\n{stderr}");
            }
            Verdict::Refused(stderr) => {
                panic!("run {name} refused what validate accepts:\n{stderr}")
            }
        }
    }
    Ok(())
}

/// A files source over the sample orders, the `[query]` keys `query`, the tables `middle` and
/// the `[sink]` table `sink`.
fn pipeline(tag: &str, query: &str, middle: &str, sink: &str) -> String {
    format!(
        r#"
[query]
name = "{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"
state_store = "memory"
{query}

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
on_malformed = "drop"

{middle}

{sink}
"#
    )
}

const WATERMARK: &str = "[watermark]\ncolumn = \"occurred_at\"\ndelay = \"10 minutes\"";

fn revenue(select: &str) -> String {
    format!(
        "{WATERMARK}\n\n[aggregate]\nwindow = {{ column = \"occurred_at\", size = \"5 minutes\" }}\n\
         group_by = [\"status\"]\nselect = [{select}]"
    )
}

fn sessions(select: &str) -> String {
    format!(
        "{WATERMARK}\n\n[aggregate]\nwindow = {{ column = \"occurred_at\", gap = \"5 minutes\" }}\n\
         group_by = [\"customer_id\"]\nselect = [{select}]"
    )
}

/// Files each refused for a reason, with a problem the list must hold.
fn refused() -> Vec<(String, String)> {
    let delta = "[sink]\nkind = \"delta\"\npath = \"tables/out\"";
    let many: Vec<String> = (0..256).map(|i| format!("\"count(*) AS c{i}\"")).collect();
    vec![
        // Refused only by `weir run` before, when the sink or the operator started.
        (
            pipeline("delta_update", "output_mode = \"update\"", &revenue("\"count(*) AS n\""), delta),
            "query.output_mode: a delta sink takes output_mode \"append\" or \"complete\", not \"update\"".into(),
        ),
        (
            pipeline(
                "delta_complete",
                "output_mode = \"complete\"",
                &revenue("\"count(*) AS n\""),
                &format!("{delta}\ncommit_every = 10"),
            ),
            "sink.commit_every: complete mode rewrites the whole table every batch".into(),
        ),
        (
            pipeline("bad_aggregate", "", &revenue("\"count(*) AS n\", \"median(amount)\""), "[sink]\nkind = \"memory\""),
            "aggregate.select[1]: aggregate \"median(amount)\": unknown function \"median\"".into(),
        ),
        (
            pipeline("many_aggregates", "", &revenue(&many.join(", ")), "[sink]\nkind = \"memory\""),
            "aggregate.select: 256 aggregates; at most 255 are supported".into(),
        ),
        (
            pipeline(
                "distinct_sessions",
                "",
                &sessions("\"count(DISTINCT order_id) AS orders\""),
                "[sink]\nkind = \"memory\"",
            ),
            "aggregate.select[0]: aggregate \"count(DISTINCT order_id) AS orders\": count(DISTINCT) is not supported with session windows".into(),
        ),
        (
            pipeline(
                "missing_grant",
                "",
                "",
                "[sink]\nkind = \"plugin\"\nname = \"jsonl_sink\"\nplugin = \"plugins/jsonl_sink.wasm\"\n\
                 config = { path = \"/out/orders.jsonl\" }\n\
                 capabilities = { dirs = [ { host = \"no-such-folder\", guest = \"/out\", writable = true } ] }",
            ),
            "sink.capabilities.dirs[0].host: no such folder (create it before the query starts)".into(),
        ),
        // SQL transforms: the statement is checked, and planned against the source's schema.
        (
            pipeline("sql_group_by", "", "[[transform]]\nsql = \"SELECT status, count(*) AS n FROM input GROUP BY status\"", "[sink]\nkind = \"memory\""),
            "transform[0].sql: GROUP BY is not supported in a transform: aggregation keeps state across batches: use [aggregate] (group_by, window, select)".into(),
        ),
        (
            pipeline("sql_order_by", "", "[[transform]]\nsql = \"SELECT * FROM input ORDER BY amount LIMIT 3\"", "[sink]\nkind = \"memory\""),
            "transform[0].sql: ORDER BY is not supported in a transform".into(),
        ),
        (
            pipeline("sql_column", "", "[[transform]]\nsql = \"SELECT order_id, amout FROM input\"", "[sink]\nkind = \"memory\""),
            "transform[0].sql: no column \"amout\" in the transform's input (did you mean amount?)".into(),
        ),
        (
            pipeline("sql_function", "", "[[transform]]\nsql = \"SELECT lowr(status) AS s FROM input\"", "[sink]\nkind = \"memory\""),
            "transform[0].sql: unknown function lowr() (did you mean lower?)".into(),
        ),
        (
            pipeline("sql_input", "", "[[transform]]\ninput = \"clicks\"\nsql = \"SELECT * FROM input\"", "[sink]\nkind = \"memory\""),
            "transform[0].input: no [[source]] is named \"clicks\" (the sources are orders)".into(),
        ),
        (
            pipeline("sql_and_plugin", "", "[[transform]]\nplugin = \"plugins/filter_rows.wasm\"\nsql = \"SELECT * FROM input\"", "[sink]\nkind = \"memory\""),
            "transform[0].plugin: is a plugin's key: a [[transform]] runs either `sql` or a `plugin`, not both".into(),
        ),
        // Refused by both already.
        (
            pipeline("no_watermark", "", "[aggregate]\ngroup_by = [\"status\"]\nselect = [\"count(*)\"]", "[sink]\nkind = \"memory\""),
            "query.output_mode: \"append\" needs a [watermark]".into(),
        ),
        (
            pipeline("session_update", "output_mode = \"update\"", &sessions("\"count(*) AS n\""), "[sink]\nkind = \"memory\""),
            "aggregate.window.gap: session windows do not support output_mode = \"update\"".into(),
        ),
        (
            pipeline("stray_key", "", "", "[sink]\nkind = \"files\"\npath = \"out\"\ncommit_every = 2"),
            "sink.commit_every: unknown key of a files sink (known keys: kind, path, format); it is a key of delta sinks".into(),
        ),
        (
            pipeline("unknown_kind", "", "", "[sink]\nkind = \"hive\""),
            "sink.kind: \"hive\" is not a sink kind".into(),
        ),
        (
            pipeline("bad_values", "colour = \"blue\"", "", "[sink]\nkind = \"files\"\npath = \"out\"\nformat = \"xlsx\""),
            "query.colour: unknown key".into(),
        ),
    ]
}

#[test]
fn every_refused_file_is_refused_by_both_with_the_same_problems() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    for (i, (text, expected)) in refused().iter().enumerate() {
        let file = ws.pipeline(&format!("refused{i}.toml"), text)?;
        let checked = validate(&file, &[])?;
        let ran = run(&file, &[], ws.path(), Duration::from_secs(120))?;
        let Verdict::Refused(problems) = &checked else {
            panic!("validate accepted file {i} ({expected}): {checked:?}");
        };
        assert!(
            problems.contains(expected.as_str()),
            "file {i}: {expected:?} missing from:\n{problems}"
        );
        assert_eq!(checked, ran, "file {i}: validate and run disagree");
    }
    assert!(
        !ws.path().join("checkpoints").exists() && !ws.path().join("tables").exists(),
        "nothing was opened"
    );
    Ok(())
}
