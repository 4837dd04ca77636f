//! `weir-bench stateful`: the revenue and dedup queries of the reference
//! workload, Weir and Spark side by side in one run.
//!
//! Weir runs in a child process measured with `wait4` (its own CPU seconds
//! and peak RSS: it is one process). Spark runs under the reference
//! harness's `measure.py`, which samples the python + JVM process tree
//! (pyspark never waits for its JVM, so rusage would miss it). Both read the
//! same files one per micro-batch and write Parquet. Spark runs with
//! `--no-result` (its read-back of the sink would count as its CPU); instead,
//! after each Spark run this process reads Spark's Parquet output and compares
//! it with Weir's in the same run (row for row for revenue and the static join;
//! for dedup the row count and a digest of the whole rows kept). `--expect`
//! also checks Weir's result against a CSV of Spark's (the attribution join's
//! pairs, whose Spark script writes no Parquet). Spark's JVM start-up is measured once
//! (`--query startup`) so its rows per CPU-second are given both whole and
//! net of start-up.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::{flag, median};

/// One measured run of either engine.
#[derive(Debug, Clone)]
struct Run {
    wall_s: f64,
    cpu_s: f64,
    peak_rss_mb: f64,
    /// Weir only: the anonymous and file-backed MB of the largest sampled resident set.
    rss_parts_mb: (f64, f64),
    rows: u64,
    state_bytes: u64,
    /// The largest numRowsTotal of any batch.
    state_rows_max: u64,
    /// Rows the sink received over all batches.
    output_rows: u64,
    result: Vec<String>,
}

