//! A foreachBatch sink that appends rows to a JSON-lines file, exactly once per batch id even
//! when the process dies at any point: the example of an idempotent Wasm sink, with nothing but
//! the file system the host grants (a WASI preopen).
//!
//! Config: `{ "path": "/out/orders.jsonl" }`.
//!
//! # Protocol
//! Next to the data file, a sidecar `<path>.batches` holds `"<last batch id> <data length>\n"`:
//! the last batch written in full and the data file's length right after it. `write_batch(N)`:
//! 1. reads the sidecar; if `N <= last`, the batch is already in the file: skip it;
//! 2. truncates the data file to the recorded length, which drops whatever an interrupted
//!    attempt appended;
//! 3. appends every row, flushes and syncs;
//! 4. replaces the sidecar atomically (write `<path>.batches.tmp`, sync, rename).
//!
//! A crash before step 4 leaves the sidecar at the previous batch, so the replay truncates and
//! rewrites; a crash after it makes the replay a skip. Either way the file holds each batch once.
//!
//! # Row format
//! One object per row, keys in schema order, nulls omitted; timestamps RFC 3339 UTC with `Z`
//! (and 3 or 6 fractional digits when needed), dates `YYYY-MM-DD`, decimals exact at their scale
//! (`23.90`), non-finite floats as the strings `NaN`, `Infinity`, `-Infinity` (as Spark writes them).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use weir_plugin_sdk::text::{Date32Text, DecimalText, TimestampMicrosText};
use weir_plugin_sdk::{
    Batch, BatchInfo, Column, PluginError, Schema, Sink, Values, log_debug, log_info, log_warn,
};

/// The plugin's `config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The data file, inside a directory the host grants.
    pub path: PathBuf,
}

/// The sink.
#[derive(Debug)]
pub struct JsonlSink {
    path: PathBuf,
    sidecar: PathBuf,
    sidecar_tmp: PathBuf,
}

/// What the sidecar records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Progress {
    last_batch: u64,
    length: u64,
}

/// A file-system failure as a plugin error naming the file and what was being done. A missing
/// or forbidden path will not fix itself; anything else (a full disk, an I/O error) may.
fn io_error(what: &str, path: &Path, e: &io::Error) -> PluginError {
    let message = format!("jsonl_sink: {what} {}: {e}", path.display());
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => PluginError::fatal(message),
        _ => PluginError::retryable(message),
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

impl Sink for JsonlSink {
    type Config = Config;

    fn new(config: Config, _input: &Schema) -> Result<Self, PluginError> {
        let path = config.path;
        if path.file_name().is_none() {
            return Err(PluginError::invalid_config(format!(
                "jsonl_sink: path `{}` does not name a file",
                path.display()
            )));
        }
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if let Err(e) = fs::metadata(dir) {
            return Err(PluginError::invalid_config(format!(
                "jsonl_sink: directory {} of path `{}` is not accessible (is it granted?): {e}",
                dir.display(),
                path.display()
            )));
        }
        Ok(Self {
            sidecar: with_suffix(&path, ".batches"),
            sidecar_tmp: with_suffix(&path, ".batches.tmp"),
            path,
        })
    }

    fn write_batch(&mut self, batch: &Batch<'_>, info: &BatchInfo) -> Result<(), PluginError> {
        let id = info.batch_id;
        let progress = self.read_progress()?;
        if let Some(p) = progress
            && id <= p.last_batch
        {
            log_info(&format!(
                "jsonl_sink: batch {id} is already in {} (last written: {}), skipping",
                self.path.display(),
                p.last_batch
            ));
            return Ok(());
        }
        let length = progress.map_or(0, |p| p.length);

        let mut file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&self.path)
            .map_err(|e| io_error("cannot open", &self.path, &e))?;
        let actual = file
            .metadata()
            .map_err(|e| io_error("cannot stat", &self.path, &e))?
            .len();
        if actual < length {
            return Err(PluginError::fatal(format!(
                "jsonl_sink: {} has {actual} bytes but {} records {length}: the file was changed outside the sink",
                self.path.display(),
                self.sidecar.display()
            )));
        }
        if actual > length {
            log_warn(&format!(
                "jsonl_sink: dropping {} bytes of an interrupted write from {}",
                actual - length,
                self.path.display()
            ));
            file.set_len(length)
                .map_err(|e| io_error("cannot truncate", &self.path, &e))?;
        }
        file.seek(SeekFrom::Start(length))
            .map_err(|e| io_error("cannot seek in", &self.path, &e))?;

        let columns = (0..batch.schema().len())
            .map(|i| batch.column_at(i))
            .collect::<Result<Vec<_>, _>>()?;
        self.append_rows(&mut file, &columns, batch.num_rows(), id)
            .map_err(|e| io_error("cannot write", &self.path, &e))?;
        file.sync_all()
            .map_err(|e| io_error("cannot sync", &self.path, &e))?;
        let new_length = file
            .stream_position()
            .map_err(|e| io_error("cannot tell the position in", &self.path, &e))?;

        self.write_progress(Progress {
            last_batch: id,
            length: new_length,
        })
    }
}

