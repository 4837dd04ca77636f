//! `weir-bench nexmark --events N [--files F] [--queries q0,q1,...] [--runs R] [--work DIR]
//! [--kafka] [--plot FILE.svg]`: the Nexmark queries Weir can express, on the events of the
//! Nexmark generator.
//!
//! The field compares stream processors on Nexmark, in events per core-second (the Nexmark
//! README's `Events / (Cores × Time)`), so this is where Weir stands beside Flink's published
//! figures. The events come from the `nexmark` crate (RisingWave's port of the Java generator),
//! with its defaults: Person 2 %, Auction 6 %, Bid 92 %, 10,000 events a second of event time
//! from a fixed base time (2023-01-01), so every run writes the same bytes. They are written as
//! JSON lines, one folder per event type (`events/person`, `events/auction`, `events/bid`),
//! file k of each type holding the events of the same range of event numbers, with ISO-8601
//! timestamps. `--kafka` also produces the Bid lines to the topic `bid` of librdkafka's mock
//! cluster (in this process, over TCP; it keeps at most 5 MiB of a partition, so there are as
//! many partitions as that needs) and runs each query that needs no watermark from there too,
//! as many records a batch as a file holds.
//!
//! Each query is a pipeline file (`available-now`, one file per batch) ending in a `memory`
//! sink that the runner empties after every batch: Flink's figures use its blackhole sink. A
//! query runs one stateful operator, so q5, q7 and q8 (an aggregate, then a join) are chains of
//! two or three queries that pass their rows on through Parquet files, run one after the other
//! in the same child and measured together. A query runs in a child process (`weir-bench
//! nexmark-run`), measured with `wait4`; the figure is all N generated events over the child's
//! CPU seconds, as Flink's counts every event the generator made although a Bid query reads
//! only the Bid ones.
//!
//! Before the timed runs, one run per query digests every output row (an order-free hash of
//! each row's values) and compares it with the same digest of the rows the query must give,
//! computed here directly from the generator's events (not from the files): the reference.
//! An unbounded aggregate (q15–q17) runs in update mode, emitting a key's row again each batch
//! it changes; its check digests each key's last row. The queries Weir cannot express yet are
//! listed with what is missing.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::File;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::nexmark::EventGenerator;
use ::nexmark::config::NexmarkConfig;
use ::nexmark::event::Event;
use anyhow::{Context, Result, bail};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Decimal128Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    TimestampMicrosecondType, TimestampMillisecondType, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use weir_host::query::{Query, QueryOptions};
use weir_host::sink::MemorySink;

use super::{flag, median};

/// 2023-01-01T00:00:00Z: fixed, so that every run writes the same events (the crate's default
/// is the time of the run).
const BASE_TIME_MS: u64 = 1_672_531_200_000;
/// Events per second of event time: the crate's default (Flink's suite generates at 10M/s,
/// which puts 10M events inside one second, less than the 4 s watermark delay).
const RATE: usize = 10_000;

const BID_SCHEMA: &str = "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time TIMESTAMP, extra STRING";
const AUCTION_SCHEMA: &str = "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra STRING";
const PERSON_SCHEMA: &str = "id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, state STRING, date_time TIMESTAMP, extra STRING";

/// A Nexmark query as Weir runs it.
struct NexmarkQuery {
    name: &'static str,
    /// Events per core-second of Flink 1.13 in the Nexmark README (8 cores × 3 nodes,
    /// 100M events).
    flink: f64,
    /// Feldera's events per second on 16 cores (feldera/feldera `benchmark/README.md`), where
    /// it publishes one.
    feldera_16_cores: Option<f64>,
    /// The pipelines that run before the query's own, each whole but for its `[query]` table.
    /// A query runs one stateful operator, so a Nexmark query with two in a row (an aggregate
    /// and then a join) is a chain of queries through Parquet files under `stages/<query>/`,
    /// all of them run and measured.
    before: &'static [&'static str],
    /// The `[[source]]` tables of the query's own pipeline: `None` for the Bid events alone.
    /// `@source KIND` (and `@source KIND watermark`) stands for the files of that event type,
    /// `@stage NAME PATH [COLUMN]` for the Parquet files an earlier query of the chain wrote to
    /// `stages/PATH` (with a watermark on COLUMN, without delay: they arrive in order).
    sources: Option<&'static str>,
    /// The pipeline file's stages after the sources.
    body: &'static str,
    /// Update mode: the output's first `n` columns are a key, and the result is each key's
    /// last row (an unbounded aggregate emits a key's row again each batch it changes).
    upsert: Option<usize>,
    /// The rows the query must give, from the events.
    reference: fn(&mut dyn Iterator<Item = Event>) -> Digest,
}

