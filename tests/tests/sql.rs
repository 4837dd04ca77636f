//! SQL transforms through `weir run`: the batch clock across a crash and its
//! replay, a failing expression failing only its batch, transforms of one
//! input before the inputs meet, and which edits of the SQL a restart takes.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;
use weir_tests::{
    SCHEMA, Workspace, commit_ids, files_sink, lines, offset_entry, run_killed_at, run_ok, weir,
};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn source(name: &str, path: &str) -> String {
    format!(
        "[[source]]\nname = \"{name}\"\nkind = \"files\"\npath = \"{path}\"\nformat = \"json\"\n\
         schema = \"{SCHEMA}\"\nmax_files_per_trigger = 1\non_malformed = \"drop\"\n"
    )
}

fn pipeline(tag: &str, query: &str, middle: &str, sink: &str) -> String {
    format!(
        "[query]\nname = \"{tag}\"\ncheckpoint = \"checkpoints/{tag}\"\ntrigger = \"available-now\"\n\
         {query}\n\n{}\n{middle}\n\n{sink}",
        source("orders", "data/orders")
    )
}

fn sql(text: &str) -> String {
    format!("[[transform]]\nname = \"enrich\"\nsql = \"\"\"{text}\"\"\"\n")
}

/// The file a JSON files sink under `out/<tag>` writes for batch `n`.
fn batch_file(tag: &str, n: u64) -> String {
    format!("out/{tag}/batch-{n:020}.json")
}

fn rows(path: &Path) -> Result<Vec<Value>> {
    lines(path)?
        .iter()
        .map(|l| serde_json::from_str(l).with_context(|| format!("{}: {l}", path.display())))
        .collect()
}

/// An ISO-8601 timestamp as microseconds since the epoch (arrow's parser).
fn micros(text: &str) -> Result<i64> {
    use arrow_array::Array;
    let parsed = arrow_cast::cast(
        &arrow_array::StringArray::from(vec![text]),
        &arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, None),
    )?;
    let parsed = parsed
        .as_any()
        .downcast_ref::<arrow_array::TimestampMicrosecondArray>()
        .context("timestamp")?;
    anyhow::ensure!(parsed.is_valid(0), "{text} is not a timestamp");
    Ok(parsed.value(0))
}

#[test]
fn a_replayed_batch_computes_the_same_clock_and_bytes() -> Result<()> {
    let ws = Workspace::new(3, 200)?;
    let file = ws.pipeline(
        "clock.toml",
        &pipeline(
            "clock",
            "",
            &sql(
                "SELECT order_id, lower(trim(status)) AS status, amount * 2 AS doubled, \
                 current_timestamp() AS ingested_at FROM input WHERE amount > 10",
            ),
            &files_sink("clock"),
        ),
    )?;
    // Batch 1's rows are written, then the process dies before the commit.
    run_killed_at(EXE, &cache(), &file, "before-commit@1")?;
    let checkpoint = ws.path().join("checkpoints/clock");
    assert_eq!(commit_ids(&checkpoint)?, [0]);
    let written = ws.path().join(batch_file("clock", 1));
    let first = std::fs::read(&written).context("batch 1's output before the crash")?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commit_ids(&checkpoint)?, [0, 1, 2]);
    let replayed = std::fs::read(&written)?;
    assert!(!first.is_empty());
    assert_eq!(first, replayed, "the replay of batch 1 wrote other bytes");

    // Every row of a batch carries that batch's timestamp, as its offsets entry records it.
    for n in 0..3_u64 {
        let stamp = offset_entry(&checkpoint, n)?["batchTimestampMs"]
            .as_i64()
            .context("batchTimestampMs")?;
        let batch = rows(&ws.path().join(batch_file("clock", n)))?;
        assert!(!batch.is_empty());
        for row in &batch {
            let text = row["ingested_at"].as_str().context("ingested_at")?;
            assert_eq!(micros(text)?, stamp * 1000, "batch {n}: {row}");
        }
    }
    Ok(())
}