pub fn stateful(args: &[String]) -> Result<()> {
    let input = PathBuf::from(flag(args, "--input").context("--input DIR (orders-*.json)")?);
    let query = flag(args, "--query").unwrap_or_else(|| "revenue".into());
    let runs: usize = flag(args, "--runs").map_or(Ok(2), |r| r.parse())?;
    let store = flag(args, "--store").unwrap_or_else(|| "runs".into());
    // The dedup keys: one integer key (`order_id`, stored as integer sets), a
    // composite key such as `order_id,customer_id` or a string key such as
    // `session_id` (one state entry per key). Spark's side runs the same keys
    // (benches/spark_dedup.py around the reference script).
    let dedup_key_names = flag(args, "--dedup-keys").unwrap_or_else(|| "order_id".into());
    let dedup_keys: Vec<String> = dedup_key_names
        .split(',')
        .map(|k| format!("{:?}", k.trim()))
        .collect();
    let work = flag(args, "--work").map_or_else(
        || std::env::temp_dir().join(format!("weir-bench-stateful-{}", std::process::id())),
        PathBuf::from,
    );
    let spark_python = flag(args, "--spark-python");
    let spark_bench = flag(args, "--spark-bench").map(PathBuf::from);
    let expect = flag(args, "--expect").map(PathBuf::from);
    // `query.threads` (default: Weir's, the cores).
    let threads: Option<usize> = flag(args, "--threads").map(|t| t.parse()).transpose()?;
    if !matches!(query.as_str(), "revenue" | "dedup" | "join" | "attribution") {
        bail!("--query revenue|dedup|join|attribution");
    }
    // The attribution query's other stream: the clicks benches/gen_clicks.py writes for the
    // orders (default: `clicks/` beside the orders folder).
    let clicks = flag(args, "--clicks").map_or_else(
        || input.parent().unwrap_or(&input).join("clicks"),
        PathBuf::from,
    );
    if query == "attribution" && !clicks.is_dir() {
        bail!(
            "--clicks {}: no such folder (python3 benches/gen_clicks.py --orders {} --out {} --seed 42)",
            clicks.display(),
            input.display(),
            clicks.display()
        );
    }
    // The join query's static side: the customers dimension gen_orders.py writes beside the
    // orders folder.
    let customers = flag(args, "--customers").map_or_else(
        || input.parent().unwrap_or(&input).join("customers.json"),
        PathBuf::from,
    );
    if query == "join" && !customers.is_file() {
        bail!(
            "--customers {}: no such file (gen_orders.py writes customers.json beside the orders)",
            customers.display()
        );
    }
    let inputs = Inputs {
        orders: input.clone(),
        customers: customers.clone(),
        clicks,
    };
    if spark_python.is_some() != spark_bench.is_some() {
        bail!("--spark-python and --spark-bench go together");
    }
    std::fs::create_dir_all(&work)?;
    let exe = std::env::current_exe()?;
    let cache = work.join("cache");

    let mut weir = Vec::new();
    let mut spark = Vec::new();
    let spark_startup = match (&spark_python, &spark_bench) {
        (Some(py), Some(dir)) => {
            let s = spark_startup(py, dir, &work)?;
            eprintln!("spark start-up: {s:.2} CPU-s");
            Some(s)
        }
        _ => None,
    };
    for run in 1..=runs {
        let w = weir_run(
            &exe,
            &work.join(format!("r{run}")),
            &cache,
            &inputs,
            &Shape {
                query: &query,
                store: &store,
                dedup_keys: &dedup_keys,
                threads,
            },
        )?;
        eprintln!(
            "weir  run {run}: {:.2} s wall, {:.2} CPU-s, {:.0} MB peak RSS (sampled peak: {:.0} MB anonymous + {:.0} MB file-backed), {} rows, state max {} rows / {} KB on disk",
            w.wall_s,
            w.cpu_s,
            w.peak_rss_mb,
            w.rss_parts_mb.0,
            w.rss_parts_mb.1,
            w.rows,
            w.state_rows_max,
            w.state_bytes / 1024
        );
        weir.push(w);
        if let (Some(py), Some(dir)) = (&spark_python, &spark_bench) {
            let s = spark_run(py, dir, &work, &inputs, &query, &dedup_key_names, run)?;
            eprintln!(
                "spark run {run}: {:.2} s wall, {:.2} CPU-s, {:.0} MB peak RSS, {} rows",
                s.wall_s, s.cpu_s, s.peak_rss_mb, s.rows
            );
            spark.push(s);
        }
    }

    println!(
        "### {query} ({} input rows, Weir state store {store})\n",
        weir[0].rows
    );
    println!(
        "| engine | runs | wall s (median) | CPU s (median) | rows per CPU-s | peak RSS MB (max) | state on disk MB | state rows (max) | output rows |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let line = |name: &str, v: &[Run]| {
        let wall = median(v.iter().map(|r| r.wall_s).collect());
        let cpu = median(v.iter().map(|r| r.cpu_s).collect());
        let rss = v.iter().map(|r| r.peak_rss_mb).fold(0.0, f64::max);
        println!(
            "| {name} | {} | {wall:.2} | {cpu:.2} | {:.0} | {rss:.0} | {:.1} | {} | {} |",
            v.len(),
            v[0].rows as f64 / cpu,
            v[0].state_bytes as f64 / 1e6,
            v[0].state_rows_max,
            // Spark's file sink reports no numOutputRows.
            if v[0].output_rows > 0 {
                v[0].output_rows.to_string()
            } else {
                "–".to_owned()
            }
        );
        (cpu, rss)
    };
    let (weir_cpu, weir_rss) = line("Weir", &weir);
    let consistent = weir.iter().all(|w| w.result == weir[0].result);
    println!();
    println!("Weir's runs agree with each other: {consistent}");
    if let Some(path) = &expect {
        let expected = expected_rows(path)?;
        let same = expected == weir[0].result;
        println!(
            "Weir's result equals {} ({} rows): {same}",
            path.display(),
            expected.len()
        );
        if !same {
            show_difference(&expected, &weir[0].result);
        }
    }
    if let Some(startup) = spark_startup {
        let (spark_cpu, spark_rss) = line("Spark local[2]", &spark);
        let net = (spark_cpu - startup).max(f64::MIN_POSITIVE);
        let same_state = spark
            .iter()
            .all(|s| s.state_rows_max == weir[0].state_rows_max);
        let (whole_ratio, net_ratio) = (spark_cpu / weir_cpu, net / weir_cpu);
        let rss_ratio = spark_rss / weir_rss;
        println!();
        println!(
            "Weir / Spark rows per CPU-second: {whole_ratio:.1}× (Spark's whole process), {net_ratio:.1}× (Spark net of its {startup:.1} CPU-s start-up); peak RSS {rss_ratio:.1}× less"
        );
        if query != "attribution" {
            let same = spark.iter().all(|s| s.result == weir[0].result);
            let shown = |r: &[String]| match query.as_str() {
                "dedup" => r.join(", "),
                _ => format!("{} rows", r.len()),
            };
            println!(
                "Spark's result equals Weir's in every run: {same} (Weir: {}; Spark: {})",
                shown(&weir[0].result),
                spark
                    .iter()
                    .map(|s| shown(&s.result))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            if let Some(other) = spark.iter().find(|s| s.result != weir[0].result) {
                show_difference(&other.result, &weir[0].result);
            }
        }
        println!(
            "the same largest state as Spark: {same_state} (Weir {} rows, Spark {})",
            weir[0].state_rows_max,
            spark
                .iter()
                .map(|s| s.state_rows_max.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let bar = if matches!(query.as_str(), "revenue" | "join" | "attribution") {
            30.0
        } else {
            20.0
        };
        println!(
            "bars: rows per CPU-second ≥ {bar}× Spark (net): {}; peak RSS ≤ Spark / 10: {}",
            pass(net_ratio >= bar),
            pass(rss_ratio >= 10.0)
        );
    }
    Ok(())
}

fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

/// Spark's rows from its own CSV (`window_start,…` with a header), sorted.
fn expected_rows(path: &Path) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut rows: Vec<String> = text.lines().skip(1).map(str::to_owned).collect();
    rows.sort();
    Ok(rows)
}

fn show_difference(expected: &[String], got: &[String]) {
    let expected: std::collections::BTreeSet<_> = expected.iter().collect();
    let got: std::collections::BTreeSet<_> = got.iter().collect();
    for row in expected.difference(&got).take(10) {
        println!("  only Spark: {row}");
    }
    for row in got.difference(&expected).take(10) {
        println!("  only Weir:  {row}");
    }
}

/// The files a query reads.
struct Inputs {
    orders: PathBuf,
    customers: PathBuf,
    clicks: PathBuf,
}

/// The guide's attribution: clicks joined with the orders placed within an hour after them in
/// the same session, both streams with 30-minute watermarks. Each input keeps its declared
/// columns (the permissive sources' `_corrupt_record` would be on both sides; Spark's schemas
/// declare none).
fn attribution_pipeline(inputs: &Inputs, store: &str) -> String {
    format!(
        r#"[query]
name = "bench_attribution"
checkpoint = "checkpoint"
trigger = "available-now"
output_mode = "append"
state_store = "{store}"
state_partitions = 2

[[source]]
name = "clicks"
kind = "files"
path = "{clicks}"
format = "json"
schema = "click_id BIGINT, session_id STRING, clicked_at TIMESTAMP, url STRING"
max_files_per_trigger = 1
watermark = {{ column = "clicked_at", delay = "30 minutes" }}

[[source]]
name = "orders"
kind = "files"
path = "{orders}"
format = "json"
schema = "{schema}"
max_files_per_trigger = 1
watermark = {{ column = "occurred_at", delay = "30 minutes" }}

[[transform]]
name = "clicks_columns"
input = "clicks"
sql = "SELECT click_id, session_id, clicked_at, url FROM input"

[[transform]]
name = "orders_columns"
input = "orders"
sql = "SELECT order_id, customer_id, status, amount, occurred_at, session_id FROM input"

[join]
left = "clicks"
right = "orders"
type = "inner"
on = ["session_id"]
condition = "orders.occurred_at BETWEEN clicks.clicked_at AND clicks.clicked_at + INTERVAL 1 HOUR"

[sink]
kind = "files"
path = "out"
format = "parquet"
"#,
        clicks = inputs.clicks.display(),
        orders = inputs.orders.display(),
        schema = weir_host::examples::ORDERS_SCHEMA
    )
}

fn pipeline_file(inputs: &Inputs, query: &str, store: &str, dedup_keys: &[String]) -> String {
    if query == "attribution" {
        return attribution_pipeline(inputs, store);
    }
    let (input, customers) = (&inputs.orders, &inputs.customers);
    let dedup = format!("[deduplicate]\nkeys = [{}]\n", dedup_keys.join(", "));
    // Spark's `stream.join(customers, "customer_id", "left").groupBy(window, "country").count()`.
    let join = format!(
        r#"[[table]]
name = "customers"
kind = "files"
path = "{}"
format = "json"
schema = "customer_id BIGINT, name STRING, country STRING, tier STRING"

[join]
left = "orders"
right = "customers"
type = "left"
on = ["customer_id"]

[aggregate]
window = {{ column = "occurred_at", size = "5m" }}
group_by = ["country"]
select = ["count(*) AS orders"]
"#,
        customers.display()
    );
    let stateful = match query {
        "join" => &join,
        "revenue" => {
            r#"[aggregate]
window = { column = "occurred_at", size = "5m" }
group_by = ["status"]
select = ["count(*) AS orders", "sum(amount) AS revenue"]
"#
        }
        _ => &dedup,
    };
    format!(
        r#"[query]
name = "bench_{query}"
checkpoint = "checkpoint"
trigger = "available-now"
output_mode = "append"
state_store = "{store}"
state_partitions = 2

[[source]]
name = "orders"
kind = "files"
path = "{}"
format = "json"
schema = "{}"
max_files_per_trigger = 1

[watermark]
column = "occurred_at"
delay = "10m"

{stateful}
[sink]
kind = "files"
path = "out"
format = "parquet"
"#,
        input.display(),
        weir_host::examples::ORDERS_SCHEMA
    )
}

/// What Weir's pipeline runs.
struct Shape<'a> {
    query: &'a str,
    store: &'a str,
    dedup_keys: &'a [String],
    /// `query.threads`, when given.
    threads: Option<usize>,
}

fn weir_run(
    exe: &Path,
    work: &Path,
    cache: &Path,
    inputs: &Inputs,
    shape: &Shape<'_>,
) -> Result<Run> {
    let query = shape.query;
    // A fresh folder per run, nothing deleted while the benchmark runs: on
    // ext4, creating files right after deleting many makes inode allocation
    // search the recently freed ones, a cost of the machine, not the engine.
    let dir = work.join(format!("weir-{query}"));
    if dir.exists() {
        bail!("{} exists: give --work an empty folder", dir.display());
    }
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("pipeline.toml");
    let mut pipeline = pipeline_file(inputs, query, shape.store, shape.dedup_keys);
    if let Some(n) = shape.threads {
        pipeline = pipeline.replacen("[query]\n", &format!("[query]\nthreads = {n}\n"), 1);
    }
    std::fs::write(&file, pipeline)?;
    let started = Instant::now();
    let child = Command::new(exe)
        .args(["cli", "run"])
        .arg(&file)
        .arg("--cache-dir")
        .arg(cache)
        .env("WEIR_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let used = crate::wait_measured(&child, started, &format!("weir {query} run"))?;
    let progress = std::fs::read_to_string(dir.join("checkpoint").join("progress.jsonl"))?;
    let (mut rows, mut state_rows_max, mut output_rows) = (0, 0, 0);
    // The state's rows after each batch, for the plot of BENCHMARKS.md.
    let mut state_series = String::from("batch_id,input_rows,num_rows_total,watermark\n");
    for line in progress.lines() {
        let p: serde_json::Value = serde_json::from_str(line)?;
        rows += p["numInputRows"].as_u64().unwrap_or(0);
        output_rows += p["sink"]["numOutputRows"].as_u64().unwrap_or(0);
        let total = p["stateOperators"][0]["numRowsTotal"].as_u64().unwrap_or(0);
        state_rows_max = state_rows_max.max(total);
        state_series.push_str(&format!(
            "{},{},{total},{}\n",
            p["batchId"],
            p["numInputRows"],
            p["eventTime"]["watermark"].as_str().unwrap_or("")
        ));
    }
    std::fs::write(work.join(format!("{query}-state.csv")), state_series)?;
    Ok(Run {
        wall_s: used.wall.as_secs_f64(),
        cpu_s: (used.user + used.system).as_secs_f64(),
        peak_rss_mb: used.max_rss_kb as f64 / 1024.0,
        rss_parts_mb: (
            used.sampled_anon_kb as f64 / 1024.0,
            used.sampled_file_kb as f64 / 1024.0,
        ),
        rows,
        state_bytes: du(&dir.join("checkpoint").join("state"), &mut HashSet::new())?,
        state_rows_max,
        output_rows,
        result: sink_result(&dir.join("out"), query)?,
    })
}

/// Bytes of the files under `dir`, each file once however many snapshots
/// hard-link it (RocksDB checkpoints share their table files).
fn du(dir: &Path, seen: &mut HashSet<(u64, u64)>) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    if !dir.exists() {
        return Ok(0);
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            du(&entry.path(), seen)?
        } else if seen.insert((meta.dev(), meta.ino())) {
            meta.len()
        } else {
            0
        };
    }
    Ok(total)
}

