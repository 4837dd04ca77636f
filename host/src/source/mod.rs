//! Where a query's input comes from. A source plans a batch (which data it
//! will read, recorded in the checkpoint before anything runs) and later
//! reads exactly that data, as often as a replay asks for it.
//!
//! # Layout
//! - `files`: a folder of JSON-lines or CSV files, new files each batch.
//! - [`kafka`]: Kafka topics, a range of offsets per partition each batch.

pub mod files;
pub mod kafka;

pub use files::{FileEntry, FilesSource, SourceError};
