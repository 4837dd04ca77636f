//! Fuzzing the pipeline-file parser ([`crate::spec::parse`]) and the value parsers it uses.
//!
//! Inputs: arbitrary text; TOML-like token soup; and valid pipelines (the shipped examples and a
//! few that use every section) with lines deleted, duplicated, swapped or rewritten, values
//! replaced by values of other types or by hostile strings (overflowing durations, sizes and
//! offsets, bad DDL, regexes, grants), unknown keys and tables inserted, bytes mutated, and
//! random `--set` overrides. Property: `parse` never panics, returns a pipeline or a
//! [`SpecErrors`] with at least one problem, and is deterministic; the stateful checks accept
//! whatever it returns. The duration and size formatters must round-trip through their parsers.
//!
//! Budget: about 12 000 cases in all, about a second.

use std::path::Path;

use proptest::prelude::*;

use super::{Reach, byte_edits, mutate, run};
use crate::spec::{
    self, Pipeline, SpecErrors, format_byte_size, format_duration, parse_byte_size,
    parse_condition, parse_dedup, parse_duration, parse_schema,
};

/// Valid pipelines the mutations start from.
const CORPUS: &[&str] = &[
    include_str!("../../../examples/dedup_orders.toml"),
    include_str!("../../../examples/kafka_orders.toml"),
    include_str!("../../../examples/orders_foreach_batch.toml"),
    include_str!("../../../examples/orders_to_parquet.toml"),
    include_str!("../../../examples/revenue_5m.toml"),
    // CSV input, sliding windows, update mode, a transform with every limit and capability.
    r#"
[query]
name = "q.1-x"
checkpoint = "cp"
trigger = "once"
output_mode = "update"
max_batch_retries = 0
state_store = "memory"
state_partitions = 3
watermark_policy = "max"

[[source]]
name = "orders"
kind = "files"
path = "in"
format = "csv"
csv = { header = true, delimiter = ";" }
schema = "id BIGINT, n INT, ok BOOLEAN, x DOUBLE, d DATE, at TIMESTAMP, amount DECIMAL(38,10), s STRING"
on_malformed = "drop"

[[transform]]
plugin = "plugins/filter_rows.wasm"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
config = { column = "s", nested = { list = [1, 2.5, true, "x"] } }
limits = { memory = "1 GiB", timeout = "1h 30m", fuel = 9223372036854775807 }
capabilities = { dirs = [ { host = "out", guest = "/out", writable = true } ], env = ["HOME"], http = ["127.0.0.1:8080", "example.com"] }

[watermark]
column = "at"
delay = "10 minutes"
idle_timeout = "5 minutes"

[aggregate]
window = { column = "at", size = "10 minutes", slide = "5 minutes" }
group_by = ["s"]
select = ["sum(amount) AS total", "count(*) AS n", "max(x) AS top"]

[sink]
kind = "console"
max_rows = 5
"#,
    // Session windows, a Delta source and sink.
    r#"
[query]
name = "sessions"
checkpoint = "/tmp/cp"
trigger = "15s"
output_mode = "append"

[[source]]
name = "events"
kind = "delta"
path = "tables/events"
max_files_per_trigger = 2
starting_version = 3

[watermark]
column = "at"
delay = "1h"

[aggregate]
window = { column = "at", gap = "30 minutes" }
group_by = ["user"]
select = ["count(*) AS clicks"]

[sink]
kind = "delta"
path = "tables/sessions"
partition_by = ["user"]
target_file_size = "8 MiB"
commit_every = "30s"
"#,
    // Kafka in with a pattern and specific offsets, a MERGE sink, deduplication.
    r#"
[query]
name = "merge"
checkpoint = "cp"
output_mode = "append"

[[source]]
name = "a"
kind = "kafka"
bootstrap_servers = "127.0.0.1:9092,127.0.0.1:9093"
subscribe_pattern = "orders-.*"
starting_offsets = '{"orders-1":{"0":23,"1":-2}}'
max_offsets_per_trigger = 10
fail_on_data_loss = false
format = "json"
schema = "order_id BIGINT, at TIMESTAMP"
on_malformed = "dead-letter"
dead_letter_path = "dead"

[watermark]
column = "at"
delay = "0s"

[deduplicate]
keys = ["order_id"]
within_watermark = true

[sink]
kind = "delta-merge"
path = "t"
keys = ["order_id"]
when_matched_update = "s.at > t.at"
dedup = "latest-by:at"
"#,
    // A plugin sink with a MERGE capability, a Kafka sink alternative via overrides.
    r#"
[query]
name = "p"
checkpoint = "cp"

[[source]]
name = "orders"
kind = "files"
path = "in"
format = "json"
schema = "id BIGINT"

[sink]
kind = "plugin"
plugin = "plugins/merge_sink.wasm"
config = { table = "orders" }

[sink.capabilities.delta_merge.orders]
path = "tables/orders"
keys = ["id"]
"#,
    r#"
[query]
name = "k"
checkpoint = "cp"

[[source]]
name = "orders"
kind = "kafka"
bootstrap_servers = "b:9092"
subscribe = ["a", "b"]

[sink]
kind = "kafka"
bootstrap_servers = "b:9092"
topic = "out"
key = "key"
value = "value"
delivery = "at-least-once"
"#,
];

