//! `weir-bench loading`: what loading and running a plugin costs, per
//! language (Rust, Python, JavaScript), with the pooling allocator:
//!
//! 1. compile (cold, empty cache) against a load from the compiled cache by
//!    a second engine (what a second start does), instantiation from the
//!    pool (a fresh store and instance of a prepared component, plus `open`),
//!    and the fixed cost of one call per batch (0 rows);
//! 2. the filter example over the 1M orders of `--input`, decoded first so
//!    that only the plugin is timed: rows/s by wall and by thread-CPU time,
//!    and what one batch costs;
//! 3. `--instances` idle instances alive in one host process, each language
//!    in its own child process (`weir-bench instances`) so that its RSS is its
//!    own; a child stops early, and says so, when its RSS passes `--max-rss-mb`.
//!
//! Medians throughout; the machine is shared, so thread-CPU time is the
//! figure to compare.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arrow_array::RecordBatch;
use weir_host::operator::BatchTransform;
use weir_host::plugin::{
    BatchInfo, EngineOptions, PluginEngine, PluginOptions, PoolOptions, Sandbox, WasmTransform,
};

use crate::{NativeFilter, filter_plugins, flag, median, median_us};

const CONFIG: &str = r#"{"column":"status","op":"eq","value":"completed"}"#;

fn options() -> PluginOptions {
    PluginOptions {
        name: "keep_completed".into(),
        config_json: CONFIG.into(),
        sandbox: Sandbox::default(),
        failpoint: None,
        replay_key: weir_host::plugin::ReplayKey::new(
            &weir_host::checkpoint::QuerySecret::from_bytes([7; 32]),
            0,
        ),
    }
}

fn info() -> BatchInfo {
    BatchInfo {
        query_id: "bench".into(),
        batch_id: 0,
        attempt: 0,
        timestamp_micros: 0,
        partition: 0,
    }
}

/// CPU time of the calling thread.
pub(crate) fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Resident set size of this process, in MB.
fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn engine(cache: &Path, instances: u32) -> Result<PluginEngine> {
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(cache.to_owned()),
        fuel: false,
        pool: Some(PoolOptions {
            instances,
            max_memory_bytes: Sandbox::default().memory_bytes,
        }),
    })?;
    if !engine.pooled() {
        bail!("the instance pool could not be reserved");
    }
    Ok(engine)
}

/// Part 1 for one language.
#[derive(Debug)]
struct LoadRow {
    cold: Duration,
    warm_ms: f64,
    open_us: f64,
    instantiate_us: f64,
    empty_us: f64,
}

/// Part 2 for one language.
#[derive(Debug)]
struct FilterRow {
    wall_s: f64,
    cpu_s: f64,
    kept: usize,
}

/// Part 3 for one language, as the child reported it.
#[derive(Debug, Default)]
struct InstancesRow {
    opened: usize,
    base_mb: f64,
    loaded_mb: f64,
    total_mb: f64,
    open_us: f64,
    stopped: bool,
}

