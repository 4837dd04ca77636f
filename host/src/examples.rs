//! The example plugins, compiled from `plugins/` by the build and embedded,
//! plus a small generator of "bookshop orders" data: together they let
//! `weir demo`, the tests and the benchmarks run a real pipeline with no
//! files to fetch and no manual build step.

use std::io::Write;
use std::path::Path;

/// `plugins/filter_rows`: keeps rows matching a predicate on one column.
pub const FILTER_ROWS_WASM: &[u8] = include_bytes!(env!("WEIR_PLUGIN_FILTER_ROWS"));
/// `plugins/normalize_status`: lower-cases, trims and maps a string column.
pub const NORMALIZE_STATUS_WASM: &[u8] = include_bytes!(env!("WEIR_PLUGIN_NORMALIZE_STATUS"));
/// `plugins/jsonl_sink`: a foreachBatch sink appending JSON lines, idempotent by batch id.
pub const JSONL_SINK_WASM: &[u8] = include_bytes!(env!("WEIR_PLUGIN_JSONL_SINK"));
/// `plugins/running_total`: a running total per key, kept in the host's keyed state.
pub const RUNNING_TOTAL_WASM: &[u8] = include_bytes!(env!("WEIR_PLUGIN_RUNNING_TOTAL"));
/// `plugins/merge_sink`: a foreachBatch sink that MERGEs into granted Delta tables.
pub const MERGE_SINK_WASM: &[u8] = include_bytes!(env!("WEIR_PLUGIN_MERGE_SINK"));
/// `plugins/count_char`: the scalar function `count_char(s, c)` for SQL (Nexmark q14).
pub const COUNT_CHAR_WASM: &[u8] = include_bytes!(env!("WEIR_PLUGIN_COUNT_CHAR"));
/// `plugins/query_log`: the guide's example query listener (world `listener`).
pub const QUERY_LOG_WASM: &[u8] = include_bytes!(env!("WEIR_PLUGIN_QUERY_LOG"));

/// Every example plugin by file name.
pub const PLUGINS: &[(&str, &[u8])] = &[
    ("filter_rows.wasm", FILTER_ROWS_WASM),
    ("normalize_status.wasm", NORMALIZE_STATUS_WASM),
    ("jsonl_sink.wasm", JSONL_SINK_WASM),
    ("running_total.wasm", RUNNING_TOTAL_WASM),
    ("merge_sink.wasm", MERGE_SINK_WASM),
    ("count_char.wasm", COUNT_CHAR_WASM),
    ("query_log.wasm", QUERY_LOG_WASM),
];

/// Writes the example plugins into `dir`.
///
/// # Errors
/// When a file cannot be written.
pub fn write_plugins(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in PLUGINS {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}

/// The schema of the generated orders, in the pipeline file's DDL form.
pub const ORDERS_SCHEMA: &str = "order_id BIGINT, customer_id BIGINT, status STRING, amount DECIMAL(12,2), occurred_at TIMESTAMP, session_id STRING";

/// Shape of a generated data set.
#[derive(Debug, Clone, Copy)]
pub struct OrdersSpec {
    pub files: usize,
    pub lines_per_file: usize,
    pub seed: u64,
    /// One line in this many is malformed (0: none).
    pub malformed_every: usize,
}

impl Default for OrdersSpec {
    fn default() -> Self {
        Self {
            files: 5,
            lines_per_file: 2_000,
            seed: 42,
            malformed_every: 200,
        }
    }
}

/// What [`write_orders`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrdersWritten {
    pub lines: u64,
    pub malformed: u64,
    /// Valid lines per status: completed, pending, returned, cancelled.
    pub by_status: [u64; 4],
}

/// Statuses as they appear in the data, messy on purpose (for normalize_status).
const STATUS_SPELLINGS: [[&str; 3]; 4] = [
    ["completed", "Completed", " COMPLETED "],
    ["pending", "PENDING", "pending"],
    ["returned", "Returned", "returned"],
    ["cancelled", "canceled", "Cancelled"],
];

/// Writes `orders-NNNNN.json` files of JSON lines into `dir`, one minute of
/// event time per file, with modification times in file order (so that an
/// mtime-ordered source reads them in order). Deterministic for a seed.
///
/// # Errors
/// When a file cannot be written.
pub fn write_orders(dir: &Path, spec: OrdersSpec) -> std::io::Result<OrdersWritten> {
    std::fs::create_dir_all(dir)?;
    let mut rng = spec.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut written = OrdersWritten::default();
    let start_ms: i64 = 1_709_251_200_000; // 2024-03-01T00:00:00Z
    let mut order_id = 10_000_000u64;
    for f in 0..spec.files {
        let path = dir.join(format!("orders-{f:05}.json"));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
        for i in 0..spec.lines_per_file {
            order_id += 1;
            let r = next();
            let status = match r % 100 {
                0..80 => 0,
                80..90 => 1,
                90..96 => 2,
                _ => 3,
            };
            let spelling = STATUS_SPELLINGS[status][((r >> 8) % 3) as usize];
            let cents = 99 + (r >> 16) % 20_000;
            let event_ms =
                start_ms + (f as i64) * 60_000 + (i as i64 * 60_000) / spec.lines_per_file as i64
                    - ((r >> 40) % 5_000) as i64;
            let line = format!(
                "{{\"order_id\":{order_id},\"customer_id\":{},\"status\":\"{spelling}\",\"amount\":{}.{:02},\"occurred_at\":\"{}\",\"session_id\":\"s-{:016x}\"}}",
                1 + (r >> 24) % 50_000,
                cents / 100,
                cents % 100,
                crate::progress::rfc3339_ms(event_ms),
                next()
            );
            written.lines += 1;
            if spec.malformed_every > 0 && (order_id as usize).is_multiple_of(spec.malformed_every)
            {
                // A producer that died mid-write: a truncated line.
                writeln!(out, "{}", &line[..line.len() / 2])?;
                written.malformed += 1;
            } else {
                writeln!(out, "{line}")?;
                written.by_status[status] += 1;
            }
        }
        out.flush()?;
        drop(out);
        let mtime =
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000 + f as u64);
        std::fs::File::options()
            .write(true)
            .open(&path)?
            .set_modified(mtime)?;
    }
    Ok(written)
}
