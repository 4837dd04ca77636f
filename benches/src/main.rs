//! `weir-bench`: the benchmarks behind BENCHMARKS.md. Benchmarks, not timed
//! tests: they run by hand on a release build and print medians.
//!
//! `weir-bench pipeline --input DIR [--runs N] [--work DIR]` runs
//! files → JSON decode → transform → Parquet with four transforms (the Wasm
//! filter plugin, the same filter native, the SQL transform of issue 14, none), each run in its own child process so that CPU seconds and
//! peak RSS are the child's own (wait4), and measures the time from starting
//! `weir run` to the first batch starting.
//!
//! `weir-bench boundary` measures the plugin boundary for the filter example in
//! Rust, Python and JavaScript: compile and load times, instantiation,
//! per-call overhead, a 65k-row filter in Wasm against native.
//!
//! `weir-bench loading --input DIR` measures loading a plugin (compile, cached
//! load, instantiation from the pool), the filter over 1M orders and the RSS of
//! 100 idle instances, in Rust, Python and JavaScript (see `loading.rs`).
//!
//! `weir-bench stateful` runs the revenue and dedup queries, Weir and Spark
//! side by side (see `stateful.rs`).
//!
//! `weir-bench kafka [--orders N | --input DIR] [--partitions P] [--runs R]
//! [--format parquet|json|delta] [--broker mock|tansu]` produces N orders to a Kafka broker
//! and runs Kafka → JSON decode → files or Delta (see `kafka.rs`).
//! `weir-bench delta [--rows N] [--commits N] [--chain-rows N] [--runs N] [--work DIR]` times
//! Delta commits and a Delta → Delta query (see `delta.rs`).
//! `weir-bench latency [--rate N] [--query stateless|count] [--mode real-time|micro-batch]
//! [--engine weir|spark]` measures Kafka → Weir → Kafka end-to-end latency, or the same
//! pipeline's in Spark (see `latency.rs`).
//! `weir-bench nexmark [--events N] [--queries q0,q1,...] [--kafka]` runs the Nexmark queries
//! Weir can express, checked against a direct computation, in events per core-second beside
//! Flink's published figures (see `nexmark.rs`).
//! `weir-bench serve noisy|load` runs many tenants' queries in one `weir serve`: noisy
//! neighbours, and 100 queries of 10 tenants (see `serve.rs`).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark reports on the terminal"
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arrow_array::{RecordBatch, Scalar, StringArray};
use arrow_schema::SchemaRef;
use weir_host::operator::{BatchTransform, TransformError};
use weir_host::plugin::BatchInfo;
use weir_host::query::{Query, QueryOptions};

mod delta;
mod fixed_cost;
mod kafka;
mod latency;
mod loading;
mod nexmark;
mod plugin_state;
mod serve;
mod stateful;
mod threads;