/// `weir-bench sink-result --query Q DIR`: prints what [`sink_result`] compares for the sink
/// folder `DIR` of either engine (its rows, or for dedup the count and digest), so that a
/// comparison of the side-by-side run can be repeated on the folders it leaves.
pub fn print_sink_result(args: &[String]) -> Result<()> {
    let query = flag(args, "--query").context("--query revenue|dedup|join|attribution")?;
    let Some(dir) = args.last().filter(|a| !a.starts_with("--") && **a != query) else {
        bail!("sink-result --query Q DIR");
    };
    for line in sink_result(Path::new(dir), &query)? {
        println!("{line}");
    }
    Ok(())
}

/// The Parquet files of a sink's folder, sorted: Weir's `batch-*.parquet` or Spark's
/// `part-*.parquet` (Spark's `_spark_metadata` and hidden files left out).
fn sink_files(out: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(out).with_context(|| format!("reading {}", out.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_file()
            && name.ends_with(".parquet")
            && !name.starts_with('_')
            && !name.starts_with('.')
        {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The comparable result of a sink's folder, from either engine's files (Spark writes
/// timestamps as INT96, read as nanoseconds; sums at a wider decimal precision: columns are
/// cast to one type first). For revenue and the joins the sorted rows as Spark's CSV prints
/// them (`window_start,window_end,status,orders,revenue`; `…,country,orders`; `click,order`);
/// for dedup the number of rows and a digest of the multiset of whole rows (the sum of a hash
/// of each row's six columns), so a different row kept for a key shows.
pub(crate) fn sink_result(out: &Path, query: &str) -> Result<Vec<String>> {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Decimal128Type, Int64Type, TimestampMicrosecondType};
    use arrow_schema::{DataType, TimeUnit};
    use std::hash::{Hash, Hasher};
    if !matches!(query, "revenue" | "join" | "attribution" | "dedup") {
        bail!("no result to compare for query {query}");
    }
    let mut rows = Vec::new();
    let (mut count, mut digest) = (0u64, 0u64);
    for file in sink_files(out)? {
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(&file)?,
        )?
        .build()?;
        for batch in reader {
            let batch = batch?;
            count += batch.num_rows() as u64;
            // Column `name` cast to `to`.
            let col = |name: &str, to: &DataType| -> Result<arrow_array::ArrayRef> {
                let c = batch
                    .column_by_name(name)
                    .with_context(|| format!("no column {name} in {}", file.display()))?;
                arrow_cast::cast(c, to).with_context(|| format!("{name} in {}", file.display()))
            };
            let micros = DataType::Timestamp(TimeUnit::Microsecond, None);
            let (int, text, cents) = (DataType::Int64, DataType::Utf8, DataType::Decimal128(38, 2));
            let ts = |v: i64| normalise_ts(&weir_host::progress::rfc3339_ms(v.div_euclid(1000)));
            let opt = |valid: bool, v: String| if valid { v } else { String::new() };
            match query {
                "attribution" => {
                    let (click, order) = (col("click_id", &int)?, col("order_id", &int)?);
                    let (click, order) = (
                        click.as_primitive::<Int64Type>(),
                        order.as_primitive::<Int64Type>(),
                    );
                    for i in 0..batch.num_rows() {
                        rows.push(format!(
                            "{},{}",
                            opt(click.is_valid(i), click.value(i).to_string()),
                            opt(order.is_valid(i), order.value(i).to_string())
                        ));
                    }
                }
                "join" | "revenue" => {
                    let (start, end) = (col("window_start", &micros)?, col("window_end", &micros)?);
                    let start = start.as_primitive::<TimestampMicrosecondType>();
                    let end = end.as_primitive::<TimestampMicrosecondType>();
                    let group = col(if query == "join" { "country" } else { "status" }, &text)?;
                    let group = group.as_string::<i32>();
                    let orders = col("orders", &int)?;
                    let orders = orders.as_primitive::<Int64Type>();
                    let revenue = if query == "revenue" {
                        Some(col("revenue", &cents)?)
                    } else {
                        None
                    };
                    let revenue = revenue.as_ref().map(|r| r.as_primitive::<Decimal128Type>());
                    for i in 0..batch.num_rows() {
                        let mut row = format!(
                            "{},{},{},{}",
                            ts(start.value(i)),
                            ts(end.value(i)),
                            opt(group.is_valid(i), group.value(i).to_owned()),
                            orders.value(i)
                        );
                        if let Some(r) = revenue {
                            row.push(',');
                            row.push_str(&opt(r.is_valid(i), r.value_as_string(i)));
                        }
                        rows.push(row);
                    }
                }
                "dedup" => {
                    let (order, customer) = (col("order_id", &int)?, col("customer_id", &int)?);
                    let (status, session) = (col("status", &text)?, col("session_id", &text)?);
                    let (amount, at) = (col("amount", &cents)?, col("occurred_at", &micros)?);
                    let order = order.as_primitive::<Int64Type>();
                    let customer = customer.as_primitive::<Int64Type>();
                    let (status, session) = (status.as_string::<i32>(), session.as_string::<i32>());
                    let amount = amount.as_primitive::<Decimal128Type>();
                    let at = at.as_primitive::<TimestampMicrosecondType>();
                    for i in 0..batch.num_rows() {
                        // A fixed-key SipHash: the same for both engines' folders and on
                        // every run of this build.
                        let mut h = std::hash::DefaultHasher::new();
                        order.is_valid(i).then(|| order.value(i)).hash(&mut h);
                        customer.is_valid(i).then(|| customer.value(i)).hash(&mut h);
                        status.is_valid(i).then(|| status.value(i)).hash(&mut h);
                        amount.is_valid(i).then(|| amount.value(i)).hash(&mut h);
                        at.is_valid(i).then(|| at.value(i)).hash(&mut h);
                        session.is_valid(i).then(|| session.value(i)).hash(&mut h);
                        digest = digest.wrapping_add(h.finish());
                    }
                }
                other => bail!("no result to compare for query {other}"),
            }
        }
    }
    if query == "dedup" {
        Ok(vec![
            format!("rows={count}"),
            format!("digest={digest:016x}"),
        ])
    } else {
        rows.sort();
        Ok(rows)
    }
}

/// `2024-03-01T00:05:00.000Z` → `2024-03-01T00:05:00Z`, as Spark's CSV prints it.
fn normalise_ts(v: &str) -> String {
    match v.strip_suffix(".000Z") {
        Some(base) => format!("{base}Z"),
        None => v.to_owned(),
    }
}

fn spark_run(
    python: &str,
    bench: &Path,
    work: &Path,
    inputs: &Inputs,
    query: &str,
    dedup_keys: &str,
    run: usize,
) -> Result<Run> {
    let (input, customers) = (&inputs.orders, &inputs.customers);
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The reference harness has no stream-stream join and deduplicates on order_id only:
    // this repository's scripts run the others.
    let reference = bench.join("spark_revenue.py");
    let (script, wrapper): (PathBuf, Vec<std::ffi::OsString>) = match query {
        "attribution" => (here.join("spark_attribution.py"), Vec::new()),
        "dedup" if dedup_keys != "order_id" => (
            here.join("spark_dedup.py"),
            vec![
                "--script".into(),
                reference.into_os_string(),
                "--keys".into(),
                dedup_keys.into(),
                "--".into(),
            ],
        ),
        _ => (reference, Vec::new()),
    };
    let results = work.join("spark-results");
    std::fs::create_dir_all(&results)?;
    let tag = format!("{query}.r{run}");
    let measure = results.join(format!("{tag}.measure.json"));
    let spark_work = work.join(format!("spark-{query}-{run}"));
    let status = run_in_own_group(
        Command::new(python)
            .arg(bench.join("measure.py"))
            .arg(&measure)
            .arg("--")
            .arg(python)
            .arg(&script)
            .args(&wrapper)
            .args(if query == "attribution" {
                vec![]
            } else {
                vec!["--query", query]
            })
            .args(["--state-store", "rocksdb", "--tag", &tag, "--no-result"])
            .arg("--input")
            .arg(input)
            .arg("--work")
            .arg(&spark_work)
            .arg("--results")
            .arg(&results)
            .args(
                (query == "join")
                    .then(|| ["--customers".as_ref(), customers.as_os_str()])
                    .into_iter()
                    .flatten(),
            )
            .args(
                (query == "attribution")
                    .then(|| ["--clicks".as_ref(), inputs.clicks.as_os_str()])
                    .into_iter()
                    .flatten(),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(
                results.join(format!("{tag}.stderr.log")),
            )?),
    )?;
    if !status.success() {
        bail!(
            "spark {query} run failed ({status}); see {}",
            results.join(format!("{tag}.stderr.log")).display()
        );
    }
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&measure)?)?;
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        results.join(format!("{tag}.timing.json")),
    )?)?;
    let state_bytes = du(
        &spark_work.join("checkpoint").join("state"),
        &mut HashSet::new(),
    )?;
    Ok(Run {
        wall_s: m["wall_s"].as_f64().unwrap_or(0.0),
        cpu_s: m["sampled_cpu_s_total"].as_f64().unwrap_or(0.0),
        peak_rss_mb: m["sampled_peak_tree_rss_kb"].as_f64().unwrap_or(0.0) / 1024.0,
        rss_parts_mb: (0.0, 0.0),
        rows: t["input_rows"].as_u64().unwrap_or(0),
        state_bytes,
        state_rows_max: t["state_rows_max"].as_u64().unwrap_or(0),
        output_rows: t["sink_output_rows_sum"].as_u64().unwrap_or(0),
        // Read here, after Spark's process is measured: its own read-back would be its CPU.
        result: match query {
            "attribution" => Vec::new(),
            _ => sink_result(&spark_work.join("out"), query)?,
        },
    })
}

