//! Golden tests: Weir must give the same answers as Apache Spark.
//!
//! `tests/golden/` holds a small seeded "bookshop orders" input (12 files of 500 lines, with late,
//! too-late, duplicate and malformed lines) and, per case, what Spark 4.3 Structured Streaming
//! produced from it (`make_golden.py` regenerates them; see `tests/golden/README.md`):
//! `expected.csv` (the result), `batches.csv` (which micro-batch emitted which row),
//! `progress.csv` (each batch's input rows and watermark) and `pipeline.toml`, the same query for
//! Weir. No Java or Python is needed here. The stream-static join cases also read a static table,
//! `tests/golden/input_<table>/` (a customers dimension, also made by `make_golden.py`), copied to
//! the run's scratch folder and given to Weir with `--set table.<table>.path=...`. The
//! stream-stream join cases read a second stream, `tests/golden/input_<stream>/` (clicks, made by
//! `benches/gen_clicks.py` from the orders), as many files as `input/`: its file `i` is copied in
//! together with input file `i`, with the same mtime (one file of each per batch, as Spark read
//! them), and given to Weir with `--set source.<stream>.path=...`.
//!
//! The goldens are only worth anything if Spark wrote them: `make_golden.py` is their only writer
//! and records the SHA-256 of every file it wrote in `tests/golden/hashes.json`.
//! `golden_files_are_make_goldens` checks those hashes and `golden_results_follow_from_batches`
//! that each `expected.csv` is what its `batches.csv` implies, so a golden edited by hand (to make
//! Weir pass, or to "fix" a number) fails here instead of silently changing what Weir is held to.
//!
//! Each case is run three ways, and each must match Spark exactly, batch by batch:
//! 1. uninterrupted, `trigger = "available-now"`, one file per batch;
//! 2. stopped and restarted mid-stream: the files arrive one by one for the first batches, each
//!    run with `trigger = "once"`, then the rest with `available-now` (the same batch cut as 1.);
//! 3. killed with SIGKILL (`--failpoint`) after writing the offsets of one batch, before the
//!    commit of a later one, and before the commit of the last one, restarted each time.
//!
//! git keeps no modification times, and the files source (like Spark's) reads the oldest file
//! first: the input is copied to a scratch folder and file `i` (in name order) gets the mtime
//! `MTIME_BASE + i`, exactly as `make_golden.py` did for Spark.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use sha2::{Digest, Sha256};
use weir_tests::{commit_ids, run_ok, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

/// The mtime base of `gen_orders.py` and `make_golden.py`.
const MTIME_BASE: u64 = 1_700_000_000;

/// Batches run one file at a time with `trigger = "once"` before the restart with available-now.
const ONCE_RUNS: usize = 3;

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// Spark's output modes, as the golden files capture them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every row is emitted once; the result is all rows.
    Append,
    /// Each batch emits the rows it changed; the result is the last row per key (the first
    /// `keys` columns).
    Update { keys: usize },
    /// Each batch emits the whole result; the result is the last batch's.
    Complete,
}

/// Every golden case and its mode; `golden_files_are_make_goldens` checks this against what
/// `make_golden.py` recorded, so a case added there without a test here fails.
const CASES: [(&str, Mode); 19] = [
    ("revenue_append", Mode::Append),
    ("revenue_update", Mode::Update { keys: 3 }),
    ("revenue_complete", Mode::Complete),
    ("sliding", Mode::Append),
    ("session", Mode::Append),
    ("dedup", Mode::Append),
    ("dedup_within_watermark", Mode::Append),
    ("sql_transform", Mode::Append),
    ("status_complete", Mode::Complete),
    ("status_expressions", Mode::Complete),
    ("status_update", Mode::Update { keys: 1 }),
    ("join_customers_left", Mode::Append),
    ("join_customers_inner", Mode::Append),
    ("join_customers_left_semi", Mode::Append),
    ("join_customers_left_anti", Mode::Append),
    ("attribution_inner", Mode::Append),
    ("attribution_left", Mode::Append),
    ("attribution_full", Mode::Append),
    ("attribution_left_semi", Mode::Append),
];

#[test]
fn revenue_append() -> Result<()> {
    golden_case("revenue_append")
}

#[test]
fn revenue_update() -> Result<()> {
    golden_case("revenue_update")
}

#[test]
fn revenue_complete() -> Result<()> {
    golden_case("revenue_complete")
}

#[test]
fn sliding() -> Result<()> {
    golden_case("sliding")
}

#[test]
fn session() -> Result<()> {
    golden_case("session")
}

#[test]
fn dedup() -> Result<()> {
    golden_case("dedup")
}

#[test]
fn dedup_within_watermark() -> Result<()> {
    golden_case("dedup_within_watermark")
}

