//! The query's secret: 32 random bytes kept in the checkpoint (`secret`, mode 0600).
//!
//! Why it exists: what a plugin draws from its random interfaces must be the same when a batch
//! runs again, so it cannot come from the machine's entropy; but it must not be computable from
//! anything another tenant can see either (the query id is in `metadata`, in sink records and in
//! Delta `txn` actions). A value that lives as long as the checkpoint and is readable only by
//! the host's user gives both. The file is written once, atomically, and never rewritten.

use std::path::Path;

use super::CheckpointError;
use super::fsio;

/// Length of the secret in bytes.
pub const SECRET_LEN: usize = 32;

/// A query's secret. Its `Debug` does not show it, and nothing in Weir logs it.
#[derive(Clone)]
pub struct QuerySecret([u8; SECRET_LEN]);

impl std::fmt::Debug for QuerySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QuerySecret(<redacted>)")
    }
}

impl QuerySecret {
    /// A secret with these bytes: for tools and tests; a query takes its checkpoint's.
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> Self {
        Self(bytes)
    }

    /// The bytes, for the keyed hashes derived from them.
    pub(crate) fn expose(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }
}

/// The secret in `path`; `Ok(None)` when the file does not exist.
///
/// # Errors
/// [`CheckpointError::Corrupt`] naming the file when it does not hold exactly
/// [`SECRET_LEN`] bytes, [`CheckpointError::Io`] when it cannot be read.
pub(super) fn read(path: &Path) -> Result<Option<QuerySecret>, CheckpointError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CheckpointError::io(path, "read", e)),
    };
    let bytes: [u8; SECRET_LEN] = bytes.as_slice().try_into().map_err(|_| {
        CheckpointError::corrupt(
            path,
            format!(
                "the file holds {} bytes, not a secret of {SECRET_LEN}",
                bytes.len()
            ),
        )
    })?;
    Ok(Some(QuerySecret(bytes)))
}

/// Creates a fresh secret in `path` (mode 0600, atomically).
///
/// # Errors
/// [`CheckpointError::Io`] when the OS gives no random bytes or the file cannot be written.
pub(super) fn create(path: &Path) -> Result<QuerySecret, CheckpointError> {
    let mut bytes = [0u8; SECRET_LEN];
    getrandom::fill(&mut bytes).map_err(|e| {
        CheckpointError::io(
            path,
            "draw random bytes for",
            std::io::Error::other(e.to_string()),
        )
    })?;
    fsio::write_private_atomically(path, &bytes)?;
    Ok(QuerySecret(bytes))
}
