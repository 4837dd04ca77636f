//! The checkpoint's durable writes and wall-clock stamps, as [`CheckpointError`]s.
//!
//! Why it exists: a checkpoint file must never be seen half-written, even after a power cut;
//! [`crate::durable`] does the writing, this module names the failure as the checkpoint's.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use super::CheckpointError;
use crate::durable::{self, FsError};

impl From<FsError> for CheckpointError {
    fn from(e: FsError) -> Self {
        Self::io(&e.path, e.action, e.source)
    }
}

/// Writes `bytes` to `path` atomically, replacing any existing file. Creates the parent directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    Ok(durable::write_atomically(path, bytes)?)
}

/// As [`write_atomically`], unless `path` exists: `true` when the bytes were written, `false`
/// when an existing file was left as it was.
pub(super) fn write_new(path: &Path, bytes: &[u8]) -> Result<bool, CheckpointError> {
    Ok(durable::write_new(path, bytes)? == durable::Written::New)
}

/// As [`write_atomically`], for a file only its owner may read (mode 0600).
pub(super) fn write_private_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    Ok(durable::write_private_atomically(path, bytes)?)
}

/// Makes a rename in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    Ok(durable::sync_dir(dir)?)
}

/// The current time as RFC 3339 UTC with seconds, e.g. `2024-03-01T00:03:07Z`.
pub(super) fn now_rfc3339() -> String {
    // A clock before 1970 is reported as the epoch rather than failing the lock.
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    format!("{}Z", crate::calendar::format_seconds(secs))
}
