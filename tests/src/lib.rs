//! Shared pieces of Weir's end-to-end tests: sample data, pipeline files,
//! running the `weir` binary as a child process, and reading outputs.
//!
//! Every test works in its own temporary folder; paths come from the
//! caller, never from the working directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail, ensure};
use arrow_array::RecordBatch;
use serde_json::Value;
use weir_host::checkpoint::{CheckpointReader, Metadata};
pub use weir_host::examples::{OrdersSpec, OrdersWritten};

pub mod delta;
pub mod kafka;
pub mod serve;
pub mod tansu;

/// What plugins opened outside a query draw their random numbers from: one fixed secret, as
/// if every test instance belonged to one checkpoint (so a new instance replays a batch).
pub fn replay_key() -> weir_host::plugin::ReplayKey {
    weir_host::plugin::ReplayKey::new(&weir_host::checkpoint::QuerySecret::from_bytes([7; 32]), 0)
}

/// A scratch folder with sample orders and the example plugins in it.
#[derive(Debug)]
pub struct Workspace {
    pub dir: tempfile::TempDir,
    pub orders: OrdersWritten,
}

impl Workspace {
    /// Writes `files` × `lines` orders (1 in 100 malformed) and the plugins.
    pub fn new(files: usize, lines: usize) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let orders = weir_host::examples::write_orders(
            &dir.path().join("data/orders"),
            OrdersSpec {
                files,
                lines_per_file: lines,
                seed: 7,
                malformed_every: 100,
            },
        )?;
        weir_host::examples::write_plugins(&dir.path().join("plugins"))?;
        std::fs::write(dir.path().join("plugins/hostile.wasm"), HOSTILE_WASM)?;
        Ok(Self { dir, orders })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a pipeline file named `name` and returns its path.
    pub fn pipeline(&self, name: &str, text: &str) -> Result<PathBuf> {
        let path = self.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    }
}

/// The misbehaving plugin (`plugins/hostile`), built by this crate's build script.
pub const HOSTILE_WASM: &[u8] = include_bytes!(env!("WEIR_PLUGIN_HOSTILE"));

/// The Python example plugins (`plugins/python`), built by this crate's build script.
pub const PYTHON_FILTER_ROWS: &str = env!("WEIR_PLUGIN_PYTHON_FILTER_ROWS");
pub const PYTHON_JSONL_SINK: &str = env!("WEIR_PLUGIN_PYTHON_JSONL_SINK");
/// `count_char(s, c)` of world `scalar-function` (`plugins/python/count_char.py`).
pub const PYTHON_COUNT_CHAR: &str = env!("WEIR_PLUGIN_PYTHON_COUNT_CHAR");
/// `plugins/python/running_total.py` (world `stateful-transform`).
pub const PYTHON_RUNNING_TOTAL: &str = env!("WEIR_PLUGIN_PYTHON_RUNNING_TOTAL");
/// `plugins/python/merge_sink.py` (world `merge-sink`).
pub const PYTHON_MERGE_SINK: &str = env!("WEIR_PLUGIN_PYTHON_MERGE_SINK");
/// The JavaScript example plugins (`plugins/js`), built by this crate's build script.
pub const JS_FILTER_ROWS: &str = env!("WEIR_PLUGIN_JS_FILTER_ROWS");
pub const JS_JSONL_SINK: &str = env!("WEIR_PLUGIN_JS_JSONL_SINK");
/// `plugins/js/running_total.js` (world `stateful-transform`).
pub const JS_RUNNING_TOTAL: &str = env!("WEIR_PLUGIN_JS_RUNNING_TOTAL");
/// `plugins/js/merge_sink.js` (world `merge-sink`).
pub const JS_MERGE_SINK: &str = env!("WEIR_PLUGIN_JS_MERGE_SINK");
/// The C example plugins (`plugins/c`), built by this crate's build script with clang.
pub const C_FILTER_ROWS: &str = env!("WEIR_PLUGIN_C_FILTER_ROWS");
pub const C_JSONL_SINK: &str = env!("WEIR_PLUGIN_C_JSONL_SINK");

/// The orders schema in DDL form.
pub const SCHEMA: &str = weir_host::examples::ORDERS_SCHEMA;