const QUERIES: &[NexmarkQuery] = &[
    NexmarkQuery {
        name: "q0",
        flink: 155_020.0,
        feldera_16_cores: Some(6_973_987.0),
        before: &[],
        sources: None,
        body: r#"[[transform]]
name = "q0"
sql = "SELECT auction, bidder, price, date_time, extra FROM input"
"#,
        upsert: None,
        reference: reference_q0,
    },
    NexmarkQuery {
        name: "q1",
        flink: 157_940.0,
        feldera_16_cores: Some(6_595_871.0),
        before: &[],
        sources: None,
        body: r#"[[transform]]
name = "q1"
sql = "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM input"
"#,
        upsert: None,
        reference: reference_q1,
    },
    NexmarkQuery {
        name: "q2",
        flink: 175_210.0,
        feldera_16_cores: Some(6_748_549.0),
        before: &[],
        sources: None,
        body: r#"[[transform]]
name = "q2"
sql = "SELECT auction, price FROM input WHERE auction % 123 = 0"
"#,
        upsert: None,
        reference: reference_q2,
    },
    NexmarkQuery {
        name: "q3",
        flink: 152_120.0,
        feldera_16_cores: None,
        before: &[],
        sources: Some("@source auction\n@source person\n"),
        body: r#"[[transform]]
name = "category_10"
input = "auction"
sql = "SELECT id, seller FROM input WHERE category = 10"

[[transform]]
name = "sellers_in_or_id_ca"
input = "person"
sql = "SELECT id AS seller, name, city, state FROM input WHERE state = 'or' OR state = 'id' OR state = 'ca'"

[join]
left = "auction"
right = "person"
type = "inner"
on = ["seller"]

[[transform]]
name = "q3"
sql = "SELECT name, city, state, id FROM input"
"#,
        upsert: None,
        reference: reference_q3,
    },
    NexmarkQuery {
        name: "q5",
        flink: 22_140.0,
        feldera_16_cores: None,
        before: &[
            r#"@source bid

[watermark]
column = "date_time"
delay = "4 seconds"

[aggregate]
window = { column = "date_time", size = "10 seconds", slide = "2 seconds" }
group_by = ["auction"]
select = ["count(*) AS num"]

[sink]
kind = "files"
path = "stages/q5/counts"
format = "parquet"
"#,
            r#"@stage counts q5/counts

[watermark]
column = "window_start"
delay = "0 seconds"

[aggregate]
group_by = ["window_start"]
select = ["max(num) AS maxn"]

[sink]
kind = "files"
path = "stages/q5/maxes"
format = "parquet"
"#,
        ],
        sources: Some(
            r#"@stage counts q5/counts window_start
@stage maxes q5/maxes window_start
"#,
        ),
        body: r#"[[transform]]
name = "counts"
input = "counts"
sql = "SELECT window_start, auction, num FROM input"

[join]
left = "counts"
right = "maxes"
type = "inner"
on = ["window_start"]
condition = "counts.num >= maxes.maxn"

[[transform]]
name = "q5"
sql = "SELECT auction, num FROM input"
"#,
        upsert: None,
        reference: reference_q5,
    },
    NexmarkQuery {
        name: "q7",
        flink: 12_330.0,
        feldera_16_cores: None,
        before: &[r#"@source bid

[watermark]
column = "date_time"
delay = "4 seconds"

[aggregate]
window = { column = "date_time", size = "10 seconds" }
group_by = []
select = ["max(price) AS maxprice"]

[sink]
kind = "files"
path = "stages/q7/maxes"
format = "parquet"
"#],
        sources: Some(
            r#"@source bid watermark

@stage maxes q7/maxes window_end
"#,
        ),
        body: r#"[[transform]]
name = "bids"
input = "bid"
sql = "SELECT auction, bidder, price, date_time, extra FROM input"

[[transform]]
name = "maxes"
input = "maxes"
sql = "SELECT maxprice AS price, window_end FROM input"

[join]
left = "bid"
right = "maxes"
type = "inner"
on = ["price"]
condition = "bid.date_time BETWEEN maxes.window_end - INTERVAL 10 SECONDS AND maxes.window_end"

[[transform]]
name = "q7"
sql = "SELECT auction, bidder, price, date_time, extra FROM input"
"#,
        upsert: None,
        reference: reference_q7,
    },
    NexmarkQuery {
        name: "q8",
        flink: 146_140.0,
        feldera_16_cores: None,
        before: &[
            r#"@source person

[watermark]
column = "date_time"
delay = "4 seconds"

[aggregate]
window = { column = "date_time", size = "10 seconds" }
group_by = ["id", "name"]
select = ["count(*) AS n"]

[sink]
kind = "files"
path = "stages/q8/person"
format = "parquet"
"#,
            r#"@source auction

[watermark]
column = "date_time"
delay = "4 seconds"

[aggregate]
window = { column = "date_time", size = "10 seconds" }
group_by = ["seller"]
select = ["count(*) AS n"]

[sink]
kind = "files"
path = "stages/q8/auction"
format = "parquet"
"#,
        ],
        sources: Some(
            r#"@stage p q8/person window_start
@stage a q8/auction window_start
"#,
        ),
        body: r#"[[transform]]
name = "p"
input = "p"
sql = "SELECT id, name, window_start FROM input"

[[transform]]
name = "a"
input = "a"
sql = "SELECT seller AS id, window_start FROM input"

[join]
left = "p"
right = "a"
type = "inner"
on = ["id", "window_start"]

[[transform]]
name = "q8"
sql = "SELECT id, name, window_start AS starttime FROM input"
"#,
        upsert: None,
        reference: reference_q8,
    },
    NexmarkQuery {
        name: "q11",
        flink: 39_700.0,
        feldera_16_cores: None,
        before: &[],
        sources: None,
        body: r#"[watermark]
column = "date_time"
delay = "4 seconds"

[aggregate]
window = { column = "date_time", gap = "10 seconds" }
group_by = ["bidder"]
select = ["count(*) AS bid_count"]
"#,
        upsert: None,
        reference: reference_q11,
    },
    NexmarkQuery {
        name: "q13",
        flink: 130_730.0,
        feldera_16_cores: Some(3_675_255.0),
        before: &[],
        sources: None,
        body: r#"[[transform]]
name = "side_key"
input = "bid"
sql = "SELECT auction, bidder, price, date_time, auction % 10000 AS side_key FROM input"

[[table]]
name = "side_input"
kind = "files"
path = "events/side_input.csv"
format = "csv"
csv = { header = false }
schema = "side_key BIGINT, side_value STRING"

[join]
left = "bid"
right = "side_input"
type = "inner"
on = ["side_key"]

[[transform]]
name = "q13"
sql = "SELECT auction, bidder, price, date_time, side_value FROM input"
"#,
        upsert: None,
        reference: reference_q13,
    },
    NexmarkQuery {
        name: "q14",
        flink: 161_230.0,
        feldera_16_cores: Some(6_858_711.0),
        before: &[],
        sources: None,
        body: r#"[[function]]
name = "count_char"
plugin = "plugins/count_char.wasm"
arguments = ["STRING", "STRING"]
returns = "INT"

[[transform]]
name = "q14"
sql = """
SELECT auction, bidder, 0.908 * price AS price,
       CASE
         WHEN hour(date_time) >= 8 AND hour(date_time) <= 18 THEN 'dayTime'
         WHEN hour(date_time) <= 6 OR hour(date_time) >= 20 THEN 'nightTime'
         ELSE 'otherTime'
       END AS bid_time_type,
       date_time, extra, count_char(extra, 'c') AS c_counts
FROM input
WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000
"""
"#,
        upsert: None,
        reference: reference_q14,
    },
    NexmarkQuery {
        name: "q15",
        flink: 72_420.0,
        feldera_16_cores: None,
        before: &[],
        sources: None,
        body: r#"[aggregate]
group_by = ["to_char(date_time, '%Y-%m-%d') AS day"]
select = [
    "count(*) AS total_bids",
    "count(*) FILTER (WHERE price < 10000) AS rank1_bids",
    "count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids",
    "count(*) FILTER (WHERE price >= 1000000) AS rank3_bids",
    "count(DISTINCT bidder) AS total_bidders",
    "count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders",
    "count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders",
    "count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders",
    "count(DISTINCT auction) AS total_auctions",
    "count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions",
    "count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions",
    "count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions",
]
"#,
        upsert: Some(1),
        reference: reference_q15,
    },
    NexmarkQuery {
        name: "q16",
        flink: 18_650.0,
        feldera_16_cores: None,
        before: &[],
        sources: None,
        body: r#"[aggregate]
group_by = ["channel", "to_char(date_time, '%Y-%m-%d') AS day"]
select = [
    "max(to_char(date_time, '%H:%M')) AS minute",
    "count(*) AS total_bids",
    "count(*) FILTER (WHERE price < 10000) AS rank1_bids",
    "count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids",
    "count(*) FILTER (WHERE price >= 1000000) AS rank3_bids",
    "count(DISTINCT bidder) AS total_bidders",
    "count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders",
    "count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders",
    "count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders",
    "count(DISTINCT auction) AS total_auctions",
    "count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions",
    "count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions",
    "count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions",
]
"#,
        upsert: Some(2),
        reference: reference_q16,
    },
    NexmarkQuery {
        name: "q17",
        flink: 116_800.0,
        feldera_16_cores: None,
        before: &[],
        sources: None,
        body: r#"[aggregate]
group_by = ["auction", "to_char(date_time, '%Y-%m-%d') AS day"]
select = [
    "count(*) AS total_bids",
    "count(*) FILTER (WHERE price < 10000) AS rank1_bids",
    "count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids",
    "count(*) FILTER (WHERE price >= 1000000) AS rank3_bids",
    "min(price) AS min_price",
    "max(price) AS max_price",
    "avg(price) AS avg_price",
    "sum(price) AS sum_price",
]
"#,
        upsert: Some(2),
        reference: reference_q17,
    },
    NexmarkQuery {
        name: "q20",
        flink: 18_980.0,
        feldera_16_cores: None,
        before: &[],
        sources: Some("@source bid\n@source auction\n"),
        body: r#"[[transform]]
name = "bids"
input = "bid"
sql = "SELECT auction, bidder, price, channel, url, date_time AS bid_date_time, extra AS bid_extra FROM input"

[[transform]]
name = "category_10"
input = "auction"
sql = "SELECT id AS auction, item_name, description, initial_bid, reserve, date_time AS auction_date_time, expires, seller, category, extra AS auction_extra FROM input WHERE category = 10"

[join]
left = "bid"
right = "auction"
type = "inner"
on = ["auction"]
"#,
        upsert: None,
        reference: reference_q20,
    },
    NexmarkQuery {
        name: "q21",
        flink: 98_490.0,
        feldera_16_cores: Some(6_634_820.0),
        before: &[],
        sources: None,
        body: r#"[[transform]]
name = "q21"
sql = """
SELECT auction, bidder, price, channel,
       CASE
         WHEN lower(channel) = 'apple' THEN '0'
         WHEN lower(channel) = 'google' THEN '1'
         WHEN lower(channel) = 'facebook' THEN '2'
         WHEN lower(channel) = 'baidu' THEN '3'
         ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)
       END AS channel_id
FROM input
WHERE regexp_like(url, '(&|^)channel_id=') OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')
"""
"#,
        upsert: None,
        reference: reference_q21,
    },
    NexmarkQuery {
        name: "q22",
        flink: 129_960.0,
        feldera_16_cores: Some(6_305_568.0),
        before: &[],
        sources: None,
        body: r#"[[transform]]
name = "q22"
sql = "SELECT auction, bidder, price, channel, split_part(url, '/', 4) AS dir1, split_part(url, '/', 5) AS dir2, split_part(url, '/', 6) AS dir3 FROM input"
"#,
        upsert: None,
        reference: reference_q22,
    },
];

/// The queries not run, and why.
const NOT_YET: &[(&str, &str)] = &[
    (
        "q4, q6, q9",
        "an aggregate over the result of an unbounded aggregate (the maximum bid of each auction, then their average by category) and top-1 per key: both need retractions, which Weir's operators do not emit",
    ),
    (
        "q10",
        "a files sink partitioned by columns (Delta's `partition_by` does it)",
    ),
    ("q12", "processing-time windows"),
    ("q18, q19", "keep-last dedup and top-N per key with updates"),
];

pub fn nexmark(args: &[String]) -> Result<()> {
    let events: u64 = flag(args, "--events").map_or(Ok(1_000_000), |v| v.parse())?;
    let files: u64 = flag(args, "--files").map_or(Ok(100), |v| v.parse())?;
    let runs: usize = flag(args, "--runs").map_or(Ok(3), |v| v.parse())?;
    let wanted: Option<Vec<String>> =
        flag(args, "--queries").map(|q| q.split(',').map(|s| s.trim().to_owned()).collect());
    let work = match flag(args, "--work") {
        Some(w) => PathBuf::from(w),
        None => std::env::temp_dir().join(format!("weir-bench-nexmark-{}", std::process::id())),
    };
    if !events.is_multiple_of(files) {
        bail!("--events {events} is not a multiple of --files {files}");
    }
    let queries: Vec<&NexmarkQuery> = QUERIES
        .iter()
        .filter(|q| {
            wanted
                .as_ref()
                .is_none_or(|w| w.iter().any(|n| n == q.name))
        })
        .collect();
    if let Some(w) = &wanted
        && let Some(unknown) = w.iter().find(|n| !QUERIES.iter().any(|q| q.name == *n))
    {
        bail!("--queries: {unknown} is not one this harness runs");
    }

    std::fs::create_dir_all(&work)?;
    let data = work.join("events");
    let generated = generate(&data, events, files)?;
    weir_host::examples::write_plugins(&work.join("plugins"))?;
    let exe = std::env::current_exe()?;
    let cache = work.join("plugin-cache");

    println!(
        "Nexmark, {events} events ({files} files a type, {} bytes), generated in {:.1} s{}",
        generated.bytes,
        generated.seconds,
        if generated.seconds == 0.0 {
            " (already there)"
        } else {
            ""
        }
    );
    println!();
    println!(
        "| query | output rows | result | CPU s (median of {runs}) | wall s | peak RSS MB | events per core-second | Flink 1.13 | Weir / Flink | Feldera (16 cores) / 16 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    let mut plotted: Vec<(String, f64, f64)> = Vec::new();
    let mut kafka = None;
    let mut runs_of: Vec<(&NexmarkQuery, bool)> = queries.iter().map(|q| (*q, false)).collect();
    if args.iter().any(|a| a == "--kafka") {
        runs_of.extend(
            queries
                .iter()
                .filter(|q| {
                    q.before.is_empty() && q.sources.is_none() && !q.body.contains("[watermark]")
                })
                .map(|q| (*q, true)),
        );
    }
    for (q, from_kafka) in runs_of {
        // The topic is filled after the runs from files: a child's peak RSS as `wait4` reports
        // it includes what this process held when it started the child, and the mock cluster
        // holds every record.
        if from_kafka && kafka.is_none() {
            kafka = Some(Kafka::start(&data, files)?);
        }
        let from_kafka = if from_kafka { kafka.as_ref() } else { None };
        let files_of_q = write_pipeline(&work, q, from_kafka)?;
        let label = if from_kafka.is_some() {
            format!("{} (Kafka)", q.name)
        } else if q.before.is_empty() {
            q.name.to_owned()
        } else {
            format!("{} ({} queries)", q.name, q.before.len() + 1)
        };
        // The check run: every output row digested, against the reference.
        let checked = match run_child(&exe, &files_of_q, &cache, true, q.upsert) {
            Ok(c) => c,
            Err(e) => {
                println!("| {label} | – | **failed**: {e} | | | | | | | |");
                failures.push(format!("{label}: {e}"));
                continue;
            }
        };
        let expected = reference_in_child(&exe, q.name, events)?;
        let ok = checked.digest == Some(expected);
        if !ok {
            failures.push(format!(
                "{label}: Weir gave {} rows (digest {:?}), the reference {} ({:?})",
                checked.output_rows, checked.digest, expected.rows, expected.sum
            ));
        }
        let mut cpu = Vec::new();
        let mut wall = Vec::new();
        let mut rss = 0u64;
        for _ in 0..runs {
            let r = run_child(&exe, &files_of_q, &cache, false, q.upsert)?;
            cpu.push(r.cpu_s);
            wall.push(r.wall_s);
            rss = rss.max(u64::try_from(r.max_rss_kb / 1024).unwrap_or(0));
        }
        let cpu_s = median(cpu);
        let per_core = events as f64 / cpu_s;
        if from_kafka.is_none() {
            plotted.push((label.clone(), per_core, q.flink));
        }
        let rss = if from_kafka.is_some() {
            "–".to_owned()
        } else {
            rss.to_string()
        };
        println!(
            "| {label} | {} | {} | {cpu_s:.2} | {:.2} | {rss} | {} | {} | {:.1}× | {} |",
            checked.output_rows,
            if ok { "= reference" } else { "**differs**" },
            median(wall),
            thousands(per_core),
            thousands(q.flink),
            per_core / q.flink,
            q.feldera_16_cores
                .map_or("–".to_owned(), |f| thousands(f / 16.0)),
        );
    }
    println!();
    if let Some(path) = flag(args, "--plot") {
        std::fs::write(&path, plot(&plotted, events)).with_context(|| format!("writing {path}"))?;
        println!("The plot: {path}");
        println!();
    }
    println!("Not run yet:");
    for (which, why) in NOT_YET {
        println!("- {which}: {why}");
    }
    if flag(args, "--work").is_none() {
        std::fs::remove_dir_all(&work)?;
    }
    drop(kafka);
    if !failures.is_empty() {
        bail!(
            "results differ from the reference:\n{}",
            failures.join("\n")
        );
    }
    Ok(())
}

/// An SVG bar chart of events per core-second per query, Weir's bar above Flink 1.13's, on a
/// logarithmic scale (the queries span two orders of magnitude).
fn plot(rows: &[(String, f64, f64)], events: u64) -> String {
    const LEFT: f64 = 130.0;
    const WIDTH: f64 = 620.0;
    const BAR: f64 = 11.0;
    const ROW: f64 = 2.0 * BAR + 10.0;
    const TOP: f64 = 50.0;
    let (lo, hi) = (1e4_f64, 1e7_f64);
    let x = |v: f64| LEFT + WIDTH * (v.clamp(lo, hi).log10() - lo.log10()) / (hi / lo).log10();
    let height = TOP + ROW * rows.len() as f64 + 40.0;
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="18" font-size="14">Nexmark: events per core-second ({events} events; log scale)</text>
<rect x="{LEFT}" y="28" width="12" height="10" fill="#d9480f"/><text x="{lx1}" y="37">Weir (weir-bench nexmark, this machine)</text>
<rect x="{lx2}" y="28" width="12" height="10" fill="#868e96"/><text x="{lx3}" y="37">Flink 1.13 (Nexmark README, 3 × 8 cores)</text>
"##,
        w = LEFT + WIDTH + 90.0,
        lx1 = LEFT + 16.0,
        lx2 = LEFT + 290.0,
        lx3 = LEFT + 306.0,
    );
    let mut tick = lo;
    while tick <= hi {
        let tx = x(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{tx:.1}" y1="{TOP}" x2="{tx:.1}" y2="{y2:.1}" stroke="#dee2e6"/><text x="{tx:.1}" y="{ty:.1}" text-anchor="middle">{label}</text>"##,
            y2 = height - 35.0,
            ty = height - 20.0,
            label = thousands(tick),
        );
        tick *= 10.0;
    }
    for (i, (name, weir, flink)) in rows.iter().enumerate() {
        let y = TOP + ROW * i as f64 + 4.0;
        let _ = writeln!(
            svg,
            r##"<text x="{tx}" y="{ny:.1}" text-anchor="end">{name}</text>
<rect x="{LEFT}" y="{y:.1}" width="{ww:.1}" height="{BAR}" fill="#d9480f"/><text x="{wx:.1}" y="{wy:.1}">{wv}</text>
<rect x="{LEFT}" y="{fy:.1}" width="{fw:.1}" height="{BAR}" fill="#868e96"/><text x="{fx:.1}" y="{fty:.1}">{fv}</text>"##,
            tx = LEFT - 8.0,
            ny = y + BAR + 4.0,
            ww = x(*weir) - LEFT,
            wx = x(*weir) + 4.0,
            wy = y + BAR - 1.0,
            wv = thousands(*weir),
            fy = y + BAR,
            fw = x(*flink) - LEFT,
            fx = x(*flink) + 4.0,
            fty = y + 2.0 * BAR - 1.0,
            fv = thousands(*flink),
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn thousands(v: f64) -> String {
    let n = v.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn config() -> NexmarkConfig {
    NexmarkConfig {
        base_time: BASE_TIME_MS,
        first_rate: RATE,
        next_rate: RATE,
        ..NexmarkConfig::default()
    }
}

fn generator(events: u64) -> impl Iterator<Item = Event> {
    EventGenerator::new(config()).take(usize::try_from(events).unwrap_or(usize::MAX))
}

struct Generated {
    bytes: u64,
    seconds: f64,
}

/// Writes the events, unless the folder already holds these (its `done` file names them).
fn generate(dir: &Path, events: u64, files: u64) -> Result<Generated> {
    let stamp = format!("events {events} files {files} base {BASE_TIME_MS} rate {RATE}\n");
    let done = dir.join("done");
    let size = |dir: &Path| -> Result<u64> {
        let mut total = 0;
        for kind in ["person", "auction", "bid"] {
            for f in std::fs::read_dir(dir.join(kind))? {
                total += f?.metadata()?.len();
            }
        }
        Ok(total)
    };
    if std::fs::read_to_string(&done).is_ok_and(|s| s == stamp) {
        return Ok(Generated {
            bytes: size(dir)?,
            seconds: 0.0,
        });
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let started = Instant::now();
    for kind in ["person", "auction", "bid"] {
        std::fs::create_dir_all(dir.join(kind))?;
    }
    let per_file = events / files;
    let cfg = config();
    let mut line = String::new();
    for k in 0..files {
        let open = |kind: &str| -> Result<BufWriter<File>> {
            let path = dir.join(kind).join(format!("events-{k:05}.json"));
            Ok(BufWriter::with_capacity(1 << 20, File::create(path)?))
        };
        let (mut p, mut a, mut b) = (open("person")?, open("auction")?, open("bid")?);
        let batch = EventGenerator::new(cfg.clone())
            .with_offset(k * per_file)
            .take(usize::try_from(per_file)?);
        for event in batch {
            line.clear();
            let out = match &event {
                Event::Person(e) => {
                    write!(line, r#"{{"id":{},"name":"#, e.id)?;
                    json_str(&mut line, &e.name);
                    line.push_str(r#","email_address":"#);
                    json_str(&mut line, &e.email_address);
                    line.push_str(r#","credit_card":"#);
                    json_str(&mut line, &e.credit_card);
                    line.push_str(r#","city":"#);
                    json_str(&mut line, &e.city);
                    line.push_str(r#","state":"#);
                    json_str(&mut line, &e.state);
                    write!(line, r#","date_time":"{}","extra":"#, iso(e.date_time))?;
                    json_str(&mut line, &e.extra);
                    &mut p
                }
                Event::Auction(e) => {
                    write!(line, r#"{{"id":{},"item_name":"#, e.id)?;
                    json_str(&mut line, &e.item_name);
                    line.push_str(r#","description":"#);
                    json_str(&mut line, &e.description);
                    write!(
                        line,
                        r#","initial_bid":{},"reserve":{},"date_time":"{}","expires":"{}","seller":{},"category":{},"extra":"#,
                        e.initial_bid,
                        e.reserve,
                        iso(e.date_time),
                        iso(e.expires),
                        e.seller,
                        e.category
                    )?;
                    json_str(&mut line, &e.extra);
                    &mut a
                }
                Event::Bid(e) => {
                    write!(
                        line,
                        r#"{{"auction":{},"bidder":{},"price":{},"channel":"#,
                        e.auction, e.bidder, e.price
                    )?;
                    json_str(&mut line, &e.channel);
                    line.push_str(r#","url":"#);
                    json_str(&mut line, &e.url);
                    write!(line, r#","date_time":"{}","extra":"#, iso(e.date_time))?;
                    json_str(&mut line, &e.extra);
                    &mut b
                }
            };
            line.push_str("}\n");
            out.write_all(line.as_bytes())?;
        }
        for mut w in [p, a, b] {
            w.flush()?;
        }
    }
    // Nexmark's side input of q13: keys 0..10,000, each its own value.
    let mut side = BufWriter::new(File::create(dir.join("side_input.csv"))?);
    for i in 0..10_000 {
        writeln!(side, "{i},{i}")?;
    }
    side.flush()?;
    let seconds = started.elapsed().as_secs_f64();
    std::fs::write(&done, stamp)?;
    Ok(Generated {
        bytes: size(dir)?,
        seconds,
    })
}

/// `s` as a JSON string (the generator's strings need no escaping, but nothing relies on it).
fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Milliseconds since the epoch as ISO-8601 UTC with milliseconds.
fn iso(ms: u64) -> String {
    let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Howard Hinnant's `civil_from_days`: the proleptic Gregorian date of a day number.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The Bid events in a topic of librdkafka's mock cluster.
struct Kafka {
    cluster: MockCluster<'static, DefaultProducerContext>,
    /// Records a batch: as many as a file holds.
    per_batch: u64,
}

impl Kafka {
    fn start(data: &Path, files: u64) -> Result<Self> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(data.join("bid"))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        paths.sort();
        let mut bytes = 0;
        for p in &paths {
            bytes += std::fs::metadata(p)?.len();
        }
        // The mock keeps at most 5 MiB of a partition.
        let partitions = i32::try_from(bytes.div_ceil(3 << 20).max(4))?;
        let cluster: MockCluster<'static, DefaultProducerContext> =
            MockCluster::new(1).context("starting the mock cluster")?;
        cluster.create_topic("bid", partitions, 1)?;
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("linger.ms", "20")
            .set("batch.size", "1000000")
            .set("queue.buffering.max.messages", "1000000")
            .create()?;
        let started = Instant::now();
        let mut produced = 0u64;
        for p in &paths {
            let text = std::fs::read_to_string(p)?;
            for line in text.lines() {
                let record: BaseRecord<'_, (), str> = BaseRecord::to("bid")
                    .partition(i32::try_from(produced % u64::try_from(partitions)?)?)
                    .payload(line);
                super::kafka::send(&producer, record)?;
                produced += 1;
            }
        }
        producer.flush(Duration::from_secs(120))?;
        let high_sum =
            super::kafka::high_watermark_sum(&cluster.bootstrap_servers(), "bid", partitions)?;
        if u64::try_from(high_sum)? != produced {
            bail!("{produced} bids produced, the topic holds {high_sum}");
        }
        eprintln!(
            "produced {produced} bids to {partitions} partitions in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok(Self {
            cluster,
            per_batch: produced / files,
        })
    }
}

/// The `[[source]]` of an event type's files, with the 4-second watermark when asked.
fn event_source(kind: &str, watermark: bool) -> Result<String> {
    let schema = match kind {
        "bid" => BID_SCHEMA,
        "auction" => AUCTION_SCHEMA,
        "person" => PERSON_SCHEMA,
        other => bail!("@source {other}: not an event type"),
    };
    let mut text = format!(
        r#"[[source]]
name = "{kind}"
kind = "files"
path = "events/{kind}"
max_files_per_trigger = 1
format = "json"
schema = "{schema}"
on_malformed = "fail"
"#
    );
    if watermark {
        text.push_str("watermark = { column = \"date_time\", delay = \"4 seconds\" }\n");
    }
    Ok(text)
}

/// The `[[source]]` of the Parquet files an earlier query of a chain wrote to `stages/PATH`.
fn stage_source(name: &str, path: &str, watermark: Option<&str>) -> String {
    let mut text = format!(
        r#"[[source]]
name = "{name}"
kind = "files"
path = "stages/{path}"
format = "parquet"
max_files_per_trigger = 1
"#
    );
    if let Some(column) = watermark {
        let _ = writeln!(
            text,
            "watermark = {{ column = \"{column}\", delay = \"0 seconds\" }}"
        );
    }
    text
}

/// `text` with each `@source KIND [watermark]` and `@stage NAME PATH [COLUMN]` line replaced
/// by that source.
fn expand_sources(text: &str) -> Result<String> {
    let mut out = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("@source ") {
            let mut words = rest.split_whitespace();
            let kind = words.next().unwrap_or("");
            out.push_str(&event_source(kind, words.next() == Some("watermark"))?);
        } else if let Some(rest) = line.strip_prefix("@stage ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let [name, path, watermark @ ..] = words.as_slice() else {
                bail!("{line:?}: @stage NAME PATH [COLUMN]");
            };
            out.push_str(&stage_source(name, path, watermark.first().copied()));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// Writes the query's pipeline files (those of its chain first) and returns them in the order
/// they run.
fn write_pipeline(work: &Path, q: &NexmarkQuery, kafka: Option<&Kafka>) -> Result<Vec<PathBuf>> {
    let name = match kafka {
        None => q.name.to_owned(),
        Some(_) => format!("{}_kafka", q.name),
    };
    let sources = match (q.sources, kafka) {
        (Some(sources), _) => sources.to_owned(),
        (None, None) => event_source("bid", false)?,
        (None, Some(k)) => format!(
            r#"[[source]]
name = "bid"
kind = "kafka"
bootstrap_servers = "{}"
subscribe = ["bid"]
starting_offsets = "earliest"
max_offsets_per_trigger = {}
format = "json"
schema = "{BID_SCHEMA}"
on_malformed = "fail"
"#,
            k.cluster.bootstrap_servers(),
            k.per_batch
        ),
    };
    let own = format!("{sources}\n{}\n[sink]\nkind = \"memory\"\n", q.body);
    let mut files = Vec::new();
    let stages = q.before.iter().map(|s| (*s).to_owned()).chain([own]);
    let count = q.before.len() + 1;
    for (i, stage) in stages.enumerate() {
        let stage_name = if i + 1 == count {
            name.clone()
        } else {
            format!("{name}_{}", i + 1)
        };
        let stage = expand_sources(&stage)?;
        let watermark = stage.contains("[watermark]") || stage.contains("watermark = {");
        let mode =
            if (stage.contains("[aggregate]") || stage.contains("[deduplicate]")) && !watermark {
                // An unbounded aggregate: each batch emits the keys it changed.
                "output_mode = \"update\"\nstate_store = \"rocksdb\"\n"
            } else if stage.contains("[aggregate]") || stage.contains("[deduplicate]") {
                "output_mode = \"append\"\nstate_store = \"rocksdb\"\n"
            } else if stage.contains("[join]") && stage.matches("[[source]]").count() > 1 {
                "state_store = \"rocksdb\"\n"
            } else {
                ""
            };
        let text = format!(
            r#"[query]
name = "nexmark_{stage_name}"
checkpoint = "checkpoints/{stage_name}"
trigger = "available-now"
{mode}
{stage}"#
        );
        let file = work.join(format!("{stage_name}.toml"));
        std::fs::write(&file, text)?;
        files.push(file);
    }
    Ok(files)
}

struct ChildRun {
    output_rows: u64,
    digest: Option<Digest>,
    cpu_s: f64,
    wall_s: f64,
    max_rss_kb: i64,
}

fn run_child(
    exe: &Path,
    files: &[PathBuf],
    cache: &Path,
    check: bool,
    upsert: Option<usize>,
) -> Result<ChildRun> {
    let last = files.last().context("a query without a pipeline")?;
    let dir = last.parent().context("the pipeline's folder")?;
    let name = last
        .file_stem()
        .and_then(|s| s.to_str())
        .context("the pipeline's name")?;
    // Fresh checkpoints each run, and a chain's folders emptied.
    for file in files {
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let checkpoint = dir.join("checkpoints").join(stem);
        if checkpoint.exists() {
            std::fs::remove_dir_all(&checkpoint)?;
        }
    }
    let stages = dir.join("stages").join(name);
    if stages.exists() {
        std::fs::remove_dir_all(&stages)?;
    }
    let started = Instant::now();
    let mut cmd = Command::new(exe);
    cmd.arg("nexmark-run").arg(cache).args(files);
    if check {
        cmd.arg("--digest");
        if let Some(n) = upsert {
            cmd.arg(format!("--upsert={n}"));
        }
    }
    let child = cmd.env("WEIR_LOG", "warn").stdout(Stdio::piped()).spawn()?;
    let used = super::wait_measured(&child, started, name)?;
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout {
        std::io::Read::read_to_string(&mut stdout, &mut out)?;
    }
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).with_context(|| format!("{name}: printed {out:?}"))?;
    let digest = v.get("digest").and_then(|d| {
        Some(Digest {
            rows: d["rows"].as_u64()?,
            sum: d["sum"].as_str()?.parse().ok()?,
            xor: d["xor"].as_str()?.parse().ok()?,
        })
    });
    Ok(ChildRun {
        output_rows: v["output_rows"].as_u64().unwrap_or(0),
        digest,
        cpu_s: (used.user + used.system).as_secs_f64(),
        wall_s: used.wall.as_secs_f64(),
        max_rss_kb: used.max_rss_kb,
    })
}

/// `weir-bench nexmark-run CACHE FILE... [--digest]`: runs the pipelines in this process, one
/// after the other (a chain's earlier queries write the files the later ones read), emptying
/// the last one's memory sink after every batch (digesting the rows first with `--digest`), and
/// prints what it counted as JSON.
pub fn run(args: &[String]) -> Result<()> {
    let digesting = args.iter().any(|a| a == "--digest");
    let mut paths = args.iter().filter(|a| !a.starts_with("--"));
    let (Some(cache), files) = (paths.next(), paths.collect::<Vec<_>>()) else {
        bail!("nexmark-run CACHE FILE... [--digest]");
    };
    let Some((file, before)) = files.split_last() else {
        bail!("nexmark-run CACHE FILE... [--digest]");
    };
    let mut stage_rows = Vec::new();
    for stage in before {
        let spec =
            weir_host::spec::load(Path::new(stage), &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
        let options = QueryOptions {
            cache_dir: Some(PathBuf::from(cache)),
            ..QueryOptions::default()
        };
        let summary = Query::start(spec, options)
            .with_context(|| format!("starting {stage}"))?
            .run()
            .with_context(|| format!("running {stage}"))?;
        stage_rows.push(summary.output_rows);
    }
    let spec = weir_host::spec::load(Path::new(file), &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
    let sink = MemorySink::new();
    let table = sink.table();
    let upsert: Option<usize> = args
        .iter()
        .find_map(|a| a.strip_prefix("--upsert="))
        .map(str::parse)
        .transpose()?;
    let digest = Arc::new(Mutex::new(Collected::default()));
    let options = QueryOptions {
        cache_dir: Some(PathBuf::from(cache)),
        memory_sink: Some(sink),
        on_progress: Some({
            let (table, digest) = (Arc::clone(&table), Arc::clone(&digest));
            Arc::new(move |_, _| {
                let batches = std::mem::take(&mut *table.lock().unwrap_or_else(|p| p.into_inner()));
                if digesting {
                    let mut d = digest.lock().unwrap_or_else(|p| p.into_inner());
                    for batch in batches.values().flatten() {
                        if let Err(e) = d.add_batch(batch, upsert) {
                            d.error.get_or_insert(e);
                        }
                    }
                }
            })
        }),
        ..QueryOptions::default()
    };
    let summary = Query::start(spec, options)?.run()?;
    let collected = std::mem::take(&mut *digest.lock().unwrap_or_else(|p| p.into_inner()));
    if let Some(e) = collected.error {
        bail!("digesting the output: {e}");
    }
    let mut d = collected.digest;
    for row in collected.latest.into_values() {
        d.add_row(&row);
    }
    let mut out = serde_json::json!({
        "batches": summary.batches,
        "input_rows": summary.input_rows,
        "output_rows": summary.output_rows,
        "stage_rows": stage_rows,
    });
    if digesting {
        out["digest"] =
            serde_json::json!({"rows": d.rows, "sum": d.sum.to_string(), "xor": d.xor.to_string()});
    }
    println!("{out}");
    Ok(())
}

/// What the check run gathers from the output: the digest of its rows, or in update mode the
/// last row of each key (digested at the end).
#[derive(Debug, Default)]
struct Collected {
    digest: Digest,
    latest: HashMap<Vec<String>, Vec<String>>,
    error: Option<String>,
}

impl Collected {
    fn add_batch(&mut self, batch: &RecordBatch, upsert: Option<usize>) -> Result<(), String> {
        let Some(n) = upsert else {
            return self.digest.add_batch(batch);
        };
        for row in 0..batch.num_rows() {
            let values = batch
                .columns()
                .iter()
                .map(|c| canonical(c, row))
                .collect::<Result<Vec<_>, _>>()?;
            self.latest
                .insert(values[..n.min(values.len())].to_vec(), values);
        }
        Ok(())
    }
}

/// The reference digest of query `name`, computed in a child: a reference may hold every bid,
/// and the kernel counts what this process holds when it starts a child into that child's peak
/// RSS (the child begins as a copy of it), so this process stays small.
fn reference_in_child(exe: &Path, name: &str, events: u64) -> Result<Digest> {
    let out = Command::new(exe)
        .arg("nexmark-reference")
        .arg(name)
        .arg(events.to_string())
        .output()?;
    if !out.status.success() {
        bail!(
            "the reference of {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(Digest {
        rows: v["rows"].as_u64().context("rows")?,
        sum: v["sum"].as_str().context("sum")?.parse()?,
        xor: v["xor"].as_str().context("xor")?.parse()?,
    })
}

/// `weir-bench nexmark-reference QUERY EVENTS`: prints the reference digest of a query over the
/// first EVENTS events.
pub fn reference(args: &[String]) -> Result<()> {
    let [name, events, ..] = args else {
        bail!("nexmark-reference QUERY EVENTS");
    };
    let q = QUERIES
        .iter()
        .find(|q| q.name == name)
        .with_context(|| format!("{name}: not a query this harness runs"))?;
    let d = (q.reference)(&mut generator(events.parse()?));
    println!(
        "{}",
        serde_json::json!({"rows": d.rows, "sum": d.sum.to_string(), "xor": d.xor.to_string()})
    );
    Ok(())
}

/// An order-free digest of rows: how many, and the wrapping sum and the xor of a hash of each
/// row's values in their canonical text (integers and timestamps in µs as integers, decimals
/// without trailing zeros, strings as they are, null as `∅`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Digest {
    rows: u64,
    sum: u64,
    xor: u64,
}

impl Digest {
    fn add_row(&mut self, values: &[String]) {
        let mut h = DefaultHasher::new();
        for v in values {
            v.hash(&mut h);
        }
        let h = h.finish();
        self.rows += 1;
        self.sum = self.sum.wrapping_add(h);
        self.xor ^= h;
    }

    fn add_batch(&mut self, batch: &RecordBatch) -> Result<(), String> {
        let mut values = Vec::with_capacity(batch.num_columns());
        for row in 0..batch.num_rows() {
            values.clear();
            for col in batch.columns() {
                values.push(canonical(col, row)?);
            }
            self.add_row(&values);
        }
        Ok(())
    }
}

fn canonical(col: &ArrayRef, row: usize) -> Result<String, String> {
    if col.is_null(row) {
        return Ok("∅".into());
    }
    Ok(match col.data_type() {
        DataType::Int8 => col.as_primitive::<Int8Type>().value(row).to_string(),
        DataType::Int16 => col.as_primitive::<Int16Type>().value(row).to_string(),
        DataType::Int32 => col.as_primitive::<Int32Type>().value(row).to_string(),
        DataType::Int64 => col.as_primitive::<Int64Type>().value(row).to_string(),
        DataType::UInt32 => col.as_primitive::<UInt32Type>().value(row).to_string(),
        DataType::UInt64 => col.as_primitive::<UInt64Type>().value(row).to_string(),
        DataType::Float64 => format!("{:.6}", col.as_primitive::<Float64Type>().value(row)),
        DataType::Boolean => col.as_boolean().value(row).to_string(),
        DataType::Utf8 => col.as_string::<i32>().value(row).to_owned(),
        DataType::LargeUtf8 => col.as_string::<i64>().value(row).to_owned(),
        DataType::Utf8View => col.as_string_view().value(row).to_owned(),
        DataType::Timestamp(TimeUnit::Microsecond, _) => col
            .as_primitive::<TimestampMicrosecondType>()
            .value(row)
            .to_string(),
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            (col.as_primitive::<TimestampMillisecondType>().value(row) * 1000).to_string()
        }
        DataType::Decimal128(_, scale) => decimal(
            col.as_primitive::<Decimal128Type>().value(row),
            u32::try_from(*scale).map_err(|_| format!("decimal scale {scale}"))?,
        ),
        other => return Err(format!("no canonical text for {other}")),
    })
}

/// `value / 10^scale` without trailing zeros in its fraction.
fn decimal(value: i128, scale: u32) -> String {
    let p = 10i128.pow(scale);
    let (int, frac) = (value / p, (value % p).abs());
    let sign = if value < 0 && int == 0 { "-" } else { "" };
    if frac == 0 {
        return format!("{sign}{int}");
    }
    let digits = format!("{frac:0width$}", width = scale as usize);
    format!("{sign}{int}.{}", digits.trim_end_matches('0'))
}

fn micros(ms: u64) -> String {
    (ms * 1000).to_string()
}

fn bids(events: &mut dyn Iterator<Item = Event>, mut f: impl FnMut(&::nexmark::event::Bid)) {
    for e in events {
        if let Event::Bid(b) = e {
            f(&b);
        }
    }
}

/// A bid as q0 (and q7) gives it: auction, bidder, price, date_time, extra.
fn q0_row(b: &::nexmark::event::Bid) -> [String; 5] {
    [
        b.auction.to_string(),
        b.bidder.to_string(),
        b.price.to_string(),
        micros(b.date_time),
        b.extra.clone(),
    ]
}

fn reference_q0(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut d = Digest::default();
    bids(events, |b| d.add_row(&q0_row(b)));
    d
}

fn reference_q1(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut d = Digest::default();
    bids(events, |b| {
        d.add_row(&[
            b.auction.to_string(),
            b.bidder.to_string(),
            decimal(b.price as i128 * 908, 3),
            micros(b.date_time),
            b.extra.clone(),
        ]);
    });
    d
}

fn reference_q2(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut d = Digest::default();
    bids(events, |b| {
        if b.auction % 123 == 0 {
            d.add_row(&[b.auction.to_string(), b.price.to_string()]);
        }
    });
    d
}

/// Sessions of each bidder's bids (a bid within 10 s of the session's last one joins it; the
/// session ends 10 s after its last bid), emitted once the final watermark (the newest bid's
/// time less 4 s) reaches their end: `available-now` stops there, as Spark does.
fn reference_q11(events: &mut dyn Iterator<Item = Event>) -> Digest {
    const GAP_MS: u64 = 10_000;
    let mut open: HashMap<usize, (u64, u64, u64)> = HashMap::new();
    let mut closed: Vec<(usize, u64, u64, u64)> = Vec::new();
    let mut newest = 0u64;
    bids(events, |b| {
        newest = newest.max(b.date_time);
        match open.get_mut(&b.bidder) {
            Some((_, end, count)) if b.date_time <= *end => {
                *end = (*end).max(b.date_time + GAP_MS);
                *count += 1;
            }
            Some(session) => {
                closed.push((b.bidder, session.0, session.1, session.2));
                *session = (b.date_time, b.date_time + GAP_MS, 1);
            }
            None => {
                open.insert(b.bidder, (b.date_time, b.date_time + GAP_MS, 1));
            }
        }
    });
    closed.extend(open.into_iter().map(|(k, (s, e, c))| (k, s, e, c)));
    let watermark = newest.saturating_sub(4_000);
    let mut d = Digest::default();
    for (bidder, start, end, count) in closed {
        if end <= watermark {
            d.add_row(&[
                micros(start),
                micros(end),
                bidder.to_string(),
                count.to_string(),
            ]);
        }
    }
    d
}

const WINDOW_MS: u64 = 10_000;
const DELAY_MS: u64 = 4_000;

/// Auctions of category 10 whose seller lives in OR, ID or CA (the crate writes states in
/// lower case, and RisingWave's q3 asks for `'or'`, `'id'`, `'ca'`): an inner join without a
/// watermark, so every pair is found, whichever event came first.
fn reference_q3(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut sellers: HashMap<usize, (String, String, String)> = HashMap::new();
    let mut auctions = Vec::new();
    for e in events {
        match e {
            Event::Person(p) if matches!(p.state.as_str(), "or" | "id" | "ca") => {
                sellers.insert(p.id, (p.name, p.city, p.state));
            }
            Event::Auction(a) if a.category == 10 => auctions.push((a.id, a.seller)),
            _ => {}
        }
    }
    let mut d = Digest::default();
    for (id, seller) in auctions {
        if let Some((name, city, state)) = sellers.get(&seller) {
            d.add_row(&[name.clone(), city.clone(), state.clone(), id.to_string()]);
        }
    }
    d
}

/// The auctions with the most bids of each 10-second window sliding by 2 seconds, as the chain
/// computes them: the first query emits a window's counts once the bids' watermark (the newest
/// bid less 4 s) reaches its end, the second emits each window's maximum once its own
/// watermark (the newest window start it read) reaches the window's start, which the final
/// batch does for every window, and the join keeps the counts at the maximum.
fn reference_q5(events: &mut dyn Iterator<Item = Event>) -> Digest {
    const SLIDE_MS: u64 = 2_000;
    let mut counts: HashMap<(u64, usize), u64> = HashMap::new();
    let mut newest = 0u64;
    bids(events, |b| {
        newest = newest.max(b.date_time);
        let last = b.date_time / SLIDE_MS * SLIDE_MS;
        for k in 0..WINDOW_MS / SLIDE_MS {
            let Some(start) = last.checked_sub(k * SLIDE_MS) else {
                break;
            };
            *counts.entry((start, b.auction)).or_default() += 1;
        }
    });
    let watermark = newest.saturating_sub(DELAY_MS);
    counts.retain(|(start, _), _| start + WINDOW_MS <= watermark);
    let mut max: HashMap<u64, u64> = HashMap::new();
    for ((start, _), n) in &counts {
        let m = max.entry(*start).or_default();
        *m = (*m).max(*n);
    }
    let mut d = Digest::default();
    for ((start, auction), n) in counts {
        if n >= max[&start] {
            d.add_row(&[auction.to_string(), n.to_string()]);
        }
    }
    d
}

/// The bids at the highest price of each 10-second window, as the chain computes them: the
/// first query emits a window's maximum once the bids' watermark reaches its end, and the join
/// pairs it with every bid at that price from the window's start to its end, both included
/// (SQL's `BETWEEN`), so a bid at the very end of a window is also paired with the window it
/// ends.
fn reference_q7(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut max: HashMap<u64, usize> = HashMap::new();
    let mut all = Vec::new();
    let mut newest = 0u64;
    bids(events, |b| {
        newest = newest.max(b.date_time);
        let m = max.entry(b.date_time / WINDOW_MS * WINDOW_MS).or_default();
        *m = (*m).max(b.price);
        all.push(b.clone());
    });
    let watermark = newest.saturating_sub(DELAY_MS);
    let closed = |start: u64| -> Option<usize> {
        (start + WINDOW_MS <= watermark)
            .then(|| max.get(&start).copied())
            .flatten()
    };
    let mut d = Digest::default();
    for b in all {
        let start = b.date_time / WINDOW_MS * WINDOW_MS;
        let mut windows = vec![start];
        if b.date_time == start && start >= WINDOW_MS {
            windows.push(start - WINDOW_MS);
        }
        for w in windows {
            if closed(w) == Some(b.price) {
                d.add_row(&q0_row(&b));
            }
        }
    }
    d
}

/// The people who opened an auction in the 10-second window they joined in: both windowed
/// groupings emit a window once their own input's watermark (its newest event less 4 s)
/// reaches its end, and the join pairs the windows both emitted.
fn reference_q8(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut people = Vec::new();
    let mut sellers: std::collections::HashSet<(usize, u64)> = std::collections::HashSet::new();
    let (mut newest_person, mut newest_auction) = (0u64, 0u64);
    let mut auctions = Vec::new();
    for e in events {
        match e {
            Event::Person(p) => {
                newest_person = newest_person.max(p.date_time);
                people.push(p);
            }
            Event::Auction(a) => {
                newest_auction = newest_auction.max(a.date_time);
                auctions.push((a.seller, a.date_time / WINDOW_MS * WINDOW_MS));
            }
            Event::Bid(_) => {}
        }
    }
    let auction_watermark = newest_auction.saturating_sub(DELAY_MS);
    sellers.extend(
        auctions
            .into_iter()
            .filter(|(_, start)| start + WINDOW_MS <= auction_watermark),
    );
    let person_watermark = newest_person.saturating_sub(DELAY_MS);
    let mut groups: std::collections::HashSet<(usize, String, u64)> =
        std::collections::HashSet::new();
    for p in people {
        let start = p.date_time / WINDOW_MS * WINDOW_MS;
        if start + WINDOW_MS <= person_watermark {
            groups.insert((p.id, p.name, start));
        }
    }
    let mut d = Digest::default();
    for (id, name, start) in groups {
        if sellers.contains(&(id, start)) {
            d.add_row(&[id.to_string(), name, micros(start)]);
        }
    }
    d
}

/// The day and the price bands of q15–q17.
fn day(ms: u64) -> String {
    iso(ms)[..10].to_owned()
}

fn band(price: usize) -> usize {
    match price {
        p if p < 10_000 => 1,
        p if p < 1_000_000 => 2,
        _ => 3,
    }
}

/// q15 and q16's figures of one group: bids, distinct bidders and distinct auctions, in all
/// and per price band.
#[derive(Default)]
struct Bands {
    bids: [u64; 4],
    bidders: [std::collections::HashSet<usize>; 4],
    auctions: [std::collections::HashSet<usize>; 4],
}

impl Bands {
    fn add(&mut self, b: &::nexmark::event::Bid) {
        for i in [0, band(b.price)] {
            self.bids[i] += 1;
            self.bidders[i].insert(b.bidder);
            self.auctions[i].insert(b.auction);
        }
    }

    fn values(&self) -> Vec<String> {
        let mut out: Vec<String> = self.bids.iter().map(u64::to_string).collect();
        out.extend(self.bidders.iter().map(|s| s.len().to_string()));
        out.extend(self.auctions.iter().map(|s| s.len().to_string()));
        out
    }
}

/// Bids per day: counts, distinct bidders and distinct auctions, in all and per price band;
/// each day's last row as update mode emitted it.
fn reference_q15(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut days: HashMap<String, Bands> = HashMap::new();
    bids(events, |b| days.entry(day(b.date_time)).or_default().add(b));
    let mut d = Digest::default();
    for (day, bands) in days {
        d.add_row(&[vec![day], bands.values()].concat());
    }
    d
}

/// q15 per channel and day, with the day's latest minute.
fn reference_q16(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut groups: HashMap<(String, String), (String, Bands)> = HashMap::new();
    bids(events, |b| {
        let minute = iso(b.date_time)[11..16].to_owned();
        let (latest, bands) = groups
            .entry((b.channel.clone(), day(b.date_time)))
            .or_default();
        if minute > *latest {
            *latest = minute;
        }
        bands.add(b);
    });
    let mut d = Digest::default();
    for ((channel, day), (minute, bands)) in groups {
        d.add_row(&[vec![channel, day, minute], bands.values()].concat());
    }
    d
}

/// Bids per auction and day: counts per price band, and the lowest, highest, mean (DOUBLE, as
/// Spark's `avg`; Flink's is BIGINT) and total price.
fn reference_q17(events: &mut dyn Iterator<Item = Event>) -> Digest {
    // Per (auction, day): bids in all and per band, lowest, highest and total price.
    type Figures = ([u64; 4], usize, usize, u64);
    let mut groups: HashMap<(usize, String), Figures> = HashMap::new();
    bids(events, |b| {
        let g = groups
            .entry((b.auction, day(b.date_time)))
            .or_insert(([0; 4], usize::MAX, 0, 0));
        g.0[0] += 1;
        g.0[band(b.price)] += 1;
        g.1 = g.1.min(b.price);
        g.2 = g.2.max(b.price);
        g.3 += b.price as u64;
    });
    let mut d = Digest::default();
    for ((auction, day), (counts, min, max, sum)) in groups {
        let mut row = vec![auction.to_string(), day];
        row.extend(counts.iter().map(u64::to_string));
        row.extend([
            min.to_string(),
            max.to_string(),
            format!("{:.6}", sum as f64 / counts[0] as f64),
            sum.to_string(),
        ]);
        d.add_row(&row);
    }
    d
}

/// Every bid with its auction, for the auctions of category 10: an inner join without a
/// watermark.
fn reference_q20(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut auctions: HashMap<usize, ::nexmark::event::Auction> = HashMap::new();
    let mut all = Vec::new();
    for e in events {
        match e {
            Event::Auction(a) if a.category == 10 => {
                auctions.insert(a.id, a);
            }
            Event::Bid(b) => all.push(b),
            _ => {}
        }
    }
    let mut d = Digest::default();
    for b in all {
        if let Some(a) = auctions.get(&b.auction) {
            d.add_row(&[
                b.auction.to_string(),
                b.bidder.to_string(),
                b.price.to_string(),
                b.channel.clone(),
                b.url.clone(),
                micros(b.date_time),
                b.extra.clone(),
                a.item_name.clone(),
                a.description.clone(),
                a.initial_bid.to_string(),
                a.reserve.to_string(),
                micros(a.date_time),
                micros(a.expires),
                a.seller.to_string(),
                a.category.to_string(),
                a.extra.clone(),
            ]);
        }
    }
    d
}

fn reference_q13(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut d = Digest::default();
    bids(events, |b| {
        d.add_row(&[
            b.auction.to_string(),
            b.bidder.to_string(),
            b.price.to_string(),
            micros(b.date_time),
            (b.auction % 10_000).to_string(),
        ]);
    });
    d
}

fn reference_q14(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut d = Digest::default();
    bids(events, |b| {
        let scaled = b.price as i128 * 908;
        if scaled <= 1_000_000_000 || scaled >= 50_000_000_000 {
            return;
        }
        let hour = b.date_time / 3_600_000 % 24;
        let kind = if (8..=18).contains(&hour) {
            "dayTime"
        } else if hour <= 6 || hour >= 20 {
            "nightTime"
        } else {
            "otherTime"
        };
        d.add_row(&[
            b.auction.to_string(),
            b.bidder.to_string(),
            decimal(scaled, 3),
            kind.to_owned(),
            micros(b.date_time),
            b.extra.clone(),
            b.extra.matches('c').count().to_string(),
        ]);
    });
    d
}

/// The value of `channel_id=` in `url` where it starts the url or follows a `&`.
fn channel_id(url: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(i) = url[from..].find("channel_id=") {
        let at = from + i;
        if at == 0 || url.as_bytes()[at - 1] == b'&' {
            let rest = &url[at + "channel_id=".len()..];
            return Some(rest.split('&').next().unwrap_or(""));
        }
        from = at + 1;
    }
    None
}

fn reference_q21(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut d = Digest::default();
    bids(events, |b| {
        let id = match b.channel.to_lowercase().as_str() {
            "apple" => Some("0"),
            "google" => Some("1"),
            "facebook" => Some("2"),
            "baidu" => Some("3"),
            _ => channel_id(&b.url),
        };
        if let Some(id) = id {
            d.add_row(&[
                b.auction.to_string(),
                b.bidder.to_string(),
                b.price.to_string(),
                b.channel.clone(),
                id.to_owned(),
            ]);
        }
    });
    d
}

fn reference_q22(events: &mut dyn Iterator<Item = Event>) -> Digest {
    let mut d = Digest::default();
    bids(events, |b| {
        let parts: Vec<&str> = b.url.split('/').collect();
        let part = |i: usize| parts.get(i).copied().unwrap_or("").to_owned();
        d.add_row(&[
            b.auction.to_string(),
            b.bidder.to_string(),
            b.price.to_string(),
            b.channel.clone(),
            part(3),
            part(4),
            part(5),
        ]);
    });
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_has_a_pair_of_bars_per_query_on_a_log_scale() {
        let svg = plot(
            &[
                ("q0".into(), 1_000_000.0, 155_020.0),
                ("q5 (3 queries)".into(), 100_000.0, 22_140.0),
            ],
            1_000_000,
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains(">q0<") && svg.contains(">q5 (3 queries)<"));
        assert!(svg.contains(">1,000,000<") && svg.contains(">22,140<"));
        // 10^6 is two thirds of the way from 10^4 to 10^7: 620 × 2/3 wide.
        assert!(svg.contains(r#"width="413.3" height="11""#), "{svg}");
        // Two bars a query; the legend's boxes are 10 high.
        assert_eq!(svg.matches(r#"height="11""#).count(), 4);
    }

    #[test]
    fn markers_expand_to_sources() {
        let text =
            expand_sources("@source bid watermark\n@stage maxes q7/maxes window_end\n[sink]")
                .unwrap();
        assert!(text.contains("path = \"events/bid\""), "{text}");
        assert!(
            text.contains("column = \"date_time\", delay = \"4 seconds\""),
            "{text}"
        );
        assert!(
            text.contains("path = \"stages/q7/maxes\"\nformat = \"parquet\""),
            "{text}"
        );
        assert!(
            text.contains("column = \"window_end\", delay = \"0 seconds\""),
            "{text}"
        );
        assert!(text.ends_with("[sink]\n"));
        assert!(
            !expand_sources("@stage maxes q7/maxes")
                .unwrap()
                .contains("watermark")
        );
        assert!(expand_sources("@stage maxes").is_err());
        assert!(expand_sources("@source bids").is_err());
    }

    #[test]
    fn iso_dates() {
        assert_eq!(iso(BASE_TIME_MS), "2023-01-01T00:00:00.000Z");
        assert_eq!(iso(951_782_400_123), "2000-02-29T00:00:00.123Z");
    }

    #[test]
    fn decimals_lose_trailing_zeros() {
        assert_eq!(decimal(1_234_500, 3), "1234.5");
        assert_eq!(decimal(2_000, 3), "2");
        assert_eq!(decimal(-500, 3), "-0.5");
    }

    #[test]
    fn channel_ids() {
        assert_eq!(
            channel_id("https://x/y?query=1&channel_id=12&z=1"),
            Some("12")
        );
        assert_eq!(channel_id("channel_id=7"), Some("7"));
        assert_eq!(channel_id("https://x/y?xchannel_id=12"), None);
    }
}
