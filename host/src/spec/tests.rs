use std::path::Path;
use std::time::Duration;

use arrow_schema::{DataType, TimeUnit};

use super::*;

/// The example of the issue, verbatim: every key this version understands.
const EXAMPLE: &str = r#"
[query]
name = "revenue_5m"                      # required, [A-Za-z0-9_.-]+
checkpoint = "checkpoints/revenue_5m"     # required; relative paths resolve against the pipeline file's folder
trigger = "available-now"                 # "available-now" | "once" | a duration such as "30s" (processing-time); absent = continuous (next batch as soon as the previous ends)
output_mode = "append"                    # append | update | complete (default append)
max_batch_retries = 2                     # optional, retries of a batch failing with a retryable error (default 2)

[[source]]                                # exactly one source for now (say so in the error if several)
name = "orders"                           # required, unique
kind = "files"                            # only files for now
path = "data/orders"                      # folder
format = "json"                           # json (JSON lines) | csv
schema = "order_id BIGINT, customer_id BIGINT, status STRING, amount DECIMAL(12,2), occurred_at TIMESTAMP, session_id STRING"
max_files_per_trigger = 1                 # optional positive integer
on_malformed = "permissive"               # permissive (default) | drop | fail | dead-letter

[[transform]]                             # zero or more, applied in order
name = "keep_completed"                   # optional; default: the plugin file stem
plugin = "plugins/filter_rows.wasm"       # required, must end in .wasm
config = { column = "status", equals = "completed" }   # optional table, handed to the plugin as JSON
limits = { memory = "64 MiB", timeout = "10s", fuel = 1000000000 }  # optional; defaults memory 256 MiB, timeout 30s, no fuel

[sink]
kind = "files"                            # files | console | plugin | memory
path = "out/revenue"                      # files: required
format = "parquet"                        # files: json | csv | parquet (default parquet)
"#;

/// A folder holding the plugin files the example refers to.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for plugin in [
        "plugins/filter_rows.wasm",
        "plugins/normalize_status.wasm",
        "sinks/jsonl_sink.wasm",
    ] {
        let path = dir.path().join(plugin);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"\0asm").unwrap();
    }
    // Granted folders must exist.
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    dir
}

fn parse_in(dir: &Path, text: &str, overrides: &[&str]) -> Result<Pipeline, SpecErrors> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    parse(text, dir, "pipeline.toml", &overrides)
}

/// The problems as (path, message) pairs, for exact comparisons.
fn problems(dir: &Path, text: &str, overrides: &[&str]) -> Vec<(String, String)> {
    match parse_in(dir, text, overrides) {
        Ok(p) => panic!("expected problems, got {p:#?}"),
        Err(e) => e
            .problems
            .into_iter()
            .map(|p| (p.path, p.message))
            .collect(),
    }
}

fn paths(list: &[(String, String)]) -> Vec<&str> {
    list.iter().map(|(p, _)| p.as_str()).collect()
}

fn files_source(p: &Pipeline) -> &FilesSourceSpec {
    let SourceKind::Files(files) = &p.sources[0].kind else {
        panic!("not a files source: {:?}", p.sources[0].kind)
    };
    files
}

/// A valid file with only the required keys, to which tests add or change lines.
const MINIMAL: &str = r#"
[query]
name = "q"
checkpoint = "cp"

[[source]]
name = "orders"
kind = "files"
path = "in"
format = "json"
schema = "id BIGINT"

[sink]
kind = "memory"
"#;

#[test]
fn example_round_trips_to_the_expected_pipeline() {
    let dir = workspace();
    let base = dir.path();
    let pipeline = parse_in(base, EXAMPLE, &[]).unwrap();
    let schema = parse_schema(
        "order_id BIGINT, customer_id BIGINT, status STRING, amount DECIMAL(12,2), occurred_at TIMESTAMP, session_id STRING",
    )
    .unwrap();
    let expected = Pipeline {
        query: QuerySpec {
            name: "revenue_5m".into(),
            checkpoint: base.join("checkpoints/revenue_5m"),
            trigger: Trigger::AvailableNow,
            output_mode: OutputMode::Append,
            max_batch_retries: 2,
            state_store: None,
            state_partitions: 2,
            watermark_policy: WatermarkPolicy::Min,
            threads: None,
        },
        sources: vec![SourceSpec {
            name: "orders".into(),
            kind: SourceKind::Files(FilesSourceSpec {
                path: base.join("data/orders"),
                format: InputFormat::Json,
                schema: Some(std::sync::Arc::new(schema)),
                max_files_per_trigger: NonZeroUsize::new(1),
                on_malformed: MalformedPolicy::Permissive,
                dead_letter_path: None,
            }),
            watermark: None,
        }],
        transforms: vec![TransformSpec {
            name: "keep_completed".into(),
            input: None,
            kind: TransformKind::Wasm(WasmTransformSpec {
                plugin: base.join("plugins/filter_rows.wasm"),
                config: serde_json::json!({ "column": "status", "equals": "completed" }),
                limits: PluginLimits {
                    memory_bytes: 64 << 20,
                    timeout: Duration::from_secs(10),
                    fuel: Some(1_000_000_000),
                },
                sha256: None,
                capabilities: Capabilities::default(),
            }),
        }],
        functions: vec![],
        listeners: vec![],
        tables: vec![],
        join: None,
        watermark: None,
        aggregate: None,
        deduplicate: None,
        sink: SinkSpec::Files {
            path: base.join("out/revenue"),
            format: OutputFormat::Parquet,
        },
        base_dir: base.to_path_buf(),
    };
    assert_eq!(pipeline, expected);
    let schema = files_source(&pipeline).schema.as_ref().unwrap();
    let amount = schema.field(3).clone();
    assert_eq!(amount.data_type(), &DataType::Decimal128(12, 2));
    assert_eq!(
        schema.field(4).data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
    );
}

#[test]
fn defaults_apply_when_keys_are_absent() {
    let dir = workspace();
    let text = format!("{MINIMAL}\n[[transform]]\nplugin = \"plugins/normalize_status.wasm\"\n");
    let p = parse_in(dir.path(), &text, &[]).unwrap();
    assert_eq!(p.query.trigger, Trigger::Continuous);
    assert_eq!(p.query.output_mode, OutputMode::Append);
    assert_eq!(p.query.max_batch_retries, 2);
    let files = files_source(&p);
    assert_eq!(files.on_malformed, MalformedPolicy::Permissive);
    assert_eq!(files.max_files_per_trigger, None);
    assert_eq!(files.dead_letter_path, None);
    assert_eq!(p.transforms[0].name, "normalize_status");
    assert_eq!(
        p.transforms[0].wasm().unwrap().config,
        serde_json::json!({})
    );
    assert_eq!(
        p.transforms[0].wasm().unwrap().limits,
        PluginLimits {
            memory_bytes: 256 << 20,
            timeout: Duration::from_secs(30),
            fuel: None
        }
    );
    assert_eq!(p.sink, SinkSpec::Memory);
}