#[test]
fn sql_transform() -> Result<()> {
    golden_case("sql_transform")
}

#[test]
fn status_complete() -> Result<()> {
    golden_case("status_complete")
}

#[test]
fn status_expressions() -> Result<()> {
    golden_case("status_expressions")
}

#[test]
fn status_update() -> Result<()> {
    golden_case("status_update")
}

#[test]
fn join_customers_left() -> Result<()> {
    golden_case("join_customers_left")
}

#[test]
fn join_customers_inner() -> Result<()> {
    golden_case("join_customers_inner")
}

#[test]
fn join_customers_left_semi() -> Result<()> {
    golden_case("join_customers_left_semi")
}

#[test]
fn join_customers_left_anti() -> Result<()> {
    golden_case("join_customers_left_anti")
}

#[test]
fn attribution_inner() -> Result<()> {
    golden_case("attribution_inner")
}

#[test]
fn attribution_left() -> Result<()> {
    golden_case("attribution_left")
}

#[test]
fn attribution_full() -> Result<()> {
    golden_case("attribution_full")
}

#[test]
fn attribution_left_semi() -> Result<()> {
    golden_case("attribution_left_semi")
}

// ---------------------------------------------------------------------------------------------
// The golden files themselves: written by make_golden.py only.
// ---------------------------------------------------------------------------------------------

/// The files of a case whose SHA-256 `make_golden.py` records (its `CASE_FILES`).
const CASE_FILES: [&str; 4] = [
    "batches.csv",
    "expected.csv",
    "pipeline.toml",
    "progress.csv",
];

/// What to do about a golden that is not what `make_golden.py` wrote.
const REGENERATE: &str = "the goldens are Spark's answers and make_golden.py is their only \
     writer: never edit them by hand; undo the edit (git checkout) or rerun \
     tests/golden/make_golden.py (see tests/golden/README.md)";

fn sha256_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    Ok(hex::encode(Sha256::digest(bytes)))
}

/// `tests/golden/hashes.json`, as `make_golden.py` wrote it.
fn hashes() -> Result<serde_json::Value> {
    let path = golden_dir().join("hashes.json");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    serde_json::from_str(&text).with_context(|| path.display().to_string())
}

/// The folder of a static table's files: `input_<table>/` beside `input/`.
fn table_dir(table: &str) -> PathBuf {
    golden_dir().join(format!("input_{table}"))
}

/// The folder of another stream's files: `input_<stream>/` beside `input/`, file `i` (in name
/// order) arriving with `input/` file `i`.
fn stream_dir(stream: &str) -> PathBuf {
    golden_dir().join(format!("input_{stream}"))
}

/// The `*.json` files of `dir`, in name order.
fn json_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| dir.display().to_string())?
        .map(|e| Ok(e?.path()))
        .collect::<Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "json"));
    files.sort();
    Ok(files)
}

/// The SHA-256 of each input file (`*.json`) in `dir`, and of their `sha256sum` listing
/// (`"<hex>  <name>\n"` per file, in name order), as `make_golden.py` computes them.
fn input_hashes(dir: &Path) -> Result<(BTreeMap<String, String>, String)> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .context("input file name")?
            .to_owned();
        if name.ends_with(".json") {
            files.insert(name, sha256_file(&path)?);
        }
    }
    let listing: String = files.iter().map(|(n, h)| format!("{h}  {n}\n")).collect();
    let digest = hex::encode(Sha256::digest(listing.as_bytes()));
    Ok((files, digest))
}

