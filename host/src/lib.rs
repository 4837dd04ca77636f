//! Weir: a micro-batch stream processor with the semantics of Spark
//! Structured Streaming, whose user code runs as WebAssembly components.
//!
//! The `weir` binary is a thin layer over this library; programs may embed
//! the host directly through [`query::Query`].
//!
//! # Layout
//! - [`spec`]: the pipeline file, typed and validated.
//! - [`checkpoint`]: the write-ahead logs and the lock of a query.
//! - [`source`]: where input comes from (a folder of files, a Delta table).
//! - [`decode`]: bytes to Arrow, with Spark's malformed-record policies.
//! - [`plugin`]: the WebAssembly host (sandbox, batches across the boundary).
//! - [`operator`]: per-batch operators between source and sink.
//! - [`sink`]: where output goes, idempotent by batch id.
//! - [`state`]: versioned state stores of stateful operators.
//! - [`watermark`]: event-time progress and lateness.
//! - [`query`]: the micro-batch loop and its recovery.
//! - [`progress`]: Spark-compatible progress records.
//! - [`failpoint`]: crash injection for recovery tests.
//! - [`examples`]: the bundled example plugins and sample data.
//! - `cli`: the `weir` command line.

pub mod checkpoint;
pub mod cli;
pub mod decode;
pub mod examples;
pub mod failpoint;
pub mod operator;
pub mod plugin;
pub mod progress;
pub mod query;
pub mod sink;
pub mod source;
pub mod spec;
pub mod state;
pub mod watermark;