/// The plugin files the corpus names, so that validation goes past the file checks.
const PLUGINS: &[&str] = &[
    "plugins/filter_rows.wasm",
    "plugins/normalize_status.wasm",
    "plugins/jsonl_sink.wasm",
    "plugins/merge_sink.wasm",
];

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for plugin in PLUGINS {
        let path = dir.path().join(plugin);
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("plugin folder");
        std::fs::write(&path, b"\0asm").expect("plugin file");
    }
    // The corpus grants this folder, and granted folders must exist.
    std::fs::create_dir_all(dir.path().join("out")).expect("granted folder");
    dir
}

/// Strings that are hostile to one value parser or another.
const NASTY: &[&str] = &[
    "",
    " ",
    "0",
    "-1",
    "0s",
    "1.5s",
    "-1s",
    "18446744073709551615ms",
    "18446744073709551616ms",
    "213503982334601 days",
    "99999999999999999999 d",
    "1h, 30m,",
    "1 fortnight",
    "0 B",
    "64 MiB",
    "18446744073709551615 TiB",
    "17179869184 GiB",
    "1.5 GiB",
    "id BIGINT",
    "a DECIMAL(38,38)",
    "a DECIMAL(0,0)",
    "a DECIMAL(39,2)",
    "a DECIMAL(5,-1)",
    "a DECIMAL(5,6)",
    "a DECIMAL(255,255)",
    "a DECIMAL(99999999999999999999,1)",
    "a STRUCT<b: INT>",
    "a ARRAY<INT>",
    "a MAP<STRING, INT>",
    "`a``b` INT",
    "`unterminated INT",
    "a TIMESTAMP_NTZ, b TIMESTAMP_LTZ",
    "a INT NOT NULL COMMENT 'x'",
    "a INT, a INT",
    "_corrupt_record STRING",
    "a INT,",
    ",",
    "a",
    "s.a > t.a",
    "t.a <= s.a",
    "s. > t.",
    "s.a >= s.a",
    "s.a >",
    "s.`a` != t.`b`",
    "latest-by:",
    "latest-by:at",
    "none",
    "available-now",
    "once",
    "append",
    "complete",
    "rocksdb",
    "min",
    "permissive",
    "dead-letter",
    "json",
    "csv",
    "parquet",
    "files",
    "kafka",
    "delta",
    "delta-merge",
    "plugin",
    "console",
    "memory",
    "exactly-once",
    "/",
    "..",
    "../..",
    "a\u{0}b",
    "plugins/filter_rows.wasm",
    "plugins/missing.wasm",
    "plugins",
    "{}",
    "[",
    r#"{"t":{"0":-3}}"#,
    r#"{"t":{"99999999999":1}}"#,
    r#"{"t":{"0":9223372036854775807}}"#,
    r#"{"t":{"x":1}}"#,
    r#"{"":{}}"#,
    "earliest",
    "(",
    "a{99999}",
    "[z-a]",
    ".*",
    "host:0",
    "host:99999",
    ":80",
    "[::1]:8080",
    "http://x",
    "A=B",
    "out",
    "/a/../b",
    "\u{202e}\u{fffd}",
];

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// TOML value text: well-typed or not, valid TOML or not.
fn value_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(NASTY).prop_map(toml_string),
        2 => any::<String>().prop_map(|s| toml_string(&s)),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => proptest::sample::select(&[
            "0", "-1", "1", "9223372036854775807", "-9223372036854775808",
            "18446744073709551615", "1.5", "-0.0", "inf", "nan", "1e400", "true", "false",
            "[]", "[\"a\", \"a\"]", "[1, \"x\"]", "[[]]", "{}", "{ a = 1 }",
            "{ column = \"at\", size = \"0s\" }", "{ host = \"out\" }",
            "1979-05-27T07:32:00Z", "\"\"\"\nmulti\n\"\"\"", "'literal'", "\"unterminated",
            "{ dirs = [ { host = \"..\", guest = \"/\" } ], http = [\"\"] }",
            "{ memory = \"0\", timeout = \"0s\", fuel = 0 }",
        ][..]).prop_map(str::to_owned),
        1 => "[ -~]{0,20}",
    ]
}