#[test]
fn a_failing_expression_fails_its_batch_and_the_fixed_query_resumes() -> Result<()> {
    let ws = Workspace::new(2, 50)?;
    let bad = pipeline(
        "casts",
        "",
        &sql("SELECT order_id, CAST(status AS BIGINT) AS n FROM input"),
        &files_sink("casts"),
    );
    let file = ws.pipeline("casts.toml", &bad)?;
    let out = weir(EXE, &cache(), &["run", file.to_str().context("path")?])?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("transform enrich failed batch 0: ") && stderr.contains("Cast error"),
        "{stderr}"
    );
    let checkpoint = ws.path().join("checkpoints/casts");
    assert!(
        commit_ids(&checkpoint)?.is_empty(),
        "a failed batch was committed"
    );

    // The same query with the cast fixed reruns batch 0 and goes on.
    std::fs::write(
        &file,
        bad.replace("CAST(status AS BIGINT)", "try_cast(status AS BIGINT)"),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commit_ids(&checkpoint)?, [0, 1]);
    let all: Vec<Value> = (0..2)
        .map(|n| rows(&ws.path().join(batch_file("casts", n))))
        .collect::<Result<Vec<_>>>()?
        .concat();
    assert_eq!(all.len() as u64, ws.orders.lines - ws.orders.malformed);
    assert!(
        all.iter().all(|r| r["n"].is_null()),
        "no status is a number"
    );
    Ok(())
}

#[test]
fn a_transform_of_one_input_runs_before_the_inputs_meet() -> Result<()> {
    let ws = Workspace::new(2, 100)?;
    // A second input: the same orders under another folder.
    let copy = ws.path().join("data/more");
    std::fs::create_dir_all(&copy)?;
    for entry in std::fs::read_dir(ws.path().join("data/orders"))? {
        let path = entry?.path();
        std::fs::copy(&path, copy.join(path.file_name().context("name")?))?;
    }
    let text = format!(
        "[query]\nname = \"two\"\ncheckpoint = \"checkpoints/two\"\ntrigger = \"available-now\"\n\n\
         {}\n{}\n\
         [[transform]]\nname = \"mark_a\"\ninput = \"a\"\n\
         sql = \"SELECT order_id, customer_id, concat('a:', lower(trim(status))) AS status, amount, occurred_at, session_id FROM input\"\n\n\
         [[transform]]\nname = \"both\"\nsql = \"SELECT order_id, status FROM input WHERE status IS NOT NULL\"\n\n{}",
        source("a", "data/orders"),
        source("b", "data/more"),
        files_sink("two"),
    );
    let file = ws.pipeline("two.toml", &text)?;
    let checked = weir(EXE, &cache(), &["validate", file.to_str().context("path")?])?;
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    run_ok(EXE, &cache(), &file, &[])?;
    let mut all = Vec::new();
    for entry in std::fs::read_dir(ws.path().join("out/two"))? {
        all.extend(rows(&entry?.path())?);
    }
    let valid = ws.orders.lines - ws.orders.malformed;
    let from_a = all
        .iter()
        .filter(|r| r["status"].as_str().is_some_and(|s| s.starts_with("a:")))
        .count() as u64;
    assert_eq!(from_a, valid, "rows of input a, marked by its transform");
    assert_eq!(all.len() as u64, 2 * valid);
    assert!(
        all.iter()
            .all(|r| r.as_object().is_some_and(|o| o.len() == 2))
    );

    // A transform of one input after one of every input is refused, by validate and by run.
    let misplaced = text.replace(
        "[[transform]]\nname = \"mark_a\"\ninput = \"a\"\n",
        "[[transform]]\nname = \"mark_a\"\n",
    );
    let misplaced = misplaced.replace(
        "[[transform]]\nname = \"both\"\n",
        "[[transform]]\nname = \"both\"\ninput = \"b\"\n",
    );
    let file = ws.pipeline("misplaced.toml", &misplaced)?;
    for command in ["validate", "run"] {
        let out = weir(EXE, &cache(), &[command, file.to_str().context("path")?])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains(
                "transform[1].input: comes after transform[0], which applies once the inputs meet"
            ),
            "{command}: {stderr}"
        );
    }
    Ok(())
}