/// Every golden file is byte for byte what `make_golden.py` wrote: the hashes it recorded in
/// `hashes.json` match, for the input and for each case's files; the cases there are the cases
/// here, with the same modes; and they all come from the pyspark that `spark.json` names.
#[test]
fn golden_files_are_make_goldens() -> Result<()> {
    let hashes = hashes()?;
    let mut report = String::new();

    let (input, digest) = input_hashes(&golden_dir().join("input"))?;
    let recorded = hashes["input"]
        .as_object()
        .context("hashes.json: no \"input\"")?;
    check_input_files("input", &input, recorded, &mut report);
    // The static tables the join cases read: `input_<table>/`, per table in "tables".
    let mut table_digests = BTreeMap::new();
    if let Some(tables) = hashes["tables"].as_object() {
        for (table, recorded) in tables {
            let folder = format!("input_{table}");
            let recorded = recorded
                .as_object()
                .with_context(|| format!("hashes.json: tables.{table} is not an object"))?;
            let (files, digest) = input_hashes(&table_dir(table))?;
            check_input_files(&folder, &files, recorded, &mut report);
            table_digests.insert(table.clone(), digest);
        }
    }
    // The other streams the stream-stream join cases read: `input_<stream>/`, per stream in
    // "streams".
    let mut stream_digests = BTreeMap::new();
    if let Some(streams) = hashes["streams"].as_object() {
        for (stream, recorded) in streams {
            let folder = format!("input_{stream}");
            let recorded = recorded
                .as_object()
                .with_context(|| format!("hashes.json: streams.{stream} is not an object"))?;
            let (files, digest) = input_hashes(&stream_dir(stream))?;
            check_input_files(&folder, &files, recorded, &mut report);
            stream_digests.insert(stream.clone(), digest);
        }
    }

    let spark: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(golden_dir().join("spark.json")).context("spark.json")?,
    )
    .context("spark.json")?;
    let pyspark = spark["pyspark"]
        .as_str()
        .context("spark.json: no \"pyspark\"")?;

    let cases = hashes["cases"]
        .as_object()
        .context("hashes.json: no \"cases\"")?;
    let recorded_names: Vec<&str> = cases.keys().map(String::as_str).collect();
    let mut tested: Vec<&str> = CASES.iter().map(|(name, _)| *name).collect();
    tested.sort_unstable();
    if recorded_names != tested {
        let _ = writeln!(
            report,
            "make_golden.py wrote the cases {recorded_names:?}, golden.rs tests {tested:?}"
        );
    }
    for (name, case) in cases {
        let dir = golden_dir().join(name);
        for file in CASE_FILES {
            let want = case["files"][file].as_str().unwrap_or("(nothing)");
            let path = dir.join(file);
            if !path.exists() {
                let _ = writeln!(
                    report,
                    "tests/golden/{name}/{file}, written by make_golden.py, is missing"
                );
                continue;
            }
            let sha = sha256_file(&path)?;
            if sha != want {
                let _ = writeln!(
                    report,
                    "tests/golden/{name}/{file} was edited by hand: SHA-256 {sha}, make_golden.py wrote {want}"
                );
            }
        }
        if case["input"].as_str() != Some(digest.as_str()) {
            let _ = writeln!(
                report,
                "tests/golden/{name} was made from another input than tests/golden/input/"
            );
        }
        for (table, want) in case["tables"].as_object().into_iter().flatten() {
            if want.as_str() != table_digests.get(table).map(String::as_str) {
                let _ = writeln!(
                    report,
                    "tests/golden/{name} was made from another table than tests/golden/input_{table}/"
                );
            }
        }
        for (stream, want) in case["streams"].as_object().into_iter().flatten() {
            if want.as_str() != stream_digests.get(stream).map(String::as_str) {
                let _ = writeln!(
                    report,
                    "tests/golden/{name} was made from another stream than tests/golden/input_{stream}/"
                );
            }
        }
        if case["pyspark"].as_str() != Some(pyspark) {
            let _ = writeln!(
                report,
                "tests/golden/{name} comes from pyspark {}, spark.json names {pyspark}",
                case["pyspark"]
            );
        }
        if let Some((_, mode)) = CASES.iter().find(|(n, _)| *n == name.as_str())
            && let Err(e) = read_csv(&dir.join("expected.csv"))
                .and_then(|(header, _)| mode_matches(*mode, case, &header))
        {
            let _ = writeln!(report, "tests/golden/{name}: {e:#}");
        }
    }

    ensure!(
        report.is_empty(),
        "golden files not as make_golden.py wrote them ({REGENERATE}):\n{report}"
    );
    Ok(())
}

/// Compares the input files found in `tests/golden/<folder>/` with the hashes `make_golden.py`
/// recorded for them, adding each difference to `report`.
fn check_input_files(
    folder: &str,
    found: &BTreeMap<String, String>,
    recorded: &serde_json::Map<String, serde_json::Value>,
    report: &mut String,
) {
    for (name, sha) in found {
        match recorded.get(name).and_then(|v| v.as_str()) {
            Some(want) if want == sha => {}
            Some(want) => {
                let _ = writeln!(
                    report,
                    "tests/golden/{folder}/{name} was edited by hand: SHA-256 {sha}, make_golden.py wrote {want}"
                );
            }
            None => {
                let _ = writeln!(
                    report,
                    "tests/golden/{folder}/{name} was not written by make_golden.py"
                );
            }
        }
    }
    for name in recorded.keys().filter(|n| !found.contains_key(*n)) {
        let _ = writeln!(
            report,
            "tests/golden/{folder}/{name}, written by make_golden.py, is missing"
        );
    }
}