fn main() -> ExitCode {
    weir_host::malloc::tune();
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("pipeline") => pipeline(&args[2..]),
        Some("run-variant") => run_variant(&args[2..]),
        Some("boundary") => boundary(&args[2..]),
        Some("stateful") => stateful::stateful(&args[2..]),
        Some("sink-result") => stateful::print_sink_result(&args[2..]),
        Some("loading") => loading::loading(&args[2..]),
        Some("plugin-state") => plugin_state::plugin_state(&args[2..]),
        Some("fixed-cost") => fixed_cost::fixed_cost(&args[2..]),
        Some("instances") => loading::instances(&args[2..]),
        Some("kafka") => kafka::kafka(&args[2..]),
        Some("latency") => latency::latency(&args[2..]),
        Some("nexmark") => nexmark::nexmark(&args[2..]),
        Some("nexmark-run") => nexmark::run(&args[2..]),
        Some("nexmark-reference") => nexmark::reference(&args[2..]),
        Some("delta") => delta::delta(&args[2..]),
        Some("serve") => serve::serve(&args[2..]),
        Some("threads") => threads::threads(&args[2..]),
        Some("cli") => return weir_host::cli::main_from(args[1..].iter()),
        _ => Err(anyhow::anyhow!(
            "usage: weir-bench pipeline --input DIR [--runs N] [--work DIR] | weir-bench threads --input DIR [--runs N] [--threads N] [--work DIR] | weir-bench boundary [--iterations N] [--slow-iterations N] | weir-bench loading --input DIR [--iterations N] [--runs N] [--instances N] [--max-rss-mb MB] [--work DIR] | weir-bench plugin-state --input DIR [--runs N] [--work DIR] | weir-bench fixed-cost [--batches N] [--runs N] [--work DIR] | weir-bench kafka [--orders N | --input DIR] [--partitions P] [--runs R] [--format parquet|json|delta] [--broker mock|tansu] [--work DIR] | weir-bench latency [--rate N] [--seconds S] [--warmup S] [--query stateless|count] [--mode real-time|micro-batch] [--interval DURATION] [--partitions P] [--tick MS] [--engine weir|spark] [--spark-python PY] [--work DIR] | weir-bench nexmark [--events N] [--files F] [--queries q0,q1,...] [--runs R] [--kafka] [--plot FILE.svg] [--work DIR] | weir-bench delta [--rows N] [--commits N] [--chain-rows N] [--runs N] [--work DIR] | weir-bench stateful --input DIR --query revenue|dedup|join|attribution [--customers FILE] [--clicks DIR] [--runs N] [--store runs|rocksdb|memory] [--threads N] [--work DIR] [--spark-python PY --spark-bench DIR] [--expect SPARK.csv] | weir-bench sink-result --query revenue|dedup|join|attribution DIR"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The samples of one kind (a variant, a thread count): their count, rows, medians of wall
/// and CPU seconds, and largest peak RSS in MB.
struct Summary {
    runs: usize,
    rows: u64,
    wall: f64,
    cpu: f64,
    rss_mb: i64,
}

fn summarise<K: PartialEq>(samples: &[(K, Sample)], kind: &K) -> Summary {
    let of: Vec<Sample> = samples
        .iter()
        .filter(|(k, _)| k == kind)
        .map(|(_, s)| *s)
        .collect();
    Summary {
        runs: of.len(),
        rows: of.first().map_or(0, |s| s.rows),
        wall: median(of.iter().map(|s| s.wall.as_secs_f64()).collect()),
        cpu: median(of.iter().map(|s| s.cpu.as_secs_f64()).collect()),
        rss_mb: of.iter().map(|s| s.max_rss_kb).max().unwrap_or(0) / 1024,
    }
}

/// One measured child run.
#[derive(Debug, Clone, Copy)]
struct Sample {
    wall: Duration,
    cpu: Duration,
    max_rss_kb: i64,
    rows: u64,
}

impl std::fmt::Display for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rows in {:.2} s wall, {:.2} CPU-s, peak RSS {} MB",
            self.rows,
            self.wall.as_secs_f64(),
            self.cpu.as_secs_f64(),
            self.max_rss_kb / 1024
        )
    }
}