impl JsonlSink {
    fn read_progress(&self) -> Result<Option<Progress>, PluginError> {
        let text = match fs::read_to_string(&self.sidecar) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("cannot read", &self.sidecar, &e)),
        };
        let corrupt = || {
            PluginError::fatal(format!(
                "jsonl_sink: {} is not `<batch id> <length>`: {text:?}",
                self.sidecar.display()
            ))
        };
        let (batch, length) = text.trim_end().split_once(' ').ok_or_else(corrupt)?;
        Ok(Some(Progress {
            last_batch: batch.parse().map_err(|_| corrupt())?,
            length: length.parse().map_err(|_| corrupt())?,
        }))
    }

    fn write_progress(&self, progress: Progress) -> Result<(), PluginError> {
        let tmp = &self.sidecar_tmp;
        let mut file = File::create(tmp).map_err(|e| io_error("cannot create", tmp, &e))?;
        writeln!(file, "{} {}", progress.last_batch, progress.length)
            .and_then(|()| file.sync_all())
            .map_err(|e| io_error("cannot write", tmp, &e))?;
        fs::rename(tmp, &self.sidecar).map_err(|e| io_error("cannot rename", tmp, &e))?;
        // Syncing the directory makes the rename survive a power loss; the crash model here is
        // the process dying, which the rename alone survives, and some WASI hosts cannot open a
        // directory as a file. So this is best effort and its failure is not an error.
        if let Some(dir) = self.sidecar.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(dir) = File::open(dir)
        {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    /// Appends one JSON line per row. Halfway through it flushes and logs, so that the host's
    /// crash tests can kill the process in that host call with half a batch on disk.
    fn append_rows(
        &self,
        file: &mut File,
        columns: &[Column],
        rows: usize,
        batch_id: u64,
    ) -> io::Result<()> {
        let keys: Vec<Vec<u8>> = columns
            .iter()
            .map(|c| {
                let mut key = Vec::with_capacity(c.name.len() + 3);
                write_json_string(&mut key, c.name.as_bytes())?;
                key.push(b':');
                Ok(key)
            })
            .collect::<io::Result<_>>()?;
        let mut out = BufWriter::with_capacity(64 * 1024, file);
        for row in 0..rows {
            if row == rows / 2 {
                out.flush()?;
                log_debug(&format!("jsonl_sink: wrote half of batch {batch_id}"));
            }
            out.write_all(b"{")?;
            let mut first = true;
            for (column, key) in columns.iter().zip(&keys) {
                if column.is_null(row) {
                    continue;
                }
                if !first {
                    out.write_all(b",")?;
                }
                first = false;
                out.write_all(key)?;
                write_value(&mut out, column, row)?;
            }
            out.write_all(b"}\n")?;
        }
        out.flush()
    }
}

/// Writes value `row` of `column` (not null) as JSON.
fn write_value(out: &mut impl Write, column: &Column, row: usize) -> io::Result<()> {
    match &column.values {
        Values::Boolean(b) => out.write_all(if b.get(row) { b"true" } else { b"false" }),
        Values::Int32(v) => write!(out, "{}", v[row]),
        Values::Int64(v) => write!(out, "{}", v[row]),
        Values::Float64(v) => {
            let x = v[row];
            if x.is_nan() {
                out.write_all(b"\"NaN\"")
            } else if x.is_infinite() {
                out.write_all(if x > 0.0 {
                    b"\"Infinity\""
                } else {
                    b"\"-Infinity\""
                })
            } else {
                // Debug keeps a float a float (`1.0`) and uses exponents only where JSON allows.
                write!(out, "{x:?}")
            }
        }
        Values::Decimal128(v) => {
            write!(
                out,
                "{}",
                DecimalText(v[row], column.decimal_scale().unwrap_or(0))
            )
        }
        Values::Utf8 { .. } => write_json_string(out, column.bytes(row).unwrap_or_default()),
        Values::TimestampMicros(v) => write!(out, "\"{}\"", TimestampMicrosText(v[row])),
        Values::Date32(v) => write!(out, "\"{}\"", Date32Text(v[row])),
    }
}

/// Writes UTF-8 `bytes` as a JSON string, copying runs that need no escape in one go.
fn write_json_string(out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    out.write_all(b"\"")?;
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.write_all(&bytes[run..i])?;
        if escape.is_empty() {
            write!(out, "\\u{b:04x}")?;
        } else {
            out.write_all(escape)?;
        }
        run = i + 1;
    }
    out.write_all(&bytes[run..])?;
    out.write_all(b"\"")
}