const KEYS: &[&str] = &[
    "name",
    "checkpoint",
    "trigger",
    "output_mode",
    "max_batch_retries",
    "state_store",
    "state_partitions",
    "watermark_policy",
    "kind",
    "path",
    "format",
    "schema",
    "max_files_per_trigger",
    "on_malformed",
    "dead_letter_path",
    "csv",
    "bootstrap_servers",
    "subscribe",
    "subscribe_pattern",
    "starting_offsets",
    "max_offsets_per_trigger",
    "fail_on_data_loss",
    "starting_version",
    "plugin",
    "config",
    "limits",
    "sha256",
    "capabilities",
    "column",
    "delay",
    "idle_timeout",
    "window",
    "group_by",
    "select",
    "keys",
    "within_watermark",
    "max_rows",
    "topic",
    "key",
    "value",
    "delivery",
    "partition_by",
    "target_file_size",
    "commit_every",
    "when_matched_update",
    "when_matched_delete",
    "when_not_matched_insert",
    "dedup",
    "arguments",
    "returns",
    "csv.header",
    "limits.memory",
    "capabilities.dirs",
    "window.size",
    "unknown",
    "a.b.c",
];

const TABLES: &[&str] = &[
    "[query]",
    "[[source]]",
    "[[transform]]",
    "[[function]]",
    "[sink]",
    "[watermark]",
    "[aggregate]",
    "[deduplicate]",
    "[source]",
    "[[sink]]",
    "[[query]]",
    "[sink.capabilities]",
    "[sink.capabilities.delta_merge.x]",
    "[aggregate.window]",
    "[extra]",
    "[source.csv]",
];

/// One edit of a pipeline file, line by line.
#[derive(Debug, Clone)]
enum LineEdit {
    Delete(usize),
    Duplicate(usize),
    Swap(usize, usize),
    /// Keep the key of the line, replace its value.
    Value(usize, String),
    /// Keep the value of the line, replace its key.
    Key(usize, String),
    Insert(usize, String),
}