fn pipeline(args: &[String]) -> Result<()> {
    let input =
        PathBuf::from(flag(args, "--input").context("--input DIR (orders from gen_orders.py)")?);
    let runs: usize = flag(args, "--runs").map_or(Ok(3), |r| r.parse())?;
    let work = match flag(args, "--work") {
        Some(w) => PathBuf::from(w),
        None => std::env::temp_dir().join(format!("weir-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work)?;
    weir_host::examples::write_plugins(&work.join("plugins"))?;
    let cache = work.join("plugin-cache");
    // Each run writes its checkpoint and output into folders of its own, and nothing is
    // deleted until every run is measured: ext4 charges the creation of new files for the
    // inodes freed just before (`recently_deleted`), which would bill a run for its
    // predecessor's clean-up.
    let runs_dir = work.join("runs");
    if runs_dir.exists() {
        std::fs::remove_dir_all(&runs_dir)?;
    }
    let exe = std::env::current_exe()?;

    // Warm-up: compiles the plugin into the cache, fills the page cache.
    let _ = measure(
        &exe,
        &cache,
        "wasm",
        &write_pipeline(&work, &input, "wasm", "warm-up")?,
    )?;

    let mut samples: Vec<(&str, Sample)> = Vec::new();
    for run in 0..runs {
        for variant in VARIANTS {
            let file = write_pipeline(&work, &input, variant, &run.to_string())?;
            let s = measure(&exe, &cache, variant, &file)?;
            eprintln!("{variant}: {s}");
            samples.push((variant, s));
        }
    }
    let mut startups = Vec::new();
    for run in 0..runs.max(3) {
        startups.push(startup(&exe, &work, &cache, &input, run)?);
    }
    std::fs::remove_dir_all(&runs_dir)?;

    println!(
        "| variant | runs | rows | wall s (median) | CPU s (median) | rows per CPU-second | rows/s wall | peak RSS MB (max) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut per_cpu = Vec::new();
    for variant in VARIANTS {
        let Summary {
            runs,
            rows,
            wall,
            cpu,
            rss_mb: rss,
        } = summarise(&samples, &variant);
        per_cpu.push(cpu);
        println!(
            "| {variant} | {runs} | {rows} | {wall:.3} | {cpu:.3} | {:.0} | {:.0} | {rss} |",
            rows as f64 / cpu,
            rows as f64 / wall
        );
    }
    println!();
    println!(
        "Wasm/native CPU ratio (median): {:.3}",
        per_cpu[0] / per_cpu[1]
    );
    println!(
        "SQL/no-transform CPU ratio (median): {:.3}; Wasm/no-transform: {:.3}",
        per_cpu[2] / per_cpu[3],
        per_cpu[0] / per_cpu[3]
    );
    println!(
        "SQL (every row and column, three more)/no-transform CPU ratio (median): {:.3}; with the Wasm count_char: {:.3}",
        per_cpu[4] / per_cpu[3],
        per_cpu[5] / per_cpu[3]
    );
    let fixed = sql_fixed_cost()?;
    println!(
        "SQL transform fixed cost per batch (1-row batches, median of 5 × 20,000): {fixed:.2} µs"
    );
    println!(
        "time from `weir run` to the first batch starting (plugin cached), median of {}: {:.1} ms",
        startups.len(),
        median(startups.iter().map(|d| d.as_secs_f64() * 1000.0).collect())
    );
    Ok(())
}

/// The variants of `pipeline`: the Wasm filter, the same filter native, the
/// SQL transform of issue 14, and no transform at all; then SQL that keeps every row and
/// column and adds three (the same output as `none` and more), and the same with a Wasm
/// scalar function (`[[function]] count_char`, world `scalar-function`) instead of `upper`.
const VARIANTS: [&str; 6] = ["wasm", "native", "sql", "none", "sql-all", "udf"];

/// `sql-all`: every row, every column, and three computed ones.
const BENCH_SQL_ALL: &str = "SELECT *, upper(status) AS status_upper, amount * 2 AS doubled, \
                             current_timestamp() AS ingested_at FROM input";

/// `udf`: as `sql-all`, with the plugin's `count_char` for the string function.
const BENCH_SQL_UDF: &str = "SELECT *, count_char(session_id, '-') AS dashes, amount * 2 AS doubled, \
                             current_timestamp() AS ingested_at FROM input";

/// The statement the SQL variant runs.
const BENCH_SQL: &str = "SELECT order_id, upper(status) AS status, amount * 2 AS doubled, \
                         current_timestamp() AS ingested_at FROM input WHERE amount > 50";

/// The cost of one SQL transform call apart from its rows: a one-row batch
/// through the statement of the SQL variant, in µs (median of 5 rounds).
fn sql_fixed_cost() -> Result<f64> {
    let schema = weir_host::spec::parse_schema(weir_host::examples::ORDERS_SCHEMA)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let schema = Arc::new(schema);
    let columns: Vec<arrow_array::ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| {
            let one =
                arrow_cast::cast(&StringArray::from(vec!["70"]), f.data_type()).or_else(|_| {
                    arrow_cast::cast(
                        &StringArray::from(vec!["2024-03-01T00:00:00Z"]),
                        f.data_type(),
                    )
                });
            one.map_err(anyhow::Error::from)
        })
        .collect::<Result<_>>()?;
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    let mut t = weir_host::sql::SqlTransform::new("bench", BENCH_SQL, &schema, &[])?;
    let mut rounds = Vec::new();
    for round in 0..5_u64 {
        let started = Instant::now();
        for i in 0..20_000_u64 {
            let info = BatchInfo {
                query_id: "bench".into(),
                batch_id: round * 20_000 + i,
                attempt: 0,
                timestamp_micros: 1_700_000_000_000_000,
                partition: 0,
            };
            let out = t.process(&batch, &info)?;
            std::hint::black_box(out);
        }
        rounds.push(started.elapsed().as_secs_f64() * 1e6 / 20_000.0);
    }
    Ok(median(rounds))
}

/// The pipeline file of `variant` whose checkpoint and output are in `runs/<run>/`. One
/// thread (`threads = 1`): this benchmark measures CPU per row; `threads` compares thread
/// counts.
fn pipeline_file(input: &Path, variant: &str, run: &str) -> String {
    let transform = match variant {
        "wasm" => "[[transform]]\nname = \"keep_completed\"\nplugin = \"plugins/filter_rows.wasm\"\nconfig = { column = \"status\", op = \"eq\", value = \"completed\" }\n".to_owned(),
        "sql" => format!("[[transform]]\nname = \"enrich\"\nsql = \"{BENCH_SQL}\"\n"),
        "sql-all" => format!("[[transform]]\nname = \"enrich\"\nsql = \"{BENCH_SQL_ALL}\"\n"),
        "udf" => format!(
            "[[function]]\nname = \"count_char\"\nplugin = \"plugins/count_char.wasm\"\n\
             arguments = [\"STRING\", \"STRING\"]\nreturns = \"INT\"\n\n\
             [[transform]]\nname = \"enrich\"\nsql = \"{BENCH_SQL_UDF}\"\n"
        ),
        _ => String::new(),
    };
    format!(
        r#"[query]
name = "bench_{variant}"
checkpoint = "runs/{run}/checkpoints/{variant}"
trigger = "available-now"
threads = 1

[[source]]
name = "orders"
kind = "files"
path = "{}"
format = "json"
schema = "{}"
max_files_per_trigger = 1

{transform}
[sink]
kind = "files"
path = "runs/{run}/out/{variant}"
format = "parquet"
"#,
        input.display(),
        weir_host::examples::ORDERS_SCHEMA
    )
}

/// Writes the pipeline file of `variant` for `run`, returning its path.
fn write_pipeline(work: &Path, input: &Path, variant: &str, run: &str) -> Result<PathBuf> {
    let file = work.join(format!("{variant}-{run}.toml"));
    std::fs::write(&file, pipeline_file(input, variant, run))?;
    Ok(file)
}

/// What a child process used, as `wait4` reports it: its own CPU and peak RSS, not its
/// parent's or its siblings'.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildUsage {
    pub user: Duration,
    pub system: Duration,
    pub wall: Duration,
    pub max_rss_kb: i64,
    /// The resident set at the largest of the samples taken every 50 ms from
    /// `/proc/<pid>/status`: its anonymous and its file-backed part (the executable's code
    /// pages, shared with every process that runs it), in KB; zeros where there is no `/proc`.
    pub sampled_anon_kb: u64,
    pub sampled_file_kb: u64,
}

/// The anonymous and file-backed resident KB of process `pid`, from `/proc/<pid>/status`.
fn rss_parts(pid: i32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((field("RssAnon:")?, field("RssFile:")?))
}

/// Waits for `child`, started at `started`, and takes its resource usage; an exit other than 0
/// fails, naming `what`.
pub(crate) fn wait_measured(
    child: &std::process::Child,
    started: Instant,
    what: &str,
) -> Result<ChildUsage> {
    let pid = i32::try_from(child.id())?;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut peak = (0u64, 0u64);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some((anon, file)) = rss_parts(pid)
                    && anon + file > peak.0 + peak.1
                {
                    peak = (anon, file);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        })
    };
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet reaped; the pointers are valid.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (sampled_anon_kb, sampled_file_kb) = sampler.join().unwrap_or_default();
    if reaped != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{what} failed (status {status})");
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    Ok(ChildUsage {
        user: tv(usage.ru_utime),
        system: tv(usage.ru_stime),
        wall,
        max_rss_kb: usage.ru_maxrss,
        sampled_anon_kb,
        sampled_file_kb,
    })
}

