//! Where a query's input comes from. A source plans a batch (which data it
//! will read, recorded in the checkpoint before anything runs) and later
//! reads exactly that data, as often as a replay asks for it.
//!
//! # Layout
//! - `files`: a folder of JSON-lines or CSV files, new files each batch.
//! - `delta`: a Delta Lake table, the files its new versions append.
//! - this module: [`Input`], the query's view of whichever source it has.

pub mod delta;
pub mod files;

use arrow_schema::SchemaRef;

use crate::checkpoint::Checkpoint;
use crate::decode::Decoded;
pub use delta::{DeltaFile, DeltaSource, DeltaSourceError};
pub use files::{FileEntry, FilesSource, SourceError};

/// The source of a query, whatever its kind.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "one value per query, made once and never moved on a hot path"
)]
pub enum Input {
    Files(FilesSource),
    Delta(DeltaSource),
}

/// Units of input (files) not yet planned, or planned for one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Units {
    Files(Vec<FileEntry>),
    Delta(Vec<DeltaFile>),
}

impl Units {
    pub fn len(&self) -> usize {
        match self {
            Self::Files(f) => f.len(),
            Self::Delta(f) => f.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the first `n` units (those a batch took).
    pub fn drain_front(&mut self, n: usize) {
        match self {
            Self::Files(f) => drop(f.drain(..n.min(f.len()))),
            Self::Delta(f) => drop(f.drain(..n.min(f.len()))),
        }
    }
}

/// Errors of [`Input`]: those of the source kind in use.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error(transparent)]
    Files(#[from] SourceError),
    #[error(transparent)]
    Delta(#[from] DeltaSourceError),
}

impl InputError {
    /// Whether reading again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Files(SourceError::Read { .. }) | Self::Delta(DeltaSourceError::Io { .. })
        )
    }
}

impl Input {
    pub fn name(&self) -> &str {
        match self {
            Self::Files(s) => s.name(),
            Self::Delta(s) => s.name(),
        }
    }

    pub fn description(&self) -> String {
        match self {
            Self::Files(s) => s.description(),
            Self::Delta(s) => s.description(),
        }
    }

    pub fn schema(&self) -> &SchemaRef {
        match self {
            Self::Files(s) => s.schema(),
            Self::Delta(s) => s.schema(),
        }
    }

    /// Units present and not yet planned, in the order batches take them.
    ///
    /// # Errors
    /// When the input cannot be listed.
    pub fn list_new(&self) -> Result<Units, InputError> {
        Ok(match self {
            Self::Files(s) => Units::Files(s.list_new()?),
            Self::Delta(s) => Units::Delta(s.list_new()?),
        })
    }

    /// The units of the next batch, honouring the rate limit unless `unlimited`.
    pub fn take(&self, candidates: &Units, unlimited: bool) -> Units {
        match (self, candidates) {
            (Self::Files(s), Units::Files(c)) => Units::Files(s.take(c, unlimited)),
            (Self::Delta(s), Units::Delta(c)) => Units::Delta(s.take(c, unlimited)),
            (Self::Files(_), _) => Units::Files(Vec::new()),
            (Self::Delta(_), _) => Units::Delta(Vec::new()),
        }
    }

    /// No input, for a batch without data.
    pub fn nothing(&self) -> Units {
        match self {
            Self::Files(_) => Units::Files(Vec::new()),
            Self::Delta(_) => Units::Delta(Vec::new()),
        }
    }

    /// Records the units of batch `batch_id` in the source log.
    ///
    /// # Errors
    /// When the log entry cannot be written.
    pub fn record(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        units: &Units,
    ) -> Result<(), InputError> {
        match (self, units) {
            (Self::Files(s), Units::Files(f)) => s.record(checkpoint, batch_id, f)?,
            (Self::Delta(s), Units::Delta(f)) => s.record(checkpoint, batch_id, f)?,
            (Self::Files(s), _) => s.record(checkpoint, batch_id, &[])?,
            (Self::Delta(s), _) => s.record(checkpoint, batch_id, &[])?,
        }
        Ok(())
    }

    /// Reads exactly what batch `batch_id` planned; returns the rows and the number of files.
    ///
    /// # Errors
    /// When the plan is missing or the input cannot be read.
    pub fn read(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
    ) -> Result<(Decoded, usize), InputError> {
        match self {
            Self::Files(s) => {
                let files = s.planned(checkpoint, batch_id)?;
                Ok((s.read(batch_id, &files)?, files.len()))
            }
            Self::Delta(s) => {
                let files = s.planned(checkpoint, batch_id)?;
                let (batches, rows) = s.read(&files)?;
                Ok((
                    Decoded {
                        batches,
                        num_input_rows: rows,
                        ..Decoded::default()
                    },
                    files.len(),
                ))
            }
        }
    }
}