#[test]
fn many_problems_are_reported_together_with_their_paths() {
    let dir = workspace();
    let text = r#"
[query]
name = "revenue 5m"
checkpoint = "cp"
trigger = "soon"
output_mode = "sometimes"
state_store = "rocksdb"

[[source]]
name = "orders"
kind = "files"
path = "in"
format = "json"
schema = "id BIGINT, amount MONEY"
max_file_per_trigger = 1
on_malformed = "dead-letter"
csv = { header = true }

[[transform]]
plugin = "plugins/filter_rows.so"

[[transform]]
plugin = "plugins/missing.wasm"
limits = { memory = "64 MB x", timeout = "forever", fuel = 0 }

[watermark]
column = "ts"
delay = "10 minutes"

[sink]
kind = "hive"
path = "t"
"#;
    let found = problems(dir.path(), text, &[]);
    let missing = dir.path().join("plugins/missing.wasm");
    let expected: Vec<(String, String)> = vec![
        ("source.orders.max_file_per_trigger", "unknown key of a files source (known keys: kind, name, path, format, schema, max_files_per_trigger, on_malformed, dead_letter_path, csv, watermark)"),
        ("query.name", "\"revenue 5m\" is not a valid name: use letters, digits, '_', '.' and '-'"),
        ("query.trigger", "\"soon\" is not a trigger: use \"available-now\", \"once\", \"real-time\" or a duration such as \"30s\""),
        ("query.output_mode", "\"sometimes\" is not an output mode: use \"append\", \"update\" or \"complete\""),
        ("source.orders.csv", "csv options apply only to format = \"csv\" (format is \"json\")"),
        ("source.orders.schema", "column 2 (\"amount\"): unknown type MONEY at character 19; known types: BIGINT (LONG), INT (INTEGER), DOUBLE, DECIMAL(p,s), STRING, BOOLEAN, TIMESTAMP, DATE"),
        ("source.orders.dead_letter_path", "required when on_malformed = \"dead-letter\": the folder for malformed rows"),
        ("transform[0].plugin", "\"plugins/filter_rows.so\" is not a Wasm component: the path must end in .wasm"),
        ("transform[1].plugin", &format!("no such file: {}", missing.display())),
        ("transform[1].limits.memory", "\"64 MB x\" is not a size: unknown unit \"MB x\"; use an integer with an optional unit B, KB, MB, GB (1000-based) or KiB, MiB, GiB (1024-based), e.g. \"64 MiB\""),
        ("transform[1].limits.timeout", "\"forever\" is not a duration: expected a number at \"forever\"; write e.g. \"30s\" or \"1h 30m\""),
        ("transform[1].limits.fuel", "must be a positive integer, not 0"),
        ("sink.kind", "\"hive\" is not a sink kind: use \"files\", \"console\", \"plugin\", \"memory\", \"kafka\", \"delta\" or \"delta-merge\""),
    ]
    .into_iter()
    .map(|(p, m)| (p.to_string(), m.to_string()))
    .collect();
    assert_eq!(found, expected);

    let err = parse_in(dir.path(), text, &[]).unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.starts_with(
            "pipeline.toml: 13 problem(s):\n  - source.orders.max_file_per_trigger: unknown key"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("\n  - sink.kind: \"hive\" is not a sink kind"),
        "{shown}"
    );
    assert_eq!(shown.lines().count(), 14);
}

#[test]
fn wrongly_typed_keys_are_reported_once_not_also_as_missing() {
    let dir = workspace();
    let text = r#"
[query]
name = 5
checkpoint = ["cp"]
max_batch_retries = "two"

[[source]]
name = "orders"
kind = "files"
path = "in"
format = "json"
schema = "id BIGINT"
csv = { header = "yes", quote = "'" }

[sink]
kind = "console"
max_rows = "many"
"#;
    let found = problems(dir.path(), text, &[]);
    assert_eq!(
        found,
        vec![
            (
                "query.checkpoint".into(),
                "invalid type: array, expected a string".into()
            ),
            (
                "query.max_batch_retries".into(),
                "invalid type: string \"two\", expected an integer".into()
            ),
            (
                "query.name".into(),
                "invalid type: integer `5`, expected a string".into()
            ),
            (
                "sink.max_rows".into(),
                "invalid type: string \"many\", expected an integer".into()
            ),
            (
                "source.orders.csv.header".into(),
                "invalid type: string \"yes\", expected a boolean".into()
            ),
            (
                "source.orders.csv.quote".into(),
                "unknown key (known keys: header, delimiter)".into()
            ),
            (
                "source.orders.csv".into(),
                "csv options apply only to format = \"csv\" (format is \"json\")".into()
            ),
        ] as Vec<(String, String)>
    );
}

#[test]
fn missing_tables_and_keys_are_named() {
    let dir = workspace();
    let found = problems(dir.path(), "[query]\n[[source]]\n[sink]\n", &[]);
    assert_eq!(
        paths(&found),
        vec![
            "query.name",
            "query.checkpoint",
            "source[0].name",
            "source[0].kind",
            "source[0].path",
            "source[0].format",
            "source[0].schema",
            "sink.kind",
        ]
    );
    assert_eq!(
        found[3].1,
        "required key is missing: use \"files\", \"kafka\" or \"delta\""
    );
    assert_eq!(
        found[5].1,
        "required key is missing: use \"json\", \"csv\" or \"parquet\""
    );
    assert_eq!(
        found[7].1,
        "required key is missing: use \"files\", \"console\", \"plugin\", \"memory\", \"kafka\", \"delta\" or \"delta-merge\""
    );

    let found = problems(dir.path(), "", &[]);
    assert_eq!(
        found,
        vec![
            ("query".into(), "required table [query] is missing".into()),
            (
                "source".into(),
                "required: one [[source]] table (none given)".into()
            ),
            ("sink".into(), "required table [sink] is missing".into()),
        ] as Vec<(String, String)>
    );
}

#[test]
fn a_single_source_table_asks_for_an_array_of_tables() {
    let dir = workspace();
    let text = MINIMAL.replace("[[source]]", "[source]");
    let found = problems(dir.path(), &text, &[]);
    assert_eq!(
        found,
        vec![(
            "source".to_string(),
            "expected an array of tables: write [[source]] for each source".to_string()
        )]
    );
}

#[test]
fn duplicate_source_names_and_unknown_kinds_are_refused() {
    let dir = workspace();
    let text = format!(
        "{MINIMAL}\n[[source]]\nname = \"orders\"\nkind = \"rate\"\n\n[[source]]\nname = \"refunds\"\nkind = \"files\"\npath = \"r\"\nformat = \"csv\"\nschema = \"id INT\"\n"
    );
    let found = problems(dir.path(), &text, &[]);
    assert_eq!(
        found,
        vec![
            ("source.orders.name".into(), "duplicate source name \"orders\" (also source number 1): source names must be unique".into()),
            ("source.orders.kind".into(), "\"rate\" is not a source kind: use \"files\", \"kafka\" or \"delta\"".into()),
        ] as Vec<(String, String)>
    );
}

#[test]
fn several_sources_are_unioned_and_must_share_their_columns() {
    let dir = workspace();
    let second = |schema: &str, on_malformed: &str| {
        format!(
            "{MINIMAL}\n[[source]]\nname = \"refunds\"\nkind = \"files\"\npath = \"r\"\nformat = \"json\"\nschema = \"{schema}\"\non_malformed = \"{on_malformed}\"\n"
        )
    };
    // The same columns: accepted, two sources in order.
    let p = parse_in(dir.path(), &second("id BIGINT", "permissive"), &[]).unwrap();
    assert_eq!(
        p.sources
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        ["orders", "refunds"]
    );
    // Other columns: refused, naming the source and the one it differs from.
    assert_eq!(
        problems(dir.path(), &second("id INT", "permissive"), &[]),
        vec![(
            "source.refunds.schema".to_string(),
            "differs from the schema of source orders: the sources of a query are unioned and must have the same columns".to_string()
        )]
    );
    assert_eq!(
        paths(&problems(dir.path(), &second("id BIGINT", "drop"), &[])),
        ["source.refunds.on_malformed"]
    );
}