/// A pipeline: orders → normalize_status → filter status = completed → `sink`.
/// `tag` separates checkpoints and outputs of several runs in one workspace.
pub fn orders_pipeline(tag: &str, on_malformed: &str, sink: &str) -> String {
    format!(
        r#"
[query]
name = "orders_{tag}"
checkpoint = "checkpoints/{tag}"
trigger = "available-now"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1
on_malformed = "{on_malformed}"

[[transform]]
name = "normalize_status"
plugin = "plugins/normalize_status.wasm"
config = {{ column = "status", lowercase = true, trim = true, map = {{ canceled = "cancelled" }} }}

[[transform]]
name = "keep_completed"
plugin = "plugins/filter_rows.wasm"
config = {{ column = "status", op = "eq", value = "completed" }}

{sink}
"#
    )
}

/// A foreachBatch sink section writing `out/<tag>/orders.jsonl` through the jsonl_sink plugin.
pub fn jsonl_plugin_sink(tag: &str) -> String {
    format!(
        r#"[sink]
kind = "plugin"
name = "jsonl_sink"
plugin = "plugins/jsonl_sink.wasm"
config = {{ path = "/out/orders.jsonl" }}
capabilities = {{ dirs = [ {{ host = "out/{tag}", guest = "/out", writable = true }} ] }}
"#
    )
}

/// Runs the `weir` binary at `exe` with `args` in no particular directory.
pub fn weir(exe: &str, cache_dir: &Path, args: &[&str]) -> Result<Output> {
    let out = Command::new(exe)
        .args(args)
        .arg("--cache-dir")
        .arg(cache_dir)
        .env_remove("WEIR_LOG")
        .output()
        .with_context(|| format!("running {exe}"))?;
    Ok(out)
}