weir_plugin_sdk::export_sink!(JsonlSink);

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use weir_plugin_sdk::testing::{self, MemoryBatch, run_sink};
    use weir_plugin_sdk::{Bitmap, ErrorKind, Level};

    fn config(dir: &Path) -> String {
        format!(
            r#"{{"path": {:?}}}"#,
            dir.join("orders.jsonl").to_str().unwrap()
        )
    }

    fn orders(first_id: i64, rows: usize) -> MemoryBatch {
        let ids: Vec<i64> = (0..rows as i64).map(|i| first_id + i).collect();
        MemoryBatch::new(vec![
            Column::int64("order_id", ids.clone(), None),
            Column::utf8_from_iter(
                "status",
                ids.iter()
                    .map(|i| if i % 2 == 0 { Some("completed") } else { None }),
            ),
        ])
    }

    fn lines(dir: &Path) -> Vec<String> {
        fs::read_to_string(dir.join("orders.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn ids(dir: &Path) -> Vec<i64> {
        lines(dir)
            .iter()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["order_id"].as_i64().unwrap()
            })
            .collect()
    }

    #[test]
    fn rows_are_json_in_schema_order_without_nulls() {
        let dir = tempfile::tempdir().unwrap();
        let batch = MemoryBatch::new(vec![
            Column::int64("order_id", vec![1, 2], None),
            Column::utf8_from_iter("status", [Some("a \"quoted\"\n\u{1}é"), None]),
            Column::decimal128("amount", 12, 2, vec![2390, -5], None),
            Column::timestamp_micros(
                "occurred_at",
                vec![1_714_566_896_000_000, 1_714_566_896_123_456],
                None,
            ),
            Column::date32("day", vec![19_844, 0], None),
            Column::float64("score", vec![1.0, f64::NAN], None),
            Column::boolean(
                "paid",
                Bitmap::from_bools(&[true, false]),
                Some(Bitmap::from_bools(&[false, true])),
            ),
            Column::int32("qty", vec![3, 4], None),
        ]);
        run_sink::<JsonlSink>(&config(dir.path()), &[(BatchInfo::new(0), batch)]).unwrap();
        assert_eq!(
            lines(dir.path()),
            [
                r#"{"order_id":1,"status":"a \"quoted\"\n\u0001é","amount":23.90,"occurred_at":"2024-05-01T12:34:56Z","day":"2024-05-01","score":1.0,"qty":3}"#,
                r#"{"order_id":2,"amount":-0.05,"occurred_at":"2024-05-01T12:34:56.123456Z","day":"1970-01-01","score":"NaN","paid":false,"qty":4}"#,
            ]
        );
        for line in lines(dir.path()) {
            serde_json::from_str::<serde_json::Value>(&line).unwrap();
        }
        assert_eq!(
            fs::read_to_string(dir.path().join("orders.jsonl.batches")).unwrap(),
            format!(
                "0 {}\n",
                fs::metadata(dir.path().join("orders.jsonl")).unwrap().len()
            )
        );
    }

    #[test]
    fn a_replayed_batch_is_skipped_even_by_a_new_instance() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        run_sink::<JsonlSink>(
            &cfg,
            &[
                (BatchInfo::new(1), orders(1, 3)),
                (BatchInfo::new(2), orders(4, 2)),
            ],
        )
        .unwrap();
        testing::take_logs();
        let mut replay = BatchInfo::new(2);
        replay.attempt = 1;
        run_sink::<JsonlSink>(
            &cfg,
            &[(replay, orders(4, 2)), (BatchInfo::new(1), orders(1, 3))],
        )
        .unwrap();
        assert_eq!(ids(dir.path()), [1, 2, 3, 4, 5]);
        let logs = testing::take_logs();
        assert!(
            logs.iter()
                .any(|(l, m)| *l == Level::Info && m.contains("batch 2 is already in")),
            "{logs:?}"
        );
        run_sink::<JsonlSink>(&cfg, &[(BatchInfo::new(3), orders(6, 1))]).unwrap();
        assert_eq!(ids(dir.path()), [1, 2, 3, 4, 5, 6]);
    }

    /// Dies inside the halfway `log` host call of batch `id`, as the host's crash tests do.
    fn crash_halfway(cfg: &str, id: u64, batch: MemoryBatch) {
        testing::on_log(|_, message| {
            if message.starts_with("jsonl_sink: wrote half of batch") {
                panic!("simulated crash: {message}");
            }
        });
        let result = catch_unwind(AssertUnwindSafe(|| {
            run_sink::<JsonlSink>(cfg, &[(BatchInfo::new(id), batch)])
        }));
        testing::clear_log_hook();
        assert!(result.is_err(), "the hook did not fire");
    }

    #[test]
    fn a_crash_halfway_through_a_batch_is_repaired_by_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());

        // Batch 0 dies halfway: half its rows are on disk, the sidecar does not exist yet.
        crash_halfway(&cfg, 0, orders(1, 10));
        assert_eq!(ids(dir.path()), [1, 2, 3, 4, 5]);
        assert!(!dir.path().join("orders.jsonl.batches").exists());
        run_sink::<JsonlSink>(&cfg, &[(BatchInfo::new(0), orders(1, 10))]).unwrap();
        assert_eq!(ids(dir.path()), (1..=10).collect::<Vec<_>>());

        // Batch 1 dies halfway after batch 0 completed.
        crash_halfway(&cfg, 1, orders(11, 7));
        assert_eq!(ids(dir.path()), (1..=13).collect::<Vec<_>>());
        run_sink::<JsonlSink>(&cfg, &[(BatchInfo::new(1), orders(11, 7))]).unwrap();
        assert_eq!(ids(dir.path()), (1..=17).collect::<Vec<_>>());
    }

    #[test]
    fn a_crash_before_the_sidecar_update_is_repaired_by_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        run_sink::<JsonlSink>(&cfg, &[(BatchInfo::new(0), orders(1, 2))]).unwrap();
        // As if batch 1 was fully appended and the process died before the rename: the data
        // file is longer than recorded, and a stale temp sidecar may be left behind.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("orders.jsonl"))
            .unwrap();
        f.write_all(b"{\"order_id\":3}\n{\"order_id\":4}\n{\"order_")
            .unwrap();
        fs::write(dir.path().join("orders.jsonl.batches.tmp"), "garbage").unwrap();
        run_sink::<JsonlSink>(&cfg, &[(BatchInfo::new(1), orders(3, 2))]).unwrap();
        assert_eq!(ids(dir.path()), [1, 2, 3, 4]);
        assert!(!dir.path().join("orders.jsonl.batches.tmp").exists());
    }

    #[test]
    fn an_empty_batch_still_counts() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        run_sink::<JsonlSink>(&cfg, &[(BatchInfo::new(4), orders(1, 0))]).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("orders.jsonl.batches")).unwrap(),
            "4 0\n"
        );
        run_sink::<JsonlSink>(&cfg, &[(BatchInfo::new(4), orders(1, 3))]).unwrap();
        assert!(lines(dir.path()).is_empty());
    }

    #[test]
    fn inconsistent_files_and_bad_configs_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        run_sink::<JsonlSink>(&cfg, &[(BatchInfo::new(0), orders(1, 2))]).unwrap();
        fs::write(dir.path().join("orders.jsonl"), "").unwrap();
        let e = run_sink::<JsonlSink>(&cfg, &[(BatchInfo::new(1), orders(3, 1))]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Fatal);
        assert!(e.message.contains("orders.jsonl has 0 bytes but"), "{e}");

        fs::write(dir.path().join("orders.jsonl.batches"), "x y").unwrap();
        let e = run_sink::<JsonlSink>(&cfg, &[(BatchInfo::new(1), orders(3, 1))]).unwrap_err();
        assert!(
            e.message
                .contains("orders.jsonl.batches is not `<batch id> <length>`"),
            "{e}"
        );

        let e = run_sink::<JsonlSink>(r#"{"path": "/out/x.jsonl", "mode": 1}"#, &[]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert!(e.message.contains("unknown field `mode`"), "{e}");

        let missing = dir.path().join("no/such/dir/x.jsonl");
        let e = run_sink::<JsonlSink>(&format!(r#"{{"path": {missing:?}}}"#), &[]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert!(
            e.message.contains("is not accessible (is it granted?)"),
            "{e}"
        );
    }
}