#[test]
fn csv_options_and_malformed_modes() {
    let dir = workspace();
    let text = MINIMAL
        .replace("format = \"json\"", "format = \"csv\"\ncsv = { header = true, delimiter = \"\\t\" }\non_malformed = \"dead-letter\"\ndead_letter_path = \"/var/dead\"");
    let p = parse_in(dir.path(), &text, &[]).unwrap();
    let files = files_source(&p);
    assert_eq!(
        files.format,
        InputFormat::Csv {
            header: true,
            delimiter: b'\t'
        }
    );
    assert_eq!(files.on_malformed, MalformedPolicy::DeadLetter);
    assert_eq!(
        files.dead_letter_path.as_deref(),
        Some(Path::new("/var/dead"))
    );

    // CSV without options: Spark's defaults.
    let text = MINIMAL.replace(
        "format = \"json\"",
        "format = \"csv\"\non_malformed = \"drop\"",
    );
    let p = parse_in(dir.path(), &text, &[]).unwrap();
    assert_eq!(
        files_source(&p).format,
        InputFormat::Csv {
            header: false,
            delimiter: b','
        }
    );
    assert_eq!(files_source(&p).on_malformed, MalformedPolicy::Drop);

    let text = MINIMAL.replace(
        "format = \"json\"",
        "format = \"avro\"\non_malformed = \"ignore\"\ndead_letter_path = \"d\"\ncsv = { delimiter = \";;\" }",
    );
    let found = problems(dir.path(), &text, &[]);
    assert_eq!(
        found,
        vec![
            ("source.orders.format".into(), "\"avro\" is not a file format: use \"json\", \"csv\" or \"parquet\"".into()),
            ("source.orders.on_malformed".into(), "\"ignore\" is not an on_malformed mode: use \"permissive\", \"drop\", \"fail\" or \"dead-letter\"".into()),
        ] as Vec<(String, String)>
    );

    let text = MINIMAL.replace(
        "format = \"json\"",
        "format = \"csv\"\non_malformed = \"fail\"\ndead_letter_path = \"d\"\ncsv = { delimiter = \";;\" }\nmax_files_per_trigger = -3",
    );
    let found = problems(dir.path(), &text, &[]);
    assert_eq!(
        found,
        vec![
            ("source.orders.csv.delimiter".into(), "\";;\" is not a delimiter: use one ASCII character other than a quote or a line break, such as \",\", \";\" or \"\\t\"".into()),
            ("source.orders.max_files_per_trigger".into(), "must be a positive integer, not -3".into()),
            ("source.orders.dead_letter_path".into(), "only used with on_malformed = \"dead-letter\" (on_malformed is \"fail\"); remove it or set on_malformed = \"dead-letter\"".into()),
        ] as Vec<(String, String)>
    );
}

#[test]
fn triggers_and_output_modes() {
    let dir = workspace();
    let with = |extra: &str| {
        MINIMAL.replace(
            "checkpoint = \"cp\"",
            &format!("checkpoint = \"cp\"\n{extra}"),
        )
    };
    let trigger = |extra: &str| parse_in(dir.path(), &with(extra), &[]).map(|p| p.query.trigger);
    assert_eq!(trigger("trigger = \"once\"").unwrap(), Trigger::Once);
    assert_eq!(
        trigger("trigger = \"available-now\"").unwrap(),
        Trigger::AvailableNow
    );
    assert_eq!(
        trigger("trigger = \"1h 30m\"").unwrap(),
        Trigger::ProcessingTime(Duration::from_secs(5400))
    );
    assert_eq!(
        trigger("trigger = \"500ms\"").unwrap(),
        Trigger::ProcessingTime(Duration::from_millis(500))
    );
    let found = problems(dir.path(), &with("trigger = \"30 parsecs\""), &[]);
    assert_eq!(
        found[0].1,
        "\"30 parsecs\" is not a trigger: use \"available-now\", \"once\", \"real-time\" or a duration such as \"30s\" (unknown unit \"parsecs\"; use ms, s, m, h or d (or sec, min, hour, day and their plurals))"
    );
    let found = problems(dir.path(), &with("trigger = \"0s\""), &[]);
    assert_eq!(found[0].0, "query.trigger");
    assert!(found[0].1.contains("longer than zero"), "{}", found[0].1);

    let mode = |m: &str| {
        parse_in(dir.path(), &with(&format!("output_mode = \"{m}\"")), &[])
            .unwrap()
            .query
            .output_mode
    };
    assert_eq!(mode("update"), OutputMode::Update);
    // Complete mode repeats an aggregation's result: refused without one.
    let found = problems(dir.path(), &with("output_mode = \"complete\""), &[]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "query.output_mode");
    assert!(
        found[0].1.contains("only for queries with an [aggregate]"),
        "{found:?}"
    );
    let retries = parse_in(dir.path(), &with("max_batch_retries = 0"), &[]).unwrap();
    assert_eq!(retries.query.max_batch_retries, 0);
    let found = problems(dir.path(), &with("max_batch_retries = -1"), &[]);
    assert_eq!(
        found,
        vec![(
            "query.max_batch_retries".to_string(),
            "-1 is not a retry count: use 0 or a positive integer".to_string()
        )]
    );
    let threads = |n: &str| parse_in(dir.path(), &with(&format!("threads = {n}")), &[]);
    assert_eq!(threads("1").unwrap().query.threads, NonZeroUsize::new(1));
    assert_eq!(
        parse_in(dir.path(), &with(""), &[]).unwrap().query.threads,
        None
    );
    for n in ["0", "-2", "1025"] {
        let found = problems(dir.path(), &with(&format!("threads = {n}")), &[]);
        assert_eq!(
            found,
            vec![(
                "query.threads".to_string(),
                format!("{n} is not a thread count: use 1 to 1024")
            )]
        );
    }
}

#[test]
fn sink_kinds_and_their_keys() {
    let dir = workspace();
    let with_sink = |sink: &str| MINIMAL.replace("[sink]\nkind = \"memory\"\n", sink);

    let p = parse_in(dir.path(), &with_sink("[sink]\nkind = \"console\"\n"), &[]).unwrap();
    assert_eq!(p.sink, SinkSpec::Console { max_rows: 20 });
    let p = parse_in(
        dir.path(),
        &with_sink("[sink]\nkind = \"console\"\nmax_rows = 5\n"),
        &[],
    )
    .unwrap();
    assert_eq!(p.sink, SinkSpec::Console { max_rows: 5 });
    let p = parse_in(
        dir.path(),
        &with_sink("[sink]\nkind = \"files\"\npath = \"out\"\nformat = \"csv\"\n"),
        &[],
    )
    .unwrap();
    assert_eq!(
        p.sink,
        SinkSpec::Files {
            path: dir.path().join("out"),
            format: OutputFormat::Csv
        }
    );

    let found = problems(
        dir.path(),
        &with_sink("[sink]\nkind = \"files\"\nformat = \"avro\"\nmax_rows = 3\n"),
        &[],
    );
    assert_eq!(
        found,
        vec![
            (
                "sink.max_rows".into(),
                "unknown key of a files sink (known keys: kind, path, format); it is a key of console sinks".into()
            ),
            ("sink.path".into(), "required key is missing".into()),
            (
                "sink.format".into(),
                "\"avro\" is not a files sink format: use \"json\", \"csv\" or \"parquet\"".into()
            ),
        ] as Vec<(String, String)>
    );
    let found = problems(
        dir.path(),
        &with_sink("[sink]\nkind = \"memory\"\npath = \"x\"\n"),
        &[],
    );
    assert_eq!(
        found,
        vec![(
            "sink.path".to_string(),
            "unknown key of a memory sink (known keys: kind); it is a key of files, delta and delta-merge sinks".to_string()
        )]
    );
    let found = problems(
        dir.path(),
        &with_sink("[sink]\nkind = \"plugin\"\nconfig = { a = 1 }\n"),
        &[],
    );
    assert_eq!(
        found,
        vec![(
            "sink.plugin".to_string(),
            "required key is missing: the path of a .wasm component".to_string()
        )]
    );
}