/// Runs `cmd` in a process group of its own, then kills whatever of the group
/// is still alive: pyspark does not always wait for its JVM, and a JVM left
/// running would take CPU from the runs after it (one stayed up for an hour,
/// at ~10 % of a core, after a 10M run on 12-02).
fn run_in_own_group(cmd: &mut Command) -> Result<std::process::ExitStatus> {
    use std::os::unix::process::CommandExt;
    let mut child = cmd.process_group(0).spawn()?;
    let status = child.wait()?;
    let group = i32::try_from(child.id())?;
    // SAFETY: signals the process group this function created; a group
    // already gone only makes `kill` return ESRCH.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
    Ok(status)
}

/// Spark's CPU seconds to start a session, run a trivial job and stop.
fn spark_startup(python: &str, bench: &Path, work: &Path) -> Result<f64> {
    let results = work.join("spark-results");
    std::fs::create_dir_all(&results)?;
    let measure = results.join("startup.measure.json");
    let status = run_in_own_group(
        Command::new(python)
            .arg(bench.join("measure.py"))
            .arg(&measure)
            .arg("--")
            .arg(python)
            .arg(bench.join("spark_revenue.py"))
            .args(["--query", "startup", "--tag", "startup", "--results"])
            .arg(&results)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(results.join("startup.stderr.log"))?),
    )?;
    if !status.success() {
        bail!("spark start-up run failed ({status})");
    }
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&measure)?)?;
    m["sampled_cpu_s_total"]
        .as_f64()
        .context("measure.py wrote no sampled_cpu_s_total")
}