/// One column of the printed table.
type Row = (&'static str, usize, LoadRow, FilterRow, InstancesRow);

pub fn loading(args: &[String]) -> Result<()> {
    let iterations: usize = flag(args, "--iterations").map_or(Ok(200), |r| r.parse())?;
    let runs: usize = flag(args, "--runs").map_or(Ok(3), |r| r.parse())?;
    let count: usize = flag(args, "--instances").map_or(Ok(100), |r| r.parse())?;
    let max_rss: f64 = flag(args, "--max-rss-mb").map_or(Ok(6_000.0), |r| r.parse())?;
    let input = PathBuf::from(flag(args, "--input").context("--input DIR (the 1M orders)")?);
    let work = flag(args, "--work").map_or_else(
        || std::env::temp_dir().join(format!("weir-loading-{}", std::process::id())),
        PathBuf::from,
    );
    std::fs::create_dir_all(&work)?;

    let batches = decode(&input)?;
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let schema = batches
        .first()
        .map(RecordBatch::schema)
        .context("no orders in --input")?;
    eprintln!("decoded {rows} rows in {} batches", batches.len());

    let mut native = NativeFilter::new(Arc::clone(&schema));
    let native_row = filter_all(&mut native, &batches, runs)?;

    let mut table: Vec<Row> = Vec::new();
    for (language, file, bytes) in filter_plugins()? {
        let path = work.join(file);
        std::fs::write(&path, &bytes)?;
        let cache = work.join(format!("cache-{language}"));
        let slow = language != "Rust";
        let n = if slow { iterations / 4 } else { iterations }.max(5);
        let load = load_row(&cache, &path, &schema, n).with_context(|| language.to_owned())?;
        eprintln!("{language}: {load:?}");
        let engine = engine(&cache, 2)?;
        let loaded = engine.load("keep_completed", &path)?;
        let mut wasm = WasmTransform::open(&engine, loaded, options(), Arc::clone(&schema))?;
        let filter = filter_all(&mut wasm, &batches, runs)?;
        if filter.kept != native_row.kept {
            bail!(
                "the {language} filter kept {} rows, native {}",
                filter.kept,
                native_row.kept
            );
        }
        eprintln!("{language}: {filter:?}");
        let instances = instances_child(language, &path, &cache, count, max_rss)?;
        eprintln!("{language}: {instances:?}");
        table.push((language, bytes.len(), load, filter, instances));
    }

    println!(
        "| measure ({rows} orders in {} batches; medians) | {} |",
        batches.len(),
        table.iter().map(|r| r.0).collect::<Vec<_>>().join(" | ")
    );
    println!("|---|{}", "---|".repeat(table.len()));
    let line = |label: &str, cell: &dyn Fn(&Row) -> String| {
        let cells: Vec<String> = table.iter().map(cell).collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    line("component size", &|r| format!("{} KB", r.1 / 1024));
    line("compile, cold (empty cache)", &|r| {
        format!("{:.0} ms", r.2.cold.as_secs_f64() * 1e3)
    });
    line("load from the compiled cache (a second start)", &|r| {
        format!("{:.2} ms", r.2.warm_ms)
    });
    line(
        "first instance + open (linker, type check, instantiate, `open`)",
        &|r| format!("{:.0} µs", r.2.open_us),
    );
    line(
        "**instantiation from the pool** (new store + instance + `open`)",
        &|r| format!("{:.0} µs", r.2.instantiate_us),
    );
    line("**fixed cost per batch** (a 0-row call)", &|r| {
        format!("{:.1} µs", r.2.empty_us)
    });
    line(&format!("filter {rows} orders, wall"), &|r| {
        format!(
            "{:.3} s ({:.2} M rows/s)",
            r.3.wall_s,
            rows as f64 / r.3.wall_s / 1e6
        )
    });
    line(&format!("filter {rows} orders, thread CPU"), &|r| {
        format!(
            "{:.3} s ({:.2} M rows/s)",
            r.3.cpu_s,
            rows as f64 / r.3.cpu_s / 1e6
        )
    });
    line("CPU per batch (of ~10,000 rows)", &|r| {
        format!("{:.0} µs", r.3.cpu_s * 1e6 / batches.len() as f64)
    });
    line("× the native filter (CPU)", &|r| {
        format!("{:.1}", r.3.cpu_s / native_row.cpu_s)
    });
    line(
        &format!("idle instances alive in one process (asked {count})"),
        &|r| {
            format!(
                "{}{}",
                r.4.opened,
                if r.4.stopped { " (RSS cap)" } else { "" }
            )
        },
    );
    line(
        "RSS: process before the engine / after loading / with the instances",
        &|r| {
            format!(
                "{:.0} / {:.0} / {:.0} MB",
                r.4.base_mb, r.4.loaded_mb, r.4.total_mb
            )
        },
    );
    line("RSS per idle instance", &|r| {
        format!(
            "{:.2} MB",
            (r.4.total_mb - r.4.loaded_mb) / r.4.opened.max(1) as f64
        )
    });
    line(
        "new instance + open while filling the pool (median)",
        &|r| format!("{:.0} µs", r.4.open_us),
    );
    println!(
        "\nnative Arrow filter, same batches: {:.3} s thread CPU ({:.1} M rows/s), kept {} rows",
        native_row.cpu_s,
        rows as f64 / native_row.cpu_s / 1e6,
        native_row.kept
    );
    if flag(args, "--work").is_none() {
        std::fs::remove_dir_all(&work)?;
    }
    Ok(())
}

/// The orders of every file in `dir`, one decoded batch per file as `weir run` reads them.
pub(crate) fn decode(dir: &Path) -> Result<Vec<RecordBatch>> {
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
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let mut decoded = weir_host::decode::Decoded::default();
    for file in &files {
        decoder.decode(
            &std::fs::read(file)?,
            &file.display().to_string(),
            &mut decoded,
        )?;
    }
    Ok(decoded.batches)
}

/// Part 1: compile, cached load, instantiation, fixed call cost.
fn load_row(
    cache: &Path,
    path: &Path,
    schema: &arrow_schema::SchemaRef,
    n: usize,
) -> Result<LoadRow> {
    if cache.exists() {
        std::fs::remove_dir_all(cache)?;
    }
    let cold_engine = engine(cache, 2)?;
    let t = Instant::now();
    cold_engine.load("keep_completed", path)?;
    let cold = t.elapsed();
    drop(cold_engine);
    // A second start: another engine, the same cache.
    let warm_engine = engine(cache, 4)?;
    let mut loaded = None;
    let (warm_us, _) = median_us(n.min(50), &mut || {
        let l = warm_engine.load("keep_completed", path)?;
        if !l.cached {
            bail!(
                "{} was compiled again instead of loaded from the cache",
                path.display()
            );
        }
        loaded = Some(l);
        Ok(0)
    })?;
    let loaded = loaded.context("no load")?;
    let (open_us, _) = median_us(n.min(50), &mut || {
        let t = WasmTransform::open(&warm_engine, loaded.clone(), options(), Arc::clone(schema))?;
        Ok(t.usage().instantiations as usize)
    })?;
    let mut wasm = WasmTransform::open(&warm_engine, loaded, options(), Arc::clone(schema))?;
    let (instantiate_us, _) = median_us(n, &mut || {
        wasm.reinstantiate()?;
        Ok(0)
    })?;
    let empty = RecordBatch::new_empty(Arc::clone(schema));
    let info = info();
    let (empty_us, _) = median_us(n * 5, &mut || Ok(wasm.process(&empty, &info)?.num_rows()))?;
    Ok(LoadRow {
        cold,
        warm_ms: warm_us / 1e3,
        open_us,
        instantiate_us,
        empty_us,
    })
}

/// Part 2: every batch through `transform`, `runs` times; the median run.
fn filter_all(
    transform: &mut dyn BatchTransform,
    batches: &[RecordBatch],
    runs: usize,
) -> Result<FilterRow> {
    let mut info = info();
    let (mut walls, mut cpus) = (Vec::new(), Vec::new());
    let mut kept = 0;
    for _ in 0..runs.max(1) {
        kept = 0;
        let (wall, cpu) = (Instant::now(), thread_cpu());
        for (i, batch) in batches.iter().enumerate() {
            info.batch_id = i as u64;
            kept += transform.process(batch, &info)?.num_rows();
        }
        cpus.push((thread_cpu() - cpu).as_secs_f64());
        walls.push(wall.elapsed().as_secs_f64());
    }
    Ok(FilterRow {
        wall_s: median(walls),
        cpu_s: median(cpus),
        kept,
    })
}

/// Part 3: runs `weir-bench instances` for one language and reads its report.
fn instances_child(
    language: &str,
    path: &Path,
    cache: &Path,
    count: usize,
    max_rss: f64,
) -> Result<InstancesRow> {
    let out = Command::new(std::env::current_exe()?)
        .arg("instances")
        .args(["--plugin", &path.display().to_string()])
        .args(["--cache", &cache.display().to_string()])
        .args(["--count", &count.to_string()])
        .args(["--max-rss-mb", &max_rss.to_string()])
        .output()
        .with_context(|| format!("{language}: running weir-bench instances"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{language}: weir-bench instances failed: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut row = InstancesRow::default();
    for pair in stdout.split_whitespace() {
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        match key {
            "opened" => row.opened = value.parse()?,
            "base_mb" => row.base_mb = value.parse()?,
            "loaded_mb" => row.loaded_mb = value.parse()?,
            "total_mb" => row.total_mb = value.parse()?,
            "open_us" => row.open_us = value.parse()?,
            "stopped" => row.stopped = value == "true",
            _ => {}
        }
    }
    Ok(row)
}

/// `weir-bench instances --plugin P --cache DIR --count N --max-rss-mb M`: opens N instances of
/// the filter plugin P (from the compiled cache) in this process, keeps them alive and idle,
/// and prints the RSS before the engine, after loading and with the instances.
pub fn instances(args: &[String]) -> Result<()> {
    let plugin = PathBuf::from(flag(args, "--plugin").context("--plugin")?);
    let cache = PathBuf::from(flag(args, "--cache").context("--cache")?);
    let count: usize = flag(args, "--count").map_or(Ok(100), |r| r.parse())?;
    let max_rss: f64 = flag(args, "--max-rss-mb").map_or(Ok(6_000.0), |r| r.parse())?;
    let schema = Arc::new(
        weir_host::spec::parse_schema(weir_host::examples::ORDERS_SCHEMA)
            .map_err(anyhow::Error::msg)?,
    );
    let base_mb = rss_mb();
    let engine = engine(&cache, u32::try_from(count)?)?;
    let loaded = engine.load("keep_completed", &plugin)?;
    let loaded_mb = rss_mb();
    let mut live = Vec::with_capacity(count);
    let mut times = Vec::with_capacity(count);
    let mut stopped = false;
    for _ in 0..count {
        if rss_mb() > max_rss {
            stopped = true;
            break;
        }
        let t = Instant::now();
        live.push(WasmTransform::open(
            &engine,
            loaded.clone(),
            options(),
            Arc::clone(&schema),
        )?);
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let total_mb = rss_mb();
    println!(
        "opened={} base_mb={base_mb:.1} loaded_mb={loaded_mb:.1} total_mb={total_mb:.1} open_us={:.1} stopped={stopped}",
        live.len(),
        median(times)
    );
    Ok(())
}