#[test]
fn plugin_sink_with_capabilities_limits_and_config() {
    let dir = workspace();
    let sink = r#"[sink]
kind = "plugin"
plugin = "sinks/jsonl_sink.wasm"
config = { prefix = "batch", nested = { list = [1, 2.5, true, "x"] }, when = 2024-01-02T03:04:05Z }
limits = { memory = 1048576, timeout = "1 minute" }
capabilities = { dirs = [ { host = "out", guest = "/out", writable = true }, { host = "/etc/ref", guest = "/ref" } ], env = ["API_TOKEN"], http = ["127.0.0.1:8080", "API.example.com"] }
"#;
    // An absolute grant: a folder outside the pipeline's.
    let reference = tempfile::tempdir().unwrap();
    let sink = sink.replace("/etc/ref", &reference.path().display().to_string());
    let text = MINIMAL.replace("[sink]\nkind = \"memory\"\n", &sink);
    let p = parse_in(dir.path(), &text, &[]).unwrap();
    let expected = SinkSpec::Plugin(PluginSinkSpec {
        name: "jsonl_sink".into(),
        plugin: dir.path().join("sinks/jsonl_sink.wasm"),
        config: serde_json::json!({
            "prefix": "batch",
            "nested": { "list": [1, 2.5, true, "x"] },
            "when": "2024-01-02T03:04:05Z"
        }),
        limits: PluginLimits {
            memory_bytes: 1_048_576,
            timeout: Duration::from_secs(60),
            fuel: None,
        },
        capabilities: Capabilities {
            dirs: vec![
                DirGrant {
                    host: dir.path().join("out"),
                    guest: "/out".into(),
                    writable: true,
                },
                DirGrant {
                    host: reference.path().to_path_buf(),
                    guest: "/ref".into(),
                    writable: false,
                },
            ],
            env: vec!["API_TOKEN".into()],
            http: vec![
                HttpGrant {
                    host: "127.0.0.1".into(),
                    port: Some(8080),
                },
                HttpGrant {
                    host: "api.example.com".into(),
                    port: None,
                },
            ],
            delta_merge: std::collections::BTreeMap::new(),
        },
        sha256: None,
    });
    assert_eq!(p.sink, expected);

    let bad = r#"[sink]
kind = "plugin"
name = ""
plugin = "sinks"
config = { x = nan }
limits = { memory = "5 GiB", timeout = "0s", extra = 1 }
capabilities = { dirs = [ { host = "out", guest = "out" }, { guest = "/a" }, { host = "b", guest = "/a", mode = "rw" } ], http = ["http://x", "x:0"], env = ["A=B", "C", "C"], net = true }
"#;
    std::fs::create_dir_all(dir.path().join("sinks.wasm")).unwrap();
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    let text = MINIMAL.replace(
        "[sink]\nkind = \"memory\"\n",
        &bad.replace("\"sinks\"", "\"sinks.wasm\""),
    );
    let found = problems(dir.path(), &text, &[]);
    assert_eq!(
        found,
        vec![
            (
                "sink.capabilities.dirs[2].mode".into(),
                "unknown key (known keys: host, guest, writable)".into()
            ),
            (
                "sink.capabilities.net".into(),
                "unknown key (known keys: dirs, env, http, delta_merge)".into()
            ),
            (
                "sink.limits.extra".into(),
                "unknown key (known keys: memory, timeout, fuel)".into()
            ),
            (
                "sink.name".into(),
                "must not be empty (leave it out to use the plugin's file name)".into()
            ),
            (
                "sink.plugin".into(),
                format!(
                    "{} is a folder, not a .wasm file",
                    dir.path().join("sinks.wasm").display()
                )
            ),
            (
                "sink.config.x".into(),
                "NaN cannot be handed to a plugin as JSON: use a finite number".into()
            ),
            (
                "sink.limits.memory".into(),
                "5 GiB is more than a 32-bit Wasm memory can hold: use at most 4 GiB".into()
            ),
            (
                "sink.limits.timeout".into(),
                "must be longer than zero".into()
            ),
            (
                "sink.capabilities.dirs[0].guest".into(),
                "\"out\" is not an absolute guest path: write it as \"/out\"".into()
            ),
            (
                "sink.capabilities.dirs[1].host".into(),
                "required key is missing".into()
            ),
            (
                "sink.capabilities.dirs[2].guest".into(),
                "\"/a\" is granted twice (also dirs[1])".into()
            ),
            (
                "sink.capabilities.env[0]".into(),
                "\"A=B\" is not an environment variable name".into()
            ),
            (
                "sink.capabilities.env[2]".into(),
                "\"C\" is granted twice (also env[1])".into()
            ),
            (
                "sink.capabilities.http[0]".into(),
                "\"http://x\" is not a host to allow: write the host without a scheme, e.g. \"api.example.com:8080\"".into()
            ),
            (
                "sink.capabilities.http[1]".into(),
                "\"x:0\" is not a host to allow: the port must be a number from 1 to 65535".into()
            ),
        ] as Vec<(String, String)>
    );
}

#[test]
fn overrides_change_keys_before_validation() {
    let dir = workspace();
    let p = parse_in(
        dir.path(),
        EXAMPLE,
        &[
            "source.orders.path=/data/elsewhere",
            "query.trigger=30s",
            "source.orders.max_files_per_trigger=10",
            "transform.keep_completed.config.equals=\"cancelled\"",
            "transform.0.limits.fuel=5",
            "sink.format=json",
        ],
    )
    .unwrap();
    assert_eq!(files_source(&p).path, Path::new("/data/elsewhere"));
    assert_eq!(
        p.query.trigger,
        Trigger::ProcessingTime(Duration::from_secs(30))
    );
    assert_eq!(
        files_source(&p).max_files_per_trigger,
        NonZeroUsize::new(10)
    );
    assert_eq!(
        p.transforms[0].wasm().unwrap().config["equals"],
        "cancelled"
    );
    assert_eq!(p.transforms[0].wasm().unwrap().limits.fuel, Some(5));
    assert_eq!(
        p.sink,
        SinkSpec::Files {
            path: dir.path().join("out/revenue"),
            format: OutputFormat::Json
        }
    );

    // A missing intermediate table is created; the value then validates like any other.
    let text = MINIMAL.replace(
        "kind = \"memory\"",
        "kind = \"plugin\"\nplugin = \"sinks/jsonl_sink.wasm\"",
    );
    let p = parse_in(
        dir.path(),
        &text,
        &[
            "sink.config.dir={ path = \"/out\" }",
            "sink.limits.memory=64 MiB",
        ],
    )
    .unwrap();
    let SinkSpec::Plugin(sink) = &p.sink else {
        panic!("not a plugin sink")
    };
    assert_eq!(
        sink.config,
        serde_json::json!({ "dir": { "path": "/out" } })
    );
    assert_eq!(sink.limits.memory_bytes, 64 << 20);

    // Bad overrides and the problems they cause are all reported.
    let found = problems(
        dir.path(),
        EXAMPLE,
        &[
            "source.refunds.path=x",
            "trigger",
            "query.trigger=soon",
            "query.colour=blue",
        ],
    );
    assert_eq!(
        found,
        vec![
            ("--set source.refunds.path".into(), "no [[source]] named \"refunds\" (known: orders)".into()),
            ("--set trigger".into(), "expected KEY=VALUE, e.g. --set source.orders.path=data/in".into()),
            ("query.colour".into(), "unknown key (known keys: name, checkpoint, trigger, output_mode, max_batch_retries, state_store, state_partitions, watermark_policy, threads)".into()),
            ("query.trigger".into(), "\"soon\" is not a trigger: use \"available-now\", \"once\", \"real-time\" or a duration such as \"30s\"".into()),
        ] as Vec<(String, String)>
    );
}