/// `mode` (as golden.rs tests the case) is the mode `make_golden.py` ran it in; for update mode,
/// its keys are the first columns of `header`, as [`Mode::Update`] takes them.
fn mode_matches(mode: Mode, case: &serde_json::Value, header: &[String]) -> Result<()> {
    let keys: Option<Vec<&str>> = case["keys"].as_array().map(|keys| {
        keys.iter()
            .map(|k| k.as_str().unwrap_or_default())
            .collect()
    });
    let recorded = (case["mode"].as_str(), keys);
    let ok = match mode {
        Mode::Append => recorded == (Some("append"), None),
        Mode::Complete => recorded == (Some("complete"), None),
        Mode::Update { keys } => {
            let first: Option<Vec<&str>> = header
                .get(..keys)
                .map(|h| h.iter().map(String::as_str).collect());
            first.is_some() && recorded == (Some("update"), first)
        }
    };
    ensure!(
        ok,
        "golden.rs tests it as {mode:?}, make_golden.py ran it in mode {} with keys {}",
        case["mode"],
        case["keys"]
    );
    Ok(())
}

/// Each `expected.csv` is, byte for byte, what its `batches.csv` implies under the case's output
/// mode, derived exactly as `make_golden.py` derives it; and `batches.csv` and `progress.csv` are
/// in the shape it writes (batch ids ascending and run by Spark, rows sorted within a batch).
#[test]
fn golden_results_follow_from_batches() -> Result<()> {
    let hashes = hashes()?;
    let mut report = String::new();
    for (name, _) in CASES {
        let case = &hashes["cases"][name];
        if let Err(e) = check_derivation(name, case) {
            let _ = writeln!(report, "tests/golden/{name}: {e:#}");
        }
    }
    ensure!(
        report.is_empty(),
        "golden results that do not follow from their batches ({REGENERATE}):\n{report}"
    );
    Ok(())
}

fn check_derivation(name: &str, case: &serde_json::Value) -> Result<()> {
    let dir = golden_dir().join(name);
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file)).with_context(|| format!("{name}/{file}"))
    };
    let (batches_text, expected_text, progress_text) = (
        read("batches.csv")?,
        read("expected.csv")?,
        read("progress.csv")?,
    );

    // progress.csv: batches 0, 1, 2, … as Spark ran them.
    let mut lines = progress_text.lines();
    ensure!(
        lines.next() == Some("batch_id,input_rows,watermark"),
        "progress.csv: unexpected header"
    );
    let mut ran = Vec::new();
    for (i, line) in lines.enumerate() {
        let id: u64 = line
            .split(',')
            .next()
            .unwrap_or_default()
            .parse()
            .with_context(|| format!("progress.csv line {}: {line:?}", i + 2))?;
        ensure!(
            id == i as u64,
            "progress.csv line {}: batch {id}, Spark numbers its batches 0, 1, 2, …",
            i + 2
        );
        ran.push(id);
    }

    // batches.csv: `batch_id` + the result's columns; ids ascending, each one Spark ran; rows
    // sorted within a batch.
    let mut lines = batches_text.lines();
    let batch_header = lines.next().context("batches.csv: empty")?;
    let header = batch_header
        .strip_prefix("batch_id,")
        .context("batches.csv: the header does not start with batch_id")?;
    let mut batches: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    let mut last = None;
    for (i, line) in lines.enumerate() {
        let at = || format!("batches.csv line {}: {line:?}", i + 2);
        let (id, row) = line.split_once(',').with_context(at)?;
        let id: u64 = id.parse().with_context(at)?;
        ensure!(ran.contains(&id), "{}: Spark ran no batch {id}", at());
        match last {
            Some((prev, prev_row)) if prev > id || (prev == id && prev_row > row) => {
                bail!(
                    "{}: not in make_golden.py's order (batch id, then row)",
                    at()
                )
            }
            _ => last = Some((id, row)),
        }
        batches.entry(id).or_default().push(row);
    }

    // The result, as make_golden.py derives it.
    let mut result: Vec<&str> = match case["mode"].as_str() {
        Some("append") => batches.values().flatten().copied().collect(),
        // foreachBatch is called for every batch Spark runs: the last one's full result.
        Some("complete") => ran
            .last()
            .and_then(|id| batches.get(id))
            .cloned()
            .unwrap_or_default(),
        Some("update") => {
            let columns = split_csv_line(header);
            let keys: Vec<usize> = case["keys"]
                .as_array()
                .context("hashes.json: an update case without keys")?
                .iter()
                .map(|k| {
                    let k = k.as_str().context("hashes.json: a key that is not text")?;
                    columns
                        .iter()
                        .position(|c| c == k)
                        .with_context(|| format!("key column {k} not in {columns:?}"))
                })
                .collect::<Result<_>>()?;
            let mut latest = BTreeMap::new();
            for row in batches.values().flatten() {
                let fields = split_csv_line(row);
                let key: Vec<String> = keys
                    .iter()
                    .map(|&i| fields.get(i).cloned().unwrap_or_default())
                    .collect();
                latest.insert(key, *row);
            }
            latest.into_values().collect()
        }
        other => bail!("hashes.json: unknown mode {other:?}"),
    };
    result.sort_unstable();
    let mut implied = format!("{header}\n");
    for row in &result {
        implied.push_str(row);
        implied.push('\n');
    }
    if implied != expected_text {
        let want: Vec<&str> = implied.lines().collect();
        let have: Vec<&str> = expected_text.lines().collect();
        let line = want
            .iter()
            .zip(&have)
            .position(|(a, b)| a != b)
            .unwrap_or(want.len().min(have.len()));
        bail!(
            "expected.csv is not what batches.csv implies ({} mode): line {}: expected.csv has {:?}, \
             batches.csv implies {:?} ({} lines against {})",
            case["mode"],
            line + 1,
            have.get(line).copied().unwrap_or("(end of file)"),
            want.get(line).copied().unwrap_or("(end of file)"),
            have.len(),
            want.len()
        );
    }
    Ok(())
}