#[test]
fn a_restart_takes_an_edited_filter_but_not_a_changed_state_column() -> Result<()> {
    let ws = Workspace::new(3, 100)?;
    // Files 1 and 2 arrive later, one per run.
    let data = ws.path().join("data/orders");
    let later = ws.path().join("later");
    std::fs::create_dir_all(&later)?;
    let mut names: Vec<_> = std::fs::read_dir(&data)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    for name in &names[1..] {
        std::fs::rename(data.join(name), later.join(name))?;
    }
    let arrive = |i: usize| std::fs::rename(later.join(&names[i]), data.join(&names[i]));

    let aggregate = "[aggregate]\ngroup_by = [\"status\"]\nselect = [\"count(*) AS orders\", \"sum(amount) AS revenue\"]";
    let with = |select: &str| {
        pipeline(
            "edits",
            "output_mode = \"update\"\nstate_store = \"memory\"",
            &format!("{}\n{aggregate}", sql(select)),
            &files_sink("edits"),
        )
    };
    let file = ws.pipeline(
        "edits.toml",
        &with("SELECT lower(trim(status)) AS status, amount FROM input WHERE amount > 0"),
    )?;
    let path = file.to_str().context("path")?;
    run_ok(EXE, &cache(), &file, &[])?;
    let checkpoint = ws.path().join("checkpoints/edits");
    assert_eq!(commit_ids(&checkpoint)?, [0]);

    // Another filter, the same columns and types: the query goes on from its checkpoint.
    arrive(1)?;
    std::fs::write(
        &file,
        with("SELECT lower(trim(status)) AS status, amount FROM input WHERE amount > 20"),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(commit_ids(&checkpoint)?, [0, 1]);

    // The grouping column becomes a number: the state's key changes, and the restart is refused.
    arrive(2)?;
    std::fs::write(
        &file,
        with("SELECT length(status) AS status, amount FROM input WHERE amount > 20"),
    )?;
    let out = weir(EXE, &cache(), &["run", path])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the key schema of the stateful operator's state changed: column status was Utf8, is now Int32"),
        "{stderr}"
    );
    assert_eq!(
        commit_ids(&checkpoint)?,
        [0, 1],
        "a refused restart ran a batch"
    );
    Ok(())
}

/// `[[function]] name = "count_char"` of `plugin` (world `scalar-function`).
fn count_char(plugin: &str, arguments: &str) -> String {
    format!(
        "[[function]]\nname = \"count_char\"\nplugin = \"{plugin}\"\narguments = [{arguments}]\n\
         returns = \"INT\"\nlimits = {{ memory = \"64 MiB\", timeout = \"10s\" }}\n"
    )
}

/// A plugin's scalar function called from SQL, one call per batch: the Rust and the Python
/// builds of `count_char` give the values computed here (NULL for NULL), the same bytes, and
/// the same bytes again when a batch is replayed after a crash; a declaration the plugin
/// refuses stops the start with its reason.
#[test]
fn a_plugin_s_scalar_function_is_called_from_sql_in_rust_and_python() -> Result<()> {
    let ws = Workspace::new(3, 150)?;
    std::fs::copy(
        weir_tests::PYTHON_COUNT_CHAR,
        ws.path().join("plugins/python_count_char.wasm"),
    )?;
    let statement = sql(
        "SELECT order_id, status, session_id, count_char(status, 'e') AS es, \
         count_char(session_id, '-') + 1 AS parts FROM input WHERE count_char(status, 'e') >= 0",
    );
    let mut outputs = Vec::new();
    for (tag, plugin) in [
        ("rust", "plugins/count_char.wasm"),
        ("python", "plugins/python_count_char.wasm"),
    ] {
        let text = pipeline(
            tag,
            "",
            &format!(
                "{}\n{statement}",
                count_char(plugin, "\"STRING\", \"STRING\"")
            ),
            &files_sink(tag),
        );
        let file = ws.pipeline(&format!("{tag}.toml"), &text)?;
        for command in ["validate", "run"] {
            let out = weir(EXE, &cache(), &[command, file.to_str().context("path")?])?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{tag} {command}: {stderr}");
        }
        let checkpoint = ws.path().join("checkpoints").join(tag);
        assert_eq!(commit_ids(&checkpoint)?, [0, 1, 2], "{tag}");
        let mut seen = 0;
        let mut batches = Vec::new();
        for n in 0..3_u64 {
            let path = ws.path().join(batch_file(tag, n));
            for row in rows(&path)? {
                seen += 1;
                let count = |column: &str, c: char| {
                    row[column]
                        .as_str()
                        .map(|s| Value::from(s.chars().filter(|x| *x == c).count()))
                        .unwrap_or(Value::Null)
                };
                assert_eq!(row["es"], count("status", 'e'), "{tag}: {row}");
                let parts = count("session_id", '-')
                    .as_u64()
                    .map_or(Value::Null, |d| Value::from(d + 1));
                assert_eq!(row["parts"], parts, "{tag}: {row}");
            }
            batches.push(std::fs::read(&path)?);
        }
        assert_eq!(seen, ws.orders.lines - ws.orders.malformed, "{tag}");
        outputs.push(batches);
    }
    assert_eq!(
        outputs[0], outputs[1],
        "the Rust and the Python builds wrote other bytes"
    );

    // Killed after batch 1's rows are written, before its commit: the replay calls the
    // function again and writes the same bytes.
    let file = ws.pipeline(
        "killed.toml",
        &pipeline(
            "killed",
            "",
            &format!(
                "{}\n{statement}",
                count_char("plugins/count_char.wasm", "\"STRING\", \"STRING\"")
            ),
            &files_sink("killed"),
        ),
    )?;
    run_killed_at(EXE, &cache(), &file, "before-commit@1")?;
    run_ok(EXE, &cache(), &file, &[])?;
    for n in 0..3_u64 {
        assert_eq!(
            std::fs::read(ws.path().join(batch_file("killed", n)))?,
            outputs[0][usize::try_from(n)?],
            "batch {n} after the replay"
        );
    }

    // The plugin refuses a signature it does not implement, naming the function.
    let refused = ws.pipeline(
        "refused.toml",
        &pipeline(
            "refused",
            "",
            &format!(
                "{}\n{}",
                count_char("plugins/count_char.wasm", "\"STRING\""),
                sql("SELECT count_char(status) AS n FROM input")
            ),
            &files_sink("refused"),
        ),
    )?;
    let out = weir(EXE, &cache(), &["run", refused.to_str().context("path")?])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("plugin count_char rejected its config: ") && stderr.contains("count_char"),
        "{stderr}"
    );
    Ok(())
}