#[test]
fn relative_paths_resolve_against_the_file_folder() {
    let dir = workspace();
    let folder = dir.path().join("pipelines");
    std::fs::create_dir_all(folder.join("plugins")).unwrap();
    std::fs::write(folder.join("plugins/filter_rows.wasm"), b"\0asm").unwrap();
    let file = folder.join("revenue.toml");
    let text = EXAMPLE
        .replace("path = \"data/orders\"", "path = \"/abs/orders\"")
        .replace(
            "on_malformed = \"permissive\"",
            "on_malformed = \"dead-letter\"\ndead_letter_path = \"../dead\"",
        );
    std::fs::write(&file, text).unwrap();
    let p = load(&file, &[]).unwrap();
    assert_eq!(p.base_dir, folder);
    assert_eq!(p.query.checkpoint, folder.join("checkpoints/revenue_5m"));
    let files = files_source(&p);
    assert_eq!(files.path, Path::new("/abs/orders"));
    assert_eq!(files.dead_letter_path, Some(folder.join("../dead")));
    assert_eq!(
        p.transforms[0].wasm().unwrap().plugin,
        folder.join("plugins/filter_rows.wasm")
    );
    assert_eq!(
        p.sink,
        SinkSpec::Files {
            path: folder.join("out/revenue"),
            format: OutputFormat::Parquet
        }
    );
    // The source folder need not exist yet: it was never created above.
    assert!(!folder.join("data/orders").exists());
}