fn line_edit() -> impl Strategy<Value = LineEdit> {
    let line = prop_oneof![
        (proptest::sample::select(KEYS), value_text()).prop_map(|(k, v)| format!("{k} = {v}")),
        proptest::sample::select(TABLES).prop_map(str::to_owned),
        "[a-z_]{1,8}(\\.[a-z_]{1,8}){0,2} = [0-9a-z\"\\[\\]{}]{0,8}",
    ];
    prop_oneof![
        3 => any::<usize>().prop_map(LineEdit::Delete),
        2 => any::<usize>().prop_map(LineEdit::Duplicate),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| LineEdit::Swap(a, b)),
        4 => (any::<usize>(), value_text()).prop_map(|(i, v)| LineEdit::Value(i, v)),
        1 => (any::<usize>(), proptest::sample::select(KEYS))
            .prop_map(|(i, k)| LineEdit::Key(i, k.to_owned())),
        2 => (any::<usize>(), line).prop_map(|(i, l)| LineEdit::Insert(i, l)),
    ]
}

fn apply_lines(text: &str, edits: &[LineEdit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for edit in edits {
        let n = lines.len().max(1);
        match edit {
            LineEdit::Delete(i) if !lines.is_empty() => {
                lines.remove(i % n);
            }
            LineEdit::Duplicate(i) if !lines.is_empty() => {
                let copy = lines[i % n].clone();
                lines.insert(i % n, copy);
            }
            LineEdit::Swap(a, b) if !lines.is_empty() => lines.swap(a % n, b % n),
            LineEdit::Value(i, v) if !lines.is_empty() => {
                let line = &mut lines[i % n];
                if let Some((key, _)) = line.split_once('=') {
                    *line = format!("{key}= {v}");
                }
            }
            LineEdit::Key(i, k) if !lines.is_empty() => {
                let line = &mut lines[i % n];
                if let Some((_, value)) = line.split_once('=') {
                    *line = format!("{k} ={value}");
                }
            }
            LineEdit::Insert(i, l) => lines.insert(i % (lines.len() + 1), l.clone()),
            _ => {}
        }
    }
    lines.join("\n")
}

/// `--set` overrides: known dotted paths (by name and index) and random ones.
fn override_text() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        proptest::sample::select(
            &[
                "query.name",
                "query.trigger",
                "query.checkpoint",
                "query.state_partitions",
                "source.orders.path",
                "source.0.schema",
                "source.orders.csv.delimiter",
                "source.9.path",
                "source.x.y.z",
                "transform.0.limits.memory",
                "transform.keep_completed.config.x",
                "transform.99.name",
                "sink.kind",
                "sink",
                "sink.capabilities.dirs",
                "watermark.delay",
                "aggregate.window.size",
                "query.name.x",
                "source",
                "transform",
                "",
                ".",
                "a..b",
                " query . name ",
            ][..]
        )
        .prop_map(str::to_owned),
        "[a-z_0-9.]{0,20}",
    ];
    prop_oneof![
        8 => (key, value_text()).prop_map(|(k, v)| format!("{k}={v}")),
        1 => any::<String>(),
    ]
}

/// `parse` must not panic, must explain every refusal, and must give the same answer twice.
fn check_parse(base: &Path, text: &str, overrides: &[String]) -> Result<(), TestCaseError> {
    check_parse_counted(base, text, overrides).map(|_| ())
}

/// As [`check_parse`]; true when the text is a valid pipeline.
fn check_parse_counted(
    base: &Path,
    text: &str,
    overrides: &[String],
) -> Result<bool, TestCaseError> {
    let first = spec::parse(text, base, "fuzz.toml", overrides);
    let second = spec::parse(text, base, "fuzz.toml", overrides);
    match (&first, &second) {
        (Ok(a), Ok(b)) => {
            prop_assert_eq!(a, b);
            check_pipeline(a);
        }
        (Err(a), Err(b)) => {
            prop_assert_eq!(&a.problems, &b.problems);
            check_errors(a)?;
        }
        _ => prop_assert!(
            false,
            "parse is not deterministic: {first:?} then {second:?}"
        ),
    }
    Ok(first.is_ok())
}

fn check_pipeline(p: &Pipeline) {
    // The checks run after parsing (at start) must accept any pipeline `parse` returns.
    let _problems = spec::stateful_problems(p);
    let _warnings = spec::stateful_warnings(p);
}