/// Runs the pipeline `file` as `variant` (`native` adds the host filter) in a child process
/// and takes its own rusage.
fn measure(exe: &Path, cache: &Path, variant: &str, file: &Path) -> Result<Sample> {
    let started = Instant::now();
    let child = Command::new(exe)
        .arg("run-variant")
        .arg(variant)
        .arg(file)
        .arg(cache)
        .stdout(Stdio::piped())
        .spawn()?;
    let used = wait_measured(&child, started, variant)?;
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout {
        std::io::Read::read_to_string(&mut stdout, &mut out)?;
    }
    let summary: serde_json::Value = serde_json::from_str(out.trim())?;
    Ok(Sample {
        wall: used.wall,
        cpu: used.user + used.system,
        max_rss_kb: used.max_rss_kb,
        rows: summary["input_rows"].as_u64().unwrap_or(0),
    })
}

/// Child: runs one variant and prints its summary as JSON.
fn run_variant(args: &[String]) -> Result<()> {
    let [variant, file, cache] = args else {
        bail!("run-variant VARIANT FILE CACHE");
    };
    let spec = weir_host::spec::load(Path::new(file), &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut options = QueryOptions {
        cache_dir: Some(PathBuf::from(cache)),
        ..QueryOptions::default()
    };
    if variant == "native" {
        options
            .extra_transforms
            .push(Box::new(|schema: &SchemaRef| {
                Box::new(NativeFilter::new(Arc::clone(schema))) as Box<dyn BatchTransform>
            }));
    }
    let summary = Query::start(spec, options)?.run()?;
    println!(
        "{}",
        serde_json::json!({"batches": summary.batches, "input_rows": summary.input_rows, "output_rows": summary.output_rows})
    );
    Ok(())
}

/// Time from spawning `weir run` to its first batch starting.
fn startup(exe: &Path, work: &Path, cache: &Path, input: &Path, run: usize) -> Result<Duration> {
    let file = write_pipeline(work, input, "wasm", &format!("startup-{run}"))?;
    let started = Instant::now();
    let mut child = Command::new(exe)
        .args(["cli", "run"])
        .arg(file)
        .arg("--cache-dir")
        .arg(cache)
        .env("WEIR_LOG", "warn,weir_host::query=debug")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    let stderr = child.stderr.take().context("stderr")?;
    let mut first = None;
    for line in BufReader::new(stderr).lines() {
        if line?.contains("starting batch") && first.is_none() {
            first = Some(started.elapsed());
            let _ = child.kill();
        }
    }
    let _ = child.wait();
    first.context("the query never started a batch")
}

/// The median; of an even count, the mean of the middle two.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) && mid > 0 {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

/// The benchmark's filter done natively with Arrow kernels, for the ratio.
struct NativeFilter {
    schema: SchemaRef,
    column: usize,
    completed: Scalar<StringArray>,
}

impl NativeFilter {
    fn new(schema: SchemaRef) -> Self {
        let column = schema.index_of("status").unwrap_or(0);
        Self {
            schema,
            column,
            completed: Scalar::new(StringArray::from(vec!["completed"])),
        }
    }
}

impl BatchTransform for NativeFilter {
    fn name(&self) -> &str {
        "native_filter"
    }

    fn output_schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn process(
        &mut self,
        batch: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<RecordBatch, TransformError> {
        let err = |e: arrow_schema::ArrowError| TransformError::Native {
            name: "native_filter".into(),
            batch_id: info.batch_id,
            message: e.to_string(),
        };
        let mask = arrow_ord::cmp::eq(batch.column(self.column), &self.completed).map_err(err)?;
        arrow_select::filter::filter_record_batch(batch, &mask).map_err(err)
    }
}

/// The filter example in each plugin language, built by this crate's build script (Rust by
/// the host's): (language, file name, the component).
fn filter_plugins() -> Result<Vec<(&'static str, &'static str, Vec<u8>)>> {
    let read = |path: &str| std::fs::read(path).with_context(|| format!("reading {path}"));
    Ok(vec![
        (
            "Rust",
            "filter_rows.wasm",
            weir_host::examples::FILTER_ROWS_WASM.to_vec(),
        ),
        (
            "Python",
            "python_filter_rows.wasm",
            read(env!("WEIR_PLUGIN_PYTHON_FILTER_ROWS"))?,
        ),
        (
            "JavaScript",
            "js_filter_rows.wasm",
            read(env!("WEIR_PLUGIN_JS_FILTER_ROWS"))?,
        ),
        (
            "C",
            "c_filter_rows.wasm",
            read(env!("WEIR_PLUGIN_C_FILTER_ROWS"))?,
        ),
    ])
}

/// What `boundary` measures for one plugin.
#[derive(Debug)]
struct BoundaryRow {
    size_kb: usize,
    cold: Duration,
    warm: Duration,
    open_us: f64,
    empty_us: f64,
    one_us: f64,
    full_us: f64,
    full_iterations: usize,
    kept: usize,
}

/// The cost of the Wasm boundary itself, per plugin language: compile and cached load, a
/// fresh instance (pooling allocator) opened with its config, the fixed per-call cost (0 and
/// 1 rows), and the filter example on a 65,536-row batch; then the same filter native.
fn boundary(args: &[String]) -> Result<()> {
    use weir_host::plugin::{EngineOptions, PluginEngine};
    let iterations: usize = flag(args, "--iterations").map_or(Ok(300), |r| r.parse())?;
    // Python and JavaScript filter 65k rows in a fraction of a second, not a millisecond.
    let slow_iterations: usize = flag(args, "--slow-iterations").map_or(Ok(20), |r| r.parse())?;
    let work = std::env::temp_dir().join(format!("weir-boundary-{}", std::process::id()));
    let data = work.join("orders");
    weir_host::examples::write_orders(
        &data,
        weir_host::examples::OrdersSpec {
            files: 1,
            lines_per_file: 65_536,
            seed: 1,
            malformed_every: 0,
        },
    )?;
    let schema = Arc::new(
        weir_host::spec::parse_schema(weir_host::examples::ORDERS_SCHEMA)
            .map_err(anyhow::Error::msg)?,
    );
    let mut decoder = weir_host::decode::Decoder::new(
        schema,
        weir_host::decode::DecoderOptions {
            policy: weir_host::decode::MalformedPolicy::Drop,
            ..Default::default()
        },
    )?;
    let mut decoded = weir_host::decode::Decoded::default();
    decoder.decode(
        &std::fs::read(data.join("orders-00000.json"))?,
        "orders",
        &mut decoded,
    )?;
    let batch = arrow_select::concat::concat_batches(decoder.output_schema(), &decoded.batches)?;
    // Lower-case statuses so that the filter keeps ~80 %.
    let statuses = arrow_array::cast::AsArray::as_string::<i32>(batch.column(2))
        .iter()
        .map(|s| s.map(|s| s.trim().to_lowercase()))
        .collect::<StringArray>();
    let mut columns = batch.columns().to_vec();
    columns[2] = Arc::new(statuses);
    let batch = RecordBatch::try_new(batch.schema(), columns)?;

    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(work.join("cache")),
        fuel: false,
        ..EngineOptions::default()
    })?;
    let info = BatchInfo {
        query_id: "bench".into(),
        batch_id: 0,
        attempt: 0,
        timestamp_micros: 0,
        partition: 0,
    };
    let mut rows = Vec::new();
    for (language, file, bytes) in filter_plugins()? {
        let path = work.join(file);
        std::fs::write(&path, &bytes)?;
        let full_iterations = if language == "Rust" {
            iterations
        } else {
            slow_iterations
        };
        let row = boundary_row(&engine, &path, &batch, &info, iterations, full_iterations)
            .with_context(|| format!("{language} filter"))?;
        rows.push((
            language,
            BoundaryRow {
                size_kb: bytes.len() / 1024,
                ..row
            },
        ));
    }
    let mut native = NativeFilter::new(batch.schema());
    let (native_us, native_rows) = median_us(iterations, &mut || {
        Ok(native.process(&batch, &info)?.num_rows())
    })?;
    for (language, row) in &rows {
        if row.kept != native_rows {
            bail!(
                "the {language} filter kept {} rows, native {native_rows}",
                row.kept
            );
        }
    }

    println!(
        "| measure (median of {iterations}; 65,536-row filter: Rust {iterations}, others {slow_iterations}) | {} |",
        rows.iter().map(|(l, _)| *l).collect::<Vec<_>>().join(" | ")
    );
    println!("|---|{}", "---|".repeat(rows.len()));
    let line = |label: &str, cell: &dyn Fn(&BoundaryRow) -> String| {
        let cells: Vec<String> = rows.iter().map(|(_, r)| cell(r)).collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    line("component size", &|r| format!("{} KB", r.size_kb));
    line("compile, cold", &|r| {
        format!("{:.0} ms", r.cold.as_secs_f64() * 1e3)
    });
    line("load from the compiled cache", &|r| {
        format!("{:.2} ms", r.warm.as_secs_f64() * 1e3)
    });
    line("new instance + open (linker, instantiate, `open`)", &|r| {
        format!("{:.0} µs", r.open_us)
    });
    line("call, 0 rows (fixed cost per batch)", &|r| {
        format!("{:.1} µs", r.empty_us)
    });
    line("call, 1 row", &|r| format!("{:.1} µs", r.one_us));
    line(&format!("filter 65,536 rows (kept {native_rows})"), &|r| {
        format!("{:.0} µs ({:.2} M rows/s)", r.full_us, 65_536.0 / r.full_us)
    });
    line("× the native filter", &|r| {
        format!("{:.1}", r.full_us / native_us)
    });
    println!(
        "\nnative arrow kernels, same filter: {native_us:.0} µs ({:.1} M rows/s); {} iterations of the 65,536-row filter per language: {}",
        65_536.0 / native_us,
        rows.iter()
            .map(|(_, r)| r.full_iterations.to_string())
            .collect::<Vec<_>>()
            .join(" / "),
        rows.iter().map(|(l, _)| *l).collect::<Vec<_>>().join(" / ")
    );
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// The median of `iterations` runs of `f`, in µs, and what the last run returned.
fn median_us(iterations: usize, f: &mut dyn FnMut() -> Result<usize>) -> Result<(f64, usize)> {
    let mut v = Vec::with_capacity(iterations);
    let mut out = 0;
    for _ in 0..iterations.max(1) {
        let t = Instant::now();
        out = f()?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok((median(v), out))
}

/// Measures one filter plugin (see [`boundary`]).
fn boundary_row(
    engine: &weir_host::plugin::PluginEngine,
    path: &Path,
    batch: &RecordBatch,
    info: &BatchInfo,
    iterations: usize,
    full_iterations: usize,
) -> Result<BoundaryRow> {
    use weir_host::plugin::{PluginOptions, Sandbox, WasmTransform};
    let t = Instant::now();
    let _ = engine.load("filter_rows", path)?;
    let cold = t.elapsed();
    let t = Instant::now();
    let loaded = engine.load("filter_rows", path)?;
    let warm = t.elapsed();
    let options = PluginOptions {
        name: "filter_rows".into(),
        config_json: r#"{"column":"status","op":"eq","value":"completed"}"#.into(),
        sandbox: Sandbox::default(),
        failpoint: None,
        replay_key: weir_host::plugin::ReplayKey::new(
            &weir_host::checkpoint::QuerySecret::from_bytes([7; 32]),
            0,
        ),
    };
    // Each open is a fresh store and instance, opened with the config: what a new query, a
    // restart or a replaced poisoned instance costs.
    let (open_us, _) = median_us(iterations.min(50), &mut || {
        let t = WasmTransform::open(engine, loaded.clone(), options.clone(), batch.schema())?;
        Ok(t.usage().instantiations as usize)
    })?;
    let mut wasm = WasmTransform::open(engine, loaded, options, batch.schema())?;
    let (empty, one) = (batch.slice(0, 0), batch.slice(0, 1));
    let (empty_us, _) = median_us(iterations, &mut || {
        Ok(wasm.process(&empty, info)?.num_rows())
    })?;
    let (one_us, _) = median_us(iterations, &mut || Ok(wasm.process(&one, info)?.num_rows()))?;
    let (full_us, kept) = median_us(full_iterations, &mut || {
        Ok(wasm.process(batch, info)?.num_rows())
    })?;
    Ok(BoundaryRow {
        size_kb: 0,
        cold,
        warm,
        open_us,
        empty_us,
        one_us,
        full_us,
        full_iterations,
        kept,
    })
}