/// What Spark produced for one case.
struct Golden {
    name: &'static str,
    mode: Mode,
    pipeline: PathBuf,
    /// The result's header and rows (canonical text, sorted).
    header: Vec<String>,
    expected: Vec<String>,
    /// Rows emitted per batch id (sorted), batches without rows absent.
    batches: BTreeMap<u64, Vec<String>>,
    /// Per batch id: (input rows, canonical watermark or "").
    progress: BTreeMap<u64, (u64, String)>,
    /// The static tables the case joins (`[[table]]` names; files in `input_<table>/`), as
    /// `make_golden.py` recorded them in `hashes.json`.
    tables: Vec<String>,
    /// The case's streams besides the orders (`[[source]]` names; files in `input_<stream>/`), as
    /// `make_golden.py` recorded them in `hashes.json`.
    streams: Vec<String>,
}

impl Golden {
    fn load(name: &'static str, mode: Mode) -> Result<Self> {
        let dir = golden_dir().join(name);
        let (header, mut expected) = read_csv(&dir.join("expected.csv"))?;
        expected.sort();
        let (batch_header, rows) = read_csv(&dir.join("batches.csv"))?;
        ensure!(
            batch_header.first().map(String::as_str) == Some("batch_id")
                && batch_header[1..] == header[..],
            "{name}: batches.csv header {batch_header:?} does not match expected.csv {header:?}"
        );
        let mut batches: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for row in rows {
            let (id, rest) = row.split_once(',').context("batches.csv row")?;
            batches
                .entry(id.parse()?)
                .or_default()
                .push(rest.to_owned());
        }
        batches.values_mut().for_each(|rows| rows.sort());
        let (_, rows) = read_csv(&dir.join("progress.csv"))?;
        let mut progress = BTreeMap::new();
        for row in rows {
            let fields = split_csv_line(&row);
            ensure!(fields.len() == 3, "progress.csv row {row:?}");
            progress.insert(fields[0].parse()?, (fields[1].parse()?, fields[2].clone()));
        }
        let hashes = hashes()?;
        let recorded = |what: &str| -> Vec<String> {
            hashes["cases"][name][what]
                .as_object()
                .map(|t| t.keys().cloned().collect())
                .unwrap_or_default()
        };
        let (tables, streams) = (recorded("tables"), recorded("streams"));
        Ok(Self {
            name,
            mode,
            pipeline: dir.join("pipeline.toml"),
            header,
            expected,
            batches,
            progress,
            tables,
            streams,
        })
    }

    fn last_batch(&self) -> u64 {
        self.progress.keys().next_back().copied().unwrap_or(0)
    }
}

/// One run of a case in its own scratch folder.
struct Run<'a> {
    golden: &'a Golden,
    /// Holds `input/`, `input_<stream>/`, `<table>/`, `checkpoint/`, `out/`; removed on drop.
    dir: tempfile::TempDir,
    /// The golden input files, in name order.
    files: Vec<PathBuf>,
    /// Per other stream of the case: its scratch folder's name and its golden files, in name
    /// order, as many as `files`.
    streams: Vec<(String, Vec<PathBuf>)>,
}

impl<'a> Run<'a> {
    fn new(golden: &'a Golden) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("input"))?;
        let files = json_files(&golden_dir().join("input"))?;
        ensure!(!files.is_empty(), "no golden input files");
        // The other streams arrive with the orders: file `i` of each with input file `i`.
        let mut streams = Vec::new();
        for stream in &golden.streams {
            let folder = format!("input_{stream}");
            std::fs::create_dir_all(dir.path().join(&folder))?;
            let stream_files = json_files(&stream_dir(stream))?;
            ensure!(
                stream_files.len() == files.len(),
                "tests/golden/{folder}/ holds {} files, tests/golden/input/ {}: make_golden.py \
                 writes as many",
                stream_files.len(),
                files.len()
            );
            streams.push((folder, stream_files));
        }
        // The static tables do not change during a run: copied whole, once, to `<table>/`.
        for table in &golden.tables {
            let dest = dir.path().join(table);
            std::fs::create_dir_all(&dest)?;
            for entry in std::fs::read_dir(table_dir(table))? {
                let src = entry?.path();
                if src.extension().is_some_and(|e| e == "json") {
                    std::fs::copy(&src, dest.join(src.file_name().context("file name")?))?;
                }
            }
        }
        Ok(Self {
            golden,
            dir,
            files,
            streams,
        })
    }

