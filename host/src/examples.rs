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

/// The customers dimension of `examples/orders_customers.toml`: ids 1..=`count` (the orders'
/// `customer_id`s are 1..=50,000), one JSON line each, in `dir/customers.json`.
///
/// # Errors
/// When the folder or file cannot be written.
pub fn write_customers(dir: &Path, count: u64) -> std::io::Result<()> {
    const COUNTRIES: [&str; 6] = ["DE", "FR", "GB", "NL", "PL", "US"];
    const TIERS: [&str; 3] = ["bronze", "silver", "gold"];
    std::fs::create_dir_all(dir)?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join("customers.json"))?);
    for id in 1..=count {
        let h = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        writeln!(
            out,
            "{{\"customer_id\":{id},\"name\":\"customer-{id}\",\"country\":\"{}\",\"tier\":\"{}\"}}",
            COUNTRIES[(h >> 32) as usize % COUNTRIES.len()],
            TIERS[(h >> 48) as usize % TIERS.len()]
        )?;
    }
    out.flush()
}

/// The clicks of `examples/clicks_orders.toml`, made from the orders in `orders` (as
/// `benches/gen_clicks.py` makes the benchmark's): about 7 in 10 orders' sessions clicked 0 to
/// 90 minutes before the order, some twice; one clicks file per orders file, in `dir`.
///
/// # Errors
/// When the orders cannot be read or the clicks written.
pub fn write_clicks(orders: &Path, dir: &Path, seed: u64) -> std::io::Result<u64> {
    std::fs::create_dir_all(dir)?;
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut files: Vec<_> = std::fs::read_dir(orders)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut click_id = 0u64;
    for (f, path) in files.iter().enumerate() {
        let text = std::fs::read_to_string(path)?;
        let mut out = std::io::BufWriter::new(std::fs::File::create(
            dir.join(format!("clicks-{f:05}.json")),
        )?);
        for line in text.lines() {
            let Ok(order) = serde_json::from_str::<serde_json::Value>(line) else {
                continue; // a malformed order line
            };
            let (Some(session), Some(at)) =
                (order["session_id"].as_str(), order["occurred_at"].as_str())
            else {
                continue;
            };
            let Ok(at_ns) = arrow_cast::parse::string_to_timestamp_nanos(at) else {
                continue;
            };
            let r = next();
            let clicks = match r % 10 {
                0..=5 => 1,
                6 => 2,
                _ => 0,
            };
            for c in 0..clicks {
                click_id += 1;
                let before_ms = ((r >> (16 + 8 * c)) % 5_400_000) as i64;
                let clicked_ms = at_ns / 1_000_000 - before_ms;
                writeln!(
                    out,
                    "{{\"click_id\":{click_id},\"session_id\":\"{session}\",\"clicked_at\":\"{}\",\"url\":\"/books/{}\"}}",
                    crate::progress::rfc3339_ms(clicked_ms),
                    (r >> 40) % 1_000
                )?;
            }
        }
        out.flush()?;
    }
    Ok(click_id)
}

/// Everything the pipelines of `examples/` read, written beside them in `dir`: the example
/// plugins (`plugins/`), orders (`data/orders`), the customers table (`data/customers`) and
/// clicks (`data/clicks`), so that each pipeline runs as written (`weir examples`).
///
/// # Errors
/// When a file cannot be written.
pub fn write_examples(dir: &Path) -> std::io::Result<OrdersWritten> {
    write_plugins(&dir.join("plugins"))?;
    let orders = dir.join("data/orders");
    // Half an hour of event time (a file per minute), so that the windows of
    // `revenue_5m.toml` close behind its 10-minute watermark.
    let written = write_orders(
        &orders,
        OrdersSpec {
            files: 30,
            lines_per_file: 1_000,
            ..OrdersSpec::default()
        },
    )?;
    write_customers(&dir.join("data/customers"), 50_000)?;
    write_clicks(&orders, &dir.join("data/clicks"), 7)?;
    // The folder `orders_foreach_batch.toml` grants its sink.
    std::fs::create_dir_all(dir.join("out"))?;
    Ok(written)
}