/// `weir validate` plans the SQL with the declared functions: a call with the wrong number of
/// arguments, a misspelt function and a name that is a built-in are each refused at their key.
#[test]
fn validation_knows_the_declared_functions() -> Result<()> {
    let ws = Workspace::new(1, 10)?;
    let cases = [
        (
            count_char("plugins/count_char.wasm", "\"STRING\", \"STRING\""),
            "SELECT count_chr(status, 'e') AS n FROM input",
            "transform[0].sql: unknown function count_chr() (did you mean count_char?)",
        ),
        (
            count_char("plugins/count_char.wasm", "\"STRING\", \"STRING\""),
            "SELECT count_char(status) AS n FROM input",
            "transform[0].sql: ",
        ),
        (
            count_char("plugins/count_char.wasm", "\"STRING\", \"STRING\"")
                .replace("name = \"count_char\"", "name = \"upper\""),
            "SELECT order_id FROM input",
            "function[0].name: \"upper\" is a built-in SQL function",
        ),
        (
            count_char("plugins/count_char.wasm", "\"STRING\", \"MAP\""),
            "SELECT order_id FROM input",
            "function[0].arguments[1]: \"MAP\"",
        ),
    ];
    for (i, (function, statement, problem)) in cases.iter().enumerate() {
        let file = ws.pipeline(
            &format!("case{i}.toml"),
            &pipeline(
                &format!("case{i}"),
                "",
                &format!("{function}\n{}", sql(statement)),
                &files_sink("case"),
            ),
        )?;
        let out = weir(EXE, &cache(), &["validate", file.to_str().context("path")?])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {i}: {stderr}");
        assert!(stderr.contains(problem), "case {i}: {stderr}");
    }
    Ok(())
}

/// A `[[function]]` inside an aggregate of `[aggregate]`: the lowering computes the plugin's
/// function before the operator, and the totals are those of the input.
#[test]
fn a_plugin_s_function_feeds_an_aggregate() -> Result<()> {
    let ws = Workspace::new(2, 100)?;
    let text = pipeline(
        "agg",
        "output_mode = \"update\"\nstate_store = \"memory\"",
        &format!(
            "{}\n[aggregate]\ngroup_by = [\"status\"]\nselect = [\"sum(count_char(session_id, '-')) AS dashes\", \"count(*) AS orders\"]\n",
            count_char("plugins/count_char.wasm", "\"STRING\", \"STRING\"")
        ),
        &files_sink("agg"),
    );
    let file = ws.pipeline("agg.toml", &text)?;
    run_ok(EXE, &cache(), &file, &[])?;
    // What the input says: per status, the dashes of its session ids and its orders.
    let mut want: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    let mut inputs: Vec<_> = std::fs::read_dir(ws.path().join("data/orders"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    inputs.sort();
    for path in inputs {
        for line in lines(&path)? {
            let Ok(row) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let Some(status) = row["status"].as_str() else {
                continue;
            };
            let dashes = row["session_id"]
                .as_str()
                .map_or(0, |s| s.matches('-').count() as u64);
            let entry = want.entry(status.to_owned()).or_default();
            entry.0 += dashes;
            entry.1 += 1;
        }
    }
    // Update mode: the last row each status was emitted with is its total.
    let mut got: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for n in 0..2_u64 {
        for row in rows(&ws.path().join(batch_file("agg", n)))? {
            let status = row["status"].as_str().context("status")?.to_owned();
            let dashes = row["dashes"].as_u64().context("dashes")?;
            let orders = row["orders"].as_u64().context("orders")?;
            got.insert(status, (dashes, orders));
        }
    }
    assert!(!got.is_empty());
    assert_eq!(got, want);
    Ok(())
}