    /// Copies input files `range` in, each with file `i` of every other stream, and gives the
    /// files `i` the mtime `MTIME_BASE + i`.
    fn add_files(&self, range: std::ops::Range<usize>) -> Result<()> {
        for i in range {
            let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs(MTIME_BASE + i as u64);
            let inputs = std::iter::once(("input", &self.files[i])).chain(
                self.streams
                    .iter()
                    .map(|(folder, files)| (folder.as_str(), &files[i])),
            );
            for (folder, src) in inputs {
                let dest = self
                    .dir
                    .path()
                    .join(folder)
                    .join(src.file_name().context("file name")?);
                std::fs::copy(src, &dest)?;
                std::fs::File::options()
                    .write(true)
                    .open(&dest)?
                    .set_modified(mtime)?;
            }
        }
        Ok(())
    }

    fn args(&self, trigger: &str) -> Vec<String> {
        let p = |name: &str| self.dir.path().join(name).display().to_string();
        [
            format!("source.orders.path={}", p("input")),
            format!("query.checkpoint={}", p("checkpoint")),
            format!("sink.path={}", p("out")),
            format!("query.trigger={trigger}"),
        ]
        .into_iter()
        .chain(
            self.golden
                .tables
                .iter()
                .map(|t| format!("table.{t}.path={}", p(t.as_str()))),
        )
        .chain(
            self.golden
                .streams
                .iter()
                .map(|s| format!("source.{s}.path={}", p(format!("input_{s}").as_str()))),
        )
        .flat_map(|s| ["--set".to_owned(), s])
        .collect()
    }

    fn run(&self, trigger: &str) -> Result<()> {
        let args = self.args(trigger);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_ok(EXE, &cache(), &self.golden.pipeline, &args)?;
        Ok(())
    }