#[test]
fn load_names_the_file_in_errors() {
    let dir = workspace();
    let file = dir.path().join("broken.toml");
    std::fs::write(
        &file,
        "[query]\nname = \"q\"\ncheckpoint = \"cp\"\ntrigger = [\n",
    )
    .unwrap();
    let err = load(&file, &[]).unwrap_err();
    assert_eq!(err.origin, file.display().to_string());
    assert_eq!(err.problems.len(), 1);
    assert_eq!(err.problems[0].path, "line 4, column 12");
    assert!(
        err.problems[0].message.starts_with("invalid TOML: "),
        "{:?}",
        err.problems[0]
    );
    assert!(
        err.to_string().starts_with(&format!(
            "{}: 1 problem(s):\n  - line 4, column 12: invalid TOML",
            file.display()
        )),
        "{err}"
    );

    let err = load(&dir.path().join("nope.toml"), &[]).unwrap_err();
    assert_eq!(err.problems.len(), 1);
    assert!(
        err.problems[0]
            .message
            .starts_with("cannot read the pipeline file"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("nope.toml: 1 problem(s):\n  - cannot read the pipeline file"),
        "{err}"
    );
}

#[test]
fn syntax_errors_give_line_and_column() {
    let dir = workspace();
    let err = parse_in(dir.path(), "[query]\nname = \"q\"\nname = \"r\"\n", &[]).unwrap_err();
    assert_eq!(err.problems.len(), 1);
    assert_eq!(err.problems[0].path, "line 3, column 1");
    assert!(
        err.problems[0].message.contains("duplicate key"),
        "{:?}",
        err.problems[0]
    );
    let err = parse_in(dir.path(), "[query]\nname = q\"\n", &[]).unwrap_err();
    assert_eq!(err.problems[0].path, "line 2, column 8");
}

#[test]
fn unknown_keys_list_the_known_ones_whatever_their_name() {
    let dir = workspace();
    let text = MINIMAL.replace("kind = \"memory\"", "kind = \"memory\"\nexpected_rows = 3");
    let found = problems(dir.path(), &text, &[]);
    assert_eq!(
        found,
        vec![(
            "sink.expected_rows".to_string(),
            "unknown key of a memory sink (known keys: kind)".to_string()
        )]
    );
}

const STATEFUL: &str = r#"
[query]
name = "revenue_5m"
checkpoint = "checkpoints/revenue_5m"
state_store = "memory"
state_partitions = 4
threads = 3

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "order_id BIGINT, status STRING, amount DECIMAL(12,2), occurred_at TIMESTAMP"

[watermark]
column = "occurred_at"
delay = "10 minutes"

[aggregate]
window = { column = "occurred_at", size = "5 minutes", slide = "1 minute" }
group_by = ["status"]
select = ["sum(amount) AS revenue", "count(*) AS orders"]

[sink]
kind = "console"
"#;

#[test]
fn stateful_tables_are_read() {
    let dir = workspace();
    let p = parse_in(dir.path(), STATEFUL, &[]).unwrap();
    assert_eq!(p.query.state_store, Some(StoreKind::Memory));
    assert_eq!(p.query.state_partitions, 4);
    assert_eq!(p.query.threads, NonZeroUsize::new(3));
    assert_eq!(
        p.watermark,
        Some(WatermarkSpec {
            column: "occurred_at".into(),
            delay: Duration::from_secs(600),
            idle_timeout: None
        })
    );
    let a = p.aggregate.unwrap();
    assert_eq!(
        a.window,
        Some(WindowSpec {
            column: "occurred_at".into(),
            kind: WindowKind::Sliding {
                size: Duration::from_secs(300),
                slide: Duration::from_secs(60)
            }
        })
    );
    assert_eq!(a.group_by, ["status"]);
    assert_eq!(a.select.len(), 2);
    assert!(p.deduplicate.is_none());
}

#[test]
fn stateful_problems_are_all_reported() {
    let dir = workspace();
    let text = STATEFUL
        .replace("state_store = \"memory\"", "state_store = \"redis\"")
        .replace(
            "size = \"5 minutes\", slide = \"1 minute\"",
            "size = \"5 minutes\", slide = \"9 minutes\"",
        )
        .replace("delay = \"10 minutes\"", "delay = \"ten\"")
        .replace("[sink]", "[deduplicate]\nkeys = []\n\n[sink]");
    let err = parse_in(dir.path(), &text, &[]).unwrap_err();
    let paths: Vec<&str> = err.problems.iter().map(|p| p.path.as_str()).collect();
    for expected in [
        "query.state_store",
        "watermark.delay",
        "aggregate.window.slide",
        "deduplicate.keys",
    ] {
        assert!(
            paths.contains(&expected),
            "{expected} missing from {paths:?}"
        );
    }
}

#[test]
fn spark_refused_stateful_combinations_are_reported_with_their_keys() {
    let dir = workspace();
    let mode = |m: &str| {
        STATEFUL.replace(
            "state_partitions = 4",
            &format!("state_partitions = 4\noutput_mode = \"{m}\""),
        )
    };
    let complete = parse_in(dir.path(), &mode("complete"), &[]).unwrap();
    assert_eq!(complete.query.output_mode, OutputMode::Complete);
    let no_watermark = STATEFUL.replace(
        "[watermark]\ncolumn = \"occurred_at\"\ndelay = \"10 minutes\"\n",
        "",
    );
    assert_ne!(no_watermark, STATEFUL);
    let found = problems(dir.path(), &no_watermark, &[]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "query.output_mode");
    assert!(
        found[0].1.contains("\"append\" needs a [watermark]"),
        "{found:?}"
    );
    assert!(
        parse_in(
            dir.path(),
            &no_watermark.replace("state_partitions = 4", "output_mode = \"update\""),
            &[]
        )
        .is_ok()
    );

    let sessions = mode("update").replace(
        "size = \"5 minutes\", slide = \"1 minute\"",
        "gap = \"5 minutes\"",
    );
    let found = problems(dir.path(), &sessions, &[]);
    assert_eq!(
        found.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
        ["aggregate.window.gap"]
    );
    let found = problems(
        dir.path(),
        &sessions.replace("group_by = [\"status\"]", "group_by = []"),
        &[],
    );
    assert_eq!(
        found.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
        ["aggregate.window.gap", "aggregate.group_by"]
    );

    // Without a window the watermark column must be a key in append mode.
    let no_window = STATEFUL.replace(
        "window = { column = \"occurred_at\", size = \"5 minutes\", slide = \"1 minute\" }\n",
        "",
    );
    let found = problems(dir.path(), &no_window, &[]);
    assert_eq!(found[0].0, "query.output_mode");
    assert!(
        found[0]
            .1
            .contains("to be the window column or a group_by key"),
        "{found:?}"
    );
    assert!(
        parse_in(
            dir.path(),
            &no_window.replace("[\"status\"]", "[\"status\", \"Occurred_At\"]"),
            &[]
        )
        .is_ok()
    );
}

#[test]
fn delta_sink_keys_are_typed_and_checked() {
    let dir = workspace();
    let with_sink = |sink: &str| MINIMAL.replace("[sink]\nkind = \"memory\"\n", sink);
    let p = parse_in(
        dir.path(),
        &with_sink("[sink]\nkind = \"delta\"\npath = \"t\"\n"),
        &[],
    )
    .unwrap();
    assert_eq!(
        p.sink,
        SinkSpec::Delta(DeltaSinkSpec {
            path: dir.path().join("t"),
            partition_by: Vec::new(),
            target_file_size: DEFAULT_DELTA_TARGET_FILE_SIZE,
            commit_every: CommitEvery::Batches(std::num::NonZeroU64::new(1).unwrap()),
        })
    );
    let p = parse_in(
        dir.path(),
        &with_sink(
            "[sink]\nkind = \"delta\"\npath = \"t\"\npartition_by = [\"status\"]\ntarget_file_size = \"8 MiB\"\ncommit_every = \"30s\"\n",
        ),
        &[],
    )
    .unwrap();
    assert_eq!(
        p.sink,
        SinkSpec::Delta(DeltaSinkSpec {
            path: dir.path().join("t"),
            partition_by: vec!["status".into()],
            target_file_size: 8 << 20,
            commit_every: CommitEvery::Interval(Duration::from_secs(30)),
        })
    );
    let p = parse_in(
        dir.path(),
        &with_sink("[sink]\nkind = \"delta\"\npath = \"t\"\ncommit_every = 5\n"),
        &[],
    )
    .unwrap();
    let SinkSpec::Delta(d) = &p.sink else {
        panic!("{:?}", p.sink)
    };
    assert_eq!(
        d.commit_every,
        CommitEvery::Batches(std::num::NonZeroU64::new(5).unwrap())
    );

    let found = problems(
        dir.path(),
        &with_sink(
            "[sink]\nkind = \"delta\"\nformat = \"json\"\npartition_by = [\"a\", \"a\"]\ntarget_file_size = \"big\"\ncommit_every = 0\n",
        ),
        &[],
    );
    assert_eq!(
        found,
        vec![
            ("sink.format".into(), "unknown key of a delta sink (known keys: kind, path, partition_by, target_file_size, commit_every); it is a key of files sinks".into()),
            ("sink.path".into(), "required key is missing".into()),
            ("sink.partition_by[1]".into(), "column \"a\" is listed twice".into()),
            ("sink.target_file_size".into(), "\"big\" is not a size: use an integer with an optional unit B, KB, MB, GB (1000-based) or KiB, MiB, GiB (1024-based), e.g. \"64 MiB\"".into()),
            ("sink.commit_every".into(), "must be a positive integer, not 0".into()),
        ] as Vec<(String, String)>
    );
    // Files keys on a delta sink... and delta keys on a files sink.
    let found = problems(
        dir.path(),
        &with_sink("[sink]\nkind = \"files\"\npath = \"o\"\ncommit_every = 2\n"),
        &[],
    );
    assert_eq!(
        found,
        vec![(
            "sink.commit_every".to_string(),
            "unknown key of a files sink (known keys: kind, path, format); it is a key of delta sinks".to_string()
        )]
    );
}

#[test]
fn delta_merge_sink_and_capability_keys_are_typed_and_checked() {
    let dir = workspace();
    let with_sink = |sink: &str| {
        MINIMAL
            .replace(
                "schema = \"id BIGINT\"",
                "schema = \"order_id BIGINT, status STRING, occurred_at TIMESTAMP\"",
            )
            .replace("[sink]\nkind = \"memory\"\n", sink)
    };
    let p = parse_in(
        dir.path(),
        &with_sink(
            "[sink]\nkind = \"delta-merge\"\npath = \"t\"\nkeys = [\"order_id\"]\nwhen_matched_update = \"s.occurred_at > t.occurred_at\"\ndedup = \"latest-by:occurred_at\"\n",
        ),
        &[],
    )
    .unwrap();
    assert_eq!(
        p.sink,
        SinkSpec::DeltaMerge(MergeTableSpec {
            path: dir.path().join("t"),
            keys: vec!["order_id".into()],
            when_matched_delete: None,
            when_matched_update: Some(
                parse_condition("s.occurred_at > t.occurred_at", Sides::Both).unwrap()
            ),
            when_not_matched_insert: None,
            dedup: MergeDedup::LatestBy("occurred_at".into()),
            target_file_size: DEFAULT_DELTA_TARGET_FILE_SIZE,
        })
    );
    let found = problems(
        dir.path(),
        &with_sink(
            "[sink]\nkind = \"delta-merge\"\nkeys = [\"id\", \"id\"]\nwhen_matched_update = \"s.at > x.at\"\ndedup = \"first\"\ncommit_every = 2\n",
        ),
        &[],
    );
    assert_eq!(
        found,
        vec![
            ("sink.commit_every".into(), "unknown key of a delta-merge sink (known keys: kind, path, keys, when_matched_update, when_matched_delete, when_not_matched_insert, dedup, target_file_size); it is a key of delta sinks".into()),
            ("sink.path".into(), "required key is missing".into()),
            ("sink.keys[1]".into(), "column \"id\" is listed twice".into()),
            ("sink.when_matched_update".into(), "\"s.at > x.at\": x.at: x is neither s (the batch's row) nor t (the table's row of the same key)".into()),
            ("sink.dedup".into(), "\"first\" is not a dedup policy: use \"none\" or \"latest-by:<column>\"".into()),
        ] as Vec<(String, String)>
    );

    // Keys and conditions are checked against the rows the sink is given, when the file says
    // what they are.
    let found = problems(
        dir.path(),
        &with_sink(
            "[sink]\nkind = \"delta-merge\"\npath = \"t\"\nkeys = [\"id\"]\nwhen_matched_delete = \"s.stauts = 'void'\"\nwhen_not_matched_insert = \"s.status\"\n",
        ),
        &[],
    );
    assert_eq!(
        found,
        vec![
            ("sink.keys[0]".into(), "\"id\" is not a column of the rows the sink is given (order_id, status, occurred_at, _corrupt_record)".into()),
            ("sink.when_matched_delete".into(), "\"s.stauts = 'void'\": no column \"s.stauts\" (did you mean s.status?); the columns are s.order_id, s.status, s.occurred_at, s._corrupt_record".into()),
            ("sink.when_not_matched_insert".into(), "\"s.status\": the condition \"s.status\" is a Utf8 value, not a condition (BOOLEAN)".into()),
        ] as Vec<(String, String)>,
        "{found:#?}"
    );

    // The same keys as a capability of a plugin sink, one table per name.
    let plugin = "[sink]\nkind = \"plugin\"\nplugin = \"sinks/jsonl_sink.wasm\"\n";
    let p = parse_in(
        dir.path(),
        &with_sink(&format!(
            "{plugin}[sink.capabilities.delta_merge.orders]\npath = \"tables/orders\"\nkeys = [\"order_id\", \"region\"]\n"
        )),
        &[],
    )
    .unwrap();
    let SinkSpec::Plugin(spec) = &p.sink else {
        panic!("{:?}", p.sink)
    };
    let orders = &spec.capabilities.delta_merge["orders"];
    assert_eq!(orders.path, dir.path().join("tables/orders"));
    assert_eq!(orders.keys, vec!["order_id".to_string(), "region".into()]);
    assert_eq!(orders.when_matched_update, None);
    assert_eq!(orders.dedup, MergeDedup::Refuse);
    let found = problems(
        dir.path(),
        &with_sink(&format!(
            "{plugin}[sink.capabilities.delta_merge.orders]\nkeys = []\nwhen_matched_update = \"a > t.a\"\nwhen_not_matched_insert = \"t.a > 0\"\n"
        )),
        &[],
    );
    assert_eq!(
        found,
        vec![
            ("sink.capabilities.delta_merge.orders.path".into(), "required key is missing".into()),
            ("sink.capabilities.delta_merge.orders.keys".into(), "must name at least one column".into()),
            ("sink.capabilities.delta_merge.orders.when_matched_update".into(), "\"a > t.a\": the column a is not qualified: write s.a for the batch's row or t.a for the table's".into()),
            ("sink.capabilities.delta_merge.orders.when_not_matched_insert".into(), "\"t.a > 0\": t.a (an inserted row has no table row; use s. columns) is not supported in a MERGE condition: it compares one row of the batch (s.) with the table's row of the same key (t.)".into()),
        ] as Vec<(String, String)>
    );
}

#[test]
fn warnings_name_the_state_that_can_only_grow() {
    let dir = workspace();
    let p = parse_in(dir.path(), STATEFUL, &[]).unwrap();
    assert!(stateful_warnings(&p).is_empty());
    let mut complete = p.clone();
    complete.query.output_mode = OutputMode::Complete;
    let w = stateful_warnings(&complete);
    assert_eq!(w.len(), 1);
    assert!(w[0].contains("\"complete\" keeps every group"), "{w:?}");
    let mut by_order = p.clone();
    by_order.aggregate = None;
    by_order.deduplicate = Some(DeduplicateSpec {
        keys: vec!["order_id".into()],
        within_watermark: false,
    });
    let w = stateful_warnings(&by_order);
    assert_eq!(w.len(), 1);
    assert!(w[0].contains("deduplication keys do not include"), "{w:?}");
    by_order.deduplicate = Some(DeduplicateSpec {
        keys: vec!["order_id".into(), "occurred_at".into()],
        within_watermark: false,
    });
    assert!(stateful_warnings(&by_order).is_empty());
    by_order.watermark = None;
    assert_eq!(
        stateful_warnings(&by_order).len(),
        1,
        "no watermark, no eviction"
    );
    assert_eq!(stateful_problems(&by_order), Vec::new());
    by_order.query.output_mode = OutputMode::Complete;
    assert_eq!(stateful_problems(&by_order)[0].path, "query.output_mode");
}

#[test]
fn delta_source_takes_a_path_and_a_starting_version() {
    let dir = workspace();
    let text = MINIMAL.replace(
        "kind = \"files\"\npath = \"in\"\nformat = \"json\"\nschema = \"id BIGINT\"\n",
        "kind = \"delta\"\npath = \"bronze\"\nmax_files_per_trigger = 2\nstarting_version = 3\n",
    );
    let p = parse_in(dir.path(), &text, &[]).unwrap();
    assert_eq!(
        p.sources[0].kind,
        SourceKind::Delta(DeltaSourceSpec {
            path: dir.path().join("bronze"),
            max_files_per_trigger: NonZeroUsize::new(2),
            starting_version: Some(3),
        })
    );
    let text = MINIMAL.replace(
        "kind = \"files\"\npath = \"in\"\n",
        "kind = \"delta\"\nstarting_version = -1\n",
    );
    let found = problems(dir.path(), &text, &[]);
    let expected: Vec<(String, String)> = vec![
        ("source.orders.format".into(), "unknown key of a delta source (known keys: kind, name, path, max_files_per_trigger, starting_version, watermark; the schema is the table's); it is a key of files and kafka sources".into()),
        ("source.orders.schema".into(), "unknown key of a delta source (known keys: kind, name, path, max_files_per_trigger, starting_version, watermark; the schema is the table's); it is a key of files and kafka sources".into()),
        ("source.orders.path".into(), "required key is missing".into()),
        ("source.orders.starting_version".into(), "must be a table version (0 or more), not -1".into()),
    ];
    assert_eq!(found, expected);
    let text = MINIMAL.replace(
        "kind = \"files\"\n",
        "kind = \"files\"\nstarting_version = 1\n",
    );
    assert_eq!(
        problems(dir.path(), &text, &[]),
        vec![(
            "source.orders.starting_version".to_string(),
            "unknown key of a files source (known keys: kind, name, path, format, schema, max_files_per_trigger, on_malformed, dead_letter_path, csv, watermark); it is a key of delta sources".to_string()
        )]
    );
}

#[test]
fn a_plugin_may_pin_its_sha256_and_a_malformed_hash_is_reported_with_its_key() {
    let dir = workspace();
    let hash = "AB".repeat(32);
    let text = MINIMAL.replace(
        "[sink]\nkind = \"memory\"\n",
        &format!(
            "[[transform]]\nplugin = \"plugins/filter_rows.wasm\"\nsha256 = \"{hash}\"\n\n\
             [sink]\nkind = \"plugin\"\nplugin = \"sinks/jsonl_sink.wasm\"\nsha256 = \"{}\"\n",
            "0f".repeat(32)
        ),
    );
    let p = parse_in(dir.path(), &text, &[]).unwrap();
    assert_eq!(
        p.transforms[0].wasm().unwrap().sha256.as_deref(),
        Some(&*"ab".repeat(32))
    );
    let SinkSpec::Plugin(sink) = &p.sink else {
        panic!("expected a plugin sink, got {:?}", p.sink);
    };
    assert_eq!(sink.sha256.as_deref(), Some(&*"0f".repeat(32)));

    let bad = text
        .replace(&hash, "abc")
        .replace(&"0f".repeat(32), &"g".repeat(64));
    let found = problems(dir.path(), &bad, &[]);
    assert_eq!(found.len(), 2, "{found:?}");
    let message = |path: &str| {
        found
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    };
    assert!(
        message("transform[0].sha256")
            .starts_with("\"abc\" is not a sha256: write the 64 hex digits"),
        "{found:?}"
    );
    assert!(
        message("sink.sha256").starts_with(&format!("{:?} is not a sha256", "g".repeat(64))),
        "{found:?}"
    );

    // Only a plugin sink takes a hash.
    let stray = MINIMAL.replace(
        "kind = \"memory\"\n",
        &format!("kind = \"memory\"\nsha256 = \"{hash}\"\n"),
    );
    let found = problems(dir.path(), &stray, &[]);
    assert_eq!(
        found,
        vec![(
            "sink.sha256".to_string(),
            "unknown key of a memory sink (known keys: kind); it is a key of plugin sinks"
                .to_string()
        )]
    );
}

#[test]
fn what_weir_run_refused_at_start_is_refused_by_validation() {
    let dir = workspace();
    let delta = |mode: &str, sink: &str| {
        STATEFUL
            .replace(
                "state_partitions = 4",
                &format!("state_partitions = 4\noutput_mode = \"{mode}\""),
            )
            .replace("[sink]\nkind = \"console\"\n", sink)
    };
    // A Delta sink writes appends or the whole table, never updates.
    let found = problems(
        dir.path(),
        &delta("update", "[sink]\nkind = \"delta\"\npath = \"t\"\n"),
        &[],
    );
    assert_eq!(
        found,
        vec![(
            "query.output_mode".to_string(),
            "a delta sink takes output_mode \"append\" or \"complete\", not \"update\" (as in Spark; upserts need MERGE: use kind = \"delta-merge\")".to_string()
        )]
    );
    // Complete mode rewrites the table every batch: no commit_every other than 1.
    let found = problems(
        dir.path(),
        &delta(
            "complete",
            "[sink]\nkind = \"delta\"\npath = \"t\"\ncommit_every = \"1 minute\"\n",
        ),
        &[],
    );
    assert_eq!(
        found,
        vec![(
            "sink.commit_every".to_string(),
            "complete mode rewrites the whole table every batch, so it commits every batch; remove commit_every".to_string()
        )]
    );
    let every_batch = delta(
        "complete",
        "[sink]\nkind = \"delta\"\npath = \"t\"\ncommit_every = 1\n",
    );
    assert!(parse_in(dir.path(), &every_batch, &[]).is_ok());
    assert!(
        parse_in(
            dir.path(),
            &delta(
                "update",
                "[sink]\nkind = \"delta-merge\"\npath = \"t\"\nkeys = [\"status\"]\n"
            ),
            &[]
        )
        .is_ok()
    );

    // Aggregates the operator cannot parse, each with its index.
    let text = STATEFUL.replace(
        "select = [\"sum(amount) AS revenue\", \"count(*) AS orders\"]",
        "select = [\"sum(amount) AS revenue\", \"median(amount)\", \"sum(sum(amount))\"]",
    );
    assert_eq!(
        problems(dir.path(), &text, &[]),
        vec![
            (
                "aggregate.select[1]".to_string(),
                "aggregate \"median(amount)\": unknown function \"median\"; supported: count, sum, avg, mean, min, max, approx_count_distinct".to_string()
            ),
            (
                "aggregate.select[2]".to_string(),
                "an aggregate inside sum() is not supported in a transform: aggregates do not nest".to_string()
            ),
        ]
    );
    let many: Vec<String> = (0..256).map(|i| format!("\"count(*) AS c{i}\"")).collect();
    let text = STATEFUL.replace(
        "select = [\"sum(amount) AS revenue\", \"count(*) AS orders\"]",
        &format!("select = [{}]", many.join(", ")),
    );
    assert_eq!(
        problems(dir.path(), &text, &[]),
        vec![(
            "aggregate.select".to_string(),
            "256 aggregates; at most 255 are supported".to_string()
        )]
    );
    // An exact distinct count cannot follow sessions as they merge.
    let text = STATEFUL
        .replace(
            "size = \"5 minutes\", slide = \"1 minute\"",
            "gap = \"5 minutes\"",
        )
        .replace(
            "\"count(*) AS orders\"",
            "\"count(DISTINCT order_id) AS orders\"",
        );
    assert_eq!(
        problems(dir.path(), &text, &[]),
        vec![(
            "aggregate.select[1]".to_string(),
            "aggregate \"count(DISTINCT order_id) AS orders\": count(DISTINCT) is not supported with session windows (its values would have to move with every session merge); use approx_count_distinct".to_string()
        )]
    );
}

#[test]
fn each_kind_reads_only_its_own_keys_and_reports_all_of_them() {
    let dir = workspace();
    // A Kafka source with keys of files sources, a wrongly typed key and an unknown one.
    let text = MINIMAL.replace(
        "kind = \"files\"\npath = \"in\"\nformat = \"json\"\nschema = \"id BIGINT\"\n",
        "kind = \"kafka\"\nbootstrap_servers = \"b:1\"\nsubscribe = [\"t\"]\npath = \"in\"\n\
         fail_on_data_loss = \"no\"\ncsv = { header = true }\ncolour = \"red\"\n",
    );
    assert_eq!(
        problems(dir.path(), &text, &[]),
        vec![
            ("source.orders.colour".to_string(), "unknown key of a kafka source (known keys: kind, name, bootstrap_servers, subscribe, subscribe_pattern, starting_offsets, max_offsets_per_trigger, fail_on_data_loss, format, schema, on_malformed, dead_letter_path, watermark)".to_string()),
            ("source.orders.csv".to_string(), "unknown key of a kafka source (known keys: kind, name, bootstrap_servers, subscribe, subscribe_pattern, starting_offsets, max_offsets_per_trigger, fail_on_data_loss, format, schema, on_malformed, dead_letter_path, watermark); it is a key of files sources".to_string()),
            ("source.orders.fail_on_data_loss".to_string(), "invalid type: string \"no\", expected a boolean".to_string()),
            ("source.orders.path".to_string(), "unknown key of a kafka source (known keys: kind, name, bootstrap_servers, subscribe, subscribe_pattern, starting_offsets, max_offsets_per_trigger, fail_on_data_loss, format, schema, on_malformed, dead_letter_path, watermark); it is a key of files and delta sources".to_string()),
        ]
    );
    // A kind that is not a string is reported once, as a type, not also as missing.
    let text = MINIMAL.replace("kind = \"memory\"", "kind = 3");
    assert_eq!(
        problems(dir.path(), &text, &[]),
        vec![(
            "sink.kind".to_string(),
            "invalid type: integer `3`, expected a string".to_string()
        )]
    );
    // Problems under a kind's nested tables keep their full path.
    let text = MINIMAL.replace(
        "[sink]\nkind = \"memory\"\n",
        "[sink]\nkind = \"plugin\"\nplugin = \"sinks/jsonl_sink.wasm\"\nlimits = { memory = true, speed = 1 }\n",
    );
    let found = problems(dir.path(), &text, &[]);
    assert_eq!(
        paths(&found),
        ["sink.limits.speed", "sink.limits.memory"],
        "{found:?}"
    );
}

#[test]
fn parquet_files_sources_take_an_optional_schema() {
    let dir = workspace();
    // With a schema: columns by name, cast to it.
    let text = MINIMAL.replace("format = \"json\"", "format = \"parquet\"");
    let p = parse_in(dir.path(), &text, &[]).unwrap();
    let files = files_source(&p);
    assert_eq!(files.format, InputFormat::Parquet);
    assert_eq!(
        files
            .schema
            .as_ref()
            .map(|s| s.field(0).data_type().clone()),
        Some(DataType::Int64)
    );
    assert_eq!(files.on_malformed, MalformedPolicy::Permissive);
    assert_eq!(files.dead_letter_path, None);
    // Without: the first file's, read when the query starts.
    let text = MINIMAL.replace(
        "format = \"json\"\nschema = \"id BIGINT\"\n",
        "format = \"parquet\"\n",
    );
    let p = parse_in(dir.path(), &text, &[]).unwrap();
    assert_eq!(files_source(&p).format, InputFormat::Parquet);
    assert_eq!(files_source(&p).schema, None);
    // An explicit default policy is accepted.
    let text = MINIMAL.replace(
        "format = \"json\"",
        "format = \"parquet\"\non_malformed = \"permissive\"",
    );
    parse_in(dir.path(), &text, &[]).unwrap();
    // CSV options and the handling of malformed rows do not apply.
    let text = MINIMAL.replace(
        "format = \"json\"",
        "format = \"parquet\"\ncsv = { header = true }\non_malformed = \"drop\"\ndead_letter_path = \"d\"",
    );
    let no_malformed_rows = "does not apply to format = \"parquet\": Parquet files have no malformed rows (a file that cannot be read fails the batch, naming it)";
    assert_eq!(
        problems(dir.path(), &text, &[]),
        vec![
            (
                "source.orders.csv".to_string(),
                "csv options apply only to format = \"csv\" (format is \"parquet\")".to_string()
            ),
            (
                "source.orders.on_malformed".to_string(),
                no_malformed_rows.to_string()
            ),
            (
                "source.orders.dead_letter_path".to_string(),
                no_malformed_rows.to_string()
            ),
        ]
    );
}