fn check_errors(e: &SpecErrors) -> Result<(), TestCaseError> {
    prop_assert!(!e.problems.is_empty(), "an error without problems");
    let text = e.to_string();
    prop_assert!(text.starts_with("fuzz.toml: "), "{text}");
    for problem in &e.problems {
        prop_assert!(
            !problem.message.is_empty(),
            "empty message at {:?}",
            problem.path
        );
    }
    Ok(())
}

#[test]
fn fuzz_spec_corpus_is_valid() {
    let dir = workspace();
    for (i, text) in CORPUS.iter().enumerate() {
        if let Err(e) = spec::parse(text, dir.path(), "corpus", &[]) {
            panic!("corpus entry {i} is not a valid pipeline: {e}");
        }
    }
}

#[test]
fn fuzz_spec_arbitrary_text() {
    let dir = workspace();
    run(1_000, any::<String>(), |text| {
        check_parse(dir.path(), &text, &[])
    });
    run(1_000, "[\\[\\]{}=,.\"'#a-z_0-9 \n\t-]{0,300}", |text| {
        check_parse(dir.path(), &text, &[])
    });
}

#[test]
fn fuzz_spec_mutated_pipelines() {
    let dir = workspace();
    let strategy = (
        proptest::sample::select(CORPUS),
        proptest::collection::vec(line_edit(), 1..6),
        proptest::collection::vec(override_text(), 0..3),
    );
    let valid = Reach::default();
    run(3_000, strategy, |(doc, edits, overrides)| {
        if check_parse_counted(dir.path(), &apply_lines(doc, &edits), &overrides)? {
            valid.hit();
        }
        Ok(())
    });
    valid.check("a valid mutated pipeline", 3_000);
}

#[test]
fn fuzz_spec_byte_mutations() {
    let dir = workspace();
    let strategy = (proptest::sample::select(CORPUS), byte_edits(6));
    run(1_000, strategy, |(doc, edits)| {
        let bytes = mutate(doc.as_bytes(), &edits);
        check_parse(dir.path(), &String::from_utf8_lossy(&bytes), &[])
    });
}

#[test]
fn fuzz_spec_value_parsers() {
    let text = prop_oneof![
        proptest::sample::select(NASTY).prop_map(str::to_owned),
        any::<String>(),
        "[0-9]{0,25} ?[a-zA-Z]{0,8}(, ?[0-9]{1,22}[a-z]{1,7}){0,3}",
        "([a-z_` ]{1,6} (INT|BIGINT|STRING|DECIMAL\\([0-9-]{1,3}, ?[0-9-]{1,3}\\)|TIMESTAMP|DATE|DOUBLE|BOOLEAN|ARRAY<INT>)( NOT NULL)?,? ?){0,4}",
        "[st]\\.[a-z`]{0,4} ?(>|>=|<|<=|=|==|!=|<>|=>)? ?[st]?\\.?[a-z`]{0,4}",
    ];
    run(4_000, text, |text| {
        // Each parser returns a value or a message.
        if let Err(e) = parse_duration(&text) {
            prop_assert!(!e.is_empty());
        }
        if let Err(e) = parse_byte_size(&text) {
            prop_assert!(!e.is_empty());
        }
        if let Ok(schema) = parse_schema(&text) {
            prop_assert!(
                !schema.fields().is_empty(),
                "{text:?} parsed as an empty schema"
            );
        }
        let _condition = parse_condition(&text, spec::Sides::Both);
        let _insert = parse_condition(&text, spec::Sides::SourceOnly);
        let _dedup = parse_dedup(&text);
        Ok(())
    });
}

#[test]
fn fuzz_spec_durations_and_sizes_round_trip() {
    run(2_000, (any::<u64>(), any::<u64>()), |(ms, bytes)| {
        let duration = std::time::Duration::from_millis(ms);
        prop_assert_eq!(parse_duration(&format_duration(duration)), Ok(duration));
        prop_assert_eq!(parse_byte_size(&format_byte_size(bytes)), Ok(bytes));
        Ok(())
    });
}