    /// Runs with `--failpoint PHASE@BATCH` and insists that the process was killed.
    fn crash(&self, failpoint: &str) -> Result<()> {
        let mut args = vec!["run".to_owned(), self.golden.pipeline.display().to_string()];
        args.extend(self.args("available-now"));
        args.extend(["--failpoint".to_owned(), failpoint.to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = weir(EXE, &cache(), &args)?;
        ensure!(
            out.status.signal() == Some(libc::SIGKILL),
            "{}: --failpoint {failpoint} should have killed the process ({}); stderr:\n{}",
            self.golden.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// Compares everything the run left with Spark's; `Err` lists every difference.
    fn check(&self, how: &str) -> Result<()> {
        let g = self.golden;
        let mut report = String::new();
        let got = self.read_output()?;

        let expected_ids: Vec<u64> = g.batches.keys().copied().collect();
        let got_ids: Vec<u64> = got.keys().copied().collect();
        if expected_ids != got_ids {
            let _ = writeln!(
                report,
                "batches with output: Spark {expected_ids:?}, Weir {got_ids:?}"
            );
        }
        for id in expected_ids
            .iter()
            .chain(&got_ids)
            .collect::<std::collections::BTreeSet<_>>()
        {
            let none = Vec::new();
            let want = g.batches.get(id).unwrap_or(&none);
            let have = got.get(id).unwrap_or(&none);
            if let Some(diff) = diff_rows(want, have) {
                let _ = writeln!(
                    report,
                    "batch {id} ({} rows from Spark, {} from Weir):\n{diff}",
                    want.len(),
                    have.len()
                );
            }
        }

        let result = match g.mode {
            Mode::Append => {
                let mut all: Vec<String> = got.values().flatten().cloned().collect();
                all.sort();
                all
            }
            Mode::Complete => got.values().next_back().cloned().unwrap_or_default(),
            Mode::Update { keys } => {
                let mut latest = BTreeMap::new();
                for row in got.values().flatten() {
                    let key: Vec<String> = split_csv_line(row).into_iter().take(keys).collect();
                    latest.insert(key, row.clone());
                }
                let mut rows: Vec<String> = latest.into_values().collect();
                rows.sort();
                rows
            }
        };
        if let Some(diff) = diff_rows(&g.expected, &result) {
            let _ = writeln!(
                report,
                "result ({} rows from Spark, {} from Weir):\n{diff}",
                g.expected.len(),
                result.len()
            );
        }

        let checkpoint = self.dir.path().join("checkpoint");
        let commits = commit_ids(&checkpoint)?;
        let spark_batches: Vec<u64> = g.progress.keys().copied().collect();
        if commits != spark_batches {
            let _ = writeln!(
                report,
                "committed batches: Spark ran {spark_batches:?}, Weir committed {commits:?}"
            );
        }
        let progress = read_progress(&checkpoint.join("progress.jsonl"))?;
        for (id, (rows, watermark)) in &g.progress {
            match progress.get(id) {
                Some((r, w)) if r == rows && w == watermark => {}
                Some((r, w)) => {
                    let _ = writeln!(
                        report,
                        "batch {id} progress: Spark {rows} input rows, watermark {watermark:?}; Weir {r} rows, watermark {w:?}"
                    );
                }
                None => {
                    let _ = writeln!(report, "batch {id}: no progress record from Weir");
                }
            }
        }

        if report.is_empty() {
            Ok(())
        } else {
            bail!(
                "golden case {} ({how}) differs from Spark:\n{report}",
                g.name
            )
        }
    }

    /// The rows of every `batch-<id>.csv` the files sink wrote, as canonical text in the golden
    /// column order, sorted per batch.
    fn read_output(&self) -> Result<BTreeMap<u64, Vec<String>>> {
        let mut out = BTreeMap::new();
        let dir = self.dir.path().join("out");
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e.into()),
        };
        for entry in entries {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .context("file name")?
                .to_owned();
            let Some(id) = name
                .strip_prefix("batch-")
                .and_then(|n| n.strip_suffix(".csv"))
            else {
                bail!("unexpected file {name} in the sink's folder");
            };
            let id: u64 = id.parse().with_context(|| name.clone())?;
            let (header, rows) = read_csv(&path)?;
            let columns: Vec<usize> = self
                .golden
                .header
                .iter()
                .map(|c| {
                    header.iter().position(|h| h == c).with_context(|| {
                        format!("{name}: no column {c} in Weir's header {header:?}")
                    })
                })
                .collect::<Result<_>>()?;
            let mut rows: Vec<String> = rows
                .iter()
                .map(|row| {
                    let fields = split_csv_line(row);
                    join_csv_line(
                        columns
                            .iter()
                            .map(|&i| fields.get(i).map_or("", String::as_str)),
                    )
                })
                .collect();
            rows.sort();
            out.insert(id, rows);
        }
        Ok(out)
    }
}

fn golden_case(name: &'static str) -> Result<()> {
    let (_, mode) = CASES
        .iter()
        .find(|(n, _)| *n == name)
        .with_context(|| format!("{name} is not in CASES"))?;
    let golden = Golden::load(name, *mode)?;

    // 1. Uninterrupted.
    let run = Run::new(&golden)?;
    let n = run.files.len();
    run.add_files(0..n)?;
    run.run("available-now")?;
    run.check("one run, available-now")?;

    // 2. Files arriving one by one, a run per file, then the rest at once.
    let run = Run::new(&golden)?;
    for i in 0..ONCE_RUNS {
        run.add_files(i..i + 1)?;
        run.run("once")?;
    }
    run.add_files(ONCE_RUNS..n)?;
    run.run("available-now")?;
    run.check("stopped after each of the first batches, restarted")?;

    // 3. Killed: after the offsets of batch 3, before the commit of batch 7 (its output is written,
    //    its state not committed), before the commit of the last batch; restarted each time.
    let run = Run::new(&golden)?;
    run.add_files(0..n)?;
    for failpoint in [
        "after-offsets@3".to_owned(),
        "before-commit@7".to_owned(),
        format!("before-commit@{}", golden.last_batch()),
    ] {
        run.crash(&failpoint)?;
    }
    run.run("available-now")?;
    run.check("killed three times, restarted")?;
    Ok(())
}

/// Per batch id, the last progress record's input rows and canonical watermark ("" if none).
fn read_progress(path: &Path) -> Result<BTreeMap<u64, (u64, String)>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let id = v["batchId"]
            .as_u64()
            .context("progress record without batchId")?;
        let rows = v["numInputRows"].as_u64().unwrap_or(u64::MAX);
        let watermark = v["eventTime"]["watermark"]
            .as_str()
            .map(canonical)
            .unwrap_or_default();
        out.insert(id, (rows, watermark));
    }
    Ok(out)
}

