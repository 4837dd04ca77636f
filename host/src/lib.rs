//! Weir: a micro-batch stream processor with the semantics of Spark
//! Structured Streaming, whose user code runs as WebAssembly components.
//!
//! The `weir` binary is a thin layer over this library; programs may embed
//! the host directly through [`query::Query`].
//!
//! # Layout
//! Where each concept lives, in the order a batch meets them:
//!
//! | concept | module |
//! |---|---|
//! | the pipeline file: keys, types, every-problem validation, `--set` | [`spec`] (`raw` → `validate` → typed [`spec::Pipeline`]) |
//! | the micro-batch loop, recovery, retries, the query fingerprint | [`query`] (`fingerprint`, `reload` for new plugin builds, `stage`: transforms, sink and stateful stages as the query holds them) |
//! | offsets, commits, source logs, the lock, and where state and sink folders go | [`checkpoint`] ([`checkpoint::CheckpointReader`] for readers) |
//! | sources: files, Kafka, Delta | [`source`] (`source::open` is the factory) |
//! | bytes to Arrow, malformed-record policies, dead letters | [`decode`] |
//! | the Wasm host: engine and cache, sandbox, limits, grants, deadline, guest output checks | [`plugin`] |
//! | SQL transforms: DataFusion's planner and expressions, Spark's functions, the batch clock | [`sql`] |
//! | stateless transforms and stateful operators (aggregation, dedup, keyed Wasm state) | [`operator`] (`operator::partitioned`: the one partitioned-state helper they share) |
//! | event-time watermarks and lateness | [`watermark`] |
//! | versioned, partitioned state stores (RocksDB, memory) | [`state`] |
//! | sinks: files, console, memory, Kafka, Delta, Delta MERGE, Wasm foreachBatch | [`sink`] |
//! | Spark-compatible progress records | [`progress`] |
//! | crash injection of the recovery tests (`failpoints` feature) | [`failpoint`] |
//! | the bundled example plugins and sample orders | [`examples`] |
//! | the `weir` command line (prints and exit codes live only here) | `cli` |
//! | shared plumbing: durable writes, calendar arithmetic, FNV-1a, HMAC-SHA256 | `durable`, `calendar`, `fnv`, `mac` |

mod calendar;
pub mod checkpoint;
pub mod cli;
pub mod decode;
mod durable;
pub mod examples;
pub mod failpoint;
mod fnv;
#[cfg(test)]
mod fuzz;
mod mac;
pub mod malloc;
pub mod operator;
pub mod plugin;
pub mod progress;
pub mod query;
pub mod serve;
pub mod sink;
pub mod source;
pub mod spec;
pub mod sql;
pub mod state;
pub mod threads;
pub mod watermark;