/// Runs `weir run` with `--failpoint <failpoint>` and insists that the
/// failpoint killed it (SIGKILL), as the crash-recovery tests need.
pub fn run_killed_at(
    exe: &str,
    cache_dir: &Path,
    pipeline: &Path,
    failpoint: &str,
) -> Result<Output> {
    use std::os::unix::process::ExitStatusExt;
    let path = pipeline.to_str().context("utf-8 path")?;
    let out = weir(exe, cache_dir, &["run", path, "--failpoint", failpoint])?;
    if out.status.signal() != Some(9) {
        bail!(
            "weir run {} with failpoint {failpoint} should have been killed, but ended with {}:\n{}",
            pipeline.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// Runs `weir run` and insists on success.
pub fn run_ok(exe: &str, cache_dir: &Path, pipeline: &Path, extra: &[&str]) -> Result<Output> {
    let mut args = vec!["run", pipeline.to_str().context("utf-8 path")?];
    args.extend_from_slice(extra);
    let out = weir(exe, cache_dir, &args)?;
    if !out.status.success() {
        bail!(
            "weir run {} failed ({}):\n{}",
            pipeline.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// The lines of a text file (empty when it does not exist).
pub fn lines(path: &Path) -> Result<Vec<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The `[sink]` table of a JSON files sink writing into `out/<tag>`.
pub fn files_sink(tag: &str) -> String {
    format!("[sink]\nkind = \"files\"\npath = \"out/{tag}\"\nformat = \"json\"\n")
}

/// All lines of all JSON files of a files sink's folder, sorted (empty when
/// the folder does not exist).
pub fn sorted_output(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    if dir.exists() {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "json") {
                out.extend(lines(&path)?);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The rows the files source makes of `ws`'s orders (malformed lines
/// dropped), sorted: what a pipeline over the same orders from another
/// source must produce. Runs `files.toml` into `checkpoints/files`, `out/files`.
pub fn files_reference(ws: &Workspace, exe: &str, cache_dir: &Path) -> Result<Vec<String>> {
    let reference = ws.pipeline(
        "files.toml",
        &format!(
            "[query]\nname = \"files\"\ncheckpoint = \"checkpoints/files\"\ntrigger = \"available-now\"\n\n\
             [[source]]\nname = \"orders\"\nkind = \"files\"\npath = \"data/orders\"\nformat = \"json\"\n\
             schema = \"{SCHEMA}\"\non_malformed = \"drop\"\n\n{}",
            files_sink("files")
        ),
    )?;
    run_ok(exe, cache_dir, &reference, &[])?;
    let expected = sorted_output(&ws.path().join("out/files"))?;
    if expected.len() as u64 != ws.orders.lines - ws.orders.malformed {
        bail!(
            "the files reference made {} rows of {} valid orders",
            expected.len(),
            ws.orders.lines - ws.orders.malformed
        );
    }
    Ok(expected)
}

/// Every row of `batches` as a JSON object of all its columns, in a form that does not depend
/// on which reader typed them how: integers and booleans as themselves, strings as strings,
/// decimals as their exact text (`"12.30"`), timestamps as microseconds since the epoch and
/// dates as days since it, nulls as null. Sorted (by their JSON text), so that two outputs
/// compare as multisets of whole rows. The Python reader of [`delta`] makes the same form.
pub fn canonical_rows(batches: &[RecordBatch]) -> Result<Vec<Value>> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Date32Type, Decimal128Type, DecimalType, Float64Type, Int8Type, Int16Type, Int32Type,
        Int64Type, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
        TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
    };
    use arrow_schema::{DataType, TimeUnit};
    let mut rows = Vec::new();
    for batch in batches {
        let mut columns: Vec<(String, Vec<Value>)> = Vec::new();
        for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
            macro_rules! each {
                ($a:expr, $f:expr) => {
                    $a.iter()
                        .map(|v| v.map_or(Value::Null, $f))
                        .collect::<Vec<Value>>()
                };
            }
            let values = match field.data_type() {
                DataType::Int8 => each!(array.as_primitive::<Int8Type>(), Value::from),
                DataType::Int16 => each!(array.as_primitive::<Int16Type>(), Value::from),
                DataType::Int32 => each!(array.as_primitive::<Int32Type>(), Value::from),
                DataType::Int64 => each!(array.as_primitive::<Int64Type>(), Value::from),
                DataType::UInt8 => each!(array.as_primitive::<UInt8Type>(), Value::from),
                DataType::UInt16 => each!(array.as_primitive::<UInt16Type>(), Value::from),
                DataType::UInt32 => each!(array.as_primitive::<UInt32Type>(), Value::from),
                DataType::UInt64 => each!(array.as_primitive::<UInt64Type>(), Value::from),
                DataType::Float64 => each!(array.as_primitive::<Float64Type>(), Value::from),
                DataType::Date32 => each!(array.as_primitive::<Date32Type>(), Value::from),
                DataType::Decimal128(precision, scale) => {
                    each!(array.as_primitive::<Decimal128Type>(), |v| Value::from(
                        Decimal128Type::format_decimal(v, *precision, *scale)
                    ))
                }
                DataType::Timestamp(TimeUnit::Second, _) => {
                    each!(array.as_primitive::<TimestampSecondType>(), |v| {
                        Value::from(v * 1_000_000)
                    })
                }
                DataType::Timestamp(TimeUnit::Millisecond, _) => {
                    each!(array.as_primitive::<TimestampMillisecondType>(), |v| {
                        Value::from(v * 1_000)
                    })
                }
                DataType::Timestamp(TimeUnit::Microsecond, _) => {
                    each!(
                        array.as_primitive::<TimestampMicrosecondType>(),
                        Value::from
                    )
                }
                DataType::Timestamp(TimeUnit::Nanosecond, _) => {
                    each!(array.as_primitive::<TimestampNanosecondType>(), |v| {
                        Value::from(v.div_euclid(1_000))
                    })
                }
                DataType::Boolean => each!(array.as_boolean(), Value::from),
                DataType::Utf8 => each!(array.as_string::<i32>(), Value::from),
                DataType::LargeUtf8 => each!(array.as_string::<i64>(), Value::from),
                DataType::Utf8View => each!(array.as_string_view(), Value::from),
                other => bail!("column {}: no canonical form for {other}", field.name()),
            };
            columns.push((field.name().clone(), values));
        }
        for r in 0..batch.num_rows() {
            rows.push(Value::Object(
                columns
                    .iter()
                    .map(|(name, values)| (name.clone(), values[r].clone()))
                    .collect(),
            ));
        }
    }
    Ok(sort_rows(rows))
}

/// `rows` sorted by their JSON text: the order [`canonical_rows`] keeps.
pub fn sort_rows(rows: Vec<Value>) -> Vec<Value> {
    let mut keyed: Vec<(String, Value)> = rows.into_iter().map(|r| (r.to_string(), r)).collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    keyed.into_iter().map(|(_, r)| r).collect()
}

/// The canonical rows ([`canonical_rows`]) of JSON lines of the schema `ddl`, as a files sink
/// writes them: decoded by Weir's JSON decoder, every line well-formed.
pub fn json_rows(lines: &[String], ddl: &str) -> Result<Vec<Value>> {
    use std::sync::Arc;
    let schema = Arc::new(weir_host::spec::parse_schema(ddl).map_err(anyhow::Error::msg)?);
    let options = weir_host::decode::DecoderOptions {
        policy: weir_host::decode::MalformedPolicy::Fail,
        ..weir_host::decode::DecoderOptions::default()
    };
    let mut decoder = weir_host::decode::Decoder::new(schema, options)?;
    let mut decoded = weir_host::decode::Decoded::default();
    let mut text = lines.join("\n");
    text.push('\n');
    decoder.decode(text.as_bytes(), "reference", &mut decoded)?;
    ensure!(
        decoded.num_malformed == 0 && decoded.num_input_rows == lines.len() as u64,
        "{} of {} reference lines did not decode",
        decoded.num_malformed,
        lines.len()
    );
    canonical_rows(&decoded.batches)
}

/// Fails unless `got` and `want` (both sorted, as [`canonical_rows`] returns them) hold the
/// same rows, naming the counts and the first rows only one side has.
pub fn same_rows(got: &[Value], want: &[Value], what: &str) -> Result<()> {
    if got == want {
        return Ok(());
    }
    let key = |rows: &[Value]| -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for r in rows {
            *m.entry(r.to_string()).or_insert(0) += 1;
        }
        m
    };
    let (g, w) = (key(got), key(want));
    let only = |a: &std::collections::BTreeMap<String, usize>,
                b: &std::collections::BTreeMap<String, usize>| {
        a.iter()
            .filter(|(r, n)| b.get(*r).is_none_or(|m| m < *n))
            .map(|(r, n)| format!("  {n}x {r}"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    };
    bail!(
        "{what}: {} rows, {} expected\nfirst rows too many or unexpected:\n{}\nfirst rows missing:\n{}",
        got.len(),
        want.len(),
        only(&g, &w),
        only(&w, &g)
    )
}

/// The ids of the committed batches of the checkpoint at `checkpoint`, ascending (none when
/// the query never started), read through the checkpoint's own reader.
pub fn commit_ids(checkpoint: &Path) -> Result<Vec<u64>> {
    match CheckpointReader::open(checkpoint) {
        Ok(reader) => Ok(reader.commits().ids()?),
        Err(_) if !checkpoint.exists() => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// The ids of the planned batches (`offsets`) of the checkpoint at `checkpoint`, ascending.
pub fn offset_ids(checkpoint: &Path) -> Result<Vec<u64>> {
    match CheckpointReader::open(checkpoint) {
        Ok(reader) => Ok(reader.offsets().ids()?),
        Err(_) if !checkpoint.exists() => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// The write-ahead log entry of batch `n` (what it reads, its watermarks and timestamp).
pub fn offset_entry(checkpoint: &Path, n: u64) -> Result<Value> {
    CheckpointReader::open(checkpoint)?
        .offsets()
        .get(n)?
        .with_context(|| format!("{} has no offsets/{n}", checkpoint.display()))
}

/// Every progress record of the checkpoint at `checkpoint`, oldest first.
pub fn progress(checkpoint: &Path) -> Result<Vec<Value>> {
    Ok(CheckpointReader::open(checkpoint)?.progress()?)
}

/// The `metadata` of the checkpoint at `checkpoint` (its query id and fingerprint), read
/// through the checkpoint's own reader; an error when the query never started.
pub fn checkpoint_metadata(checkpoint: &Path) -> Result<Metadata> {
    CheckpointReader::open(checkpoint)?
        .metadata()
        .cloned()
        .with_context(|| format!("{} has no metadata", checkpoint.display()))
}

/// The id of the query whose checkpoint is at `checkpoint`.
pub fn query_id(checkpoint: &Path) -> Result<String> {
    Ok(checkpoint_metadata(checkpoint)?.id)
}

/// A decoded batch of `rows` generated orders (statuses normalised to lower case).
pub fn orders_batch(rows: usize) -> Result<RecordBatch> {
    use std::sync::Arc;
    let dir = tempfile::tempdir()?;
    weir_host::examples::write_orders(
        dir.path(),
        OrdersSpec {
            files: 1,
            lines_per_file: rows,
            seed: 3,
            malformed_every: 0,
        },
    )?;
    let schema = Arc::new(weir_host::spec::parse_schema(SCHEMA).map_err(anyhow::Error::msg)?);
    let mut decoder =
        weir_host::decode::Decoder::new(schema, weir_host::decode::DecoderOptions::default())?;
    let mut decoded = weir_host::decode::Decoded::default();
    decoder.decode(
        &std::fs::read(dir.path().join("orders-00000.json"))?,
        "orders",
        &mut decoded,
    )?;
    let batches = decoded.batches;
    Ok(arrow_select::concat::concat_batches(
        decoder.output_schema(),
        &batches,
    )?)
}