/// Multiset difference of two sorted row lists: `- row` only in Spark's, `+ row` only in Weir's.
/// `None` when they are equal.
fn diff_rows(spark: &[String], weir: &[String]) -> Option<String> {
    const SHOWN: usize = 25;
    if spark == weir {
        return None;
    }
    let (mut missing, mut extra) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < spark.len() || j < weir.len() {
        match (spark.get(i), weir.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                missing.push(a);
                i += 1;
            }
            (Some(a), None) => {
                missing.push(a);
                i += 1;
            }
            (_, Some(b)) => {
                extra.push(b);
                j += 1;
            }
            (None, None) => break,
        }
    }
    let mut text = String::new();
    for (sign, rows) in [("- (Spark only)", &missing), ("+ (Weir only) ", &extra)] {
        for row in rows.iter().take(SHOWN) {
            let _ = writeln!(text, "  {sign} {row}");
        }
        if rows.len() > SHOWN {
            let _ = writeln!(text, "  {sign} … {} more", rows.len() - SHOWN);
        }
    }
    Some(text)
}

/// A CSV file's header and its rows, each row canonicalised (see [`canonical`]).
fn read_csv(path: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let mut lines = text.lines();
    let header = split_csv_line(
        lines
            .next()
            .with_context(|| format!("{}: empty", path.display()))?,
    );
    let rows = lines
        .filter(|l| !l.is_empty())
        .map(|l| join_csv_line(split_csv_line(l).iter().map(String::as_str)))
        .collect();
    Ok((header, rows))
}

/// The fields of one CSV line (RFC 4180 quoting; no line breaks inside fields in this data).
fn split_csv_line(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            ('"', false) if field.is_empty() => quoted = true,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// Canonical fields joined into one line, quoted only where needed (as `make_golden.py` does).
fn join_csv_line<'s>(fields: impl Iterator<Item = &'s str>) -> String {
    let mut line = String::new();
    for (i, field) in fields.enumerate() {
        if i > 0 {
            line.push(',');
        }
        let field = canonical(field);
        if field.contains([',', '"', '\n', '\r']) {
            line.push('"');
            line.push_str(&field.replace('"', "\"\""));
            line.push('"');
        } else {
            line.push_str(&field);
        }
    }
    line
}

/// A field's canonical text: a UTC timestamp `YYYY-MM-DDTHH:MM:SS[.fff]Z` as `make_golden.py`
/// writes it (no fraction when it is zero, else milliseconds, or microseconds when it has any);
/// everything else as it is.
fn canonical(field: &str) -> String {
    let b = field.as_bytes();
    let shape_ok = b.len() >= 20
        && b.ends_with(b"Z")
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18]
            .iter()
            .all(|&i| b[i].is_ascii_digit());
    if !shape_ok {
        return field.to_owned();
    }
    let fraction = &field[19..field.len() - 1];
    let micros = match fraction.strip_prefix('.') {
        None if fraction.is_empty() => 0,
        Some(digits)
            if (1..=9).contains(&digits.len()) && digits.bytes().all(|d| d.is_ascii_digit()) =>
        {
            // Pad to nanoseconds; a sub-microsecond part is kept verbatim (never in this data).
            let nanos: u64 = format!("{digits:0<9}").parse().unwrap_or(0);
            if !nanos.is_multiple_of(1_000) {
                return field.to_owned();
            }
            nanos / 1_000
        }
        _ => return field.to_owned(),
    };
    let base = &field[..19];
    if micros == 0 {
        format!("{base}Z")
    } else if micros.is_multiple_of(1_000) {
        format!("{base}.{:03}Z", micros / 1_000)
    } else {
        format!("{base}.{micros:06}Z")
    }
}

#[test]
fn canonical_timestamps_match_make_golden() {
    assert_eq!(
        canonical("2024-03-01T00:05:00.000Z"),
        "2024-03-01T00:05:00Z"
    );
    assert_eq!(canonical("2024-03-01T00:05:00Z"), "2024-03-01T00:05:00Z");
    assert_eq!(
        canonical("2024-03-01T00:05:00.230Z"),
        "2024-03-01T00:05:00.230Z"
    );
    assert_eq!(
        canonical("2024-03-01T00:05:00.23Z"),
        "2024-03-01T00:05:00.230Z"
    );
    assert_eq!(
        canonical("2024-03-01T00:05:00.123400Z"),
        "2024-03-01T00:05:00.123400Z"
    );
    assert_eq!(
        canonical("2024-03-01T00:05:00.000001Z"),
        "2024-03-01T00:05:00.000001Z"
    );
    assert_eq!(canonical("123.40"), "123.40");
    assert_eq!(canonical(""), "");
    assert_eq!(
        split_csv_line(r#"a,"b,c",,"d""e""#),
        ["a", "b,c", "", "d\"e"]
    );
    assert_eq!(
        join_csv_line(["a", "b,c", "", "d\"e"].into_iter()),
        r#"a,"b,c",,"d""e""#
    );
}
