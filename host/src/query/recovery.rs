//! Where a restarted query stands, read from its checkpoint (DESIGN.md §3): the batch to run
//! again (planned, not committed) or the next to plan, and the watermarks it had reached — the
//! last planned batch's, the one its commit computed for the next batch, and each input's.

use super::{CommitEntry, OffsetEntry, QueryError, per_source_watermarks};
use crate::checkpoint::Checkpoint;

/// The batches of the checkpoint.
#[derive(Debug, Clone, Copy)]
pub(super) struct Position {
    pub last_planned: Option<u64>,
    /// A planned batch without a commit, to run again first.
    pub pending: Option<u64>,
    pub next_batch: u64,
}

/// Reads the newest entries of both logs, so that a damaged log is reported before anything
/// runs, naming the file.
///
/// # Errors
/// When a log cannot be read.
pub(super) fn position(checkpoint: &Checkpoint) -> Result<Position, QueryError> {
    let last_planned = checkpoint.offsets().latest()?;
    let last_committed = checkpoint.commits().latest()?;
    if let Some(n) = last_planned {
        let _: Option<OffsetEntry> = checkpoint.offsets().get(n)?;
    }
    if let Some(n) = last_committed {
        let _: Option<CommitEntry> = checkpoint.commits().get(n)?;
    }
    let (pending, next_batch) = match last_planned {
        None => (None, 0),
        Some(n) if last_committed.is_some_and(|c| c >= n) => (None, n + 1),
        Some(n) => (Some(n), n + 1),
    };
    Ok(Position {
        last_planned,
        pending,
        next_batch,
    })
}

/// The watermarks a query resumes with.
#[derive(Debug, Clone)]
pub(super) struct Watermarks {
    /// wm of the last planned batch, i.e. wm(b−1) for the next one.
    pub last_watermark_ms: i64,
    /// wm for the next batch to plan.
    pub next_watermark_ms: i64,
    /// Each input's watermark for the next batch to plan.
    pub source_watermarks_ms: Vec<i64>,
}

/// Where the watermark stands (§3.1) for a query of `sources` inputs at `position`.
///
/// # Errors
/// When a log entry cannot be read.
pub(super) fn watermarks(
    checkpoint: &Checkpoint,
    position: Position,
    sources: usize,
) -> Result<Watermarks, QueryError> {
    let (mut last_watermark_ms, mut next_watermark_ms) = (0, 0);
    let mut source_watermarks_ms = vec![0; sources];
    if let Some(n) = position.last_planned {
        let entry: Option<OffsetEntry> = checkpoint.offsets().get(n)?;
        let wm = entry.as_ref().map_or(0, |e| e.batch_watermark_ms);
        last_watermark_ms = wm;
        next_watermark_ms = wm;
        source_watermarks_ms =
            entry.map_or_else(|| vec![0; sources], |e| per_source_watermarks(&e, sources));
        if position.pending.is_none() {
            let commit: Option<CommitEntry> = checkpoint.commits().get(n)?;
            if let Some(c) = commit {
                next_watermark_ms = c.next_batch_watermark_ms;
                if c.next_source_watermarks_ms.len() == sources {
                    source_watermarks_ms = c.next_source_watermarks_ms;
                } else {
                    // Written before per-input watermarks were kept.
                    source_watermarks_ms = vec![next_watermark_ms; sources];
                }
            }
        } else if n > 0 {
            let previous: Option<OffsetEntry> = checkpoint.offsets().get(n - 1)?;
            last_watermark_ms = previous.map_or(0, |e| e.batch_watermark_ms);
        }
    }
    Ok(Watermarks {
        last_watermark_ms,
        next_watermark_ms,
        source_watermarks_ms,
    })
}
